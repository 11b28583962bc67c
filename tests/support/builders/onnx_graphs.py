"""Tiny hand-built ONNX graphs in the shapes tf2onnx exports TF BERT in (opset 17).

Hidden states are 2-D [B*S, H] between layers (Google's modeling.py), masks are [B, S] integer
inputs, scalars are 0-d float32 initializers, head-split shapes are computed from Shape(mask)
(dynamic batch and sequence) unless asked otherwise. Nothing here imports bertfuse.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
F32_MIN = float(np.finfo(np.float32).min)
SQRT2 = float(np.float32(math.sqrt(2.0)))
INV_SQRT2 = float(np.float32(1.0 / math.sqrt(2.0)))
SQRT_2_OVER_PI = float(np.float32(math.sqrt(2.0 / math.pi)))


class G:
    """A small ONNX graph under construction. `op` takes tensor names, NumPy arrays or Python
    floats (0-d float32 initializers) as inputs and returns its output name(s)."""

    def __init__(self, name: str = "g") -> None:
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._n = 0

    def fresh(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def input(self, name: str, dtype, shape) -> str:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, name: str, dtype=np.float32, shape=None) -> str:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def const(self, value, dtype=None, prefix: str = "c") -> str:
        arr = np.asarray(value, dtype=dtype if dtype is not None else
                         (np.float32 if isinstance(value, float) else None))
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64), prefix="i64")

    def op(self, op_type: str, *inputs, out: str | None = None, n_out: int = 1,
           domain: str = "", **attrs):
        names = [i if isinstance(i, str) else self.const(i) for i in inputs]
        outs = [out] if out is not None else [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, names, outs, name=self.fresh(op_type),
                                           domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def rename_last(self, new: str) -> str:
        """Renames the last node's first output (so it can be a graph output)."""
        node = self.nodes[-1]
        old = node.output[0]
        node.output[0] = new
        for n in self.nodes:
            for i, t in enumerate(n.input):
                if t == old:
                    n.input[i] = new
        return new

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        opsets = [helper.make_opsetid("", OPSET)]
        if any(n.domain == "com.microsoft" for n in self.nodes):
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        m = helper.make_model(graph, opset_imports=opsets, producer_name="tf2onnx-like")
        m.ir_version = 8
        return m


def census(model: onnx.ModelProto) -> Counter:
    """Ops by (domain, op_type), domain '' for ai.onnx."""
    return Counter((n.domain if n.domain not in ("ai.onnx",) else "", n.op_type)
                   for n in model.graph.node)


MS = "com.microsoft"


# ------------------------------------------------------------------------------- dense


def dense(g: G, x: str, w: np.ndarray, b: np.ndarray | None, bias_first: bool = False) -> str:
    y = g.op("MatMul", x, g.const(w, np.float32, "kernel"))
    if b is None:
        return y
    bn = g.const(b, np.float32, "bias")
    return g.op("Add", bn, y) if bias_first else g.op("Add", y, bn)


# -------------------------------------------------------------------------------- GELU


