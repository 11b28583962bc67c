"""The canonical interface every TF source (checkpoint, SavedModel, frozen, Keras) maps to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bertfuse.converter import reference

ROLES = ("input_ids", "input_mask", "segment_ids")
# Output roles: canonical name -> (the source names it is recognised by, read per token). A
# per-token output is [batch, seq, ...]: its padded positions are the padded tokens' own, so
# the mask checks watch it at kept positions only; a per-row output ([batch, ...]) is watched
# on the rows whose first token ([CLS]) is kept. `token_logits` is a `logits` of rank 3
# (token classification); `start_logits` / `end_logits` are a span head's ([batch, seq]).
OUTPUT_ROLES: dict[str, tuple[tuple[str, ...], bool]] = {
    "sequence_output": (("sequence_output", "last_hidden_state", "encoder_output",
                         "hidden_states"), True),
    "pooled_output": (("pooled_output", "pooler_output", "pooled"), False),
    "logits": (("logits",), False),
    "token_logits": (("token_logits",), True),
    "start_logits": (("start_logits",), True),
    "end_logits": (("end_logits",), True),
}


def role_of(source: "TFSource", name: str) -> str | None:
    """An output's role: what the source says, else its name where that is a role."""
    if name in source.output_roles:
        return source.output_roles[name]
    return name if name in OUTPUT_ROLES else None


def per_token(name: str) -> bool:
    """An output read at every token position (see OUTPUT_ROLES)."""
    return OUTPUT_ROLES.get(name, ((), False))[1]


@dataclass
class TFSource:
    """A TF BERT as a GraphDef whose large weights are placeholders, plus those weights.

    `inputs` maps a role (input_ids / input_mask / segment_ids) to the TF tensor name,
    `outputs` maps a canonical output name to the TF tensor name, `original_names` maps the
    canonical names back to what the user's model called them.
    """

    kind: str
    path: str
    graph_def: Any
    weights: dict[str, np.ndarray]
    inputs: dict[str, str]
    input_dtypes: dict[str, np.dtype]
    outputs: dict[str, str]
    original_names: dict[str, str] = field(default_factory=dict)
    vocab_size: int | None = None
    type_vocab_size: int = 2
    max_positions: int | None = None
    fixed_seq: int | None = None
    # 3: the inputs are [batch, choices, seq] (multiple choice), flattened inside the model
    input_rank: int = 2
    config: dict | None = None  # bert_config.json contents, where the source has one
    # Each output's role by meaning (converter/output_meaning.py), None for an output that
    # has none and keeps its source name; absent outputs: the name is the role.
    output_roles: dict[str, str | None] = field(default_factory=dict)
    backend: str = ""  # which TF computed the last reference (for the report)
    text: Any = None  # a text-in SavedModel's tokenizer (text_front.py TextFront)
    notes: list[str] = field(default_factory=list)  # what loading changed (the report's notes)
    _session: Any = None

    @property
    def tf_node_count(self) -> int:
        """Compute nodes of the TF graph (weights and their placeholders excluded)."""
        skip = {"Const", "Placeholder", "NoOp"}
        return sum(1 for n in self.graph_def.node if n.op not in skip)

    def output_table(self) -> list[dict]:
        """Each output's name, role (None: none, the output keeps its source name) and source
        name: the report's `outputs` and the model's `output_roles` metadata."""
        return [{"name": n, "role": role_of(self, n), "source": self.original_names.get(n, n)}
                for n in self.outputs]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs the TF graph on role-keyed inputs; returns canonical-name-keyed outputs."""
        return self.run_many([feeds])[0]

    def run_many(self, feed_sets: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """The TF reference for each feed set, with oneDNN's rewrites off: in this process when
        its TF has them off, else in a worker process (see converter/reference.py)."""
        if reference.in_process():
            if self._session is None:
                self._session = reference.new_session(self.graph_def)
            self.backend = reference.describe("in-process")
            return reference.run_graph(self.graph_def, self.weights, self.inputs,
                                       self.input_dtypes, self.outputs, feed_sets,
                                       self._session)
        self.backend = reference.describe("subprocess")
        return reference.run_in_subprocess(self, feed_sets)

    def close(self) -> None:
        if self.text is not None:
            self.text.close()
        if self._session is not None:
            self._session.close()
            self._session = None
