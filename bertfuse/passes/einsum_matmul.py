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

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import Layers, PassResult, const, const_value, replace_tensor
from bertfuse.passes.evaluate import rank_of


class EinsumToMatMul:
    name = "einsum_matmul"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        layers = Layers(graph)
        for node in [n for n in graph.nodes if n.op == "Einsum"]:
            layer = layers.of(node)
            why = _lower(graph, node)
            if why:
                result.missed("einsum", f"{node.attrs.get('equation', '?')}: {why}", layer)
            else:
                result.fused("einsum", layer)
        if result.rewrites:
            graph.cleanup().toposort()
        return result


def _parse(equation: str) -> tuple[str, str, str, bool] | str:
    eq = equation.replace(" ", "")
    if "->" not in eq or eq.count(",") != 1:
        return "not a two-operand einsum with an explicit output"
    lhs, out = eq.split("->")
    a, b = lhs.split(",")
    lead = a.startswith("...") and out.startswith("...")
    if lead:
        a, out = a[3:], out[3:]
    if "." in a + b + out:
        return "ellipsis other than leading in the first operand and the output"
    if any(len(set(s)) != len(s) for s in (a, b, out)):
        return "a repeated index (a trace or diagonal)"
    return a, b, out, lead


def _lower(graph: gs.Graph, node: gs.Node) -> str:
    parsed = _parse(str(node.attrs.get("equation", "")))
    if isinstance(parsed, str):
        return parsed
    a, b, out, lead = parsed
    batch = [c for c in out if c in a and c in b]
    contr = [c for c in a if c in b and c not in out]
    lfree = [c for c in out if c in a and c not in b]
    rfree = [c for c in out if c in b and c not in a]
    if set(a) != set(batch + contr + lfree) or set(b) != set(batch + contr + rfree) or \
            set(out) != set(batch + lfree + rfree):
        return "an index is summed within one operand"
    if not contr or not rfree or not (lfree or lead):
        return "not a matrix product"
    x, y = node.inputs
    yv = const_value(y)
    sizes = dict(zip(b, yv.shape)) if yv is not None else {}
    if yv is None and (len(contr) > 1 or len(rfree) > 1):
        return "several contracted or free indices on a non-constant right operand"
    if batch and (len(lfree) > 1 or lead):
        return "several left free indices beside batch indices"
    prefix = 0
    if lead:
        if batch:
            return "an ellipsis beside batch indices"
        rank = rank_of(x)
        if rank is None:
            return "the rank behind the ellipsis is unknown"
        prefix = rank - len(a)
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
    return ""


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
