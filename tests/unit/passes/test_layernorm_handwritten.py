"""LayerNormFusion on hand-written Keras 2 LayerNorms (keras-bert, bert4keras).

    keras-layer-normalization:  d = x - mean(x); y = d / Sqrt(Max(mean(d*d) + eps, 0)) * γ + β
    bert4keras:                 the same with div_no_nan: Where(Equal(s, 0), 0, d / s)

The Max and Where guards are no-ops on LayerNorm's math (var + eps > 0), so these fuse; eps
added after the sqrt, a guard that clips, or a mean over another axis must not.
ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from bertfuse.passes.layernorm import LayerNormFusion
from support.builders.onnx_graphs import G, census, layernorm_ref
from support.passes_common import B, H, S, TOL, assert_same, attr, fuse, missed, node, vec


def keras_ln(rng, guard="max", divisor="div", eps=1e-12, eps_where="inside", axis=-1,
             clip=0.0, twice=False):
    g = G("ln")
    x = g.input("x", np.float32, ["B", "S", H])
    gamma, beta = vec(rng, H, 0.2, 1.0), vec(rng, H)
    mean = g.op("ReduceMean", x, axes=[axis], keepdims=1)
    d = g.op("Sub", x, mean)
    d2 = g.op("Sub", x, mean) if twice else d  # x - mean written once per use
    var = g.op("ReduceMean", g.op("Mul", d2, d2), axes=[axis], keepdims=1)
    if eps_where == "inside":
        inner = g.op("Add", var, eps)
        if guard in ("max", "where"):  # bert4keras writes both guards
            inner = g.op("Max", inner, clip)
        s = g.op("Sqrt", inner)
    else:  # (x - mean) / (sqrt(var) + eps): not LayerNorm's math
        s = g.op("Add", g.op("Sqrt", var), eps)
    if divisor == "div":
        n = g.op("Div", d, s)
    else:  # rsqrt then multiply
        n = g.op("Mul", d, g.op("Reciprocal", s))
    if guard == "where":  # tf.math.divide_no_nan
        n = g.op("Where", g.op("Equal", s, 0.0), 0.0, n)
    g.op("Add", g.op("Mul", n, g.const(gamma, np.float32, "gamma")),
         g.const(beta, np.float32, "beta"), out="y")
    g.output("y")
    return g.model(), gamma, beta


def feeds(rng):
    return {"x": (rng.standard_normal((B, S, H)) * 2.0 + 0.7).astype(np.float32)}


@pytest.mark.parametrize("guard,divisor,twice", [
    ("max", "div", False),     # keras-bert (keras-layer-normalization), x - mean read twice
    ("max", "div", True),      # x - mean computed twice
    ("where", "div", False),   # bert4keras: Max guard and div_no_nan
    ("none", "rsqrt", False),  # rsqrt then multiply
    ("where", "rsqrt", True),
])
def test_handwritten_layernorm_fuses(rng, seed, guard, divisor, twice):
    model, gamma, beta = keras_ln(rng, guard, divisor, eps=1e-12, twice=twice)
    fused, _ = fuse(model, LayerNormFusion())
    assert census(fused) == Counter({("", "LayerNormalization"): 1}), census(fused)
    assert attr(node(fused, "LayerNormalization"), "epsilon") == pytest.approx(1e-12, rel=1e-6)
    f = feeds(rng)
    got = assert_same(model, fused, f, seed)
    assert np.abs(got["y"] - layernorm_ref(f["x"], gamma, beta, 1e-12)).max() <= TOL


@pytest.mark.parametrize("case,reason", [
    # eps after the sqrt: x / (sqrt(v) + eps) is not x / sqrt(v + eps)
    (dict(eps_where="outside", eps=1e-3), "epsilon"),
    # a guard that clips the variance: Max(v + eps, 1) changes every row with v < 1
    (dict(clip=1.0), "LayerNorm"),
    # moments over the sequence axis
    (dict(axis=1), "LayerNorm"),
])
def test_not_layernorm_math_is_not_fused(rng, seed, case, reason):
    model, *_ = keras_ln(rng, **case)
    fused, report = fuse(model, LayerNormFusion())
    assert census(fused)[("", "LayerNormalization")] == 0, census(fused)
    assert census(fused)[("", "ReduceMean")] == 2
    reasons = missed(report, "layernorm")
    assert any(reason in r for r in reasons), reasons
    assert_same(model, fused, feeds(rng), seed)