def gelu(g: G, x: str, form: str, half: float = 0.5) -> str:
    """The activation of x written the way one exporter writes it."""
    if form == "erf_x_half":  # x * 0.5 * (1 + erf(x / sqrt2))      (HF / original modeling.py)
        e = g.op("Erf", g.op("Div", x, SQRT2))
        return g.op("Mul", g.op("Mul", x, half), g.op("Add", 1.0, e))
    if form == "erf_half_x":  # 0.5 * x * (1 + erf(x * 0.7071..))
        e = g.op("Erf", g.op("Mul", x, INV_SQRT2))
        return g.op("Mul", g.op("Mul", half, x), g.op("Add", e, 1.0))
    if form == "erf_keras":  # 0.5 * x * erfc(-x / sqrt2), erfc rewritten as 1 - erf
        e = g.op("Erf", g.op("Mul", g.op("Neg", x), INV_SQRT2))
        return g.op("Mul", g.op("Mul", half, x), g.op("Sub", 1.0, e))
    if form == "erf_keras_negconst":  # 0.5 * x * erfc(x * -0.7071..), the Neg folded
        e = g.op("Erf", g.op("Mul", x, -INV_SQRT2))
        return g.op("Mul", g.op("Mul", half, x), g.op("Sub", 1.0, e))
    if form in ("tanh_pow", "tanh_mul"):  # modeling.py: x * 0.5 * (1 + tanh(c * (x + k x^3)))
        cube = g.op("Pow", x, 3.0) if form == "tanh_pow" else \
            g.op("Mul", g.op("Mul", x, x), x)
        inner = g.op("Add", x, g.op("Mul", 0.044715, cube))
        t = g.op("Tanh", g.op("Mul", SQRT_2_OVER_PI, inner))
        cdf = g.op("Mul", half, g.op("Add", 1.0, t))
        return g.op("Mul", x, cdf)
    raise ValueError(form)


def gelu_ref(x: np.ndarray, form: str) -> np.ndarray:
    from math import erf

    x = x.astype(np.float64)
    if form.startswith("erf"):
        return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


# --------------------------------------------------------------------------- LayerNorm


def _mean(g: G, t: str, reduce: str, axis: int) -> str:
    if reduce == "gap":
        return g.op("GlobalAveragePool", t)
    return g.op("ReduceMean", t, axes=[axis], keepdims=1)


def layernorm(g: G, x: str, gamma: np.ndarray, beta: np.ndarray, eps: float,
              form: str = "moments", reduce: str = "mean", axis: int = -1) -> str:
    """LayerNorm over the last axis of x, in one of the elementwise forms TF graphs take."""
    gm = g.const(gamma, np.float32, "gamma")
    bt = g.const(beta, np.float32, "beta")
    mean = _mean(g, x, reduce, axis)
    d = g.op("Sub", x, mean)
    if form == "moments":
        # tf.nn.moments + tf.nn.batch_normalization: x*g + (beta - mean*g), g = rsqrt(v+e)*γ
        var = _mean(g, g.op("Mul", d, d), reduce, axis)
        inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, eps)))
        sc = g.op("Mul", inv, gm)
        return g.op("Add", g.op("Mul", x, sc), g.op("Sub", bt, g.op("Mul", mean, sc)))
    if form == "neg":  # x*g + (Neg(mean)*g + beta)
        var = _mean(g, g.op("Pow", d, 2.0), reduce, axis)
        inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, eps)))
        sc = g.op("Mul", gm, inv)
        return g.op("Add", g.op("Mul", sc, x), g.op("Add", g.op("Mul", g.op("Neg", mean), sc), bt))
    if form == "div":  # Keras / HF: (x - mean) / sqrt(var + eps) * γ + β
        var = _mean(g, g.op("Pow", d, 2.0), reduce, axis)
        n = g.op("Div", d, g.op("Sqrt", g.op("Add", eps, var)))
        return g.op("Add", bt, g.op("Mul", n, gm))
    raise ValueError(form)


