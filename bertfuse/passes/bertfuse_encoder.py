"""bertfuse kernels: the fused fp16 ORT-contrib encoder rewritten into ai.bertfuse ops, each
one GEMM with its epilogue (bertfuse/ops/bertfuse: dense.py, bert_attention.py).

    X ─► Attention(W_qkv, b_qkv, mask) ─► ctx
    ==>  X ─► DenseBias(W_qkv, b_qkv) ─► qkv ─► BertAttention(mask) ─► ctx

    X ─► MatMul(W) ─► SkipLayerNormalization(skip, γ, β, bias) ─► y
    ==>  X ─► DenseBiasSkipLayerNorm(W, bias, skip, γ, β) ─► y

    X ─► MatMul(W) ─► BiasGelu(bias) | FastGelu(bias) | Gelu ─► y
    ==>  X ─► DenseBiasGelu(W, bias, approximate = 0 erf | 1 tanh) ─► y

The contrib ops are matched by the math their contracts define, not by names: the GELU
flavour comes from the op (BiasGelu and Gelu are exact erf GELU, FastGelu the tanh form),
an absent bias or beta becomes zeros, and SkipLayerNormalization's sum is symmetric, so the
MatMul may feed either of its first two slots. Attention's mask must be one of the forms
BertAttention reads: none, raw [B, S], or key lengths [B] (told apart by evaluating the mask
on probe inputs); [2B], [3B+2], [B,S,S], past/present, causal, an attention bias, rotary or
another mask_filter_value than -10000 stay Attention, with the reason. fp16 only.

EmbedLayerNormalization, the pooler and heads (Gemm, Tanh) are left alone.

Candidates: every com.microsoft Attention, SkipLayerNormalization, BiasGelu, FastGelu and
Gelu; each ends converted or missed, in its encoder layer.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.bertfuse.bert_attention import CONTRACT as BERT_ATTENTION
from bertfuse.ops.bertfuse.bert_attention import MASK_FILTER_VALUE, MAX_HEAD_SIZE
from bertfuse.ops.bertfuse.dense import DENSE_BIAS, DENSE_BIAS_GELU, DENSE_BIAS_SKIP_LAYERNORM
from bertfuse.ops.contrib.skip_layernorm import DEFAULT_EPSILON
from bertfuse.ops.contract import MS_DOMAIN
from bertfuse.passes.base import CandidatePass, const, const_value, detach, \
    is_graph_output, producer
from bertfuse.passes.evaluate import eval_with_ort, rank_of
from bertfuse.passes.match import MatchFailure, expect, fail
from bertfuse.io.inputs import probe_feeds

GELU_APPROXIMATE = {"BiasGelu": 0, "Gelu": 0, "FastGelu": 1}  # 0 erf, 1 tanh
COMPONENTS = {"Attention": "kernels_attention", "SkipLayerNormalization": "kernels_skip_layernorm",
              **{op: "kernels_gelu" for op in GELU_APPROXIMATE}}
_ATTENTION_EXTRAS = ("past", "attention_bias", "past_sequence_length")
Rewrite = Callable[[gs.Graph], None]  # what a match prepares: the rewrite of its node


class BertfuseKernels(CandidatePass):
    name = "bertfuse_kernels"
    _shapes: _ProbeShapes  # of this run's candidates, taken by candidates()

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        nodes = [n for n in graph.nodes if n.domain == MS_DOMAIN and n.op in COMPONENTS]
        self._shapes = _ProbeShapes(graph, nodes)  # before anything is rewritten
        return nodes

    def component(self, node: gs.Node) -> str:
        return COMPONENTS[node.op]

    def match(self, graph: gs.Graph, node: gs.Node) -> Rewrite:
        """The rewrite of the node, prepared; raises MatchFailure."""
        if node.op == "Attention":
            return _match_attention(graph, node, self._shapes)
        if node.op == "SkipLayerNormalization":
            return _match_skip_layernorm(graph, node, self._shapes)
        return _match_gelu(graph, node)

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: Rewrite) -> None:
        found(graph)


class _ProbeShapes:
    """Shapes of the tensors the matches compare (masks, residuals), from one ORT run of the
    graph on probe inputs before anything is rewritten (ORT cannot run ai.bertfuse ops).
    Shape inference alone cannot tell [B] from [2B], or a [1,S,H] residual from a [B,S,H]
    one, when dims are symbolic."""

    def __init__(self, graph: gs.Graph, candidates: list[gs.Node]) -> None:
        wanted: dict[int, gs.Tensor] = {}
        for n in candidates:
            if n.op == "Attention":
                wanted.update({id(t): t for t in n.inputs[:1] + n.inputs[3:4] if t.name})
            elif n.op == "SkipLayerNormalization":
                wanted.update({id(t): t for t in n.inputs[:2]})
        self._shapes: dict[int, tuple[int, ...]] = {}
        self._missing: dict[int, str] = {}
        tensors = list(wanted.values())
        if not tensors:
            return
        try:
            self._store(tensors, eval_with_ort(graph, tensors, probe_feeds(graph)))
        except Exception:  # noqa: BLE001
            # One run per tensor: an odd node ORT refuses on probes costs only the checks
            # that need what it computes.
            for t in tensors:
                try:
                    self._store([t], eval_with_ort(graph, [t], probe_feeds(graph)))
                except Exception as exc:  # noqa: BLE001 (any ORT failure is a reason to miss)
                    self._missing[id(t)] = (f"cannot evaluate {t.name} on probe inputs "
                                            f"({type(exc).__name__})")

    def _store(self, tensors: list[gs.Tensor], values: list[np.ndarray]) -> None:
        self._shapes.update({id(t): tuple(np.shape(v)) for t, v in zip(tensors, values)})

    def of(self, t: gs.Tensor) -> tuple[int, ...]:
        """The tensor's probe shape; raises MatchFailure with why there is none."""
        if id(t) not in self._shapes:
            fail(self._missing.get(id(t), f"no probe shape for {t.name}"))
        return self._shapes[id(t)]


