"""SkipLayerNormFusion: dense output + bias + residual, then LayerNorm.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from bertfuse.passes.layernorm import LayerNormFusion
from bertfuse.passes.skip_layernorm import SkipLayerNormFusion
from support.builders.onnx_graphs import MS, G, census, dense, layernorm
from support.passes_common import B, H, INTER, S, assert_same, attr, count, fuse, missed, node, vec


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
    fused, report = fuse(model, LayerNormFusion(), SkipLayerNormFusion())
    assert count(fused, "SkipLayerNormalization", MS) == 0
    assert count(fused, "LayerNormalization") == 1
    assert [r for r in missed(report, "skip_layernorm") if "read elsewhere" in r], \
        report.diagnostics
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


def test_skip_layernorm_without_a_dense_operand_is_missed(rng, seed):
    # LayerNorm(a + b) of two inputs: no dense layer, so no residual block (an embedding sum)
    g = G("sum")
    a = g.input("a", np.float32, ["N", H])
    r = g.input("residual", np.float32, ["N", H])
    g.op("LayerNormalization", g.op("Add", a, r), g.const(vec(rng, H, 0.2, 1.0)),
         g.const(vec(rng, H)), axis=-1, epsilon=1e-5, out="y")
    g.output("y")
    model = g.model()
    fused, report = fuse(model, SkipLayerNormFusion())
    assert count(fused, "SkipLayerNormalization", MS) == 0
    (reason,) = missed(report, "skip_layernorm")
    assert "dense layer" in reason, reason
    feeds = {"a": rng.standard_normal((B * S, H)).astype(np.float32),
             "residual": rng.standard_normal((B * S, H)).astype(np.float32)}
    assert_same(model, fused, feeds, seed)
