"""Attention found by evaluation: any einsum/transpose arrangement of BERT self-attention.

Keras' EinsumDense/MultiHeadAttention and HF-style layers reach tf2onnx as Gemm, 5-D
reshapes and transposes in every order; no structural pattern survives that. Here the dense
layers feeding the softmax (Q, K) and the context MatMul (V) are found, the layer is
evaluated with ONNX Runtime on random hidden states and probe masks, and the match is the
(Q/K order, head count, scale, mask input) whose float64 reference reproduces it. A Q/K swap
or a wrong head count cannot reproduce it, so it cannot be chosen.

The mask is a model input, or a 0/1 [B, S] tensor computed in the graph (attention_mask.py's
`computed_masks`: bert4keras' ids != 0 with key 0 kept), fed the probes in place; the latter
must leave kept keys' scores alone and lower padded ones by 10000 or more (-1e12, -inf), so
that Attention's -10000 filter is the same math once softmax saturates.

This module also holds what a match is (`AttentionMatch`), shared with attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.attention_mask import computed_masks, holds_ids, id_probe, reader
from bertfuse.passes.base import const_value, producer, scalar_factor
from bertfuse.passes.evaluate import ancestors, bs_input, eval_with_ort, rank_of
from bertfuse.passes.match import MatchFailure, expect, fail
from bertfuse.io.inputs import probe_feeds, probe_mask

MASK_FLOOR = -10000.0  # exp underflows to 0 already; finite in fp16
MASK_BIG = 10000.0  # a computed mask must lower padded keys' scores at least this much


@dataclass
class Projection:
    x: gs.Tensor
    weight: np.ndarray
    bias: np.ndarray | None
    reshape: gs.Node


@dataclass
class AttentionMatch:
    q: Projection
    k: Projection
    v: Projection
    scale: float
    mask_input: gs.Variable | None
    mask_value: float
    output: gs.Tensor
    num_heads: int
    head_size: int


_SHAPE_OPS = ("Reshape", "Unsqueeze", "Squeeze", "Transpose", "Flatten", "Identity", "Cast")
_STOP_OPS = ("LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization",
             "Attention", "Softmax")


def _dense_weight(node: gs.Node) -> np.ndarray | None:
    """The [in, out] weight of a MatMul/Gemm by a constant matrix (no bias in Gemm's C)."""
    if node.op == "MatMul":
        w = const_value(node.inputs[1])
        return w if w is not None and w.ndim == 2 else None
    if node.op == "Gemm" and not node.attrs.get("transA", 0) and \
            float(node.attrs.get("alpha", 1.0)) == 1.0:
        w = const_value(node.inputs[1])
        if w is None or w.ndim != 2:
            return None
        if len(node.inputs) > 2 and node.inputs[2].name:
            c = const_value(node.inputs[2])
            if c is None or np.any(c):
                return None
        return w.T if node.attrs.get("transB", 0) else w
    return None


def _find_projections(start: gs.Tensor, limit: int = 100) -> tuple[list[gs.Node], list[float]]:
    """Dense layers feeding `start` without passing another dense layer; scalar factors met.
    The walk is depth-first: in keras-bert's second layer more than 40 nodes of the mask
    subgraph (recomputed from the ids in every layer) come before Q and K."""
    found: list[gs.Node] = []
    scales: list[float] = []
    seen: set[int] = set()
    stack = [start]
    while stack and len(seen) < limit:
        t = stack.pop()
        node = producer(t)
        if node is None or id(node) in seen or node.op in _STOP_OPS:
            continue
        seen.add(id(node))
        if _dense_weight(node) is not None:
            found.append(node)
            continue
        factor = scalar_factor(node)
        if factor is not None:
            scales.append(factor[1])
        # Data inputs only: a Reshape's target shape (Shape of some earlier tensor) is not
        # part of the dataflow and would reach unrelated dense layers.
        data = node.inputs[:1] if node.op in ("Reshape", "Expand", "Tile") else node.inputs
        stack.extend(i for i in data if const_value(i) is None)
    return found, scales


def _projection_input(node: gs.Node) -> gs.Tensor:
    """The hidden-state tensor a dense layer reads, looking through flattening reshapes."""
    t = node.inputs[0]
    while t.inputs and t.inputs[0].op in ("Reshape", "Unsqueeze", "Squeeze", "Flatten") and \
            len(t.outputs) >= 1:
        t = t.inputs[0].inputs[0]
    return t


def _projection_bias(node: gs.Node, width: int) -> np.ndarray | None:
    """The bias added after a dense layer (through reshapes), flattened to [width]."""
    t = node.outputs[0]
    for _ in range(4):
        if len(t.outputs) != 1:
            return None
        c = t.outputs[0]
        if c.op == "Add":
            other = c.inputs[1] if c.inputs[0] is t else c.inputs[0]
            v = const_value(other)
            return v.reshape(-1) if v is not None and v.size == width else None
        if c.op not in _SHAPE_OPS:
            return None
        t = c.outputs[0]
    return None


def _reference_attention(x: np.ndarray, w: np.ndarray, b: np.ndarray, mask: np.ndarray | None,
                         heads: int, scale: float) -> np.ndarray:
    """BERT self-attention in float64: [B,S,H] -> [B,S,H], additive (1-m)*-10000 mask."""
    bsz, seq, _ = x.shape
    qkv = x @ w + b
    hidden = w.shape[1] // 3
    d = hidden // heads

    def split(t):
        return t.reshape(bsz, seq, heads, d).transpose(0, 2, 1, 3)

    q, k, v = (split(qkv[..., i * hidden:(i + 1) * hidden]) for i in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) * scale
    if mask is not None:
        scores = scores + (1.0 - mask[:, None, None, :]) * -10000.0
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(bsz, seq, hidden)


def match_numeric(graph: gs.Graph, softmax: gs.Node) -> AttentionMatch:
    """Finds Q, K, V projections, heads, scale and mask by evaluating the layer on probes;
    raises MatchFailure."""
    # The context MatMul: where the probabilities (possibly re-masked) meet V.
    t, ctx = softmax.outputs[0], None
    for _ in range(4):
        onward = [c for c in t.outputs if c.op != "Shape"]
        if len(onward) != 1:
            break
        c = onward[0]
        if c.op == "MatMul":
            ctx = c
            break
        if c.op not in ("Mul", "Add", "Where", "Cast") + _SHAPE_OPS:
            break
        t = c.outputs[0]
    expect(ctx is not None, "no MatMul of the probabilities with V")
    # The output: through shape-only ops to the tensor the output dense layer reads
    # (Shape consumers only size the reshapes on the way).
    out = ctx.outputs[0]
    for _ in range(10):
        if any(_dense_weight(c) is not None for c in out.outputs):
            break
        onward = [c for c in out.outputs if c.op != "Shape"]
        expect(len(onward) == 1 and onward[0].op in _SHAPE_OPS,
               "context is not followed by the output dense layer")
        out = onward[0].outputs[0]
    else:
        fail("context is not followed by the output dense layer")
    qk, scales = _find_projections(softmax.inputs[0])
    v_side = ctx.inputs[1] if ctx.inputs[0] is t else ctx.inputs[0]
    vv, v_scales = _find_projections(v_side)
    expect(len(qk) == 2 and len(vv) == 1,
           f"found {len(qk)} Q/K and {len(vv)} V projections, expected 2 and 1")
    xs = {id(_projection_input(n)) for n in qk + vv}
    expect(len(xs) == 1, "Q, K and V do not project the same hidden states")
    x = _projection_input(vv[0])
    weights = [_dense_weight(n) for n in qk + vv]
    hidden_in, hidden = weights[0].shape
    expect(all(w.shape == (hidden_in, hidden) for w in weights), "Q, K, V weights differ in shape")
    biases = [_projection_bias(n, hidden) for n in qk + vv]
    biases = [b if b is not None else np.zeros(hidden, weights[0].dtype) for b in biases]
    return _solve(graph, softmax, x, out, weights, biases, scales, hidden_in, hidden)


def _solve(graph, softmax, x, out, weights, biases, scales, hidden_in, hidden) -> AttentionMatch:
    """The first mask (a model input, a 0/1 [B, S] tensor computed in the graph, or none)
    under which the layer is reproduced."""
    feeds = probe_feeds(graph)
    _, sources = ancestors([softmax.inputs[0]], [x])
    candidates = [src for src in sources if src is not x and src.dtype is not None and
                  np.dtype(src.dtype).kind in "iub" and src.shape is not None and
                  len(src.shape) == 2]
    shape = _probe_shape(graph, feeds)
    computed = computed_masks(graph, [softmax.inputs[0]], (x,), shape)
    last = "no mask input reproduces the layer"
    for mask_input in candidates + computed + [None]:
        if mask_input is None and any(_reads_values(graph, x, out, c, feeds, hidden_in)
                                       for c in candidates):
            # All-ones probe ids would let "no mask" pass for a mask of another form
            # (bert4keras keeps key 0 always): the layer reads an input's values, so refuse.
            fail(f"{last} (the layer is masked by an input in a form not understood)")
        inner = mask_input is not None and bool(mask_input.inputs)
        try:
            if inner:
                _keys_only(graph, softmax.inputs[0], x, mask_input, feeds, hidden_in, shape)
            found = _solve_with_mask(graph, x, out, weights, biases, scales, hidden_in, hidden,
                                     mask_input, feeds)
            if mask_input is not None and not inner and holds_ids(mask_input):
                expect(not _reads_values(graph, x, out, mask_input, feeds, hidden_in, wide=True),
                       f"{mask_input.name} holds token ids and the layer reads their values "
                       f"({reader(mask_input, [softmax.inputs[0]])}), not only which are 0")
            return found
        except MatchFailure as failure:
            last = f"0/1 mask {producer(mask_input).name}: {failure.reason}" if inner \
                else failure.reason
    fail(last)


def _probe_shape(graph: gs.Graph, feeds: dict) -> tuple[int, int]:
    """B and S of the probes: a [batch, seq] input's (the first input may be another tensor)."""
    ref = bs_input(graph)
    return feeds[ref.name].shape[:2] if ref is not None else next(iter(feeds.values())).shape[:2]


def _hidden_probe(x: gs.Tensor, b: int, s: int, hidden_in: int) -> np.ndarray:
    """Seeded random hidden states for the layer input `x`, [B, S, H] or [B*S, H] as x is."""
    probe = np.random.default_rng(11).standard_normal((b, s, hidden_in)).astype(np.float32)
    return probe if (rank_of(x) or 2) == 3 else probe.reshape(b * s, -1)


def _keys_only(graph, scores, x, mask: gs.Variable, feeds, hidden_in: int,
               shape: tuple[int, int]) -> None:
    """The 0/1 [B, S] tensor `mask` must leave the scores of kept keys as they are and lower
    those of padded keys by MASK_BIG or more, for every head and query (the key axis is its
    axis 1): then Attention's -10000 filter is the same math, softmax saturated."""
    feeds, (b, s) = dict(feeds), shape
    feeds[x.name] = _hidden_probe(x, b, s, hidden_in)
    keep = probe_mask(b, s, seed=5)
    cut = {x.name: x, mask.name: mask}
    try:
        (plain,) = eval_with_ort(graph, [scores], feeds | {mask.name: np.ones((b, s), mask.dtype)},
                                 cut=cut)
        (masked,) = eval_with_ort(graph, [scores], feeds | {mask.name: keep.astype(mask.dtype)},
                                  cut=cut)
    except Exception as exc:
        fail(f"cannot evaluate the scores ({type(exc).__name__})")
    plain, masked = np.asarray(plain, np.float64), np.asarray(masked, np.float64)
    expect(plain.ndim == 4 and plain.shape[0] == b and plain.shape[-1] == s,
           f"scores have shape {list(plain.shape)}, expected [B, N, S, S]")
    kept = np.broadcast_to(keep[:, None, None, :].astype(bool), plain.shape)
    expect(np.allclose(masked[kept], plain[kept], rtol=1e-5, atol=1e-5),
           "it moves the scores of kept keys (not broadcast over heads and queries onto the "
           "key axis)")
    with np.errstate(invalid="ignore"):
        drop = masked[~kept] - plain[~kept]
    expect(drop.size and bool(np.all(drop <= -MASK_BIG + 1.0)),
           f"padded keys' scores are lowered by {-np.nanmax(drop):.3g}, less than {MASK_BIG:g}")


def _reads_values(graph, x, out, source, feeds, hidden_in: int, wide: bool = False) -> bool:
    """Whether the layer's output moves when `source` holds a padded probe mask instead of
    ones (x fixed); wide: token-id-like values instead of the ones at kept positions."""
    feeds = dict(feeds)
    b, s = feeds[source.name].shape[:2]
    feeds[x.name] = _hidden_probe(x, b, s, hidden_in)
    try:
        mask = probe_mask(b, s, seed=5)
        if wide:
            feeds[source.name] = mask.astype(feeds[source.name].dtype)
        (ones,) = eval_with_ort(graph, [out], feeds, cut={x.name: x})
        feeds[source.name] = (id_probe(mask, 5) if wide else mask).astype(
            feeds[source.name].dtype)
        (masked,) = eval_with_ort(graph, [out], feeds, cut={x.name: x})
    except Exception:
        return False
    return not np.allclose(ones, masked, rtol=1e-5, atol=1e-6)


def _solve_with_mask(graph, x, out, weights, biases, scales, hidden_in, hidden, mask_input,
                     feeds) -> AttentionMatch:
    rng = np.random.default_rng(11)
    feeds = dict(feeds)
    b, s = _probe_shape(graph, feeds)
    mask = probe_mask(b, s, seed=5)
    cut = {x.name: x}
    if mask_input is not None:
        feeds[mask_input.name] = mask.astype(mask_input.dtype if mask_input.inputs else
                                             feeds[mask_input.name].dtype)
        if mask_input.inputs:  # computed in the graph: fed in place
            cut[mask_input.name] = mask_input
    x_rank = rank_of(x) or 2
    probe = rng.standard_normal((b, s, hidden_in)).astype(np.float32)
    feeds[x.name] = probe if x_rank == 3 else probe.reshape(b * s, hidden_in)
    try:
        (got,) = eval_with_ort(graph, [out], feeds, cut=cut)
    except Exception as exc:
        fail(f"cannot evaluate the layer ({type(exc).__name__}: {str(exc)[:80]})")
    got = np.asarray(got, np.float64)
    expect(got.size == b * s * hidden, f"attention output has {got.size} values, expected B*S*H")
    got = got.reshape(b, s, hidden)
    extra = float(np.prod(scales)) if scales else 1.0
    x64 = probe.astype(np.float64)
    mask64 = mask.astype(np.float64) if mask_input is not None else None
    for qi, ki in ((0, 1), (1, 0)):
        w = np.concatenate([weights[qi], weights[ki], weights[2]], axis=1).astype(np.float64)
        bias = np.concatenate([biases[qi], biases[ki], biases[2]]).astype(np.float64)
        for heads in [n for n in range(1, hidden + 1) if hidden % n == 0 and hidden // n >= 8]:
            d = hidden // heads
            for scale in {1 / np.sqrt(d), extra / np.sqrt(d), extra, 1.0}:
                ref = _reference_attention(x64, w, bias, mask64, heads, scale)
                err = np.abs(ref - got).max() / (1e-3 + np.abs(ref).max())
                if err < 1e-4:
                    return AttentionMatch(
                        Projection(x, weights[qi], biases[qi], None),
                        Projection(x, weights[ki], biases[ki], None),
                        Projection(x, weights[2], biases[2], None),
                        float(scale), mask_input, MASK_FLOOR if mask_input is not None else 0.0,
                        out, heads, d)
    fail("no head count, scale and Q/K order reproduce the layer on probe inputs")
