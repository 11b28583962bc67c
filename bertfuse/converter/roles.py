"""Recognise which model input is token ids, attention mask and segment ids."""

from __future__ import annotations

import re

from bertfuse.errors import BertfuseError

# What TF Hub's BERT encoders return beside the roles: `default` (pooled_output again) and
# `encoder_outputs`, one [batch, seq, hidden] per layer. Kept only when --outputs names them.
HUB_EXTRAS = re.compile(r"default|encoder_outputs(_\d+)?")

ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "input_ids": ("input_ids", "input_word_ids", "token_ids", "word_ids", "ids", "inputs",
                  "input"),
    "input_mask": ("input_mask", "attention_mask", "padding_mask", "mask"),
    "segment_ids": ("segment_ids", "token_type_ids", "input_type_ids", "type_ids", "segments",
                    "segment_ids_0"),
}
# Looser, substring cues for names such as "serving_default_input_word_ids".
ROLE_CUES: dict[str, tuple[str, ...]] = {
    "input_ids": ("word_id", "input_id", "token_id"),
    "input_mask": ("mask",),
    "segment_ids": ("segment", "type_id", "token_type"),
}


def _norm(name: str) -> str:
    name = re.sub(r":\d+$", "", name)
    return name.rsplit("/", 1)[-1].lower().replace("-", "_")  # Keras: Input-Token -> Input_Token


def parse_override(text: str | dict[str, str] | None) -> dict[str, str]:
    """`--inputs input_ids=ids,input_mask=mask[,segment_ids=types]` -> {role: name}; the
    Python API's {role: name} is checked the same way."""
    if isinstance(text, dict):
        for role, name in text.items():
            if role not in ROLE_NAMES:
                raise BertfuseError(f"inputs: unknown role {role!r} (roles: "
                                    f"{', '.join(ROLE_NAMES)})")
            if not isinstance(name, str) or not name.strip():
                raise BertfuseError(f"inputs: {role} must name a model input, not {name!r}")
        return {role: name.strip() for role, name in text.items()}
    if not text:
        return {}
    out: dict[str, str] = {}
    for part in text.split(","):
        role, sep, name = part.partition("=")
        role = role.strip()
        if not sep or role not in ROLE_NAMES or not name.strip():
            raise BertfuseError(f"--inputs: expected ROLE=NAME with ROLE in "
                                f"{', '.join(ROLE_NAMES)}, got {part!r}")
        out[role] = name.strip()
    return out


class UnknownInput(BertfuseError):
    """--inputs names an input the model does not have: the graph cannot answer that either."""


def assign_roles(names: list[str], override: dict[str, str] | None = None,
                 int_names: set[str] | None = None) -> dict[str, str]:
    """Maps roles to the given input names; raises a clear error if that is ambiguous."""
    override = override or {}
    roles: dict[str, str] = {}
    for role, name in override.items():
        match = [n for n in names if n == name or _norm(n) == _norm(name)]
        if not match:
            raise UnknownInput(f"--inputs: the model has no input {name!r} "
                                f"(inputs: {', '.join(names)})")
        roles[role] = match[0]
    free = [n for n in names if n not in roles.values()]
    for role, exact in ROLE_NAMES.items():
        if role in roles:
            continue
        hit = [n for n in free if _norm(n) in exact]
        if not hit:
            hit = [n for n in free if any(c in _norm(n) for c in ROLE_CUES[role])]
        if len(hit) == 1:
            roles[role] = hit[0]
            free.remove(hit[0])
        elif len(hit) > 1:
            raise BertfuseError(f"inputs {', '.join(hit)} could all be {role}: "
                                f"say which with --inputs {role}=NAME")
    if int_names is not None:
        for role, name in roles.items():
            if name not in int_names:
                raise BertfuseError(f"input {name!r} looks like {role} but is not an integer "
                                    f"tensor: pass --inputs")
    if "input_ids" not in roles:
        raise BertfuseError(f"cannot tell which input holds the token ids (inputs: "
                            f"{', '.join(names)}); pass --inputs input_ids=NAME,...")
    leftover = [n for n in names if n not in roles.values()]
    if leftover:
        raise BertfuseError(f"unrecognised model inputs {', '.join(leftover)}; "
                            f"map them with --inputs ROLE=NAME")
    return roles
