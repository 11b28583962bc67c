"""Attention: Q, K, V projections + scaled dot product + mask + softmax -> one Attention node.

    X ─┬─► MatMul(Wq) ─► Add(bq) ─► Reshape[B,S,N,D] ─► Transpose(0213) ─► [Mul(c)] ─┐
       ├─► MatMul(Wk) ─► Add(bk) ─► Reshape ─► Transpose(0231) | Transpose(0213)+(0132)─► MatMul ─► Mul(s)|Div ─┐
       └─► MatMul(Wv) ─► Add(bv) ─► Reshape ─► Transpose(0213) ──────────────────┐           mask adder ─► Add
                                                                                 │                         ▼
      out ◄─ Reshape[B*S,H]|[B,S,H] ◄─ Transpose(0213) ◄─ MatMul ◄───────────── ┴──────────────────── Softmax

Weights are packed [H, 3H] in Q, K, V column order: Q is the operand that is NOT transposed
into the score MatMul's second input, K is, and V is what the probabilities multiply. The
scale is the product of every constant factor on the Q, K and score paths; it is written as
the `scale` attribute when it differs from 1/sqrt(D). The mask is checked numerically
(attention_mask.py); Attention then reads the model's raw 2-D mask input (padding anywhere),
or the 0/1 [B, S] mask the graph computes from its inputs, cast to int32 once for all layers.

Layers in any other arrangement (Keras einsum, HF) are matched by evaluation instead:
attention_match.py.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contrib.attention import CONTRACT as ATTENTION
from bertfuse.passes.attention_mask import MaskTerm, check_mask, split_mask
from bertfuse.passes.attention_match import MASK_FLOOR, AttentionMatch, Projection, match_numeric
from bertfuse.passes.base import CandidatePass, Layers, cast_int32, const, const_value, \
    is_graph_output, producer, replace_tensor, scalar_factor
from bertfuse.passes.evaluate import bs_input, eval_with_ort, rank_of
from bertfuse.passes.match import MatchFailure, expect, fail, prefixed
from bertfuse.io.inputs import probe_feeds


class AttentionFusion(CandidatePass):
    """Candidates: every Softmax, numbered as the layers (its index among them); each ends
    fused or missed with the structural match's reason and the numeric one's."""

    name = "attention"

    def __init__(self) -> None:
        self._mask_cache: dict[int, tuple[gs.Variable, float] | MatchFailure] = {}
        self._mask_int32: dict[int, gs.Tensor] = {}
        self._order: dict[int, int] = {}

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        # A [batch, classes] Softmax that is a model output is a classifier's probabilities.
        softmaxes = [n for n in graph.nodes if n.op == "Softmax" and not (
            is_graph_output(graph, n.outputs[0]) and rank_of(n.outputs[0]) == 2)]
        self._order = {id(n): i for i, n in enumerate(softmaxes)}
        return softmaxes

    def layer(self, layers: Layers, softmax: gs.Node) -> int:
        return self._order[id(softmax)]

    def match(self, graph: gs.Graph, softmax: gs.Node) -> AttentionMatch:
        """The structural match, else the numeric one (attention_match.py)."""
        # Fusing would keep the whole unfused block alive for that output.
        expect(not is_graph_output(graph, softmax.outputs[0]),
               "attention probabilities are a model output")
        try:
            return self.match_structure(graph, softmax)
        except MatchFailure as structural:
            # Not the modeling.py arrangement: find the same math numerically.
            try:
                return match_numeric(graph, softmax)
            except MatchFailure as numeric:
                fail(f"{structural.reason}; by evaluation: {numeric.reason}")

    def rewrite(self, graph: gs.Graph, softmax: gs.Node, found: AttentionMatch) -> None:
        self._rewrite(graph, found, self._order[id(softmax)])

    # -- matching ---------------------------------------------------------------------------

    def match_structure(self, graph: gs.Graph, softmax: gs.Node) -> AttentionMatch:
        """The modeling.py arrangement drawn above; raises MatchFailure."""
        expect(softmax.attrs.get("axis", -1) in (-1, 3), "softmax is not over the key axis")
        scores, mask_term = split_mask(softmax.inputs[0])
        scale = 1.0
        qk = None
        t = scores
        for _ in range(4):
            node = producer(t)
            if node is None:
                break
            if node.op == "MatMul":
                qk = node
                break
            factor = scalar_factor(node)
            if factor is None:
                fail(f"score path has an unexpected {node.op}")
            scale *= factor[1]
            t = factor[0]
        expect(qk is not None, "no Q·Kᵀ MatMul before the softmax")
        with prefixed("query path: "):
            q, q_scale = _walk_head_split(qk.inputs[0], key=False)
        with prefixed("key path: "):
            k, k_scale = _walk_head_split(qk.inputs[1], key=True)
        pv = [c for c in softmax.outputs[0].outputs]
        expect(len(pv) == 1 and pv[0].op == "MatMul" and pv[0].inputs[0] is softmax.outputs[0],
               "probabilities are not consumed by exactly one MatMul with V")
        with prefixed("value path: "):
            v, v_scale = _walk_head_split(pv[0].inputs[1], key=False)
        expect(v_scale == 1.0, "value path is scaled")
        expect(q.x is k.x is v.x, "Q, K and V do not project the same input")
        expect(q.weight.shape == k.weight.shape == v.weight.shape and q.weight.ndim == 2,
               "Q, K, V weights differ in shape")
        with prefixed("output path: "):
            out = _walk_context(pv[0])
        num_heads, head_size = self._heads(graph, q.reshape, q.weight.shape[1])
        mask_input, mask_value = None, 0.0
        if mask_term is not None:
            with prefixed("mask path: "):
                mask_input, mask_value = self._mask(graph, mask_term)
        return AttentionMatch(q, k, v, scale * q_scale * k_scale, mask_input, mask_value, out,
                              num_heads, head_size)

    @staticmethod
    def _heads(graph: gs.Graph, reshape: gs.Node, hidden: int) -> tuple[int, int]:
        shape = const_value(reshape.inputs[1])
        if shape is None:
            try:
                (shape,) = eval_with_ort(graph, [reshape.inputs[1]], probe_feeds(graph))
            except Exception as exc:
                fail(f"cannot evaluate the head-split shape ({type(exc).__name__})")
        shape = [int(s) for s in np.ravel(shape)]
        expect(len(shape) == 4, f"head split reshapes to rank {len(shape)}, expected 4")
        n, d = shape[2], shape[3]
        if n <= 0 and d > 0:
            n = hidden // d
        if d <= 0 and n > 0:
            d = hidden // n
        expect(n * d == hidden, f"head split {shape} does not divide hidden size {hidden}")
        return n, d

    def _mask(self, graph: gs.Graph, term: MaskTerm) -> tuple[gs.Variable, float]:
        """check_mask, once per mask tensor (every layer reads the same one)."""
        key = id(term.tensor)
        if key not in self._mask_cache:
            try:
                self._mask_cache[key] = check_mask(graph, term)
            except MatchFailure as failure:
                self._mask_cache[key] = failure
        found = self._mask_cache[key]
        if isinstance(found, MatchFailure):
            fail(found.reason)
        return found

    # -- rewriting --------------------------------------------------------------------------

    def _rewrite(self, graph: gs.Graph, m: AttentionMatch, layer: int) -> None:
        hidden_in, hidden = m.q.weight.shape
        prefix = f"attention_{layer}"
        weight = np.concatenate([m.q.weight, m.k.weight, m.v.weight], axis=1)
        zeros = np.zeros(hidden, m.q.weight.dtype)
        bias = np.concatenate([b if b is not None else zeros for b in (m.q.bias, m.k.bias,
                                                                         m.v.bias)])
        x = m.q.x
        if rank_of(x) != 3:
            # Attention wants [B, S, H]: unflatten with B and S of a [B, S] model input. The
            # hidden_3d pass later removes this reshape and the flatten after the node.
            x = self._unflatten(graph, x, hidden_in, prefix, m.mask_input)
        inputs = [x, const(f"{prefix}_qkv_weight", weight),
                  const(f"{prefix}_qkv_bias", bias.astype(weight.dtype))]
        attrs: dict = {"num_heads": m.num_heads}
        if m.mask_input is not None:
            inputs.append(self._int32_mask(graph, m.mask_input))
            attrs["mask_filter_value"] = float(max(m.mask_value, MASK_FLOOR))
        default_scale = 1.0 / np.sqrt(m.head_size)
        if abs(m.scale - default_scale) > 1e-6 * default_scale:
            attrs["scale"] = float(m.scale)
        out3 = gs.Variable(f"{prefix}_output", dtype=m.output.dtype)
        graph.nodes.append(ATTENTION.node(f"{prefix}_Attention", inputs, [out3], **attrs))
        if rank_of(m.output) != 3:
            flat = gs.Variable(f"{prefix}_output2d", dtype=m.output.dtype)
            graph.nodes.append(gs.Node("Reshape", f"{prefix}_to2d", inputs=[
                out3, const(f"{prefix}_shape2", np.array([-1, hidden], np.int64))],
                outputs=[flat]))
            out3 = flat
        replace_tensor(graph, m.output, out3)

    @staticmethod
    def _unflatten(graph: gs.Graph, x: gs.Tensor, hidden: int, prefix: str,
                   mask: gs.Variable | None) -> gs.Tensor:
        ref = mask if mask is not None else bs_input(graph)
        if ref is None:
            raise ValueError("no [batch, seq] model input to take B and S from")
        shape = gs.Variable(f"{prefix}_bs_full", dtype=np.int64)
        graph.nodes.append(gs.Node("Shape", f"{prefix}_bs_shape", inputs=[ref], outputs=[shape]))
        bs = gs.Variable(f"{prefix}_bs", dtype=np.int64)
        graph.nodes.append(gs.Node("Slice", f"{prefix}_bs_slice", inputs=[
            shape, const(f"{prefix}_s0", np.array([0], np.int64)),
            const(f"{prefix}_s2", np.array([2], np.int64))], outputs=[bs]))
        shape3 = gs.Variable(f"{prefix}_shape3", dtype=np.int64)
        graph.nodes.append(gs.Node("Concat", f"{prefix}_shape3_concat", {"axis": 0}, inputs=[
            bs, const(f"{prefix}_hin", np.array([hidden], np.int64))], outputs=[shape3]))
        x3 = gs.Variable(f"{prefix}_input3d", dtype=x.dtype, shape=None)
        graph.nodes.append(gs.Node("Reshape", f"{prefix}_to3d", inputs=[x, shape3],
                                   outputs=[x3]))
        return x3

    def _int32_mask(self, graph: gs.Graph, mask: gs.Variable) -> gs.Tensor:
        if np.dtype(mask.dtype) == np.int32:
            return mask
        if id(mask) not in self._mask_int32:  # one Cast shared by every layer
            self._mask_int32[id(mask)] = cast_int32(graph, mask)
        return self._mask_int32[id(mask)]


def _perm(node: gs.Node) -> list[int]:
    return list(node.attrs.get("perm", []))


def _walk_head_split(t: gs.Tensor, key: bool) -> tuple[Projection, float]:
    """Back from a score/context MatMul operand to the projection MatMul: (it, the scalar
    factors met on the way)."""
    scale = 1.0
    node = producer(t)
    while node is not None and (factor := scalar_factor(node)) is not None:
        scale *= factor[1]
        t = factor[0]
        node = producer(t)
    if node is None or node.op != "Transpose":
        fail(f"expected a Transpose, found {node.op if node else 'an input'}")
    perm = _perm(node)
    if key and perm == [0, 1, 3, 2]:
        inner = producer(node.inputs[0])
        if inner is None or inner.op != "Transpose" or _perm(inner) != [0, 2, 1, 3]:
            fail("Kᵀ is not a transposed head split")
        node, perm = inner, [0, 2, 3, 1]
    want = [0, 2, 3, 1] if key else [0, 2, 1, 3]
    expect(perm == want, f"head transpose has perm {perm}, expected {want}")
    reshape = producer(node.inputs[0])
    expect(reshape is not None and reshape.op == "Reshape", "no head-split Reshape")
    x, w, b = _projection(reshape.inputs[0])
    return Projection(x, w, b, reshape), scale


def _projection(t: gs.Tensor) -> tuple[gs.Tensor, np.ndarray, np.ndarray | None]:
    node = producer(t)
    bias = None
    if node is not None and node.op == "Add":
        a, b = node.inputs
        vb, va = const_value(b), const_value(a)
        if vb is not None and vb.ndim == 1:
            bias, t = vb, a
        elif va is not None and va.ndim == 1:
            bias, t = va, b
        else:
            fail("projection bias is not a 1-D constant")
        node = producer(t)
    expect(node is not None and node.op == "MatMul", "projection is not a MatMul")
    w = const_value(node.inputs[1])
    expect(w is not None and w.ndim == 2, "projection weight is not a constant matrix")
    return node.inputs[0], w, bias


def _walk_context(pv: gs.Node) -> gs.Tensor:
    t = pv.outputs[0]
    expect(len(t.outputs) == 1 and t.outputs[0].op == "Transpose" and
           _perm(t.outputs[0]) == [0, 2, 1, 3],
           "context is not transposed back with perm [0,2,1,3]")
    t = t.outputs[0].outputs[0]
    expect(len(t.outputs) == 1 and t.outputs[0].op == "Reshape",
           "context heads are not merged by a Reshape")
    return t.outputs[0].outputs[0]
