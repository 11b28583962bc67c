"""GeluFusion: exact and tanh GELU, any operand order, with the bias folded (BiasGelu/FastGelu/Gelu).

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import pytest

from bertfuse.passes.gelu import GeluFusion
from support.builders.onnx_graphs import MS, G, census, dense, gelu, gelu_ref
from support.passes_common import B, H, INTER, S, TOL, assert_same, count, fuse, missed, node, vec


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
