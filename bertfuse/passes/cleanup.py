"""Cleanup: Identity, no-op Cast/Reshape, constant-foldable shape arithmetic, dead nodes.

    x ─► Identity ─► y                   ==>  x ─► y
    x(float) ─► Cast(to=float) ─► y      ==>  x ─► y
    x ─► Reshape(a) ─► Reshape(b) ─► y   ==>  x ─► Reshape(b) ─► y
    Constant / Shape-of-static-tensor arithmetic   ==>  folded initializers
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from bertfuse.passes.base import PassResult, const_value, is_graph_output, producer, \
    replace_tensor


def _bypass(graph: gs.Graph, node: gs.Node, src: gs.Tensor) -> bool:
    out = node.outputs[0]
    if is_graph_output(graph, out) and (is_graph_output(graph, src) or src in graph.inputs):
        return False  # an input/output must keep its name: leave the node
    replace_tensor(graph, out, src)
    node.outputs.clear()
    node.inputs.clear()
    return True


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
        for node in list(graph.nodes):
            if not node.inputs or not node.outputs:
                continue
            src = node.inputs[0]
            if node.op == "Identity":
                result.rewrites += _bypass(graph, node, src)
            elif node.op == "Cast" and src.dtype is not None and \
                    np.dtype(src.dtype) == helper.tensor_dtype_to_np_dtype(node.attrs["to"]):
                result.rewrites += _bypass(graph, node, src)
            elif node.op == "Reshape":
                prev = producer(src)
                if prev is not None and prev.op == "Reshape" and len(src.outputs) == 1 and \
                        _no_copied_dims(node):
                    node.inputs[0] = prev.inputs[0]
                    result.rewrites += 1
                elif _same_static_shape(src, node):
                    result.rewrites += _bypass(graph, node, src)
        graph.cleanup().toposort()
        return result


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
