"""Pooler and heads: first-token Slice+Squeeze -> Gather, 2-D MatMul + bias -> Gemm.

    sequence_output ─► Slice(axis 1, 0:1) ─► Squeeze(1)   ==>  Gather(axis 1, index 0)
    x[N,K] ─► MatMul(W[K,M]) ─► Add(b[M])                  ==>  Gemm(x, W, b)

Gemm carries the bias in the GEMM epilogue (one kernel instead of two). Only 2-D inputs:
Gemm is rank-2 by definition, and encoder MatMuls on [B,S,H] stay for SkipLayerNorm/BiasGelu
to absorb their bias.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import CandidatePass, const, const_value, producer, replace_tensor
from bertfuse.passes.match import expect, fail


class DenseGemmFusion(CandidatePass):
    """Candidates: every Squeeze(axis 1) of a Slice (first token) and every MatMul by a
    constant matrix whose one consumer is an Add (a dense layer with a bias); each ends fused
    or missed. In a fused encoder SkipLayerNorm/BiasGelu have taken the 3-D layers' biases;
    a 3-D MatMul + Add still here (an unfused layer's) misses, Gemm being rank-2."""

    name = "dense_gemm"

    def candidates(self, graph: gs.Graph) -> Iterator[gs.Node]:
        # Two sweeps: the MatMuls are listed once every first token is a Gather (the
        # pooler's dense layer then reads a Gather, which _rank2 knows to be 2-D).
        for node in list(graph.nodes):
            if node.op == "Squeeze" and _squeezes_slice(node):
                yield node
        for node in list(graph.nodes):
            if node.op == "MatMul" and _dense_with_bias(node):
                yield node

    def component(self, node: gs.Node) -> str:
        return "first_token" if node.op == "Squeeze" else self.name

    def match(self, graph: gs.Graph, node: gs.Node) -> gs.Tensor | tuple:
        return _first_token(node) if node.op == "Squeeze" else _gemm(node)

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: gs.Tensor | tuple) -> None:
        if node.op == "Squeeze":
            _gather_first(graph, node, found)
        else:
            _to_gemm(graph, node, *found)


def _squeeze_axes(squeeze: gs.Node):
    axes = squeeze.attrs.get("axes")
    if axes is None and len(squeeze.inputs) > 1:
        axes = const_value(squeeze.inputs[1])
    return axes


def _squeezes_slice(squeeze: gs.Node) -> bool:
    axes = _squeeze_axes(squeeze)
    sl = producer(squeeze.inputs[0])
    return axes is not None and list(np.ravel(axes)) == [1] and sl is not None and \
        sl.op == "Slice"


def _first_token(squeeze: gs.Node) -> gs.Tensor:
    """The sliced tensor, for Squeeze(Slice(x, axis 1, 0:1), 1)."""
    sl = producer(squeeze.inputs[0])
    expect(len(squeeze.inputs[0].outputs) == 1,
           f"the slice before {squeeze.name} is also read elsewhere")
    vals = [const_value(t) for t in sl.inputs[1:]]
    expect(len(vals) >= 3 and all(v is not None for v in vals[:3]),
           f"slice {sl.name} has no constant starts, ends and axes")
    starts, ends, axes_s = (np.ravel(v).tolist() for v in vals[:3])
    steps = np.ravel(vals[3]).tolist() if len(vals) > 3 and vals[3] is not None else [1]
    # Slices on other axes must be full ranges; on axis 1 exactly [0, 1).
    for s, e, a, st in zip(starts, ends, axes_s, steps * len(axes_s)):
        expect(st == 1, f"slice {sl.name} has step {st}")
        if a == 1:
            expect((s, e) == (0, 1),
                   f"slice {sl.name} takes [{s}, {e}) on axis 1, not the first token")
        elif s != 0 or e < 2**31 - 1:
            fail(f"slice {sl.name} also cuts axis {a}")
    expect(1 in axes_s, f"slice {sl.name} does not slice axis 1")
    return sl.inputs[0]


def _gather_first(graph: gs.Graph, squeeze: gs.Node, x: gs.Tensor) -> None:
    out = gs.Variable(f"{squeeze.outputs[0].name}_first", dtype=squeeze.outputs[0].dtype)
    graph.nodes.append(gs.Node("Gather", f"{squeeze.name}_first_token", {"axis": 1},
                               inputs=[x, const(f"{squeeze.name}_index0",
                                                np.array(0, np.int64))],
                               outputs=[out]))
    replace_tensor(graph, squeeze.outputs[0], out)


