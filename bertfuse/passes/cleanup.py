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

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from bertfuse.passes.base import Layers, MatchResult, PassResult, const_value, is_graph_output, \
    producer, replace_tensor


def _bypass(graph: gs.Graph, node: gs.Node, src: gs.Tensor) -> MatchResult:
    m = MatchResult()
    out = node.outputs[0]
    if is_graph_output(graph, out) and (is_graph_output(graph, src) or src in graph.inputs):
        # an input/output must keep its name: leave the node
        return m.fail(f"{node.op} {node.name} links model inputs/outputs: kept for their names")
    replace_tensor(graph, out, src)
    node.outputs.clear()
    node.inputs.clear()
    return m.ok(node)


class Cleanup:
    name = "cleanup"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        graph.cleanup().toposort()
        try:
            graph.fold_constants(fold_shapes=True, error_ok=True)
        except Exception:  # folding is an optimisation: a model it cannot fold still runs
            pass
        graph.cleanup()
        layers = Layers(graph)
        for node in list(graph.nodes):
            if not node.inputs or not node.outputs:
                continue
            src = node.inputs[0]
            layer = layers.of(node)
            if node.op == "Identity" or _no_op_cast(node, src):
                match = _bypass(graph, node, src)
            elif node.op == "Reshape":
                prev = producer(src)
                chained = prev is not None and prev.op == "Reshape" and len(src.outputs) == 1
                if chained and _no_copied_dims(node):
                    node.inputs[0] = prev.inputs[0]
                    match = MatchResult().ok(node)
                elif _same_static_shape(src, node):
                    match = _bypass(graph, node, src)
                elif chained:
                    match = MatchResult().fail(f"Reshape {node.name} copies dims (0) from the "
                                               f"Reshape {prev.name} before it: both kept")
                else:
                    continue  # a Reshape that changes the shape: nothing to clean
            else:
                continue
            if result.record(self.name, match, layer):
                result.fused(self.name, layer)
        graph.cleanup().toposort()
        return result


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
