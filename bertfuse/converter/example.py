"""`bertfuse example`: a Google-layout TF1 checkpoint + bert_config.json with seeded weights."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from bertfuse.converter.config import EXAMPLE_CONFIGS, BertConfig
from bertfuse.converter.modeling import random_weights
from bertfuse.errors import BertfuseError


def write_example(config: str | BertConfig, out_dir: str, seed: int = 0, head: bool = False,
                  hidden_act: str | None = None) -> Path:
    """Writes OUT_DIR/bert_config.json and OUT_DIR/bert_model.ckpt.*; returns OUT_DIR."""
    import tensorflow as tf

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
    out = Path(out_dir)
    # The directory is replaced as a whole: never one that holds anything but an example.
    if out.exists() and not out.is_dir():
        raise BertfuseError(f"{out}: exists and is not a directory")
    if out.is_dir():
        other = [f.name for f in out.iterdir() if f.name not in ("bert_config.json", "checkpoint")
                 and not f.name.startswith("bert_model.ckpt.")]
        if other:
            raise BertfuseError(f"{out}: directory holds other files (e.g. {other[0]}); "
                                f"not replacing it: pick a new or empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename: no half-written example on failure.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        weights = random_weights(cfg, seed, head=head)
        names = sorted(weights)
        tf.raw_ops.SaveV2(prefix=str(tmp / "bert_model.ckpt"), tensor_names=names,
                          shape_and_slices=[""] * len(names),
                          tensors=[weights[n] for n in names])
        (tmp / "checkpoint").write_text('model_checkpoint_path: "bert_model.ckpt"\n')
        (tmp / "bert_config.json").write_text(cfg.to_json())
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
