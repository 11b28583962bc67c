"""SoftmaxFromExp: exp(x - max) / sum and exp(x) / sum over the last axis become Softmax.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from bertfuse.passes.softmax_from_exp import SoftmaxFromExp
from support.builders.onnx_graphs import G, census
from support.passes_common import B, S, assert_same, attr, fuse, missed, node


def softmax_model(max_op="ReduceMax", divide="Div", sum_axis=-1, max_axis=-1,
                  rank=3, sum_out=False, exp_out=False):
    """A keras-bert style softmax over scores of [B, S, S] (rank 3) or [B, N, S, S]."""
    g = G("softmax")
    shape = ["B", "S", "T"] if rank == 3 else ["B", "N", "S", "T"]
    x = g.input("x", np.float32, shape)
    if max_op == "ReduceMax":
        e = g.op("Exp", g.op("Sub", x, g.op("ReduceMax", x, axes=[max_axis], keepdims=1)))
    elif max_op == "GlobalMaxPool":  # tf2onnx's reduce_max over the last axis of rank 3
        e = g.op("Exp", g.op("Sub", x, g.op("GlobalMaxPool", x)))
    else:  # no max subtraction
        e = g.op("Exp", x)
    axes = sum_axis if isinstance(sum_axis, tuple) else (sum_axis,)
    s = g.op("ReduceSum", e, g.ints(*axes), keepdims=1)
    if divide == "Div":
        g.op("Div", e, s, out="y")
    else:  # e * (1 / s)
        g.op("Mul", e, g.op("Reciprocal", s), out="y")
    g.output("y")
    if sum_out:  # the sum is also a model output: read outside the softmax
        g.output(s)
    if exp_out:
        g.output(e)
    return g.model()


def feeds(rng, rank=3):
    shape = (B, S, S) if rank == 3 else (B, 2, S, S)
    return {"x": (rng.standard_normal(shape) * 3.0).astype(np.float32)}


@pytest.mark.parametrize("max_op,divide,rank", [
    ("ReduceMax", "Div", 3),       # keras-bert: exp(x - max) / sum
    ("GlobalMaxPool", "Div", 3),   # the same as tf2onnx writes reduce_max on rank 3
    ("none", "Div", 3),            # exp(x) / sum: the max is only numerics
    ("ReduceMax", "Reciprocal", 4),
    ("none", "Div", 4),
])
def test_softmax_forms_fuse(rng, seed, max_op, divide, rank):
    model = softmax_model(max_op, divide, rank=rank)
    fused, report = fuse(model, SoftmaxFromExp())
    assert census(fused) == Counter({("", "Softmax"): 1}), census(fused)
    assert attr(node(fused, "Softmax"), "axis") == -1
    f = feeds(rng, rank)
    got = assert_same(model, fused, f, seed, tol=1e-6)
    x = f["x"].astype(np.float64)
    want = np.exp(x - x.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    assert np.abs(got["y"] - want).max() <= 1e-6


@pytest.mark.parametrize("case,reason", [
    (dict(sum_axis=1), "last axis"),           # a sum over the query axis: not a softmax
    (dict(sum_axis=(1, 2)), "last axis"),      # a sum over both score axes
    (dict(sum_out=True), "read outside"),      # the sum is read elsewhere
    (dict(exp_out=True), "graph output"),      # the exponentials are read elsewhere
    (dict(max_axis=1), "max"),                 # max over another axis: exp(x - m) shifts rows
])
def test_not_a_softmax_is_not_fused(rng, seed, case, reason):
    model = softmax_model(**case)
    fused, report = fuse(model, SoftmaxFromExp())
    assert census(fused)[("", "Softmax")] == 0, census(fused)
    assert census(fused)[("", "Exp")] == 1
    reasons = missed(report, "softmax")
    assert any(reason in r for r in reasons), reasons
    assert_same(model, fused, feeds(rng), seed, tol=1e-6)


def test_exp_without_a_sum_is_not_a_candidate(rng, seed):
    g = G("exp")
    x = g.input("x", np.float32, ["B", "S", "T"])
    g.op("Exp", x, out="y")
    g.output("y")
    fused, report = fuse(g.model(), SoftmaxFromExp())
    assert census(fused) == Counter({("", "Exp"): 1})
    assert missed(report, "softmax") == []  # nothing to say about an exp alone
