"""Files that go beside a model: a text-in model's vocab, MODEL.vocab.txt beside MODEL.onnx.

`bertfuse convert` writes it for a SavedModel whose tokenizer it cut off; serve, score and
verify --text-file read it when no vocab is given, so they tokenize as that SavedModel did.
"""

from __future__ import annotations

import os
from pathlib import Path

from bertfuse.io.safety import mode_of, replace_file, temp_file
from bertfuse.io.write_errors import naming_the_path


def vocab_beside(model: str | os.PathLike) -> Path:
    """MODEL.vocab.txt for MODEL.onnx (any other suffix: replaced the same way)."""
    return Path(model).with_suffix(".vocab.txt")


def find_vocab(model: str | os.PathLike | None) -> str | None:
    """The model's own vocab beside it, where there is one."""
    p = vocab_beside(model) if model is not None else None
    return str(p) if p is not None and p.is_file() else None


def write_vocab(model: str | os.PathLike, data: bytes) -> str:
    """The vocab's bytes beside the model, atomically (a temporary file, then renamed)."""
    target = vocab_beside(model)
    mode = mode_of(target)
    with naming_the_path(target, "the model's vocab"), temp_file(target) as tmp:
        tmp.write_bytes(data)
        tmp.chmod(mode)
        replace_file(tmp, target)
    return str(target)
