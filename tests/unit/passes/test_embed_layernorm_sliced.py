"""EmbedLayerNormFusion on positions sliced from the table: bert-for-tf2's embedding.

    input_ids [B, S] ─► Gather(word) ─┐
    segment_ids ─► Gather(type) ─► Add ─┐
    Slice(position_table, [0, 0], [S, -1]) ─► Reshape[1, S, H] ─► Add ─► LayerNormalization

bert-for-tf2 slices its table to the sequence length read from the ids' fixed shape (a
constant S); where the table is a constant the slice is folded to a [1, S, H] constant
before the passes run. A slice must start at row 0 and take S rows (S fixed, or computed from
the input's shape); otherwise the miss names the slice. ORT before/after on the same random
inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.passes.embed_layernorm import EmbedLayerNormFusion
from support.builders.onnx_graphs import MS, G, census, embed_weights
from support.passes_common import B, H, S, assert_same, fuse, missed

FIXED = 8  # bert-for-tf2's inputs are [batch, max_seq_len]
ROWS = 16  # position table rows (max_position_embeddings)
BIG = np.iinfo(np.int64).max  # tf2onnx's end for a size of -1


def sliced_model(rng, *, seq=FIXED, start=0, end=None, form="slice"):
    """form: 'slice' (a constant end), 'shape' (the end computed from Shape(input_ids)[1]),
    'folded' (the slice already a [1, S, H] constant)."""
    g = G("embed")
    ids = g.input("input_ids", np.int32, ["B", seq])
    segs = g.input("segment_ids", np.int32, ["B", seq])
    w = embed_weights(rng, 40, ROWS, 2, H)
    tokens = g.op("Add", g.op("Gather", g.const(w["word"], prefix="word_table"), ids, axis=0),
                  g.op("Gather", g.const(w["type"], prefix="type_table"), segs, axis=0))
    if form == "folded":
        pos = g.const(w["pos"][start:end][None], prefix="pos_rows")
    else:
        if form == "shape":
            length = g.op("Slice", g.op("Shape", ids), g.ints(1), g.ints(2))
            ends = g.op("Concat", g.op("Add", length, g.ints(start)), g.ints(BIG), axis=0)
        else:
            ends = g.ints(end, BIG)
        rows = g.op("Slice", g.const(w["pos"], prefix="pos_table"), g.ints(start, 0), ends)
        g.nodes[-1].name = "pos_slice"  # the node a miss must name
        pos = g.op("Reshape", rows, g.ints(1, -1, H))
    g.op("LayerNormalization", g.op("Add", tokens, pos), g.const(w["g"], prefix="gamma"),
         g.const(w["b"], prefix="beta"), axis=-1, epsilon=1e-12, out="emb")
    g.output("emb")
    return g.model()


def feeds(rng, seq=FIXED):
    return {"input_ids": rng.integers(0, 40, (B, seq)).astype(np.int32),
            "segment_ids": rng.integers(0, 2, (B, seq)).astype(np.int32)}


def _fused(model):
    fused, report = fuse(model, EmbedLayerNormFusion())
    return fused, report, census(fused)[(MS, "EmbedLayerNormalization")]


@pytest.mark.parametrize("form,seq", [("slice", FIXED), ("folded", FIXED), ("shape", "S")])
def test_positions_sliced_to_the_sequence_length_fuse(rng, seed, form, seq):
    model = sliced_model(rng, seq=seq, end=FIXED, form=form)
    fused, _, n = _fused(model)
    c = census(fused)
    assert n == 1, c
    for op in ("Gather", "Slice", "Reshape", "LayerNormalization", "Add"):
        assert c[("", op)] == 0, c
    assert_same(model, fused, feeds(rng, FIXED if form != "shape" else S), seed)


@pytest.mark.parametrize("form", ["slice", "shape"])
def test_slice_not_from_row_0_is_missed_naming_it(rng, seed, form):
    model = sliced_model(rng, start=1, end=FIXED + 1, form=form)
    fused, report, n = _fused(model)
    assert n == 0
    reasons = missed(report, "embed_layernorm")
    assert any("position slice pos_slice starts at row 1, not 0" in r for r in reasons), reasons
    assert_same(model, fused, feeds(rng), seed)


def test_slice_shorter_than_the_sequence_is_missed_naming_it(rng, seed):
    model = sliced_model(rng, end=1)  # row 0 added at every position (broadcast)
    fused, report, n = _fused(model)
    assert n == 0
    reasons = missed(report, "embed_layernorm")
    assert any("position slice pos_slice takes rows 0..0" in r and "input_ids is 8" in r
               for r in reasons), reasons
    assert_same(model, fused, feeds(rng), seed)


@pytest.mark.parametrize("form,names", [("slice", "position slice pos_slice"),
                                        ("folded", "constant position term")])
def test_seven_rows_with_a_free_sequence_length_are_missed(rng, seed, form, names):
    """7 rows (a constant end, or folded) on [B, S] ids: right only when S is 7 (the passes'
    probe length, so the sum's numeric check alone would pass)."""
    model = sliced_model(rng, seq="S", end=7, form=form)
    fused, report, n = _fused(model)
    assert n == 0
    reasons = missed(report, "embed_layernorm")
    assert any(names in r and "not fixed" in r for r in reasons), reasons
    assert_same(model, fused, feeds(rng, 7), seed)


def test_folded_rows_of_another_length_are_missed(rng, seed):
    """A [1, 1, H] constant: one vector at every position, not positions 0..S-1."""
    model = sliced_model(rng, end=1, form="folded")
    _, report, n = _fused(model)
    assert n == 0
    reasons = missed(report, "embed_layernorm")
    assert any("neither a lookup nor positions" in r for r in reasons), reasons