def _fp16_const(t: gs.Tensor, what: str, ndim: int) -> np.ndarray:
    value = const_value(t)
    expect(value is not None, f"{what} is not a constant")
    expect(value.ndim == ndim, f"{what} has rank {value.ndim}, expected {ndim}")
    expect(value.dtype == np.float16, f"{what} is {value.dtype}: the bertfuse ops are fp16 only")
    return value


def _zeros(name: str, n: int) -> gs.Constant:
    return const(name, np.zeros(n, np.float16))


def _reuse_output(node: gs.Node) -> gs.Tensor:
    """The node's first output, detached from it (the new node writes the same tensor, so
    names, graph outputs and consumers stay), and the node detached."""
    out = node.outputs[0]
    detach([node])
    return out


def _dense(graph: gs.Graph, t: gs.Tensor, what: str) -> tuple[gs.Node, gs.Tensor, gs.Tensor, int]:
    """t = MatMul(X, W) with a constant fp16 W [K, N], read only by the candidate:
    (the MatMul, X, W, N)."""
    mm = producer(t)
    expect(mm is not None and mm.op == "MatMul", f"{what} is not a MatMul's output")
    w = _fp16_const(mm.inputs[1], f"the weight of {mm.name}", 2)
    expect(const_value(mm.inputs[0]) is None, f"{mm.name} multiplies two constants")
    expect(len(t.outputs) == 1 and not is_graph_output(graph, t),
           f"the output of {mm.name} is also read elsewhere")
    return mm, mm.inputs[0], mm.inputs[1], w.shape[1]


