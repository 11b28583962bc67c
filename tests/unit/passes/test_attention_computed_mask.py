"""Attention whose mask is computed in the graph from the token ids (bert4keras):

    ids ─► Equal(0) ─► Not ─► Slice[:, 1:] ─┐
          ConstantOfShape(true)[B, 1] ──────┴► Concat ─► m[B, S] ─► (1 - m) * c | Where ─► Softmax

m is 0/1 by construction, so Attention reads it (cast to int32) as its raw mask, in the
modeling.py arrangement (structural match) and in the one only evaluation matches. Refused:
raw ids used as the mask (not 0/1) and a 0/1 mask on the query axis, each with a reason that
names the node. ORT before/after on ids with zeros at key 0, in the middle and at the end.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, numpy_helper

from bertfuse.passes.attention import AttentionFusion
from bertfuse.passes.attention_mask import is_binary
from support.builders.onnx_graphs import MS, G, attention, attention_ref, attention_weights, \
    mask_rows
from support.passes_common import B, H, N, S, TOL, assert_same, attr, count, fuse, missed, run
from unit.passes.test_attention_match import _output_dense


def _kept_mask(g: G, ids: str) -> tuple[str, str]:
    """bert4keras' mask: ids != 0 with key 0 always kept (bool [B, S]); and its Concat node."""
    keep = g.op("Not", g.op("Equal", ids, g.const(np.array(0, np.int32))))
    rows = g.op("Concat", g.op("Slice", g.op("Shape", ids), g.ints(0), g.ints(1)), g.ints(1),
                axis=0)
    first = g.op("ConstantOfShape", rows, value=numpy_helper.from_array(np.array([True])))
    m = g.op("Concat", first, g.op("Slice", keep, g.ints(1), g.ints(2**31 - 1), g.ints(1)),
             axis=1)
    return m, g.nodes[-1].name


def computed_mask_model(rng, form: str, numeric: bool, query_axis: bool = False,
                        adder_value: float | None = None):
    """(model, weights, name of the mask's Concat node). form: 10000 | 1e9 (additive (1-m)*c
    on the Cast mask, c = adder_value if given), where (Where(m, scores, -1e9)), raw_ids
    ((1 - ids) * -10000)."""
    g = G("attention")
    x = g.input("hidden", np.float32, ["BS", H])
    ids = g.input("input_ids", np.int32, ["B", "S"])
    m, concat = _kept_mask(g, ids)
    w = attention_weights(rng, H)
    kw = dict(q_scale_2d=numeric, shape_from=ids)
    if form == "where":
        ctx = attention(g, x, m, w, H, N, mask_kind="where", **kw)
    elif form == "raw_ids":
        ctx = attention(g, x, ids, w, H, N, mask_kind="10000", **kw)
    else:
        ctx = attention(g, x, ids, w, H, N, mask_kind=form, adder_value=adder_value,
                        adder_mask=g.op("Cast", m, to=TensorProto.FLOAT), **kw)
    if query_axis:  # m[b, i] over the queries: Unsqueeze axes (1, 3) instead of (1, 2)
        (unsq,) = [n for n in g.nodes if n.op_type == "Unsqueeze" and n.input[0] == m]
        unsq.input[1] = g.ints(1, 3)
    if numeric:
        _output_dense(g, rng, ctx)
    else:
        g.rename_last("ctx")
        g.output("ctx")
    return g.model(), w, concat


def ids_feeds(rng) -> dict[str, np.ndarray]:
    """Token ids 1..99 with zeros where mask_rows pads (row 2: key 0 too)."""
    mask = mask_rows(B, S, rng)
    ids = (rng.integers(1, 100, size=(B, S)) * mask).astype(np.int32)
    return {"hidden": rng.standard_normal((B * S, H)).astype(np.float32), "input_ids": ids}


def _kept(ids: np.ndarray) -> np.ndarray:
    keep = (ids != 0).astype(np.float64)
    keep[:, 0] = 1.0
    return keep


