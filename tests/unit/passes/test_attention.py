"""AttentionFusion: the structural match of modeling.py's attention, every mask and scale form.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bertfuse.passes.attention import AttentionFusion
from support.builders.onnx_graphs import MS, G, attention, attention_ref, attention_weights, census, mask_rows
from support.passes_common import B, H, N, S, TOL, assert_same, attr, count, fuse, missed, node, run


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
