"""LayerNormFusion: every elementwise form TF graphs take becomes LayerNormalization.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from bertfuse.passes.layernorm import LayerNormFusion
from support.builders.onnx_graphs import G, census, layernorm, layernorm_ref
from support.passes_common import B, H, S, TOL, assert_same, attr, count, fuse, missed, node, vec


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