def _match_attention(graph: gs.Graph, node: gs.Node, shapes: _ProbeShapes) -> Rewrite:
    for i, slot in enumerate(_ATTENTION_EXTRAS, start=4):
        expect(not (len(node.inputs) > i and node.inputs[i].name),
               f"{node.name} has a {slot} input (BertAttention has none)")
    expect(not (len(node.outputs) > 1 and any(t.name for t in node.outputs[1:])),
           f"{node.name} has a present (KV cache) output")
    for attr in ("unidirectional", "do_rotary", "past_present_share_buffer"):
        if node.attrs.get(attr, 0):
            fail(f"{node.name} has {attr}={node.attrs[attr]}")
    expect(not node.attrs.get("qkv_hidden_sizes"),
           f"{node.name} sets qkv_hidden_sizes (Q, K, V of different widths)")
    w = _fp16_const(node.inputs[1], f"the QKV weight of {node.name}", 2)
    width = w.shape[1]
    heads = int(node.attrs["num_heads"])
    expect(not (width % 3 or (width // 3) % heads),
           f"QKV width {width} is not 3 x num_heads {heads} x head size")
    head_size = width // 3 // heads
    expect(head_size <= MAX_HEAD_SIZE, f"{node.name} has head size {head_size}; BertAttention "
                                       f"covers head sizes up to {MAX_HEAD_SIZE}")
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
    if bias is not None:
        _fp16_const(bias, f"the QKV bias of {node.name}", 1)
    x, weight = node.inputs[0], node.inputs[1]
    expect(rank_of(x) in (3, None), f"the input of {node.name} is not [B, S, H]")
    mask = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3].name else None
    if mask is not None:
        _check_mask_form(node, x, mask, shapes)
    scale = node.attrs.get("scale")

    def rewrite(graph: gs.Graph) -> None:
        ctx = _reuse_output(node)
        qkv = gs.Variable(f"{node.name}_qkv", dtype=np.float16)
        graph.nodes.append(DENSE_BIAS.node(
            f"{node.name}_DenseBias",
            [x, weight, bias if bias is not None else _zeros(f"{node.name}_qkv_bias", width)],
            [qkv]))
        graph.nodes.append(BERT_ATTENTION.node(f"{node.name}_BertAttention", [qkv, mask], [ctx],
                                               num_heads=heads, scale=scale))

    return rewrite


def _check_mask_form(node: gs.Node, x: gs.Tensor, mask: gs.Tensor, shapes: _ProbeShapes) -> None:
    """Passes for a raw [B, S] or key-length [B] int32 mask; else raises MatchFailure."""
    if mask.dtype is not None and np.dtype(mask.dtype) != np.int32:
        fail(f"the mask of {node.name} is {np.dtype(mask.dtype)}, not int32")
    if node.attrs.get("mask_filter_value", MASK_FILTER_VALUE) != MASK_FILTER_VALUE:
        fail(f"{node.name} masks with {node.attrs['mask_filter_value']:g}; BertAttention "
             f"adds {MASK_FILTER_VALUE:g}")
    got, xs = shapes.of(mask), shapes.of(x)
    b, s = xs[:2]
    expect(got == (b, s) or got == (b,),
           f"the mask of {node.name} has shape {list(got)} at B={b}, S={s}: BertAttention "
           f"reads the raw [B, S] or key-length [B] form only")


def _match_skip_layernorm(graph: gs.Graph, node: gs.Node, shapes: _ProbeShapes) -> Rewrite:
    expect(not any(t.name and (t.outputs or is_graph_output(graph, t)) for t in node.outputs[1:]),
           f"{node.name}'s mean, inv_std_var or input_skip_bias_sum is read")
    skip_slot = 1
    try:
        mm, x, w, n = _dense(graph, node.inputs[0], f"the input of {node.name}")
    except MatchFailure as first:  # input + skip is symmetric: the dense layer may be the 'skip'
        try:
            mm, x, w, n = _dense(graph, node.inputs[1], f"the skip of {node.name}")
        except MatchFailure:
            raise first from None
        skip_slot = 0
    skip = node.inputs[skip_slot]
    got, want = shapes.of(skip), shapes.of(node.inputs[1 - skip_slot])
    expect(got == want, f"the residual of {node.name} has shape {list(got)}, the dense output "
                        f"{list(want)} (a broadcast skip is not taken)")
    ins = list(node.inputs) + [None] * (5 - len(node.inputs))
    gamma, beta, bias = ins[2], ins[3], ins[4]
    eps = float(node.attrs.get("epsilon", DEFAULT_EPSILON))

    def rewrite(graph: gs.Graph) -> None:
        y = _reuse_output(node)
        detach([mm])
        graph.nodes.append(DENSE_BIAS_SKIP_LAYERNORM.node(
            f"{node.name}_Dense", [
                x, w, bias if bias is not None and bias.name else _zeros(f"{node.name}_bias", n),
                skip, gamma, beta if beta is not None and beta.name else _zeros(f"{node.name}_beta", n)],
            [y], epsilon=eps))

    return rewrite


def _match_gelu(graph: gs.Graph, node: gs.Node) -> Rewrite:
    mm, x, w, n = _dense(graph, node.inputs[0], f"the input of {node.name}")
    bias = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1].name else None
    approximate = GELU_APPROXIMATE[node.op]

    def rewrite(graph: gs.Graph) -> None:
        y = _reuse_output(node)
        detach([mm])
        graph.nodes.append(DENSE_BIAS_GELU.node(
            f"{node.name}_Dense", [x, w, bias if bias is not None else _zeros(f"{node.name}_bias", n)],
            [y], approximate=approximate))

    return rewrite
