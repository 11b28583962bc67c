"""Dense layers without a bias (Keras' use_bias=False) or with a zero one folded away: the
math's bias 0, fused like any other (skip_layernorm.py, attention.py, gelu.py, and the
lowering to bertfuse's ops, bertfuse_encoder.py).

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from bertfuse.ops.evaluator import evaluate
from bertfuse.passes.bertfuse_encoder import BertfuseKernels
from bertfuse.passes.dense_gemm import GemmToMatMul
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan
from bertfuse.passes.skip_layernorm import SkipLayerNormFusion
from support.builders.onnx_graphs import MS, G, bert, census
from support.passes_common import B, H, INTER, S, assert_same, bert_feeds, count, fuse, \
    missed, node, vec


def keras_skip_model(rng, residual_first=False, gemm_zero_bias=False, sum_read=False):
    """LayerNorm(residual + dense(a)) with the dense layer as Keras' Tensordot writes it on
    [B, S, ·]: flatten, MatMul (or Gemm with a zero C), Reshape back, Squeeze-free; no bias."""
    g = G("keras_skip")
    r = g.input("residual", np.float32, ["B", "S", H])
    a = g.input("a", np.float32, ["B", "S", INTER])
    w = (rng.standard_normal((INTER, H)) / math.sqrt(INTER)).astype(np.float32)
    flat = g.op("Reshape", a, g.ints(-1, INTER))
    if gemm_zero_bias:
        mm = g.op("Gemm", flat, g.const(w), g.const(np.zeros(H, np.float32)))
    else:
        mm = g.op("MatMul", flat, g.const(w))
    d = g.op("Reshape", mm, g.op("Concat", g.op("Slice", g.op("Shape", a), g.ints(0),
                                                g.ints(2)), g.ints(H), axis=0))
    s = g.op("Add", r, d) if residual_first else g.op("Add", d, r)
    if sum_read:
        g.op("ReduceSum", s, g.ints(-1), keepdims=0, out="s_sum")
        g.output("s_sum")
    g.op("LayerNormalization", s, g.const(vec(rng, H, 0.2, 1.0)), g.const(vec(rng, H)),
         axis=-1, epsilon=1e-5, out="y")
    g.output("y")
    return g.model()


def keras_feeds(rng):
    return {"residual": rng.standard_normal((B, S, H)).astype(np.float32),
            "a": rng.standard_normal((B, S, INTER)).astype(np.float32)}


@pytest.mark.parametrize("residual_first", [False, True])
@pytest.mark.parametrize("gemm_zero_bias", [False, True])
def test_skip_layernorm_fuses_a_bias_free_tensordot(rng, seed, residual_first, gemm_zero_bias):
    model = keras_skip_model(rng, residual_first, gemm_zero_bias)
    fused, _ = fuse(model, GemmToMatMul(), SkipLayerNormFusion())
    ops = census(fused)
    assert ops[(MS, "SkipLayerNormalization")] == 1 and ops[("", "LayerNormalization")] == 0, ops
    assert ops[("", "Add")] == 0 and ops[("", "Gemm")] == 0, ops  # the zero bias is gone
    assert len(node(fused, "SkipLayerNormalization").input) == 4  # no bias input
    assert_same(model, fused, keras_feeds(rng), seed)


def test_bias_free_sum_read_elsewhere_is_not_fused(rng, seed):
    model = keras_skip_model(rng, sum_read=True)
    fused, report = fuse(model, SkipLayerNormFusion())
    assert count(fused, "SkipLayerNormalization", MS) == 0
    assert count(fused, "LayerNormalization") == 1
    assert [r for r in missed(report, "skip_layernorm") if "read elsewhere" in r], \
        report.diagnostics
    assert_same(model, fused, keras_feeds(rng), seed)


def test_bias_free_bert_is_fully_fused(rng, seed):
    """Every dense layer without a bias: Attention (zero QKV bias), SkipLayerNormalization
    without a bias input, Gelu (no bias to take), all on ORT equal to the unfused graph."""
    model = bert(rng, layers=2, biases=False)
    fused, report = run_passes(model, fusion_plan("fp32"))
    assert report.table.fully_fused, report.table
    ops = Counter(op for (_, op), n in census(fused).items() for _ in range(n))
    assert ops["Attention"] == 2 and ops["SkipLayerNormalization"] == 4, ops
    assert ops["Gelu"] + ops["BiasGelu"] == 2 and ops["EmbedLayerNormalization"] == 1, ops
    assert ops["Softmax"] == 0 and ops["LayerNormalization"] == 0, ops
    skips = [n for n in fused.graph.node if n.op_type == "SkipLayerNormalization"]
    assert all(len(n.input) < 5 or not n.input[4] for n in skips)
    assert_same(model, fused, bert_feeds(rng), seed)


def test_bias_free_bert_lowers_every_layer(rng):
    """The lowering gives the missing biases and betas as zeros: every layer in bertfuse's ops,
    equal to the contrib form through the NumPy references."""
    contrib, report = run_passes(bert(rng, layers=2, biases=False), fusion_plan("fp16"))
    assert report.table.fully_fused
    lowered, kreport = run_passes(contrib, [BertfuseKernels()])
    assert not [d for d in kreport.diagnostics if not d.fused], kreport.diagnostics
    ops = census(lowered)
    assert ops[("ai.bertfuse", "BertAttention")] == 2, ops
    assert ops[("ai.bertfuse", "DenseBiasSkipLayerNorm")] == 4, ops
    assert ops[("ai.bertfuse", "DenseBiasGelu")] == 2, ops
    feeds = bert_feeds(rng)
    want, got = evaluate(contrib, feeds), evaluate(lowered, feeds)
    for name, ref in want.items():
        d = np.abs(got[name].astype(np.float64) - ref)
        assert d.max() <= 4e-2 and d.mean() <= 2e-3, (name, d.max(), d.mean())
