"""EmbedLayerNormFusion on keras-bert's embedding: positions added as a tiled table slice.

    input_ids ─► Gather(word) ─┐
    segment_ids ─► Gather(type) ─► Add ─┐
    Slice(pos_table, 0:S) ─► Unsqueeze(0) ─► Tile([B, 1, 1]) ─► Add ─► LayerNormalization

keras-pos-embd's PositionEmbedding (mode ADD) tiles its [1, S, H] slice over the batch; the
tiled slice must still be rows 0..S-1 of the table (the sum's numeric check decides).
ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import numpy as np

from bertfuse.passes.embed_layernorm import EmbedLayerNormFusion
from support.builders.onnx_graphs import MS, G, census, embed_weights
from support.passes_common import B, H, S, assert_same, fuse, missed


def tiled_model(rng, start: int = 0):
    g = G("embed")
    ids = g.input("input_ids", np.int32, ["B", "S"])
    segs = g.input("segment_ids", np.int32, ["B", "S"])
    w = embed_weights(rng, 40, 16, 2, H)
    tokens = g.op("Add", g.op("Gather", g.const(w["word"], prefix="word_table"), ids, axis=0),
                  g.op("Gather", g.const(w["type"], prefix="type_table"), segs, axis=0))
    shape = g.op("Shape", tokens)
    seq = g.op("Slice", shape, g.ints(1), g.ints(2))
    ends = g.op("Concat", g.op("Add", seq, g.ints(start)), g.ints(H), axis=0)
    pos = g.op("Slice", g.const(w["pos"], prefix="pos_table"), g.ints(start, 0), ends,
               g.ints(0, 1))
    reps = g.op("Concat", g.op("Slice", shape, g.ints(0), g.ints(1)), g.ints(1, 1),
                axis=0)
    tiled = g.op("Tile", g.op("Unsqueeze", pos, g.ints(0)), reps)
    g.op("LayerNormalization", g.op("Add", tokens, tiled), g.const(w["g"], prefix="gamma"),
         g.const(w["b"], prefix="beta"), axis=-1, epsilon=1e-14, out="emb")
    g.output("emb")
    return g.model()


def feeds(rng, seq=S):
    return {"input_ids": rng.integers(0, 40, (B, seq)).astype(np.int32),
            "segment_ids": rng.integers(0, 2, (B, seq)).astype(np.int32)}


def test_tiled_position_slice_fuses(rng, seed):
    model = tiled_model(rng)
    fused, _ = fuse(model, EmbedLayerNormFusion())
    c = census(fused)
    assert c[(MS, "EmbedLayerNormalization")] == 1, c
    for op in ("Gather", "Tile", "Slice", "LayerNormalization", "Add"):
        assert c[("", op)] == 0, c
    assert_same(model, fused, feeds(rng), seed)


def test_tiled_positions_not_from_zero_are_not_fused(rng, seed):
    model = tiled_model(rng, start=1)  # rows 1..S: EmbedLayerNormalization reads 0..S-1
    fused, report = fuse(model, EmbedLayerNormFusion())
    assert census(fused)[(MS, "EmbedLayerNormalization")] == 0
    reasons = missed(report, "embed_layernorm")
    assert any("position" in r for r in reasons), reasons
    assert_same(model, fused, feeds(rng), seed)
