"""Attention: Q, K, V projections + scaled dot product + mask + softmax -> one Attention node.

    X ─┬─► MatMul(Wq) ─► Add(bq) ─► Reshape[B,S,N,D] ─► Transpose(0213) ─► [Mul(c)] ─┐
       ├─► MatMul(Wk) ─► Add(bk) ─► Reshape ─► Transpose(0231) | Transpose(0213)+(0132)─► MatMul ─► Mul(s)|Div ─┐
       └─► MatMul(Wv) ─► Add(bv) ─► Reshape ─► Transpose(0213) ──────────────────┐           mask adder ─► Add
                                                                                 │                         ▼
      out ◄─ Reshape[B*S,H]|[B,S,H] ◄─ Transpose(0213) ◄─ MatMul ◄───────────── ┴──────────────────── Softmax

Weights are packed [H, 3H] in Q, K, V column order: Q is the operand that is NOT transposed
into the score MatMul's second input, K is, and V is what the probabilities multiply. The
scale is the product of every constant factor on the Q, K and score paths; it is written as
the `scale` attribute when it differs from 1/sqrt(D). The mask is checked numerically: the
adder (or Where condition) is evaluated with ONNX Runtime on probe masks with padding at the
end, middle and start of rows and must equal (1 - mask[b, j]) * c for one constant c, for
every query row. Attention then reads the model's raw 2-D mask input (padding anywhere).

Layers in any other arrangement (Keras einsum, HF) are matched by evaluation instead:
attention_match.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.attention_match import MASK_FLOOR, AttentionMatch, Projection, \
    _scalar_factor, match_numeric
from bertfuse.custom_ops.attention import CONTRACT as ATTENTION
from bertfuse.passes.base import PassResult, const, const_value, is_graph_output, \
    producer, reaches_op, replace_tensor, scalar_value
from bertfuse.passes.evaluate import ancestors, bs_input, eval_with_ort, rank_of
from bertfuse.passes.probe import probe_feeds, probe_mask


class AttentionFusion:
    name = "attention"

    def __init__(self) -> None:
        self._mask_cache: dict[int, object] = {}
        self._mask_int32: dict[int, gs.Tensor] = {}

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        softmaxes = [n for n in graph.nodes if n.op == "Softmax"]
        for layer, softmax in enumerate(softmaxes):
            if is_graph_output(graph, softmax.outputs[0]):
                # Fusing would keep the whole unfused block alive for that output.
                result.missed("attention", "attention probabilities are a model output", layer)
                continue
            found = self.match(graph, softmax)
            if isinstance(found, str):
                # Not the modeling.py arrangement: find the same math numerically.
                numeric = match_numeric(graph, softmax)
                if isinstance(numeric, str):
                    result.missed("attention", f"{found}; by evaluation: {numeric}", layer)
                    continue
                found = numeric
            self._rewrite(graph, found, layer)
            result.fused("attention", layer)
        return result

    # -- matching ---------------------------------------------------------------------------

    def match(self, graph: gs.Graph, softmax: gs.Node) -> AttentionMatch | str:
        if softmax.attrs.get("axis", -1) not in (-1, 3):
            return "softmax is not over the key axis"
        scores, mask_term = _split_mask(softmax.inputs[0])
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
            factor = _scalar_factor(node)
            if factor is None:
                return f"score path has an unexpected {node.op}"
            scale *= factor[1]
            t = factor[0]
        if qk is None:
            return "no Q·Kᵀ MatMul before the softmax"
        q, q_scale = _walk_head_split(qk.inputs[0], key=False)
        if isinstance(q, str):
            return f"query path: {q}"
        k, k_scale = _walk_head_split(qk.inputs[1], key=True)
        if isinstance(k, str):
            return f"key path: {k}"
        pv = [c for c in softmax.outputs[0].outputs]
        if len(pv) != 1 or pv[0].op != "MatMul" or pv[0].inputs[0] is not softmax.outputs[0]:
            return "probabilities are not consumed by exactly one MatMul with V"
        v, v_scale = _walk_head_split(pv[0].inputs[1], key=False)
        if isinstance(v, str):
            return f"value path: {v}"
        if v_scale != 1.0:
            return "value path is scaled"
        if not (q.x is k.x is v.x):
            return "Q, K and V do not project the same input"
        if not (q.weight.shape == k.weight.shape == v.weight.shape) or q.weight.ndim != 2:
            return "Q, K, V weights differ in shape"
        out = _walk_context(pv[0])
        if isinstance(out, str):
            return f"output path: {out}"
        heads = self._heads(graph, q.reshape, q.weight.shape[1])
        if isinstance(heads, str):
            return heads
        num_heads, head_size = heads
        mask_input, mask_value = None, 0.0
        if mask_term is not None:
            mask = self._mask(graph, mask_term)
            if isinstance(mask, str):
                return f"mask path: {mask}"
            mask_input, mask_value = mask
        return AttentionMatch(q, k, v, scale * q_scale * k_scale, mask_input, mask_value, out,
                              num_heads, head_size)

    @staticmethod
    def _heads(graph: gs.Graph, reshape: gs.Node, hidden: int) -> tuple[int, int] | str:
        shape = const_value(reshape.inputs[1])
        if shape is None:
            try:
                (shape,) = eval_with_ort(graph, [reshape.inputs[1]], probe_feeds(graph))
            except Exception as exc:
                return f"cannot evaluate the head-split shape ({type(exc).__name__})"
        shape = [int(s) for s in np.ravel(shape)]
        if len(shape) != 4:
            return f"head split reshapes to rank {len(shape)}, expected 4"
        n, d = shape[2], shape[3]
        if n <= 0 and d > 0:
            n = hidden // d
        if d <= 0 and n > 0:
            d = hidden // n
        if n * d != hidden:
            return f"head split {shape} does not divide hidden size {hidden}"
        return n, d

    def _mask(self, graph: gs.Graph, term: MaskTerm):
        key = id(term.tensor)
        if key not in self._mask_cache:
            self._mask_cache[key] = _check_mask(graph, term)
        return self._mask_cache[key]

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
        if id(mask) not in self._mask_int32:
            cast = gs.Variable(f"{mask.name}_int32", dtype=np.int32, shape=mask.shape)
            graph.nodes.append(gs.Node("Cast", f"{mask.name}_to_int32", {"to": 6},
                                       inputs=[mask], outputs=[cast]))
            self._mask_int32[id(mask)] = cast
        return self._mask_int32[id(mask)]


@dataclass
class MaskTerm:
    """An additive mask tensor, or a Where(condition, scores, fill) selection."""

    tensor: gs.Tensor
    fill: float | None = None  # Where form: the value written at padded positions
    keep_when_true: bool = True  # Where form: condition true means "attend"


def _split_mask(t: gs.Tensor) -> tuple[gs.Tensor, MaskTerm | None]:
    """The softmax input as scores + adder, Where(cond, scores, fill), or plain scores.
    A scalar constant added last is dropped: softmax is shift-invariant (HF's
    stable_softmax adds 1e-9)."""
    node = producer(t)
    while node is not None and node.op == "Add" and len(node.inputs) == 2 and \
            len(t.outputs) == 1 and any(scalar_value(i) is not None for i in node.inputs):
        t = next(i for i in node.inputs if scalar_value(i) is None)
        node = producer(t)
    if node is not None and node.op == "Add" and len(node.inputs) == 2:
        a, b = node.inputs
        if _leads_to_matmul(a):
            return a, MaskTerm(b)
        if _leads_to_matmul(b):
            return b, MaskTerm(a)
    if node is not None and node.op == "Where":
        cond, x, y = node.inputs
        if _leads_to_matmul(x) and scalar_value(y) is not None:
            return x, MaskTerm(cond, scalar_value(y), True)
        if _leads_to_matmul(y) and scalar_value(x) is not None:
            return y, MaskTerm(cond, scalar_value(x), False)
    return t, None


def _leads_to_matmul(t: gs.Tensor) -> bool:
    """A MatMul's output, possibly through scalar scalings (the 1/sqrt(d) of Q or K)."""
    return reaches_op(t, "MatMul", lambda n: (_scalar_factor(n) or (None,))[0], nodes=4)