@pytest.mark.parametrize("numeric", [False, True], ids=["structural", "numeric"])
@pytest.mark.parametrize("form", ["10000", "1e9", "where"])
def test_computed_mask_fuses_as_attention_mask(rng, seed, form, numeric):
    model, w, concat = computed_mask_model(rng, form, numeric)
    fused, report = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 1, report.diagnostics
    assert count(fused, "Softmax") == 0
    (att,) = [n for n in fused.graph.node if n.op_type == "Attention"]
    assert attr(att, "mask_filter_value") == -10000.0
    made = {o: n for n in fused.graph.node for o in n.output}
    cast = made[att.input[3]]  # the computed mask, cast to int32, not the raw ids
    assert cast.op_type == "Cast" and attr(cast, "to") == TensorProto.INT32
    assert made[cast.input[0]].name == concat
    feeds = ids_feeds(rng)
    assert (feeds["input_ids"][:, 0] == 0).any() and (feeds["input_ids"] > 1).any()
    got = assert_same(model, fused, feeds, seed)
    if not numeric:  # the context itself against the float64 reference
        ref = attention_ref(feeds["hidden"], _kept(feeds["input_ids"]), w, N)
        assert np.abs(got["ctx"] - ref).max() <= TOL


@pytest.mark.parametrize("numeric", [False, True], ids=["structural", "numeric"])
def test_raw_ids_as_mask_are_not_fused(rng, seed, numeric):
    model, _, _ = computed_mask_model(rng, "raw_ids", numeric)
    graph = gs.import_onnx(model)
    (reader,) = [n.name for n in graph.nodes if n.op == "Cast" and
                 n.inputs[0].name == "input_ids"]
    fused, report = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 0
    (reason,) = missed(report, "attention")
    assert "input_ids holds token ids" in reason and reader in reason, reason
    assert_same(model, fused, ids_feeds(rng), seed)


@pytest.mark.parametrize("numeric", [False, True], ids=["structural", "numeric"])
def test_mask_on_the_query_axis_is_not_fused(rng, seed, numeric):
    model, _, concat = computed_mask_model(rng, "where", numeric, query_axis=True)
    fused, report = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 0
    (reason,) = missed(report, "attention")
    assert f"0/1 mask {concat}:" in reason, reason
    want = "key axis" if numeric else "expected [B, 1|N, 1|S, S]"
    assert want in reason, reason
    assert_same(model, fused, ids_feeds(rng), seed)


def test_computed_mask_below_10000_is_not_fused_by_evaluation(rng, seed):
    # (1 - m) * -100: Attention's fixed -10000 filter would not be the same math
    model, _, _ = computed_mask_model(rng, "10000", True, adder_value=-100.0)
    fused, report = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 0
    (reason,) = missed(report, "attention")
    # the last one tried names itself: the Cast of m nearest the scores
    assert re.search(r"0/1 mask Cast_\d+: padded keys' scores are lowered by 100,", reason), \
        reason
    assert_same(model, fused, ids_feeds(rng), seed)


def test_binary_by_construction():
    g = G("binary")
    ids = g.input("input_ids", np.int32, ["B", "S"])
    m, _ = _kept_mask(g, ids)
    cast = g.op("Cast", m, to=TensorProto.FLOAT)
    ones = g.const(np.ones((1, 1), np.float32))
    twos = g.const(np.full((1, 1), 2.0, np.float32))
    names = {"mask": m, "cast": cast, "raw": g.op("Cast", ids, to=TensorProto.FLOAT),
             "with_ones": g.op("Concat", cast, ones, axis=1),
             "with_twos": g.op("Concat", cast, twos, axis=1),
             "sum": g.op("Add", cast, cast)}
    for k, n in names.items():
        g.output(n, np.bool_ if k == "mask" else np.float32)
    tensors = gs.import_onnx(onnx.shape_inference.infer_shapes(g.model())).tensors()
    got = {k: is_binary(tensors[v]) for k, v in names.items()}
    assert got == {"mask": True, "cast": True, "raw": False, "with_ones": True,
                   "with_twos": False, "sum": False}
    assert run(g.model(), {"input_ids": np.array([[0, 3, 0]], np.int32)})[cast].tolist() == \
        [[1.0, 1.0, 0.0]]