def _dense_with_bias(matmul: gs.Node) -> bool:
    w = const_value(matmul.inputs[1])
    y = matmul.outputs[0]
    return w is not None and w.ndim == 2 and len(y.outputs) == 1 and y.outputs[0].op == "Add"


def _gemm(matmul: gs.Node) -> tuple:
    """(W, the bias Add, its bias operand, the bias value), for a rank-2 input."""
    x, w_t = matmul.inputs
    w = const_value(w_t)
    expect(_rank2(x), f"{matmul.name} reads a tensor not known to be 2-D (Gemm is rank-2)")
    add = matmul.outputs[0].outputs[0]
    other = add.inputs[1] if add.inputs[0] is matmul.outputs[0] else add.inputs[0]
    b = const_value(other)
    expect(b is not None and b.ndim == 1 and b.shape[0] == w.shape[1],
           f"the Add after {matmul.name} is not a 1-D bias of width {w.shape[1]}")
    return w, add, other, b


def _to_gemm(graph: gs.Graph, matmul: gs.Node, w: np.ndarray, add: gs.Node, other: gs.Tensor,
             b: np.ndarray) -> None:
    x, w_t = matmul.inputs
    out = gs.Variable(f"{add.outputs[0].name}_gemm", dtype=add.outputs[0].dtype)
    graph.nodes.append(gs.Node("Gemm", f"{matmul.name}_Gemm", {}, inputs=[
        x, w_t if isinstance(w_t, gs.Constant) else const(f"{matmul.name}_W", w),
        other if isinstance(other, gs.Constant) else const(f"{matmul.name}_b", b)],
        outputs=[out]))
    replace_tensor(graph, add.outputs[0], out)


def _rank2(t: gs.Tensor) -> bool:
    if t.shape is not None:
        return len(t.shape) == 2
    node = producer(t)
    if node is None:
        return False
    if node.op in ("Gemm",):
        return True
    if node.op == "Gather" and node.attrs.get("axis") == 1:
        return True  # first-token gather of [B,S,H]
    if node.op in ("Tanh", "Relu", "Sigmoid", "Gelu", "Add", "Mul"):
        return _rank2(node.inputs[0])
    return False


class GemmToMatMul(CandidatePass):
    """The inverse, run first: Gemm(x, W[, b]) -> MatMul(x, W) [+ Add(b)].

    tf2onnx lowers einsum (Keras' EinsumDense, MultiHeadAttention) to Gemm; the fusions and
    the 3-D restructuring reason about MatMul + bias Add, so dense layers start in that form
    and the 2-D ones become Gemm again at the end (DenseGemmFusion).

    Candidates: every Gemm; each ends rewritten or missed (transA or alpha, no constant W, a
    bias that is not one row).
    """

    name = "gemm_to_matmul"

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        return [n for n in graph.nodes if n.op == "Gemm"]

    def match(self, graph: gs.Graph, node: gs.Node) -> tuple:
        """([in, out] weight, bias or None) of Gemm(x, W[, b]) with a constant W."""
        expect(not node.attrs.get("transA", 0) and float(node.attrs.get("alpha", 1.0)) == 1.0,
               f"{node.name} has transA or alpha != 1")
        w = const_value(node.inputs[1])
        expect(w is not None and w.ndim == 2, f"{node.name} has no constant weight matrix")
        if node.attrs.get("transB", 0):
            w = w.T
        bias = const_value(node.inputs[2]) if len(node.inputs) > 2 and \
            node.inputs[2].name else None
        expect(not (bias is not None and (bias.ndim > 1 and bias.shape[0] != 1)),
               f"{node.name} adds a bias that is not one row")
        return w, bias

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: tuple) -> None:
        w, bias = found
        y = node.outputs[0]
        mm_out = gs.Variable(f"{y.name}_matmul", dtype=y.dtype)
        graph.nodes.append(gs.Node("MatMul", f"{node.name}_MatMul", inputs=[
            node.inputs[0], const(f"{node.name}_W", w)], outputs=[mm_out]))
        if bias is not None and np.any(bias):
            beta = float(node.attrs.get("beta", 1.0))
            out = gs.Variable(f"{y.name}_biased", dtype=y.dtype)
            graph.nodes.append(gs.Node("Add", f"{node.name}_bias", inputs=[
                mm_out, const(f"{node.name}_b", (beta * bias).reshape(-1).astype(w.dtype))],
                outputs=[out]))
            mm_out = out
        replace_tensor(graph, y, mm_out)
        node.outputs.clear()