def _perm(node: gs.Node) -> list[int]:
    return list(node.attrs.get("perm", []))


def _walk_head_split(t: gs.Tensor, key: bool) -> tuple[Projection | str, float]:
    """Back from a score/context MatMul operand to the projection MatMul."""
    scale = 1.0
    node = producer(t)
    while node is not None and (factor := _scalar_factor(node)) is not None:
        scale *= factor[1]
        t = factor[0]
        node = producer(t)
    if node is None or node.op != "Transpose":
        return f"expected a Transpose, found {node.op if node else 'an input'}", scale
    perm = _perm(node)
    if key and perm == [0, 1, 3, 2]:
        inner = producer(node.inputs[0])
        if inner is None or inner.op != "Transpose" or _perm(inner) != [0, 2, 1, 3]:
            return "Kᵀ is not a transposed head split", scale
        node, perm = inner, [0, 2, 3, 1]
    want = [0, 2, 3, 1] if key else [0, 2, 1, 3]
    if perm != want:
        return f"head transpose has perm {perm}, expected {want}", scale
    reshape = producer(node.inputs[0])
    if reshape is None or reshape.op != "Reshape":
        return "no head-split Reshape", scale
    proj = _projection(reshape.inputs[0])
    if isinstance(proj, str):
        return proj, scale
    x, w, b = proj
    return Projection(x, w, b, reshape), scale


