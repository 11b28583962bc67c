"""Shapes from the model inputs: cut dead subgraphs that live on only to be measured.

    (fused away) ─► t ─► Shape ─► ... ─► Reshape(shape)     ==>   [B, S] input ─► Shape ─► Slice/Concat ─► Reshape

After a fusion replaces a block, tf2onnx's shape arithmetic (Keras' Tensordot sizes its
output Reshape from Shape(block output)) can keep the whole unfused block alive. When t has
no consumers but Shape nodes, each Shape's value is evaluated at two probe sizes and, when
every entry is B, S, B*S or a constant, rebuilt from the Shape of a [batch, seq] model input.

Candidates: every such Shape node; each ends rebuilt (fused) or missed (no [batch, seq] model
input, shapes that cannot be evaluated, an entry that is not B, S, B*S or a constant).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import Layers, PassResult, const, replace_tensor
from bertfuse.passes.evaluate import bs_input, eval_with_ort
from bertfuse.io.inputs import probe_feeds

_SIZES = ((3, 7), (2, 5))


class ShapeFromInputs:
    name = "shape_from_inputs"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        layers = Layers(graph)
        ref = bs_input(graph)
        shapes = [n for n in graph.nodes if n.op == "Shape" and n.inputs[0].outputs and
                  all(c.op == "Shape" for c in n.inputs[0].outputs) and n.inputs[0].inputs and
                  n.inputs[0] is not ref]
        if not shapes:
            return result
        if ref is None:
            for node in shapes:
                result.missed(self.name, "no [batch, seq] integer model input to measure",
                              layers.of(node))
            return result
        try:
            values = [eval_with_ort(graph, [n.outputs[0] for n in shapes],
                                    probe_feeds(graph, batch=b, seq=s)) for b, s in _SIZES]
        except Exception as exc:
            result.missed(self.name, f"cannot evaluate shapes ({type(exc).__name__})")
            return result
        ref_shape = None
        for i, node in enumerate(shapes):
            pattern = _pattern(values[0][i], values[1][i])
            if pattern is None:
                result.missed(self.name, f"{node.name}: an entry of the shape is not B, S, B*S "
                                         "or a constant", layers.of(node))
                continue
            if ref_shape is None:
                ref_shape = gs.Variable("input_shape_bs", dtype=np.int64)
                graph.nodes.append(gs.Node("Shape", "input_shape_bs", inputs=[ref],
                                           outputs=[ref_shape]))
            replace_tensor(graph, node.outputs[0], _build(graph, ref_shape, pattern, node.name))
            node.outputs.clear()
            result.fused(self.name, layers.of(node))
        return result


def _pattern(a: np.ndarray, b: np.ndarray) -> list | None:
    (b1, s1), (b2, s2) = _SIZES
    out: list = []
    for x, y in zip(np.ravel(a).tolist(), np.ravel(b).tolist()):
        if (x, y) == (b1, b2):
            out.append("B")
        elif (x, y) == (s1, s2):
            out.append("S")
        elif (x, y) == (b1 * s1, b2 * s2):
            out.append("BS")
        elif x == y:
            out.append(int(x))
        else:
            return None
    return out if np.ndim(a) == 1 else None


def _build(graph: gs.Graph, shape: gs.Tensor, pattern: list, name: str) -> gs.Tensor:
    parts: list[gs.Tensor] = []
    for j, p in enumerate(pattern):
        if p in ("B", "S"):
            k = 0 if p == "B" else 1
            t = gs.Variable(f"{name}_dim{j}", dtype=np.int64)
            graph.nodes.append(gs.Node("Slice", f"{name}_dim{j}", inputs=[
                shape, const(f"{name}_lo{j}", np.array([k], np.int64)),
                const(f"{name}_hi{j}", np.array([k + 1], np.int64))], outputs=[t]))
        elif p == "BS":
            t = gs.Variable(f"{name}_dim{j}", dtype=np.int64)
            graph.nodes.append(gs.Node("ReduceProd", f"{name}_dim{j}", {"keepdims": 1},
                                       inputs=[shape], outputs=[t]))
        else:
            t = const(f"{name}_c{j}", np.array([p], np.int64))
        parts.append(t)
    out = gs.Variable(f"{name}_from_inputs", dtype=np.int64)
    graph.nodes.append(gs.Node("Concat", f"{name}_from_inputs", {"axis": 0}, inputs=parts,
                               outputs=[out]))
    return out
