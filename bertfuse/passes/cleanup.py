"""Cleanup: Identity, no-op Cast/Reshape, constant-foldable shape arithmetic, dead nodes.

    x ─► Identity ─► y                   ==>  x ─► y
    x(float) ─► Cast(to=float) ─► y      ==>  x ─► y
    x ─► Reshape(a) ─► Reshape(b) ─► y   ==>  x ─► Reshape(b) ─► y
    Constant / Shape-of-static-tensor arithmetic   ==>  folded initializers

Candidates: every Identity, no-op Cast, Reshape of a Reshape and Reshape to its input's own
static shape; each ends removed (fused) or kept with a reason (an input/output name to keep,
a Reshape that copies dims from its input). Folding is onnx-graphsurgeon's and not itemised.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from bertfuse.passes.base import CandidatePass, PassResult, const_value, is_graph_output, \
    producer, replace_tensor
from bertfuse.passes.match import fail


class Cleanup(CandidatePass):
    name = "cleanup"

    def prepare(self, graph: gs.Graph) -> None:
        graph.cleanup().toposort()
        try:
            graph.fold_constants(fold_shapes=True, error_ok=True)
        except Exception:  # folding is an optimisation: a model it cannot fold still runs
            pass
        graph.cleanup()

    def candidates(self, graph: gs.Graph) -> Iterator[gs.Node]:
        for node in list(graph.nodes):
            # Read as the loop reaches it: an earlier bypass may have changed its input.
            if not node.inputs or not node.outputs:
                continue
            if node.op == "Identity" or _no_op_cast(node, node.inputs[0]) or \
                    (node.op == "Reshape" and (_chained(node) or
                                               _same_static_shape(node.inputs[0], node))):
                yield node  # a Reshape that changes the shape has nothing to clean

    def match(self, graph: gs.Graph, node: gs.Node) -> tuple[str, gs.Tensor]:
        """('chain', the input of the Reshape before) or ('bypass', the node's input)."""
        src = node.inputs[0]
        if node.op == "Reshape":
            prev = producer(src)
            if _chained(node) and _no_copied_dims(node):
                return "chain", prev.inputs[0]
            if not _same_static_shape(src, node):
                fail(f"Reshape {node.name} copies dims (0) from the Reshape {prev.name} before "
                     "it: both kept")
        if is_graph_output(graph, node.outputs[0]) and \
                (is_graph_output(graph, src) or src in graph.inputs):
            # an input/output must keep its name: leave the node
            fail(f"{node.op} {node.name} links model inputs/outputs: kept for their names")
        return "bypass", src

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: tuple[str, gs.Tensor]) -> None:
        kind, src = found
        if kind == "chain":
            node.inputs[0] = src
            return
        replace_tensor(graph, node.outputs[0], src)
        node.outputs.clear()
        node.inputs.clear()

    def finish(self, graph: gs.Graph, result: PassResult) -> None:
        graph.cleanup().toposort()


def _chained(node: gs.Node) -> bool:
    """A Reshape whose input is a Reshape's output read by it alone."""
    prev = producer(node.inputs[0])
    return prev is not None and prev.op == "Reshape" and len(node.inputs[0].outputs) == 1


def _no_op_cast(node: gs.Node, src: gs.Tensor) -> bool:
    return node.op == "Cast" and src.dtype is not None and \
        np.dtype(src.dtype) == helper.tensor_dtype_to_np_dtype(node.attrs["to"])


def _no_copied_dims(node: gs.Node) -> bool:
    """A Reshape whose target has no 0 meaning "copy this dim from the input" (allowzero=0):
    only then does it compute the same on the input of a Reshape before it."""
    if int(node.attrs.get("allowzero", 0)) == 1:
        return True
    shape = const_value(node.inputs[1])
    return shape is not None and not np.any(np.asarray(shape) == 0)


def _same_static_shape(src: gs.Tensor, node: gs.Node) -> bool:
    shape = const_value(node.inputs[1])
    if shape is None or src.shape is None or any(not isinstance(d, int) for d in src.shape):
        return False
    return list(shape) == list(src.shape) and all(d > 0 for d in shape)