def _projection(t: gs.Tensor) -> tuple[gs.Tensor, np.ndarray, np.ndarray | None] | str:
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
            return "projection bias is not a 1-D constant"
        node = producer(t)
    if node is None or node.op != "MatMul":
        return "projection is not a MatMul"
    w = const_value(node.inputs[1])
    if w is None or w.ndim != 2:
        return "projection weight is not a constant matrix"
    return node.inputs[0], w, bias


def _walk_context(pv: gs.Node) -> gs.Tensor | str:
    t = pv.outputs[0]
    if len(t.outputs) != 1 or t.outputs[0].op != "Transpose" or \
            _perm(t.outputs[0]) != [0, 2, 1, 3]:
        return "context is not transposed back with perm [0,2,1,3]"
    t = t.outputs[0].outputs[0]
    if len(t.outputs) != 1 or t.outputs[0].op != "Reshape":
        return "context heads are not merged by a Reshape"
    return t.outputs[0].outputs[0]


def _check_mask(graph: gs.Graph, term: MaskTerm):
    """Finds the model input the mask term is a function of, and the additive constant."""
    _, sources = ancestors([term.tensor])
    if not sources:
        return "mask does not depend on any model input"
    last_reason = "no model input acts as the mask"
    for cand in sources:
        if cand.dtype is not None and np.dtype(cand.dtype).kind not in "iub":
            continue
        value: float | str = last_reason
        for seed in (7, 11):
            feeds = probe_feeds(graph)
            mask = probe_mask(seed=seed)
            feeds[cand.name] = mask.astype(feeds[cand.name].dtype)
            try:
                (got,) = eval_with_ort(graph, [term.tensor], feeds)
            except Exception as exc:
                return f"cannot evaluate the mask subgraph ({type(exc).__name__})"
            value = _mask_constant(np.asarray(got), mask, term)
            if isinstance(value, str):
                last_reason = value
                break
        if not isinstance(value, str):
            return cand, value
    return last_reason


def _mask_constant(got: np.ndarray, mask: np.ndarray, term: MaskTerm) -> float | str:
    """c such that the term is (1 - mask[b, j]) * c at every query row, else a reason."""
    b, s = mask.shape
    if got.ndim != 4 or got.shape[0] not in (1, b) or got.shape[-1] != s:
        return f"mask term has shape {list(got.shape)}, expected [B, 1|N, 1|S, S]"
    full = np.broadcast_to(got, (b, got.shape[1], got.shape[2], s))
    keep = np.broadcast_to(mask[:, None, None, :].astype(bool), full.shape)
    if term.fill is not None:  # Where form: the condition must select exactly the kept keys
        cond = full.astype(bool)
        if not np.array_equal(cond, keep if term.keep_when_true else ~keep):
            return "Where condition does not follow the mask"
        return term.fill if term.fill < -1.0 else f"Where fills padded keys with {term.fill:.3g}"
    if np.abs(full[keep]).max(initial=0.0) > 1e-6:
        return "mask term is not 0 at kept positions"
    masked = full[~keep]
    if masked.size == 0:
        return "probe has no padding"
    c = float(masked.flat[0])
    if not np.allclose(masked, c, rtol=1e-6) or c > -1.0:
        return f"padded positions get {c:.3g}, not one large negative constant"
    return c
