"""TF sources -> one canonical TFSource -> raw ONNX. TensorFlow is imported lazily, here only."""

from __future__ import annotations

from pathlib import Path

from bertfuse.errors import BertfuseError
from bertfuse.io.model import versioned_savedmodel
from bertfuse.converter import untrusted
from bertfuse.converter.checkpoint import load_checkpoint
from bertfuse.converter.frozen import load_frozen
from bertfuse.converter.roles import parse_override
from bertfuse.converter.savedmodel import load_keras, load_savedmodel

KINDS = ("auto", "checkpoint", "savedmodel", "frozen", "keras")


def detect_kind(path: str) -> str:
    p = Path(path)
    if p.is_dir():
        if (p / "saved_model.pb").exists() or versioned_savedmodel(p) is not None:
            return "savedmodel"
        if (p / "bert_config.json").exists() or any(p.glob("*.index")):
            return "checkpoint"
        raise BertfuseError(f"{path}: directory holds neither a SavedModel nor a checkpoint")
    if p.suffix == ".keras":
        return "keras"
    if p.suffix in (".pb", ".pbtxt"):
        return "frozen"
    if p.suffix == ".index" or Path(str(p) + ".index").exists():
        return "checkpoint"
    if not p.exists():
        raise BertfuseError(f"{path}: no such file or directory")
    raise BertfuseError(f"{path}: cannot tell the model format; pass --format")


def load_source(path: str, kind: str, signature: str, inputs: str | None = None, outputs: list[str] | None = None,
                config: str | None = None, trust: bool = False):
    """Reads any supported TF BERT into a TFSource. Ops that reach outside the model are
    refused before TensorFlow runs any of it, unless `trust` (converter/untrusted.py)."""
    override = parse_override(inputs)
    if kind == "auto":
        kind = detect_kind(path)
    if not Path(path).exists() and kind != "checkpoint":
        raise BertfuseError(f"{path}: no such file or directory")
    if kind == "checkpoint":
        if override or outputs:
            raise BertfuseError("--inputs/--outputs do not apply to a checkpoint: bertfuse "
                                "rebuilds its graph with input_ids, input_mask, segment_ids")

        return load_checkpoint(path, config)
    if kind == "frozen":
        return load_frozen(path, outputs, override, trust)
    if kind == "savedmodel":
        # transformers' save_pretrained(..., saved_model=True) folder, TF Serving's base folder
        path = str(versioned_savedmodel(Path(path)) or path)
        notes = _untrusted(path, kind, trust)
        # Keras-exported SavedModels (model.export) are plain SavedModels with a signature.
        return _noted(load_savedmodel(path, signature, override, outputs), notes)
    if kind == "keras":
        notes = _untrusted(path, kind, trust)
        return _noted(load_keras(path, override, outputs, trust), notes)
    raise BertfuseError(f"unknown --format {kind!r} (choose from {', '.join(KINDS)})")


def _untrusted(path: str, kind: str, trust: bool) -> list[str]:
    """The refusal of ops that reach outside the model, or with `trust` the notes naming
    them."""
    return untrusted.enforce(path, untrusted.scan(path, kind), trust)


def _noted(source, notes: list[str]):
    source.notes[:0] = notes
    return source
