"""SkipLayerNormalization with bias: dense output + bias + residual, then LayerNorm.

    h ─► MatMul(W) ─► Add(bias) ─┐
                    residual ──► Add ─► LayerNormalization(γ, β) ─► y
    ==>  SkipLayerNormalization(MatMul out, residual, γ, β, bias) ─► y

Either Add operand order, bias Add on either side. The sublayer side must be a dense layer's
output (a MatMul, with or without its bias Add): that is what tells a residual connection
apart from the embedding sum, which stays for EmbedLayerNormalization. A dense layer without
a bias (`use_bias=False`, or a zero bias folded away: GemmToMatMul drops it) is the math's
bias 0, also through a Keras Tensordot's Reshape / Squeeze:

    h ─► MatMul(W) ─► [Reshape ─► Squeeze] ─┐
                           residual ──────► Add ─► LayerNormalization(γ, β) ─► y
    ==>  SkipLayerNormalization(dense out, residual, γ, β) ─► y   (no bias input)

Candidates: every LayerNormalization; each ends fused or missed (LayerNorm not over the last
axis, input not an Add, the sum read elsewhere, no dense-layer operand).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contrib.skip_layernorm import CONTRACT as SKIP_LN
from bertfuse.passes.base import CandidatePass, const_value, producer, reaches_op, replace_tensor
from bertfuse.passes.match import expect, fail


class SkipLayerNormFusion(CandidatePass):
    name = "skip_layernorm"

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        return [n for n in graph.nodes if n.op == "LayerNormalization"]

    def match(self, graph: gs.Graph, ln: gs.Node) -> tuple:
        """(dense output, bias constant or None, residual)."""
        if ln.attrs.get("axis", -1) != -1:
            fail(f"LayerNormalization {ln.name} is over axis {ln.attrs['axis']}, not the last")
        s = ln.inputs[0]
        add = producer(s)
        if add is None or add.op != "Add":
            fail(f"LayerNormalization {ln.name} does not read an Add (no residual sum)")
        expect(len(s.outputs) == 1, f"the residual sum before {ln.name} is also read elsewhere")
        found = _sublayer_and_residual(add)
        expect(found is not None,
               f"no operand of the sum before {ln.name} is a dense layer's output")
        return found

    def rewrite(self, graph: gs.Graph, ln: gs.Node, found: tuple) -> None:
        dense, bias, residual = found
        # LayerNormalization's B (beta) is optional, and so is SkipLayerNormalization's:
        # without it leave beta's slot empty (or off entirely when there is no bias).
        beta = ln.inputs[2] if len(ln.inputs) > 2 else None
        y = ln.outputs[0]
        out = gs.Variable(f"{y.name}_skipln", dtype=y.dtype, shape=y.shape)
        graph.nodes.append(SKIP_LN.node(f"{ln.name}_Skip",
                                        [dense, residual, ln.inputs[1], beta, bias], [out],
                                        epsilon=float(ln.attrs.get("epsilon", 1e-5))))
        replace_tensor(graph, y, out)


def _dense_output(t: gs.Tensor) -> bool:
    """A MatMul's output, possibly through the reshapes of a Keras Tensordot."""
    return reaches_op(t, "MatMul", lambda n: n.inputs[0] if n.op in _RESHAPES else None,
                      nodes=3)


_RESHAPES = ("Reshape", "Squeeze", "Unsqueeze")


def _sublayer_and_residual(add: gs.Node) -> tuple | None:
    """(dense output, bias constant or None, residual) for Add(dense [+ bias], residual)."""
    for i in (0, 1):
        side, residual = add.inputs[i], add.inputs[1 - i]
        if const_value(residual) is not None or not side.inputs:
            continue
        node = side.inputs[0]
        if _dense_output(side):  # no bias, or a zero one folded away: bias 0
            return side, None, residual
        if node.op == "Add" and len(side.outputs) == 1:
            for j in (0, 1):
                bias = node.inputs[j]
                inner = node.inputs[1 - j]
                value = const_value(bias)
                if value is not None and value.ndim == 1 and _dense_output(inner):
                    if not isinstance(bias, gs.Constant):
                        bias = gs.Constant(f"{node.name}_bias", np.asarray(value))
                    return inner, bias, residual
    return None
