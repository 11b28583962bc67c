"""DenseGemmFusion: the pooler's first-token Slice+Squeeze and 2-D MatMul + bias.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from bertfuse.passes.dense_gemm import DenseGemmFusion, GemmToMatMul
from support.builders.onnx_graphs import G, census, dense
from support.passes_common import B, H, S, assert_same, fuse, fused_in, missed, vec


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
    fused, report = fuse(model, DenseGemmFusion())
    assert census(fused) == Counter({("", "MatMul"): 1, ("", "Add"): 1, ("", "Tanh"): 1})
    (reason,) = missed(report, "dense_gemm")
    assert "2-D" in reason, reason
    assert_same(model, fused, {"x": rng.standard_normal((B, S, H)).astype(np.float32)}, seed)


def test_dense_gemm_first_token_pooler(rng, seed):
    model = gemm_model(rng, 3, first_token=True)
    fused, _ = fuse(model, DenseGemmFusion())
    assert census(fused) == Counter({("", "Gather"): 1, ("", "Gemm"): 1, ("", "Tanh"): 1}), \
        census(fused)
    assert_same(model, fused, {"x": rng.standard_normal((B, S, H)).astype(np.float32)}, seed)


def gemm_node_model(rng, **attrs):
    g = G("gemm")
    x = g.input("x", np.float32, ["N", H])
    w = (rng.standard_normal((8, H) if attrs.get("transB") else (H, 8)) * 0.3).astype(np.float32)
    g.op("Gemm", x, g.const(w), g.const(vec(rng, 8)), out="y", **attrs)
    g.output("y")
    return g.model()


@pytest.mark.parametrize("attrs", [{}, {"transB": 1}, {"beta": 0.5}], ids=["plain", "transB", "beta"])
def test_gemm_to_matmul(rng, seed, attrs):
    model = gemm_node_model(rng, **attrs)
    fused, report = fuse(model, GemmToMatMul())
    assert census(fused) == Counter({("", "MatMul"): 1, ("", "Add"): 1}), census(fused)
    assert fused_in(report, "gemm_to_matmul") == [None]
    assert_same(model, fused, {"x": rng.standard_normal((B * S, H)).astype(np.float32)}, seed)


def test_gemm_with_alpha_stays_and_is_missed(rng, seed):
    model = gemm_node_model(rng, alpha=2.0)
    fused, report = fuse(model, GemmToMatMul())
    assert census(fused) == Counter({("", "Gemm"): 1})
    (reason,) = missed(report, "gemm_to_matmul")
    assert "alpha" in reason
    assert_same(model, fused, {"x": rng.standard_normal((B * S, H)).astype(np.float32)}, seed)


def test_dense_gemm_bias_not_1d_is_missed(rng, seed):
    g = G("gemm")
    x = g.input("x", np.float32, ["N", H])
    w = (rng.standard_normal((H, 8)) * 0.3).astype(np.float32)
    y = g.op("Add", g.op("MatMul", x, g.const(w)), g.const(vec(rng, 8).reshape(1, 8)))
    g.op("Tanh", y, out="y")
    g.output("y")
    model = g.model()
    fused, report = fuse(model, DenseGemmFusion())
    assert census(fused) == Counter({("", "MatMul"): 1, ("", "Add"): 1, ("", "Tanh"): 1})
    (reason,) = missed(report, "dense_gemm")
    assert "1-D bias" in reason, reason
    assert_same(model, fused, {"x": rng.standard_normal((B * S, H)).astype(np.float32)}, seed)


def test_dense_gemm_first_token_slice_read_elsewhere_is_missed(rng, seed):
    g = G("gemm")
    x = g.input("x", np.float32, ["B", "S", H])
    first = g.op("Slice", x, g.ints(0), g.ints(1), g.ints(1))
    g.op("ReduceSum", first, g.ints(-1), keepdims=0, out="first_sum")  # another reader
    g.output("first_sum")
    g.op("Tanh", g.op("Squeeze", first, g.ints(1)), out="y")
    g.output("y")
    model = g.model()
    fused, report = fuse(model, DenseGemmFusion())
    assert census(fused)[("", "Gather")] == 0, census(fused)
    (reason,) = missed(report, "first_token")
    assert "read elsewhere" in reason, reason
    assert_same(model, fused, {"x": rng.standard_normal((B, S, H)).astype(np.float32)}, seed)
