"""bertfuse: TensorFlow BERT -> fused ONNX (ONNX Runtime contrib ops) for fast GPU serving.

The public API (README, "Python API")::

    import bertfuse

    model, report = bertfuse.convert("bert_ckpt/", "model.onnx")
    model, report = bertfuse.optimize("raw.onnx", "fused.onnx", inputs={"input_ids": "ids"})
    sess = bertfuse.Session("model.onnx", device="cpu")

Importing the package imports neither TensorFlow nor ONNX Runtime: every name below is
loaded on first use, so `import bertfuse` is fast and works on hosts without them (the
converter needs the `tf` extra, the runtime the `cpu` or `gpu` extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bertfuse.errors import BertfuseError, FusionIncomplete, MissingDependency, ParityError

from bertfuse._version import __version__

# name -> module that defines it, imported on first access (PEP 562).
_LAZY = {
    "convert": "bertfuse.api",
    "optimize": "bertfuse.api",
    "Session": "bertfuse.runtime",
    "SessionOptions": "bertfuse.runtime",
    "SessionPool": "bertfuse.runtime",
    "RunReport": "bertfuse.pipeline.stages",
}

__all__ = ["BertfuseError", "FusionIncomplete", "MissingDependency", "ParityError",
           "__version__", *_LAZY]

if TYPE_CHECKING:
    from bertfuse.api import convert, optimize
    from bertfuse.pipeline.stages import RunReport
    from bertfuse.runtime import Session, SessionOptions, SessionPool


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bertfuse' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
