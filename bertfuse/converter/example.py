"""`bertfuse example`: a Google-layout TF1 checkpoint + bert_config.json with seeded weights,
and a vocab.txt of its vocab size (example_vocab.py) for text input.

It never replaces a directory it did not write: only an empty one, or an earlier example
(marked by the file MARKER, holding example files only).
"""

from __future__ import annotations

import os
from pathlib import Path

from bertfuse.converter.config import EXAMPLE_CONFIGS, BertConfig
from bertfuse.converter.example_vocab import example_vocab
from bertfuse.converter.modeling import random_weights
from bertfuse.errors import BertfuseError
from bertfuse.io.safety import pause_point, swap_dir_in, temp_dir
from bertfuse.optional import optional

# Marks a directory as written by `bertfuse example`, which may then replace it as a whole.
MARKER = ".bertfuse-example"
_MARKER_TEXT = ("Written by `bertfuse example`. A later `bertfuse example -o` to this directory "
                "replaces it as a whole;\ndelete this file to keep that from happening.\n")


def write_example(config: str | BertConfig, out_dir: str, seed: int = 0, head: bool = False,
                  hidden_act: str | None = None) -> Path:
    """Writes OUT_DIR/bert_config.json, OUT_DIR/bert_model.ckpt.* and OUT_DIR/vocab.txt (not
    below 5 tokens: no room for the special ones); returns OUT_DIR.

    OUT_DIR may exist only if it is empty or an earlier example (it holds MARKER and nothing
    but example files); then it is replaced as a whole. Any other directory is refused."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    if isinstance(config, str):
        if config not in EXAMPLE_CONFIGS:
            raise BertfuseError(f"unknown example config {config!r} "
                                f"(choose from {', '.join(EXAMPLE_CONFIGS)})")
        cfg = BertConfig(**{**EXAMPLE_CONFIGS[config].__dict__})
    else:
        cfg = config
    if hidden_act:
        cfg.hidden_act = hidden_act
    cfg.validate()
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise BertfuseError(f"--seed must be a non-negative integer, got {seed!r}")
    out = Path(os.path.abspath(out_dir))
    _check_replaceable_dir(out, out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built in a sibling temp dir (never inside OUT_DIR), then renamed into place.
    with temp_dir(out.parent, prefix=f".{out.name}.") as tmp:
        os.chmod(tmp, 0o755)
        weights = random_weights(cfg, seed, head=head)
        names = sorted(weights)
        tf.raw_ops.SaveV2(prefix=str(tmp / "bert_model.ckpt"), tensor_names=names,
                          shape_and_slices=[""] * len(names),
                          tensors=[weights[n] for n in names])
        (tmp / "checkpoint").write_text('model_checkpoint_path: "bert_model.ckpt"\n')
        (tmp / "bert_config.json").write_text(cfg.to_json())
        vocab = example_vocab(cfg.vocab_size)
        if vocab:
            (tmp / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
        (tmp / MARKER).write_text(_MARKER_TEXT)
        pause_point("example-tmp")
        swap_dir_in(tmp, out)
    return Path(out_dir)


def _is_example_file(name: str) -> bool:
    return name in ("bert_config.json", "checkpoint", "vocab.txt", MARKER) or \
        name.startswith("bert_model.ckpt.")


def _check_replaceable_dir(out: Path, shown: str) -> None:
    """Refuses any existing OUT_DIR but an empty directory or an earlier example."""
    if out.is_symlink():
        raise BertfuseError(f"{shown}: is a symbolic link; not replacing it: pick a new or "
                            f"empty directory")
    if out.exists() and not out.is_dir():
        raise BertfuseError(f"{shown}: exists and is not a directory")
    if not out.is_dir():
        return
    cwd = Path.cwd().resolve()
    if out.resolve() == cwd or out.resolve() in cwd.parents:
        raise BertfuseError(f"{shown}: is the current directory (or holds it); not replacing "
                            f"it: pick a new or empty directory")
    entries = [f.name for f in out.iterdir()]
    if not entries:
        return
    other = [n for n in entries if not _is_example_file(n)]
    if other:
        raise BertfuseError(f"{shown}: directory holds other files (e.g. {other[0]}); "
                            f"not replacing it: pick a new or empty directory")
    if MARKER not in entries:
        raise BertfuseError(f"{shown}: holds a checkpoint that bertfuse example did not write "
                            f"(no {MARKER}); not replacing it: pick a new or empty directory")

