"""SavedModels with XLA-compiled functions (`tf.function(jit_compile=True)`), made freezable.

Such a function is saved with `_XlaMustCompile` and `_noinline` on its FunctionDef (and
`jit_compile: ON` in its function spec). Freezing inlines function calls before it turns
variables into constants, but grappler never inlines a function marked so: the call stays,
its body still reads the variables through the call's resource inputs, and freezing fails
("input resource[0] expected type resource != float"), or leaves a StatefulPartitionedCall
that tf2onnx cannot map. Whether XLA compiles a function changes how it runs, not what it
computes, so the SavedModel is loaded from a copy whose saved_model.pb has those marks
removed (variables and assets linked, not copied); the parity check then holds the ONNX
model to what the unmarked graph computes.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from bertfuse.io.safety import scratch_dir
from bertfuse.optional import optional

# Attributes that keep grappler from inlining a function (jit_compile=True sets both).
MARKS = ("_XlaMustCompile", "_noinline")


def _strip(saved) -> int:
    """Removes the marks from every function, call node and function spec; returns how many
    functions were marked."""
    marked = 0
    for meta in saved.meta_graphs:
        for fn in meta.graph_def.library.function:
            if fn.attr.get("_XlaMustCompile") is not None and fn.attr["_XlaMustCompile"].b:
                marked += 1
            for key in MARKS:
                fn.attr.pop(key, None)
            for node in fn.node_def:
                for key in MARKS:
                    node.attr.pop(key, None)
        for node in meta.graph_def.node:
            for key in MARKS:
                node.attr.pop(key, None)
        for obj in meta.object_graph_def.nodes:
            if obj.HasField("function"):
                obj.function.function_spec.jit_compile = 0  # DEFAULT
    return marked


@contextmanager
def freezable(path: str, notes: list[str]) -> Iterator[str]:
    """The SavedModel directory to load: `path` itself, or, where its functions are marked
    for XLA, a temporary copy without the marks (a note says so)."""
    pb = Path(path) / "saved_model.pb"
    try:
        data = pb.read_bytes()
    except OSError:
        data = b""
    if b"_XlaMustCompile" not in data:
        yield path
        return
    saved_model_pb2 = optional("tensorflow.core.protobuf", "saved_model_pb2",
                               why="TensorFlow runs the source model (tf extra)")

    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(data)
    except Exception:  # not ours to judge: the loader says what is wrong with it
        yield path
        return
    marked = _strip(saved)
    with scratch_dir("bertfuse-xla-") as tmp:
        (tmp / "saved_model.pb").write_bytes(saved.SerializeToString())
        for entry in Path(path).iterdir():
            if entry.name not in ("saved_model.pb", "fingerprint.pb"):
                os.symlink(entry.resolve(), tmp / entry.name)
        if marked:
            notes.append("XLA-compiled functions (jit_compile=True) inlined to freeze the graph")
        yield str(tmp)
