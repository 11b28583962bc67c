"""Hidden3DPass: the [B,S,H] <-> [B*S,H] Reshape round trips of fused layers go.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import numpy as np

from support.builders.onnx_graphs import MS, G, census, encoder_layer, layer_weights, mask_rows
from support.passes_common import B, H, INTER, N, S, assert_same, count, fuse, missed


def encoder_model(rng, layers=2, out2d=False):
    """3-D hidden input, flattened to [B*S,H], `layers` Google layers, unflattened back."""
    g = G("encoder")
    x3 = g.input("x", np.float32, ["B", "S", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    h = g.op("Reshape", x3, g.ints(-1, H))
    for _ in range(layers):
        h = encoder_layer(g, h, mask, layer_weights(rng, H, INTER), H, N)
    if out2d:
        g.output(h)
    g.op("Reshape", h, g.op("Concat", g.op("Shape", mask), g.ints(H), axis=0), out="y")
    g.output("y")
    return g.model()


def encoder_feeds(rng):
    return {"x": rng.standard_normal((B, S, H)).astype(np.float32),
            "input_mask": mask_rows(B, S, rng)}


def test_hidden_3d_removes_flatten_unflatten_of_two_fused_layers(rng, seed):
    model = encoder_model(rng)
    fused, report = fuse(model)  # the default pipeline
    c = census(fused)
    assert c[(MS, "Attention")] == 2 and c[(MS, "SkipLayerNormalization")] == 4 and \
        c[(MS, "BiasGelu")] == 2, c
    assert c[("", "Reshape")] == 0, c
    assert not missed(report, "hidden_3d")
    assert report.table.layers and all(l.fused for l in report.table.layers)
    assert_same(model, fused, encoder_feeds(rng), seed)


def test_hidden_3d_keeps_reshapes_when_a_2d_tensor_is_an_output(rng, seed):
    model = encoder_model(rng, layers=1, out2d=True)
    fused, report = fuse(model)
    assert count(fused, "Attention", MS) == 1
    assert count(fused, "Reshape") >= 2
    assert any("model output" in r for r in missed(report, "hidden_3d"))
    assert_same(model, fused, encoder_feeds(rng), seed)


def test_hidden_3d_flattened_tensor_as_graph_output(rng, seed):
    g = G("encoder")
    x3 = g.input("x", np.float32, ["B", "S", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    h = g.op("Reshape", x3, g.ints(-1, H), out="x2d")
    g.output("x2d")
    h = encoder_layer(g, h, mask, layer_weights(rng, H, INTER), H, N)
    g.op("Reshape", h, g.op("Concat", g.op("Shape", mask), g.ints(H), axis=0), out="y")
    g.output("y")
    model = g.model()
    fused, report = fuse(model)
    assert [i.name for i in fused.graph.input] == ["x", "input_mask"]
    assert any("model output" in r for r in missed(report, "hidden_3d")), report.diagnostics
    assert_same(model, fused, encoder_feeds(rng), seed)


def test_hidden_3d_takes_a_heads_unflatten_to_minus_one_s_vocab(rng, seed):
    """transformers' masked-LM decoder unflattens its [B*S, vocab] product to [-1, S, vocab]
    (B left to the Reshape): still [B, S, ·], so the round trips go."""
    vocab = 24
    g = G("encoder")
    x3 = g.input("x", np.float32, ["B", "S", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    h = g.op("Reshape", x3, g.ints(-1, H))
    h = encoder_layer(g, h, mask, layer_weights(rng, H, INTER), H, N)
    w = rng.standard_normal((H, vocab)).astype(np.float32)
    logits = g.op("MatMul", h, g.const(w))
    seq = g.op("Slice", g.op("Shape", mask), g.ints(1), g.ints(2))
    g.op("Reshape", logits, g.op("Concat", g.ints(-1), seq, g.ints(vocab), axis=0), out="y")
    g.output("y")
    model = g.model()
    fused, report = fuse(model)
    assert count(fused, "Reshape") == 0, census(fused)
    assert not missed(report, "hidden_3d"), missed(report, "hidden_3d")
    assert_same(model, fused, encoder_feeds(rng), seed)
