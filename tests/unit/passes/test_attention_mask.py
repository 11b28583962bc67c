"""attention_mask.py: the mask term split off the softmax input and checked on probe masks."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from bertfuse.passes.attention_mask import check_mask, split_mask
from bertfuse.passes.match import MatchFailure
from support.builders.onnx_graphs import F32_MIN, G, attention, attention_weights
from support.passes_common import H, N


def softmax_of(model) -> tuple[gs.Graph, gs.Node]:
    """The graph as the passes see it (after shape inference: the Where condition is bool)."""
    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(model))
    (softmax,) = [n for n in graph.nodes if n.op == "Softmax"]
    return graph, softmax


def attn(rng, mask_dtype=np.int32, **kw):
    g = G("attention")
    x = g.input("hidden", np.float32, ["BS", H])
    mask = g.input("input_mask", mask_dtype, ["B", "S"])
    attention(g, x, mask, attention_weights(rng, H), H, N, **kw)
    g.rename_last("ctx")
    g.output("ctx")
    return g.model()


@pytest.mark.parametrize("kw,value", [
    (dict(mask_kind="10000"), -10000.0),
    (dict(mask_kind="fmin"), F32_MIN),
    (dict(mask_kind="google"), -10000.0),      # ones[B,S,1] * mask[B,1,S]
    (dict(mask_kind="10000", adder_first=True), -10000.0),
    (dict(mask_kind="where"), -1e9),           # Where(mask, scores, -1e9)
    (dict(mask_kind="where_neg"), -1e9),       # Where(mask == 0, -1e9, scores)
    (dict(mask_kind="10000", softmax_shift=1e-9), -10000.0),  # shift-invariant: dropped
], ids=["1e4", "f32min", "google", "adder_first", "where", "where_neg", "shift"])
def test_mask_forms_are_split_and_read(rng, kw, value):
    graph, softmax = softmax_of(attn(rng, **kw))
    scores, term = split_mask(softmax.inputs[0])
    assert term is not None
    assert scores.inputs[0].op in ("Mul", "Div", "MatMul")  # the scaled scores, not the mask
    mask_input, c = check_mask(graph, term)
    assert mask_input.name == "input_mask"
    assert c == pytest.approx(value, rel=1e-6)


def test_no_mask_leaves_the_scores():
    graph, softmax = softmax_of(attn(np.random.default_rng(0), mask_kind="none"))
    scores, term = split_mask(softmax.inputs[0])
    assert term is None and scores is softmax.inputs[0]


@pytest.mark.parametrize("value,reason", [(5.0, "not one large negative"),
                                          (-0.5, "not one large negative")])
def test_adder_that_is_not_a_mask_is_refused(rng, value, reason):
    graph, softmax = softmax_of(attn(rng, mask_kind="10000", adder_value=value))
    _, term = split_mask(softmax.inputs[0])
    with pytest.raises(MatchFailure, match=reason):
        check_mask(graph, term)


def test_mask_that_special_cases_key0_is_refused(rng):
    g = G("attention")
    x = g.input("hidden", np.float32, ["BS", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    first = g.op("Slice", mask, g.ints(0), g.ints(1), g.ints(1))
    ones = g.op("Add", g.op("Mul", first, g.const(np.array(0, np.int32))),
                g.const(np.array(1, np.int32)))
    rest = g.op("Slice", mask, g.ints(1), g.ints(2**31 - 1), g.ints(1))
    attention(g, x, mask, attention_weights(rng, H), H, N,
              adder_mask=g.op("Concat", ones, rest, axis=1))  # "always attend [CLS]"
    g.rename_last("ctx")
    g.output("ctx")
    graph, softmax = softmax_of(g.model())
    _, term = split_mask(softmax.inputs[0])
    # key 0 is never masked: the padded positions do not all get one constant
    with pytest.raises(MatchFailure, match="padded positions get"):
        check_mask(graph, term)
