"""bertfuse: TensorFlow BERT -> fused ONNX (ONNX Runtime contrib ops, bertfuse's own CUDA
ops) for fast GPU serving.

The rooms, along the path of a model (docs/architecture.md draws them):

    cli/        the `bertfuse` command: one Command class per subcommand
    api         bertfuse.convert / bertfuse.optimize, the Python face of the pipeline
    pipeline/   convert / optimize / verify as one plan of stages; every option, once
    converter/  TF sources (checkpoint, SavedModel, GraphDef, Keras) -> raw ONNX (tf2onnx)
    passes/     the fusion passes (onnx-graphsurgeon) and the pass manager's plans
    ops/        contracts + NumPy references: contrib/ (com.microsoft), bertfuse/ (ai.bertfuse)
    kernels/    the native CUDA library behind the ai.bertfuse ops: sources, build, loader
    runtime/    Session: buckets, IO binding, CUDA graphs, pools
    serve/      HTTP serving on Ray Serve          score/    offline scoring on Ray Data
    inspect/    inspect, summarize, diff, draw     bench/    the GPU benchmark
    export/     Triton model repositories          io/       model files, ORT sessions, temp files
    text        WordPiece on a checkpoint's vocab.txt
    errors      the errors the CLI turns into one line and an exit code
    checks      argument checks for every room's Python API, one message style
    ray_cluster the Ray bring-up and shutdown serve/ and score/ share

The public API (docs/python-api.md)::

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
    "RunReport": "bertfuse.pipeline.report",
}

__all__ = ["BertfuseError", "FusionIncomplete", "MissingDependency", "ParityError",
           "__version__", *_LAZY]

if TYPE_CHECKING:
    from bertfuse.api import convert, optimize
    from bertfuse.pipeline.report import RunReport
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
