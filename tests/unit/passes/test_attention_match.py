"""attention_match.py: attention found by evaluating the layer, where no structure matches.

Q scaled on the 2-D projection before the head split (as some exporters write it) defeats the
structural matcher; the numeric match must find the same layer, heads, scale and mask, and
must refuse what its float64 reference cannot reproduce (a wrong head count, another input for
K). Fused graphs run with ORT before and after.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from bertfuse.passes.attention import AttentionFusion
from bertfuse.passes.attention_match import AttentionMatch, match_numeric
from bertfuse.passes.match import MatchFailure
from support.builders.onnx_graphs import MS, G, attention, attention_ref, attention_weights, dense
from support.passes_common import B, H, N, S, TOL, assert_same, attr, count, fuse, missed, node, run
from unit.passes.test_attention import attn_feeds


def prescaled_model(rng, heads: int = N, mask_kind: str = "10000"):
    g = G("attention")
    x = g.input("hidden", np.float32, ["BS", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    w = attention_weights(rng, H)
    ctx = attention(g, x, mask, w, H, heads, q_scale_2d=True, mask_kind=mask_kind)
    _output_dense(g, rng, ctx)
    return g.model(), w


def _output_dense(g: G, rng, ctx: str) -> None:
    """The attention output dense layer (where the numeric match finds the layer's end)."""
    wo = (rng.standard_normal((H, H)) / math.sqrt(H)).astype(np.float32)
    dense(g, ctx, wo, (0.1 * rng.standard_normal(H)).astype(np.float32))
    g.rename_last("y")
    g.output("y")


def _softmax(graph: gs.Graph) -> gs.Node:
    (softmax,) = [n for n in graph.nodes if n.op == "Softmax"]
    return softmax


@pytest.mark.parametrize("mask_kind", ["10000", "fmin", "none"])
def test_numeric_match_finds_heads_scale_mask_and_qk_order(rng, seed, mask_kind):
    model, w = prescaled_model(rng, mask_kind=mask_kind)
    graph = gs.import_onnx(model)
    softmax = _softmax(graph)
    with pytest.raises(MatchFailure):  # structure fails here
        AttentionFusion().match_structure(graph, softmax)
    found = match_numeric(graph, softmax)
    assert isinstance(found, AttentionMatch), found
    assert (found.num_heads, found.head_size) == (N, H // N)
    assert found.scale == pytest.approx(1 / math.sqrt(H // N))
    assert np.array_equal(found.q.weight, w["wq"]) and np.array_equal(found.k.weight, w["wk"])
    assert np.array_equal(found.v.bias, w["bv"])
    if mask_kind == "none":
        assert found.mask_input is None
    else:
        assert found.mask_input.name == "input_mask"
    assert [c.op for c in found.output.outputs] == ["MatMul"]  # what the output dense reads


def test_numeric_match_fuses_with_parity(rng, seed):
    model, w = prescaled_model(rng)
    fused, report = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 1, report.diagnostics
    assert count(fused, "Softmax") == 0
    assert attr(node(fused, "Attention"), "num_heads") == N
    feeds = attn_feeds(rng)
    assert_same(model, fused, feeds, seed)
    # the context itself (the output dense's input) against the float64 reference
    ctx = fused.graph.node[[n.op_type for n in fused.graph.node].index("MatMul")].input[0]
    fused.graph.output.append(onnx.helper.make_tensor_value_info(ctx, onnx.TensorProto.FLOAT,
                                                                 None))
    got = run(fused, feeds)[ctx]
    ref = attention_ref(feeds["hidden"], feeds["input_mask"], w, N)
    assert np.abs(got.reshape(ref.shape) - ref).max() <= TOL


def test_wrong_head_count_cannot_be_chosen(rng, seed):
    # 4 heads of size 4: the match only tries heads of size >= 8, and none of those
    # reproduces the layer, so it must not fuse with 1 or 2 heads
    model, _ = prescaled_model(rng, heads=4)
    graph = gs.import_onnx(model)
    with pytest.raises(MatchFailure, match="reproduce"):
        match_numeric(graph, _softmax(graph))
    fused, report = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 0
    assert any("by evaluation" in r for r in missed(report, "attention"))
    assert_same(model, fused, attn_feeds(rng), seed)


def test_key_from_other_hidden_states_is_refused(rng, seed):
    g = G("attention")
    x = g.input("hidden", np.float32, ["BS", H])
    other = g.input("other", np.float32, ["BS", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    w = attention_weights(rng, H)
    d = H // N
    split = g.op("Concat", g.op("Shape", mask), g.ints(N, d), axis=0)

    def heads_of(src, wk, bk, perm):
        return g.op("Transpose", g.op("Reshape", dense(g, src, w[wk], w[bk]), split), perm=perm)

    q = heads_of(x, "wq", "bq", [0, 2, 1, 3])
    k = heads_of(other, "wk", "bk", [0, 2, 3, 1])  # K projects another tensor
    v = heads_of(x, "wv", "bv", [0, 2, 1, 3])
    probs = g.op("Softmax", g.op("Mul", g.op("MatMul", q, k), 1 / math.sqrt(d)), axis=-1)
    ctx = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    _output_dense(g, rng, g.op("Reshape", ctx, g.ints(-1, H)))
    model = g.model()
    graph = gs.import_onnx(model)
    softmax = _softmax(graph)
    with pytest.raises(MatchFailure, match="same input"):
        AttentionFusion().match_structure(graph, softmax)
    with pytest.raises(MatchFailure, match="same hidden states"):
        match_numeric(graph, softmax)
    with pytest.raises(MatchFailure, match="same input; by evaluation: .*same hidden states"):
        AttentionFusion().match(graph, softmax)  # both reasons, as the report gives them
    fused, _ = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 0
    feeds = attn_feeds(rng) | {"other": rng.standard_normal((B * S, H)).astype(np.float32)}
    assert_same(model, fused, feeds, seed)
