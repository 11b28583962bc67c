"""Per-pass unit tests on tiny hand-built graphs in tf2onnx's shapes (tests/graph_builders.py).

Every case runs ORT CPU (no graph optimisation) on the graph before and after the pass(es) on
the same fresh random inputs (masks padded at the end, in the middle and at the start of rows,
never all zeros), requires max |diff| <= 1e-4 (fp32), and counts the ops by (domain, op).
The seed of every test is printed in its failure message; BERTFUSE_TEST_SEED=<n> replays one.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto

ort = pytest.importorskip("onnxruntime")

from bertfuse.passes.attention import AttentionFusion  # noqa: E402
from bertfuse.passes.cleanup import Cleanup  # noqa: E402
from bertfuse.passes.dense_gemm import DenseGemmFusion  # noqa: E402
from bertfuse.passes.embed_layernorm import EmbedLayerNormFusion  # noqa: E402
from bertfuse.passes.gelu import GeluFusion  # noqa: E402
from bertfuse.passes.layernorm import LayerNormFusion  # noqa: E402
from bertfuse.passes.manager import default_passes, run_passes  # noqa: E402
from bertfuse.passes.skip_layernorm import SkipLayerNormFusion  # noqa: E402

from graph_builders import (MS, G, attention, attention_ref, attention_weights, bert,  # noqa: E402
                            census, dense, embed_weights, embeddings, encoder_layer, gelu,
                            gelu_ref, layer_weights, layernorm, layernorm_ref, mask_rows)

TOL = 1e-4
H, N, INTER = 16, 2, 32
B, S = 4, 6  # differs from the passes' probe shape (3, 7) on purpose


# ----------------------------------------------------------------------------- helpers




def session(model: onnx.ModelProto):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    ins = {i.name for i in sess.get_inputs()}
    return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in ins})))


def fuse(model: onnx.ModelProto, *passes):
    """The given passes plus Cleanup (or the default pipeline with none given)."""
    return run_passes(model, [*passes, Cleanup()] if passes else None)


def assert_same(before: onnx.ModelProto, after: onnx.ModelProto, feeds, seed: int,
                tol: float = TOL) -> dict[str, np.ndarray]:
    want, got = run(before, feeds), run(after, feeds)
    assert set(want) == set(got), f"outputs changed: {sorted(want)} -> {sorted(got)}"
    for name in want:
        assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
        diff = float(np.abs(got[name].astype(np.float64) - want[name]).max())
        assert diff <= tol, f"{name}: max |diff| {diff:.3g} > {tol} (seed {seed})"
    return got


def count(model, op: str, domain: str = "") -> int:
    return census(model)[(domain, op)]


def node(model, op: str) -> onnx.NodeProto:
    (n,) = [n for n in model.graph.node if n.op_type == op]
    return n


def attr(n: onnx.NodeProto, name: str, default=None):
    for a in n.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def missed(report, component: str) -> list[str]:
    return [d.reason for d in report.diagnostics if d.component == component and not d.fused]


def vec(rng, n, s=0.3, o=0.0):
    return (rng.standard_normal(n) * s + o).astype(np.float32)


# ---------------------------------------------------------------------------- LayerNorm


def ln_model(rng, form="moments", reduce="mean", rank=2, eps=1e-3, axis=-1, extra_out=None):
    g = G("ln")
    x = g.input("x", np.float32, ["N", H] if rank == 2 else ["B", "S", H])
    gamma, beta = vec(rng, H, 0.2, 1.0), vec(rng, H)
    layernorm(g, x, gamma, beta, eps, form=form, reduce=reduce, axis=axis)
    g.rename_last("y")
    g.output("y")
    if extra_out is not None:  # an intermediate that is also read outside the normalisation
        g.output(g.nodes[extra_out].output[0])
    return g.model(), gamma, beta


def ln_feeds(rng, rank):
    shape = (B * S, H) if rank == 2 else (B, S, H)
    return {"x": (rng.standard_normal(shape) * 2.0 + 0.7).astype(np.float32)}


@pytest.mark.parametrize("form,reduce,rank", [
    ("moments", "mean", 2),  # tf.nn.moments + batch_normalization: x*g + (beta - mean*g)
    ("div", "mean", 2),      # (x - mean) / sqrt(var + eps) * gamma + beta
    ("neg", "mean", 2),      # x*g + (Neg(mean)*g + beta)
    ("moments", "mean", 3),
    ("moments", "gap", 3),   # GlobalAveragePool over the last axis of rank-3 x
    ("div", "gap", 3),
])
def test_layernorm_forms_fuse(rng, seed, form, reduce, rank):
    model, gamma, beta = ln_model(rng, form, reduce, rank, eps=1e-3)
    fused, _ = fuse(model, LayerNormFusion())
    assert census(fused) == Counter({("", "LayerNormalization"): 1}), census(fused)
    ln = node(fused, "LayerNormalization")
    assert attr(ln, "epsilon") == pytest.approx(1e-3, rel=1e-6)  # eps read off the Add
    feeds = ln_feeds(rng, rank)
    got = assert_same(model, fused, feeds, seed)
    ref = layernorm_ref(feeds["x"], gamma, beta, 1e-3)
    assert np.abs(got["y"] - ref).max() <= TOL


def test_layernorm_over_axis0_is_not_fused(rng, seed):
    model, *_ = ln_model(rng, "moments", axis=0)
    fused, report = fuse(model, LayerNormFusion())
    assert count(fused, "LayerNormalization") == 0
    assert count(fused, "ReduceMean") == 2
    assert missed(report, "layernorm")
    assert_same(model, fused, ln_feeds(rng, 2), seed)


@pytest.mark.parametrize("which", [0, 3], ids=["mean", "variance"])
def test_layernorm_intermediate_read_outside_is_not_fused(rng, seed, which):
    # node 0 is the mean, node 3 the variance ReduceMean (moments form)
    model, *_ = ln_model(rng, "moments", extra_out=which)
    fused, report = fuse(model, LayerNormFusion())
    assert count(fused, "LayerNormalization") == 0
    assert any("outside" in r for r in missed(report, "layernorm")), report.diagnostics
    assert_same(model, fused, ln_feeds(rng, 2), seed)


def test_layernorm_followed_by_mean_pooling_fuses(rng, seed):
    g = G("ln")
    x = g.input("x", np.float32, ["B", "S", H])
    layernorm(g, x, vec(rng, H, 0.2, 1.0), vec(rng, H), 1e-12, form="div")
    g.rename_last("y")
    g.output("y")
    g.op("ReduceMean", "y", axes=[1], keepdims=0, out="pooled")  # sentence embedding
    g.output("pooled")
    model = g.model()
    fused, _ = fuse(model, LayerNormFusion())
    assert_same(model, fused, ln_feeds(rng, 3), seed)
    assert count(fused, "LayerNormalization") == 1, census(fused)


@pytest.mark.parametrize("after", ["Tanh", "Mul"])
def test_layernorm_followed_by_constant_only_op_fuses(rng, seed, after):
    # the op after the LN output joins the closed region from x (its only other input is
    # constant): Tanh must stay outside the LN, Mul(c) may be folded into γ, β
    g = G("ln")
    x = g.input("x", np.float32, ["B", "S", H])
    y = layernorm(g, x, vec(rng, H, 0.2, 1.0), vec(rng, H), 1e-12, form="div")
    g.op(after, *([y] if after == "Tanh" else [y, g.const(vec(rng, H, 0.5, 1.0))]), out="z")
    g.output("z")
    model = g.model()
    fused, _ = fuse(model, LayerNormFusion())
    assert census(fused) == Counter({("", "LayerNormalization"): 1,
                                     **({("", "Tanh"): 1} if after == "Tanh" else {})}), \
        census(fused)
    assert_same(model, fused, ln_feeds(rng, 3), seed)


# --------------------------------------------------------------------------------- GELU


ERF_FORMS = ("erf_x_half", "erf_half_x", "erf_keras", "erf_keras_negconst")
TANH_FORMS = ("tanh_pow", "tanh_mul")


def gelu_model(rng, form, bias=True, bias_first=False, half=0.5, extra_out=None,
               pre_act_out=False, bias_value=None):
    g = G("gelu")
    h = g.input("h", np.float32, ["N", H])
    w = (rng.standard_normal((H, INTER)) / math.sqrt(H)).astype(np.float32)
    if bias_value is not None:
        x = g.op("Add", g.op("MatMul", h, g.const(w)), g.const(bias_value))
    else:
        x = dense(g, h, w, vec(rng, INTER) if bias else None, bias_first=bias_first)
    start = len(g.nodes)
    gelu(g, x, form, half=half)
    g.rename_last("y")
    g.output("y")
    if extra_out is not None:
        g.output(g.nodes[start + extra_out].output[0])
    if pre_act_out == "output":
        g.output(x)
    elif pre_act_out == "node":
        g.op("ReduceSum", x, g.ints(-1), keepdims=0, out="x_max")
        g.output("x_max")
    return g.model()


def gelu_feeds(rng):
    return {"h": (rng.standard_normal((B * S, H)) * 2.0).astype(np.float32)}


@pytest.mark.parametrize("form", ERF_FORMS + TANH_FORMS)
@pytest.mark.parametrize("bias_first", [False, True], ids=["Add(x,b)", "Add(b,x)"])
def test_gelu_with_bias_fuses(rng, seed, form, bias_first):
    model = gelu_model(rng, form, bias_first=bias_first)
    fused, _ = fuse(model, GeluFusion())
    op = "BiasGelu" if form.startswith("erf") else "FastGelu"
    assert census(fused) == Counter({("", "MatMul"): 1, (MS, op): 1}), census(fused)
    assert len(node(fused, op).input) == 2  # the bias is folded in
    assert_same(model, fused, gelu_feeds(rng), seed)


@pytest.mark.parametrize("form", ["erf_x_half", "erf_keras", "tanh_pow"])
def test_gelu_without_bias_fuses(rng, seed, form):
    model = gelu_model(rng, form, bias=False)
    fused, _ = fuse(model, GeluFusion())
    op = "Gelu" if form.startswith("erf") else "FastGelu"
    assert census(fused) == Counter({("", "MatMul"): 1, (MS, op): 1}), census(fused)
    feeds = gelu_feeds(rng)
    got = assert_same(model, fused, feeds, seed)
    x = feeds["h"].astype(np.float64) @ onnx.numpy_helper.to_array(model.graph.initializer[0])
    assert np.abs(got["y"] - gelu_ref(x, form)).max() <= TOL


@pytest.mark.parametrize("form", ["erf_x_half", "tanh_pow"])
def test_gelu_wrong_constant_is_not_fused(rng, seed, form):
    model = gelu_model(rng, form, half=0.6)
    fused, report = fuse(model, GeluFusion())
    assert not any(d == MS for d, _ in census(fused))
    assert count(fused, "Erf" if form.startswith("erf") else "Tanh") == 1
    assert missed(report, "gelu")
    assert_same(model, fused, gelu_feeds(rng), seed)


@pytest.mark.parametrize("form,which", [("erf_x_half", 1), ("erf_x_half", 2),
                                        ("tanh_pow", 3)], ids=["erf", "erf+1", "tanh_arg"])
def test_gelu_intermediate_read_outside_is_not_fused(rng, seed, form, which):
    model = gelu_model(rng, form, extra_out=which)
    fused, _ = fuse(model, GeluFusion())
    assert not any(d == MS for d, _ in census(fused)), census(fused)
    assert_same(model, fused, gelu_feeds(rng), seed)


def test_gelu_pre_activation_read_by_another_node_keeps_the_bias_add(rng, seed):
    model = gelu_model(rng, "erf_half_x", pre_act_out="node")
    fused, _ = fuse(model, GeluFusion())
    # x = h@W + b is needed outside: GELU fuses on x, the bias Add stays
    assert census(fused) == Counter({("", "MatMul"): 1, ("", "Add"): 1, ("", "ReduceSum"): 1,
                                     (MS, "Gelu"): 1}), census(fused)
    assert_same(model, fused, gelu_feeds(rng), seed)


def test_gelu_pre_activation_graph_output_keeps_the_bias_add(rng, seed):
    model = gelu_model(rng, "erf_half_x", pre_act_out="output")
    fused, _ = fuse(model, GeluFusion())
    # x = h@W + b is a model output: GELU fuses on x, the bias Add stays
    assert census(fused) == Counter({("", "MatMul"): 1, ("", "Add"): 1, (MS, "Gelu"): 1}), \
        census(fused)
    assert_same(model, fused, gelu_feeds(rng), seed)


def test_gelu_broadcast_scalar_add_is_not_taken_as_bias(rng, seed):
    model = gelu_model(rng, "erf_x_half", bias_value=np.array([0.25], np.float32))
    fused, _ = fuse(model, GeluFusion())
    assert census(fused) == Counter({("", "MatMul"): 1, ("", "Add"): 1, (MS, "Gelu"): 1}), \
        census(fused)
    assert_same(model, fused, gelu_feeds(rng), seed)


# ------------------------------------------------------------------------ SkipLayerNorm


def skip_model(rng, bias=True, bias_first=False, residual_first=False, sum_out=False,
               ln_op=False, with_beta=True):
    g = G("skip")
    r = g.input("residual", np.float32, ["N", H])
    a = g.input("a", np.float32, ["N", INTER])
    w = (rng.standard_normal((INTER, H)) / math.sqrt(INTER)).astype(np.float32)
    d = dense(g, a, w, vec(rng, H) if bias else None, bias_first=bias_first)
    s = g.op("Add", r, d) if residual_first else g.op("Add", d, r)
    if sum_out == "output":
        g.output(s)
    elif sum_out == "node":
        g.op("ReduceSum", s, g.ints(-1), keepdims=0, out="s_max")
        g.output("s_max")
    gamma, beta = vec(rng, H, 0.2, 1.0), vec(rng, H)
    if ln_op:
        ins = [s, g.const(gamma)] + ([g.const(beta)] if with_beta else [])
        g.op("LayerNormalization", *ins, axis=-1, epsilon=1e-5)
    else:
        layernorm(g, s, gamma, beta, 1e-5, form="div")
    g.rename_last("y")
    g.output("y")
    return g.model()


def skip_feeds(rng):
    return {"residual": rng.standard_normal((B * S, H)).astype(np.float32),
            "a": rng.standard_normal((B * S, INTER)).astype(np.float32)}


@pytest.mark.parametrize("bias,bias_first,residual_first", [
    (True, False, False), (True, True, False), (True, False, True), (True, True, True),
    (False, False, False), (False, False, True)])
def test_skip_layernorm_fuses(rng, seed, bias, bias_first, residual_first):
    model = skip_model(rng, bias, bias_first, residual_first)
    fused, _ = fuse(model, LayerNormFusion(), SkipLayerNormFusion())
    assert census(fused) == Counter({("", "MatMul"): 1, (MS, "SkipLayerNormalization"): 1}), \
        census(fused)
    sk = node(fused, "SkipLayerNormalization")
    assert len(sk.input) == (5 if bias else 4)
    assert attr(sk, "epsilon") == pytest.approx(1e-5)
    assert_same(model, fused, skip_feeds(rng), seed)


def test_skip_layernorm_sum_read_by_another_node_is_not_fused(rng, seed):
    model = skip_model(rng, sum_out="node")
    fused, _ = fuse(model, LayerNormFusion(), SkipLayerNormFusion())
    assert count(fused, "SkipLayerNormalization", MS) == 0
    assert count(fused, "LayerNormalization") == 1
    assert_same(model, fused, skip_feeds(rng), seed)


def test_skip_layernorm_sum_as_graph_output_stays_correct(rng, seed):
    model = skip_model(rng, sum_out="output")
    fused, _ = fuse(model, LayerNormFusion(), SkipLayerNormFusion())
    assert count(fused, "LayerNormalization") == 0
    assert_same(model, fused, skip_feeds(rng), seed)


def test_skip_layernorm_from_layernorm_without_beta(rng, seed):
    model = skip_model(rng, ln_op=True, with_beta=False)
    fused, _ = fuse(model, SkipLayerNormFusion())
    assert count(fused, "SkipLayerNormalization", MS) == 1, census(fused)
    assert_same(model, fused, skip_feeds(rng), seed)


# ---------------------------------------------------------------------- EmbedLayerNorm


def embed_model(rng, style="google", segments=True, dtype=np.int32, pos_start=0,
                ln_op=False, sum_out=None, with_beta=True):
    g = G("embed")
    ids = g.input("input_ids", dtype, ["B", "S"])
    segs = g.input("segment_ids", dtype, ["B", "S"]) if segments else None
    w = embed_weights(rng, 40, 16, 2, H)
    embeddings(g, ids, segs, w, style=style, pos_start=pos_start, ln_op=ln_op,
               sum_out=sum_out)
    if ln_op and not with_beta:
        g.nodes[-1].input.pop()  # drop LayerNormalization's optional beta
    g.rename_last("emb")
    g.output("emb")
    if sum_out:
        g.output(sum_out)
    return g.model()


def embed_feeds(rng, dtype=np.int32, segments=True):
    f = {"input_ids": rng.integers(0, 40, (B, S)).astype(dtype)}
    if segments:
        f["segment_ids"] = rng.integers(0, 2, (B, S)).astype(dtype)
    return f


@pytest.mark.parametrize("style,segments,dtype,ln_op", [
    ("google", True, np.int32, False),   # one-hot token types, Slice positions, raw LN
    ("google", False, np.int32, True),
    ("hf", True, np.int64, False),       # gathers, Range positions, int64 ids
    ("hf", True, np.int32, True),
])
def test_embed_layernorm_fuses(rng, seed, style, segments, dtype, ln_op):
    model = embed_model(rng, style, segments, dtype, ln_op=ln_op)
    fused, _ = fuse(model, LayerNormFusion(), EmbedLayerNormFusion())
    c = census(fused)
    assert c[(MS, "EmbedLayerNormalization")] == 1, c
    for op in ("Gather", "OneHot", "LayerNormalization", "Add", "MatMul", "ReduceMean"):
        assert c[("", op)] == 0, c
    casts = (2 if segments else 1) if dtype == np.int64 else 0
    assert c[("", "Cast")] == casts, c
    assert_same(model, fused, embed_feeds(rng, dtype, segments), seed)


@pytest.mark.parametrize("style", ["google", "hf"])
def test_embed_layernorm_positions_not_from_zero_is_not_fused(rng, seed, style):
    model = embed_model(rng, style, pos_start=1)
    fused, report = fuse(model, LayerNormFusion(), EmbedLayerNormFusion())
    assert count(fused, "EmbedLayerNormalization", MS) == 0
    assert missed(report, "embed_layernorm")
    assert_same(model, fused, embed_feeds(rng), seed)


def test_embed_layernorm_sum_read_outside_stays_correct(rng, seed):
    model = embed_model(rng, "google", sum_out="emb_sum")
    fused, _ = fuse(model, LayerNormFusion(), EmbedLayerNormFusion())
    assert {o.name for o in fused.graph.output} == {"emb", "emb_sum"}
    assert_same(model, fused, embed_feeds(rng), seed)


def test_embed_layernorm_from_layernorm_without_beta(rng, seed):
    model = embed_model(rng, "hf", ln_op=True, with_beta=False)
    fused, _ = fuse(model, EmbedLayerNormFusion())
    assert count(fused, "EmbedLayerNormalization", MS) == 1, census(fused)
    assert_same(model, fused, embed_feeds(rng), seed)


# ---------------------------------------------------------------------------- Attention


def attn_model(rng, mask_dtype=np.int32, has_mask=True, probs=None, x3d=False, **kw):
    g = G("attention")
    x = g.input("hidden", np.float32, ["B", "S", H] if x3d else ["BS", H])
    mask = g.input("input_mask", mask_dtype, ["B", "S"]) if has_mask else None
    shape_from = None
    if not has_mask:
        shape_from = g.input("input_ids", np.int32, ["B", "S"])
    w = attention_weights(rng, H)
    attention(g, x, mask, w, H, N, shape_from=shape_from,
              probs_out="probs" if probs else None, **kw)
    g.rename_last("ctx")
    g.output("ctx")
    if probs == "output":
        g.output("probs")
    elif probs == "node":
        g.op("ReduceSum", "probs", g.ints(-1), keepdims=0, out="probs_max")
        g.output("probs_max")
    return g.model(), w


def attn_feeds(rng, mask_dtype=np.int32, seq=S, x3d=False):
    x = rng.standard_normal((B, seq, H) if x3d else (B * seq, H)).astype(np.float32)
    return {"hidden": x, "input_mask": mask_rows(B, seq, rng).astype(mask_dtype),
            "input_ids": np.zeros((B, seq), np.int32)}


ATTN_CASES = {
    "mask_1e4": dict(mask_kind="10000"),
    "mask_1e9": dict(mask_kind="1e9"),
    "mask_f32min": dict(mask_kind="fmin"),
    "mask_google_BSS": dict(mask_kind="google"),
    "mask_where": dict(mask_kind="where"),
    "mask_where_inverted": dict(mask_kind="where_neg"),
    "mask_add_swapped": dict(adder_first=True),
    "bias_add_swapped": dict(bias_first=True),
    "mask_int64": dict(mask_dtype=np.int64),
    "no_mask": dict(has_mask=False, mask_kind="none"),
    "scale_mul_swapped": dict(const_first=True),
    "q_prescaled": dict(q_prescale=True),
    "q_prescaled_mul_swapped": dict(q_prescale=True, const_first=True),
    "kt_two_transposes": dict(kt="0213+0132"),
    "score_div_sqrt_d": dict(score_div=True),
    "const_head_split": dict(const_seq=S),
    "mask_bool": dict(mask_dtype=np.bool_, mask_kind="1e9"),
    "mask_bool_where": dict(mask_dtype=np.bool_, mask_kind="where"),
    # transformers' TFBertSelfAttention: 3-D x, reshape (batch,-1,N,D), Div sqrt(D), f32 min
    "hf_3d": dict(x3d=True, hf=True, mask_dtype=np.int64, mask_kind="fmin", score_div=True),
}


@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_attention_fuses(rng, seed, case):
    kw = dict(ATTN_CASES[case])
    mask_dtype = kw.pop("mask_dtype", np.int32)
    has_mask = kw.pop("has_mask", True)
    x3d = kw.get("x3d", False)
    model, w = attn_model(rng, mask_dtype, has_mask, **kw)
    fused, report = fuse(model, AttentionFusion())
    c = census(fused)
    assert c[(MS, "Attention")] == 1, (c, report.diagnostics)
    for op in ("Softmax", "MatMul", "Transpose", "Where", "Erf"):
        assert c[("", op)] == 0, c
    att = node(fused, "Attention")
    assert attr(att, "num_heads") == N
    assert attr(att, "scale") is None  # 1/sqrt(D) is the default
    if has_mask:
        assert len(att.input) == 4 and attr(att, "mask_filter_value") == -10000.0
        assert c[("", "Cast")] == (0 if mask_dtype == np.int32 else 1)  # to int32
    else:
        assert len(att.input) == 3 and attr(att, "mask_filter_value") is None
    if x3d:  # already [B,S,H]: no reshapes around the node
        assert c[("", "Reshape")] == 0, c
    feeds = attn_feeds(rng, mask_dtype, x3d=x3d)
    got = assert_same(model, fused, feeds, seed)
    if has_mask:
        ref = attention_ref(feeds["hidden"], feeds["input_mask"].astype(np.float64), w, N)
    else:
        ref = np.concatenate([attention_ref(r, None, w, N)
                              for r in feeds["hidden"].reshape(B, S, H)])
    assert np.abs(got["ctx"].reshape(ref.shape) - ref).max() <= TOL


def test_attention_hf_stable_softmax_shift_fuses(rng, seed):
    model, _ = attn_model(rng, np.int64, x3d=True, hf=True, mask_kind="fmin", score_div=True,
                          softmax_shift=1e-9)
    fused, report = fuse(model, AttentionFusion())
    assert_same(model, fused, attn_feeds(rng, np.int64, x3d=True), seed)
    assert count(fused, "Attention", MS) == 1, report.diagnostics


@pytest.mark.parametrize("q_prescale", [False, True], ids=["scores", "q"])
def test_attention_non_default_scale_is_an_attribute(rng, seed, q_prescale):
    model, w = attn_model(rng, scale=0.2, q_prescale=q_prescale)
    fused, _ = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 1
    assert attr(node(fused, "Attention"), "scale") == pytest.approx(0.2, rel=1e-6)
    feeds = attn_feeds(rng)
    got = assert_same(model, fused, feeds, seed)
    ref = attention_ref(feeds["hidden"], feeds["input_mask"], w, N, scale=0.2)
    assert np.abs(got["ctx"] - ref).max() <= TOL


def test_attention_qk_packing_order(rng, seed):
    """Q and K blocks of the packed [H, 3H] weight must be in Q, K, V order: swapping them
    in the fused model must show up as a large difference."""
    model, _ = attn_model(rng)
    fused, _ = fuse(model, AttentionFusion())
    feeds = attn_feeds(rng)
    assert_same(model, fused, feeds, seed)
    att = node(fused, "Attention")
    inits = {t.name: t for t in fused.graph.initializer}
    swapped = onnx.ModelProto()
    swapped.CopyFrom(fused)
    for slot in (1, 2):
        t = next(t for t in swapped.graph.initializer if t.name == att.input[slot])
        a = onnx.numpy_helper.to_array(inits[att.input[slot]])
        q, k, v = np.split(a, 3, axis=-1)
        t.CopyFrom(onnx.numpy_helper.from_array(np.concatenate([k, q, v], axis=-1), t.name))
    diff = np.abs(run(swapped, feeds)["ctx"] - run(model, feeds)["ctx"]).max()
    assert diff > 1e-2, f"a Q/K swap changes the output by only {diff:.3g} (seed {seed})"


def test_attention_probabilities_read_by_another_node_is_not_fused(rng, seed):
    model, _ = attn_model(rng, probs="node")
    fused, report = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 0
    assert count(fused, "Softmax") == 1
    assert any("probabilities" in r for r in missed(report, "attention"))
    assert_same(model, fused, attn_feeds(rng), seed)


def test_attention_probabilities_as_graph_output_stay_correct(rng, seed):
    model, _ = attn_model(rng, probs="output")
    fused, _ = fuse(model, AttentionFusion())
    assert_same(model, fused, attn_feeds(rng), seed)


def test_attention_probabilities_as_graph_output_is_not_fused(rng, seed):
    model, _ = attn_model(rng, probs="output")
    fused, _ = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 0


def test_attention_mask_that_special_cases_key0_is_not_taken_for_the_raw_mask(rng, seed):
    g = G("attention")
    x = g.input("hidden", np.float32, ["BS", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    w = attention_weights(rng, H)
    first = g.op("Slice", mask, g.ints(0), g.ints(1), g.ints(1))
    ones = g.op("Add", g.op("Mul", first, g.const(np.array(0, np.int32))),
                g.const(np.array(1, np.int32)))
    rest = g.op("Slice", mask, g.ints(1), g.ints(2**31 - 1), g.ints(1))
    cls_always = g.op("Concat", ones, rest, axis=1)  # "always attend [CLS]"
    attention(g, x, mask, w, H, N, adder_mask=cls_always)
    g.rename_last("ctx")
    g.output("ctx")
    model = g.model()
    fused, _ = fuse(model, AttentionFusion())
    feeds = attn_feeds(rng)
    assert feeds["input_mask"][2, 0] == 0  # row 2 pads key 0
    assert_same(model, fused, feeds, seed)


def test_attention_mask_not_large_negative_is_not_fused(rng, seed):
    model, _ = attn_model(rng, adder_value=5.0)  # (1 - m) * 5: not a mask adder
    fused, report = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 0
    assert any("mask" in r for r in missed(report, "attention"))
    assert_same(model, fused, attn_feeds(rng), seed)


@pytest.mark.parametrize("value", [-100.0, -3.0])
def test_attention_moderate_mask_constant_is_kept(rng, seed, value):
    # a mask constant above -10000 must reach mask_filter_value as is
    model, w = attn_model(rng, adder_value=value)
    fused, _ = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 1
    assert attr(node(fused, "Attention"), "mask_filter_value") == pytest.approx(value)
    feeds = attn_feeds(rng)
    got = assert_same(model, fused, feeds, seed)
    ref = attention_ref(feeds["hidden"], feeds["input_mask"], w, N, fill=value)
    assert np.abs(got["ctx"] - ref).max() <= TOL


# ------------------------------------------------------------------------ hidden_3d, encoder


def encoder_model(rng, layers=2, out2d=False):
    """3-D hidden input, flattened to [B*S,H], `layers` Google layers, unflattened back."""
    g = G("encoder")
    x3 = g.input("x", np.float32, ["B", "S", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    h = g.op("Reshape", x3, g.ints(-1, H))
    for _ in range(layers):
        h = encoder_layer(g, h, mask, layer_weights(rng, H, INTER), H, N)
    if out2d:
        g.output(h)
    g.op("Reshape", h, g.op("Concat", g.op("Shape", mask), g.ints(H), axis=0), out="y")
    g.output("y")
    return g.model()


def encoder_feeds(rng):
    return {"x": rng.standard_normal((B, S, H)).astype(np.float32),
            "input_mask": mask_rows(B, S, rng)}


def test_hidden_3d_removes_flatten_unflatten_of_two_fused_layers(rng, seed):
    model = encoder_model(rng)
    fused, report = fuse(model)  # the default pipeline
    c = census(fused)
    assert c[(MS, "Attention")] == 2 and c[(MS, "SkipLayerNormalization")] == 4 and \
        c[(MS, "BiasGelu")] == 2, c
    assert c[("", "Reshape")] == 0, c
    assert not missed(report, "hidden_3d")
    assert report.table.layers and all(l.fused for l in report.table.layers)
    assert_same(model, fused, encoder_feeds(rng), seed)


def test_hidden_3d_keeps_reshapes_when_a_2d_tensor_is_an_output(rng, seed):
    model = encoder_model(rng, layers=1, out2d=True)
    fused, report = fuse(model)
    assert count(fused, "Attention", MS) == 1
    assert count(fused, "Reshape") >= 2
    assert any("model output" in r for r in missed(report, "hidden_3d"))
    assert_same(model, fused, encoder_feeds(rng), seed)


def test_hidden_3d_flattened_tensor_as_graph_output(rng, seed):
    g = G("encoder")
    x3 = g.input("x", np.float32, ["B", "S", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    h = g.op("Reshape", x3, g.ints(-1, H), out="x2d")
    g.output("x2d")
    h = encoder_layer(g, h, mask, layer_weights(rng, H, INTER), H, N)
    g.op("Reshape", h, g.op("Concat", g.op("Shape", mask), g.ints(H), axis=0), out="y")
    g.output("y")
    model = g.model()
    fused, report = fuse(model)
    assert [i.name for i in fused.graph.input] == ["x", "input_mask"]
    assert any("model output" in r for r in missed(report, "hidden_3d")), report.diagnostics
    assert_same(model, fused, encoder_feeds(rng), seed)


def test_cleanup_identity_cast_and_reshape_chain(rng, seed):
    g = G("cleanup")
    x = g.input("x", np.float32, ["A", "C", 4])
    t = g.op("Identity", g.op("Cast", x, to=TensorProto.FLOAT))
    t = g.op("Reshape", g.op("Reshape", t, g.ints(-1, 4)), g.ints(-1, 2, 4))
    g.op("Relu", t, out="y")
    g.output("y")
    model = g.model()
    fused, _ = fuse(model, Cleanup())
    assert census(fused) == Counter({("", "Reshape"): 1, ("", "Relu"): 1}), census(fused)
    assert_same(model, fused, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}, seed)


def test_cleanup_reshape_chain_with_zero_dim(rng, seed):
    g = G("cleanup")
    x = g.input("x", np.float32, ["A", "C", 4])
    g.op("Reshape", g.op("Reshape", x, g.ints(-1, 4)), g.ints(0, -1), out="y")
    g.output("y")
    model = g.model()
    fused, _ = fuse(model, Cleanup())
    assert count(fused, "Reshape") == 2, census(fused)
    assert_same(model, fused, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}, seed)


def test_encoder_table_reports_an_unfused_layer(rng, seed):
    model = bert(rng, layers=2, broken_layer=1)
    fused, report = fuse(model)
    table = report.table
    assert table.embed_layernorm
    assert len(table.layers) == 2
    l0, l1 = table.layers
    assert l0.fused and l0.attention and l0.skip_layernorm == 2 and l0.gelu
    assert not l1.fused and not l1.attention
    assert l1.leftovers.get("Softmax") == 1
    assert any("probabilities" in r for r in l1.reasons), l1.reasons
    assert not table.fully_fused
    lines = table.unfused()
    assert len(lines) == 1 and lines[0].startswith("layer 1: attention") and \
        "probabilities" in lines[0], lines
    feeds = {"input_ids": rng.integers(0, 40, (B, S)).astype(np.int32),
             "segment_ids": rng.integers(0, 2, (B, S)).astype(np.int32),
             "input_mask": mask_rows(B, S, rng)}
    assert_same(model, fused, feeds, seed)


def bert_feeds(rng, dtype=np.int32):
    return {"input_ids": rng.integers(0, 40, (B, S)).astype(dtype),
            "segment_ids": rng.integers(0, 2, (B, S)).astype(dtype),
            "input_mask": mask_rows(B, S, rng, dtype)}


@pytest.mark.parametrize("gelu_form", ["erf_x_half", "tanh_pow"])
def test_whole_bert_fully_fused(rng, seed, gelu_form):
    model = bert(rng, gelu_form=gelu_form)
    fused, report = fuse(model)
    c = census(fused)
    want = {(MS, "EmbedLayerNormalization"): 1, (MS, "Attention"): 2,
            (MS, "SkipLayerNormalization"): 4,
            (MS, "BiasGelu" if gelu_form.startswith("erf") else "FastGelu"): 2,
            ("", "Gemm"): 1, ("", "Gather"): 1, ("", "Tanh"): 1, ("", "MatMul"): 6}
    assert c == Counter(want), c
    assert report.table.fully_fused, report.table.unfused()
    assert_same(model, fused, bert_feeds(rng), seed)


# ---------------------------------------------------------------------------- dense_gemm


def gemm_model(rng, rank, bias_first=False, first_token=False):
    g = G("gemm")
    x = g.input("x", np.float32, ["N", H] if rank == 2 else ["B", "S", H])
    if first_token:
        x = g.op("Squeeze", g.op("Slice", x, g.ints(0), g.ints(1), g.ints(1)), g.ints(1))
    y = dense(g, x, (rng.standard_normal((H, 8)) * 0.3).astype(np.float32), vec(rng, 8),
              bias_first=bias_first)
    g.op("Tanh", y, out="y")
    g.output("y")
    return g.model()


@pytest.mark.parametrize("bias_first", [False, True], ids=["Add(y,b)", "Add(b,y)"])
def test_dense_gemm_on_2d(rng, seed, bias_first):
    model = gemm_model(rng, 2, bias_first)
    fused, _ = fuse(model, DenseGemmFusion())
    assert census(fused) == Counter({("", "Gemm"): 1, ("", "Tanh"): 1}), census(fused)
    assert_same(model, fused, {"x": rng.standard_normal((B * S, H)).astype(np.float32)}, seed)


def test_dense_gemm_leaves_3d_matmul(rng, seed):
    model = gemm_model(rng, 3)
    fused, _ = fuse(model, DenseGemmFusion())
    assert census(fused) == Counter({("", "MatMul"): 1, ("", "Add"): 1, ("", "Tanh"): 1})
    assert_same(model, fused, {"x": rng.standard_normal((B, S, H)).astype(np.float32)}, seed)


def test_dense_gemm_first_token_pooler(rng, seed):
    model = gemm_model(rng, 3, first_token=True)
    fused, _ = fuse(model, DenseGemmFusion())
    assert census(fused) == Counter({("", "Gather"): 1, ("", "Gemm"): 1, ("", "Tanh"): 1}), \
        census(fused)
    assert_same(model, fused, {"x": rng.standard_normal((B, S, H)).astype(np.float32)}, seed)


# ---------------------------------------------------------------------------------- fp16


def test_fp16_int32_inputs_fp32_outputs_one_cast_each(rng, seed):
    model = bert(rng)
    fused, _ = run_passes(model, default_passes("fp16"))
    for i in fused.graph.input:
        assert i.type.tensor_type.elem_type == TensorProto.INT32, i.name
    outs = {o.name for o in fused.graph.output}
    for o in fused.graph.output:
        assert o.type.tensor_type.elem_type == TensorProto.FLOAT, o.name
    producers = {t: n for n in fused.graph.node for t in n.output}
    casts = [n for n in fused.graph.node if n.op_type == "Cast"]
    # exactly one Cast per output, and those are the only Casts (inputs are int32 already)
    assert sorted(n.output[0] for n in casts) == sorted(outs), [n.output for n in casts]
    for n in casts:
        assert attr(n, "to") == TensorProto.FLOAT
        assert not any(n.output[0] in m.input for m in fused.graph.node)  # at the very end
    # no Cast between fused ops: every com.microsoft op reads fp16 producers directly
    for n in fused.graph.node:
        if n.domain == MS:
            for t in n.input:
                assert t not in producers or producers[t].op_type != "Cast", (n.op_type, t)
    floats = [t for t in fused.graph.initializer if t.data_type == TensorProto.FLOAT]
    assert not floats, [t.name for t in floats]
    c = census(fused)
    assert c[(MS, "Attention")] == 2 and c[(MS, "EmbedLayerNormalization")] == 1
    feeds = bert_feeds(rng)
    want, got = run(model, feeds), run(fused, feeds)
    for name in want:
        assert got[name].dtype == np.float32
        diff = np.abs(got[name] - want[name]).max()
        assert diff < 5e-2, f"{name}: fp16 diff {diff:.3g} (seed {seed})"


def test_fp16_unfused_google_mask_loads(rng, seed):
    g = G("fp16_unfused")
    ids = g.input("input_ids", np.int32, ["B", "S"])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    x = g.op("Gather", g.const(rng.standard_normal((40, H)).astype(np.float32)), ids, axis=0)
    x = g.op("Reshape", x, g.ints(-1, H))
    attention(g, x, mask, attention_weights(rng, H), H, N, mask_kind="google",
              probs_out="probs")  # probabilities read outside: attention stays unfused
    g.rename_last("ctx")
    g.output("ctx")
    g.output("probs")
    model = g.model()
    fused, _ = run_passes(model, default_passes("fp16"))
    feeds = {"input_ids": rng.integers(0, 40, (B, S)).astype(np.int32),
             "input_mask": mask_rows(B, S, rng)}
    want, got = run(model, feeds), run(fused, feeds)
    assert np.abs(got["ctx"] - want["ctx"]).max() < 5e-2
