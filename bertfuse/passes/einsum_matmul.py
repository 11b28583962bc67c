"""Einsum -> MatMul: two-operand contractions lowered to Transpose / Reshape / MatMul.

    X ─► Einsum('abc,cde->abde', W[c,d,e])        ==>  X ─► MatMul(W[c, d*e]) ─► Reshape[0,0,d,e]
    K, Q ─► Einsum('aecd,abcd->acbe')             ==>  Transpose(K) , Transpose(Q) ─► MatMul ─► Transpose
    P, V ─► Einsum('acbe,aecd->abcd')             ==>  P , Transpose(V) ─► MatMul ─► Transpose

Keras' EinsumDense and MultiHeadAttention compute every projection, the scores and the
context as einsums. tf2onnx lowers most of them itself, but not all (Model Garden's
AlbertEncoder keeps 13 Einsum nodes), and the fusions read MatMuls. Any equation works
whose indices are each either shared by both operands and the output (batch), by both
operands only (contracted), or by one operand and the output (free), with at most one
contracted and one right-free index unless the right operand is a constant (then they are
merged statically). The MatMul is [batch.., left free.., contracted] x [batch..,
contracted, right free..]; a Transpose puts the result in the output's order.

Candidates: every Einsum; each ends lowered (fused) or missed with the equation and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import CandidatePass, PassResult, const, const_value, replace_tensor
from bertfuse.passes.evaluate import rank_of
from bertfuse.passes.match import expect, prefixed


@dataclass
class _Plan:
    """How one einsum becomes a MatMul: its index groups and what the operands need."""

    a: str
    b: str
    out: str
    batch: list[str]
    contr: list[str]
    lfree: list[str]
    rfree: list[str]
    yv: np.ndarray | None  # the right operand's value, when constant
    sizes: dict[str, int]
    prefix: int  # dims behind a leading ellipsis


class EinsumToMatMul(CandidatePass):
    name = "einsum_matmul"

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        return [n for n in graph.nodes if n.op == "Einsum"]

    def component(self, node: gs.Node) -> str:
        return "einsum"

    def match(self, graph: gs.Graph, node: gs.Node) -> _Plan:
        with prefixed(f"{node.attrs.get('equation', '?')}: "):
            return _plan(node)

    def rewrite(self, graph: gs.Graph, node: gs.Node, plan: _Plan) -> None:
        _lower(graph, node, plan)

    def finish(self, graph: gs.Graph, result: PassResult) -> None:
        if result.rewrites:
            graph.cleanup().toposort()


def _parse(equation: str) -> tuple[str, str, str, bool]:
    eq = equation.replace(" ", "")
    expect("->" in eq and eq.count(",") == 1, "not a two-operand einsum with an explicit output")
    lhs, out = eq.split("->")
    a, b = lhs.split(",")
    lead = a.startswith("...") and out.startswith("...")
    if lead:
        a, out = a[3:], out[3:]
    expect("." not in a + b + out,
           "ellipsis other than leading in the first operand and the output")
    expect(all(len(set(s)) == len(s) for s in (a, b, out)),
           "a repeated index (a trace or diagonal)")
    return a, b, out, lead


def _plan(node: gs.Node) -> _Plan:
    a, b, out, lead = _parse(str(node.attrs.get("equation", "")))
    batch = [c for c in out if c in a and c in b]
    contr = [c for c in a if c in b and c not in out]
    lfree = [c for c in out if c in a and c not in b]
    rfree = [c for c in out if c in b and c not in a]
    expect(set(a) == set(batch + contr + lfree) and set(b) == set(batch + contr + rfree) and
           set(out) == set(batch + lfree + rfree), "an index is summed within one operand")
    expect(contr and rfree and (lfree or lead), "not a matrix product")
    x, y = node.inputs
    yv = const_value(y)
    sizes = dict(zip(b, yv.shape)) if yv is not None else {}
    expect(not (yv is None and (len(contr) > 1 or len(rfree) > 1)),
           "several contracted or free indices on a non-constant right operand")
    expect(not (batch and (len(lfree) > 1 or lead)),
           "several left free indices beside batch indices")
    prefix = 0
    if lead:
        expect(not batch, "an ellipsis beside batch indices")
        rank = rank_of(x)
        expect(rank is not None, "the rank behind the ellipsis is unknown")
        prefix = rank - len(a)
    return _Plan(a, b, out, batch, contr, lfree, rfree, yv, sizes, prefix)


def _lower(graph: gs.Graph, node: gs.Node, p: _Plan) -> None:
    x, y = node.inputs
    a, b, out, batch, contr, lfree, rfree = p.a, p.b, p.out, p.batch, p.contr, p.lfree, p.rfree
    sizes, prefix, yv = p.sizes, p.prefix, p.yv
    name = node.name or "einsum"
    # Left operand: [prefix.., batch.., left free.., contracted(merged)].
    order = batch + lfree + contr
    x = _transpose(graph, x, list(range(prefix)) + [prefix + a.index(c) for c in order],
                   f"{name}_lhs")
    if len(contr) > 1:
        merged = int(np.prod([sizes[c] for c in contr]))
        keep = prefix + len(batch) + len(lfree)
        x = _reshape(graph, x, [0] * keep + [merged], f"{name}_lhs")
    # Right operand: [batch.., contracted(merged), right free(merged)].
    perm = [b.index(c) for c in batch + contr + rfree]
    if yv is not None:
        yv = yv.transpose(perm)
        lead_shape = list(yv.shape[:len(batch)])
        y = const(f"{name}_rhs", np.ascontiguousarray(yv.reshape(
            lead_shape + [int(np.prod([sizes[c] for c in contr])), -1])))
    else:
        y = _transpose(graph, y, perm, f"{name}_rhs")
    prod = gs.Variable(f"{name}_matmul", dtype=node.outputs[0].dtype)
    graph.nodes.append(gs.Node("MatMul", f"{name}_matmul", inputs=[x, y], outputs=[prod]))
    t: gs.Tensor = prod
    if len(rfree) > 1:
        keep = prefix + len(batch) + len(lfree)
        t = _reshape(graph, t, [0] * keep + [sizes[c] for c in rfree], f"{name}_out")
    layout = batch + lfree + rfree
    t = _transpose(graph, t, list(range(prefix)) + [prefix + layout.index(c) for c in out],
                   f"{name}_out")
    old = node.outputs[0]
    replace_tensor(graph, old, t)
    node.inputs.clear()
    node.outputs.clear()


def _transpose(graph: gs.Graph, t: gs.Tensor, perm: list[int], name: str) -> gs.Tensor:
    if perm == sorted(perm):
        return t
    out = gs.Variable(f"{name}_t", dtype=t.dtype)
    graph.nodes.append(gs.Node("Transpose", f"{name}_transpose", {"perm": perm}, inputs=[t],
                               outputs=[out]))
    return out


def _reshape(graph: gs.Graph, t: gs.Tensor, shape: list[int], name: str) -> gs.Tensor:
    out = gs.Variable(f"{name}_r", dtype=t.dtype)
    graph.nodes.append(gs.Node("Reshape", f"{name}_reshape", inputs=[
        t, const(f"{name}_shape", np.array(shape, np.int64))], outputs=[out]))
    return out