def layernorm_ref(x: np.ndarray, gamma, beta, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * gamma + beta


# --------------------------------------------------------------------------- attention


def attention_weights(rng: np.random.Generator, hidden: int) -> dict[str, np.ndarray]:
    s = 1.0 / math.sqrt(hidden)
    return {k: (rng.standard_normal((hidden, hidden)) * s * 2).astype(np.float32)
            for k in ("wq", "wk", "wv")} | \
        {k: (rng.standard_normal(hidden) * 0.5).astype(np.float32) for k in ("bq", "bk", "bv")}


def mask_adder(g: G, mask: str, kind: str, value: float | None = None) -> str:
    """The additive [B,1,1|S,S] mask term (1 - m) * value from a [B,S] integer mask."""
    m = g.op("Cast", mask, to=TensorProto.FLOAT)
    if kind == "google":  # create_attention_mask_from_input_mask: ones[B,S,1] * mask[B,1,S]
        shp = g.op("Shape", mask)
        b = g.op("Slice", shp, g.ints(0), g.ints(1))
        s = g.op("Slice", shp, g.ints(1), g.ints(2))
        to_mask = g.op("Reshape", m, g.op("Concat", b, g.ints(1), s, axis=0))
        ones = g.op("ConstantOfShape", g.op("Concat", b, s, g.ints(1), axis=0),
                    value=numpy_helper.from_array(np.array([1.0], np.float32)))
        m4 = g.op("Unsqueeze", g.op("Mul", ones, to_mask), g.ints(1))
        value = -10000.0
    else:
        m4 = g.op("Unsqueeze", m, g.ints(1, 2))
        value = {"10000": -10000.0, "1e9": -1e9, "fmin": F32_MIN}[kind] if value is None \
            else value
    return g.op("Mul", g.op("Sub", 1.0, m4), value)


def attention(g: G, x: str, mask: str | None, w: dict[str, np.ndarray], hidden: int,
              heads: int, *, mask_kind: str = "10000", q_prescale: bool = False,
              kt: str = "0231", scale: float | None = None, score_div: bool = False,
              shape_from: str | None = None, const_seq: int | None = None,
              adder_first: bool = False, bias_first: bool = False,
              probs_out: str | None = None, out3d: bool = False, hf: bool = False,
              softmax_shift: float | None = None, q_scale_2d: bool = False,
              adder_mask: str | None = None, adder_value: float | None = None,
              const_first: bool = False) -> str:
    """Google modeling.py's attention_layer on 2-D [B*S, H] hidden states.

    mask_kind: 10000 | 1e9 | fmin | google (additive (1-m)*c), where | where_neg (Where with
    -1e9), none. kt: 0231 (one Transpose) | 0213+0132 (two). scale: the score factor
    (default 1/sqrt(D)); q_prescale applies it to Q before the MatMul instead, q_scale_2d to
    the Q projection before the head split. hf: transformers' TFBertSelfAttention on 3-D
    x [B,S,H]: reshape (batch, -1, N, D) and back to (batch, -1, H). softmax_shift: a scalar
    added right before the Softmax (transformers' stable_softmax adds 1e-9). adder_mask /
    adder_value: build the additive term from another [B,S] tensor / with another constant.
    const_first: Mul(c, t) instead of Mul(t, c) for the scale."""

    def scale_by(t: str, c: float) -> str:
        return g.op("Mul", float(c), t) if const_first else g.op("Mul", t, float(c))

    d = hidden // heads
    if hf:
        batch = g.op("Slice", g.op("Shape", x), g.ints(0), g.ints(1))
        split = g.op("Concat", batch, g.ints(-1, heads, d), axis=0)
    elif const_seq is not None:
        split = g.ints(-1, const_seq, heads, d)
    else:
        split = g.op("Concat", g.op("Shape", shape_from or mask), g.ints(heads, d), axis=0)

    factor = scale if scale is not None else 1.0 / math.sqrt(d)

    def heads_of(wk: str, bk: str) -> str:
        p = dense(g, x, w[wk], w[bk], bias_first=bias_first)
        if q_scale_2d and wk == "wq":
            p = g.op("Mul", p, float(factor))
        return g.op("Reshape", p, split)

    q = g.op("Transpose", heads_of("wq", "bq"), perm=[0, 2, 1, 3])
    k4 = heads_of("wk", "bk")
    if kt == "0231":
        k = g.op("Transpose", k4, perm=[0, 2, 3, 1])
    else:
        k = g.op("Transpose", g.op("Transpose", k4, perm=[0, 2, 1, 3]), perm=[0, 1, 3, 2])
    v = g.op("Transpose", heads_of("wv", "bv"), perm=[0, 2, 1, 3])
    if q_prescale:
        q = scale_by(q, factor)
    scores = g.op("MatMul", q, k)
    if not (q_prescale or q_scale_2d):
        scores = g.op("Div", scores, float(1.0 / factor)) if score_div else \
            scale_by(scores, factor)
    if mask_kind in ("10000", "1e9", "fmin", "google"):
        adder = mask_adder(g, adder_mask or mask, mask_kind, adder_value)
        scores = g.op("Add", adder, scores) if adder_first else g.op("Add", scores, adder)
    elif mask_kind == "where":
        cond = g.op("Cast", g.op("Unsqueeze", mask, g.ints(1, 2)), to=TensorProto.BOOL)
        scores = g.op("Where", cond, scores, -1e9)
    elif mask_kind == "where_neg":
        cond = g.op("Equal", g.op("Unsqueeze", mask, g.ints(1, 2)),
                    g.const(np.array(0, dtype=_np_dtype(g, mask))))
        scores = g.op("Where", cond, -1e9, scores)
    elif mask_kind != "none":
        raise ValueError(mask_kind)
    if softmax_shift is not None:
        scores = g.op("Add", scores, float(softmax_shift))
    probs = g.op("Softmax", scores, axis=-1, out=probs_out)
    ctx = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    if hf:
        return g.op("Reshape", ctx, g.op("Concat", batch, g.ints(-1, hidden), axis=0))
    if out3d:
        return g.op("Reshape", ctx, g.op("Concat", g.op("Shape", shape_from or mask),
                                          g.ints(hidden), axis=0))
    return g.op("Reshape", ctx, g.ints(-1, hidden))


def _np_dtype(g: G, name: str):
    for vi in g.inputs:
        if vi.name == name:
            return helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    return np.int32


def attention_ref(x: np.ndarray, mask: np.ndarray | None, w: dict[str, np.ndarray],
                  heads: int, scale: float | None = None, fill: float = -10000.0) -> np.ndarray:
    """float64 reference of the block above on x [B*S,H] (or [B,S,H]), mask [B,S]."""
    B, S = mask.shape if mask is not None else (1, x.shape[0])
    H = w["wq"].shape[1]
    D = H // heads
    x = x.reshape(B, S, -1).astype(np.float64)

    def split(t):
        return t.reshape(B, S, heads, D).transpose(0, 2, 1, 3)

    q, k, v = (split(x @ w["w" + c] + w["b" + c]) for c in "qkv")
    sc = q @ k.transpose(0, 1, 3, 2) * (scale if scale is not None else 1 / math.sqrt(D))
    if mask is not None:
        sc = sc + (1.0 - mask[:, None, None, :]) * fill
    sc = sc - sc.max(-1, keepdims=True)
    p = np.exp(sc)
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(B * S, H)


# ----------------------------------------------------------------------- encoder layers


def layer_weights(rng: np.random.Generator, hidden: int, inter: int) -> dict[str, np.ndarray]:
    w = attention_weights(rng, hidden)

    def mat(i, o):
        return (rng.standard_normal((i, o)) / math.sqrt(i)).astype(np.float32)

    def vec(n, s=0.2, o=0.0):
        return (rng.standard_normal(n) * s + o).astype(np.float32)

    return w | {"wo": mat(hidden, hidden), "bo": vec(hidden), "g1": vec(hidden, 0.1, 1.0),
                "b1": vec(hidden), "wi": mat(hidden, inter), "bi": vec(inter),
                "wo2": mat(inter, hidden), "bo2": vec(hidden), "g2": vec(hidden, 0.1, 1.0),
                "b2": vec(hidden)}


def encoder_layer(g: G, x: str, mask: str, w: dict[str, np.ndarray], hidden: int, heads: int,
                  gelu_form: str = "erf_x_half", ln_form: str = "moments",
                  eps: float = 1e-12, probs_out: str | None = None, gelu_half: float = 0.5,
                  **attn) -> str:
    """Google modeling.py's transformer layer on 2-D hidden states (gelu_half other than 0.5:
    an activation that is not GELU)."""
    ctx = attention(g, x, mask, w, hidden, heads, probs_out=probs_out, **attn)
    a = dense(g, ctx, w["wo"], w["bo"])
    y1 = layernorm(g, g.op("Add", a, x), w["g1"], w["b1"], eps, form=ln_form)
    i = gelu(g, dense(g, y1, w["wi"], w["bi"]), gelu_form, half=gelu_half)
    o = dense(g, i, w["wo2"], w["bo2"])
    return layernorm(g, g.op("Add", o, y1), w["g2"], w["b2"], eps, form=ln_form)


def embed_weights(rng: np.random.Generator, vocab: int, pos: int, types: int,
                  hidden: int) -> dict[str, np.ndarray]:
    return {"word": rng.standard_normal((vocab, hidden)).astype(np.float32),
            "pos": rng.standard_normal((pos, hidden)).astype(np.float32),
            "type": rng.standard_normal((types, hidden)).astype(np.float32),
            "g": (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
            "b": (0.2 * rng.standard_normal(hidden)).astype(np.float32)}


def embeddings(g: G, ids: str, segs: str | None, w: dict[str, np.ndarray], *,
               style: str = "google", pos_start: int = 0, eps: float = 1e-12,
               ln_op: bool = False, sum_out: str | None = None) -> str:
    """Embedding sum + LayerNorm on 3-D [B,S,H].

    google: Reshape(ids,[-1]) -> Gather(word) -> Reshape[B,S,H]; one-hot MatMul for token types;
            Slice(position table, 0:S) -> Unsqueeze.
    hf:     Gather(word, ids); Gather(type, segs); Gather(pos, Unsqueeze(Range(0, S)))."""
    hidden = w["word"].shape[1]
    shp = g.op("Shape", ids)
    seq = g.op("Slice", shp, g.ints(1), g.ints(2))
    if style == "google":
        out_shape = g.op("Concat", shp, g.ints(hidden), axis=0)
        word = g.op("Reshape", g.op("Gather", g.const(w["word"], prefix="word_table"),
                                    g.op("Reshape", ids, g.ints(-1)), axis=0), out_shape)
        terms = [word]
        if segs is not None:
            flat = g.op("Reshape", segs, g.ints(-1))
            if _np_dtype(g, segs) != np.int64:  # ORT's OneHot wants int64 indices here
                flat = g.op("Cast", flat, to=TensorProto.INT64)
            oh = g.op("OneHot", flat,
                      g.const(np.array(w["type"].shape[0], np.int64)),
                      g.const(np.array([0.0, 1.0], np.float32)), axis=-1)
            terms.append(g.op("Reshape", g.op("MatMul", oh, g.const(w["type"], prefix="type_table")),
                              out_shape))
        end = g.op("Add", seq, g.ints(pos_start)) if pos_start else seq
        pos = g.op("Slice", g.const(w["pos"], prefix="pos_table"), g.ints(pos_start), end,
                   g.ints(0))
        terms.append(g.op("Unsqueeze", pos, g.ints(0)))
    else:
        terms = [g.op("Gather", g.const(w["word"], prefix="word_table"), ids, axis=0)]
        if segs is not None:
            terms.append(g.op("Gather", g.const(w["type"], prefix="type_table"), segs, axis=0))
        s0 = g.op("Squeeze", seq, g.ints(0))
        rng_ = g.op("Range", g.const(np.array(pos_start, np.int64)),
                    g.op("Add", s0, g.const(np.array(pos_start, np.int64))),
                    g.const(np.array(1, np.int64)))
        terms.append(g.op("Gather", g.const(w["pos"], prefix="pos_table"),
                          g.op("Unsqueeze", rng_, g.ints(0)), axis=0))
    total = terms[0]
    for t in terms[1:]:
        total = g.op("Add", total, t)
    if sum_out:
        total = g.op("Identity", total, out=sum_out)
    if ln_op:
        return g.op("LayerNormalization", total, g.const(w["g"], prefix="gamma"),
                    g.const(w["b"], prefix="beta"), axis=-1, epsilon=eps)
    return layernorm(g, total, w["g"], w["b"], eps, form="moments")


def bert(rng: np.random.Generator, *, layers: int = 2, hidden: int = 16, heads: int = 2,
         inter: int = 32, vocab: int = 40, positions: int = 16, types: int = 2,
         gelu_form: str = "erf_x_half", broken_layer: int | None = None,
         pooler: bool = True, ids_dtype=np.int32,
         not_gelu_layer: int | None = None, biases: bool = True) -> onnx.ModelProto:
    """A whole tiny Google-style BERT: int ids/mask/segments -> sequence_output [B,S,H]
    (unflattened from 2-D through Shape arithmetic) and pooled_output [B,H].
    broken_layer: that layer's attention probabilities are also read by a ReduceSum (unfusable).
    not_gelu_layer: that layer's activation is 0.6 * x * (1 + erf(x / sqrt2)), not GELU.
    biases=False: no dense layer has a bias (Keras' use_bias=False); LayerNorms keep theirs."""
    g = G("bert")
    ids = g.input("input_ids", ids_dtype, ["B", "S"])
    mask = g.input("input_mask", ids_dtype, ["B", "S"])
    segs = g.input("segment_ids", ids_dtype, ["B", "S"])
    ew = embed_weights(rng, vocab, positions, types, hidden)
    e = embeddings(g, ids, segs, ew)
    h = g.op("Reshape", e, g.ints(-1, hidden))
    for i in range(layers):
        probs = f"probs_{i}" if i == broken_layer else None
        w = layer_weights(rng, hidden, inter)
        if not biases:
            w.update(dict.fromkeys(("bq", "bk", "bv", "bo", "bi", "bo2")))
        h = encoder_layer(g, h, mask, w, hidden, heads,
                          gelu_form=gelu_form, probs_out=probs,
                          gelu_half=0.6 if i == not_gelu_layer else 0.5)
        if probs:  # the probabilities are also read by another node: unfusable
            g.op("ReduceSum", probs, g.ints(-1), keepdims=0, out=f"probs_max_{i}")
            g.output(f"probs_max_{i}")
    seq_shape = g.op("Concat", g.op("Shape", ids), g.ints(hidden), axis=0)
    g.op("Reshape", h, seq_shape, out="sequence_output")
    g.output("sequence_output")
    if pooler:
        first = g.op("Squeeze", g.op("Slice", "sequence_output", g.ints(0), g.ints(1),
                                     g.ints(1)), g.ints(1))
        pw = (rng.standard_normal((hidden, hidden)) / math.sqrt(hidden)).astype(np.float32)
        pb = (0.1 * rng.standard_normal(hidden)).astype(np.float32)
        g.op("Tanh", dense(g, first, pw, pb if biases else None), out="pooled_output")
        g.output("pooled_output")
    return g.model()


def mask_rows(batch: int, seq: int, rng: np.random.Generator, dtype=np.int32) -> np.ndarray:
    """0/1 mask with padding at the end, in the middle and at the start of rows; every row
    keeps at least two keys."""
    m = np.ones((batch, seq), dtype)
    m[0, -2:] = 0                       # end
    if batch > 1:
        m[1, 1:3] = 0                   # middle
    if batch > 2:
        m[2, :2] = 0                    # start
    for b in range(3, batch):
        row = (rng.random(seq) > 0.4).astype(dtype)
        row[rng.integers(seq)] = 1
        row[0] = 0                      # start padding again, random elsewhere
        if row.sum() == 0:
            row[-1] = 1
        m[b] = row
    return m
