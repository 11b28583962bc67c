"""EmbedLayerNormFusion: word + position + token-type lookups + LayerNorm.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.passes.embed_layernorm import EmbedLayerNormFusion
from bertfuse.passes.layernorm import LayerNormFusion
from support.builders.onnx_graphs import MS, G, census, embed_weights, embeddings
from support.passes_common import B, H, S, assert_same, count, fuse, missed


def embed_model(rng, style="google", segments=True, dtype=np.int32, pos_start=0,
                ln_op=False, sum_out=None, with_beta=True):
    g = G("embed")
    ids = g.input("input_ids", dtype, ["B", "S"])
    segs = g.input("segment_ids", dtype, ["B", "S"]) if segments else None
    w = embed_weights(rng, 40, 16, 2, H)
    embeddings(g, ids, segs, w, style=style, pos_start=pos_start, ln_op=ln_op,
               sum_out=sum_out)
    if ln_op and not with_beta:
        g.nodes[-1].input.pop()  # drop LayerNormalization's optional beta
    g.rename_last("emb")
    g.output("emb")
    if sum_out:
        g.output(sum_out)
    return g.model()


def embed_feeds(rng, dtype=np.int32, segments=True):
    f = {"input_ids": rng.integers(0, 40, (B, S)).astype(dtype)}
    if segments:
        f["segment_ids"] = rng.integers(0, 2, (B, S)).astype(dtype)
    return f


@pytest.mark.parametrize("style,segments,dtype,ln_op", [
    ("google", True, np.int32, False),   # one-hot token types, Slice positions, raw LN
    ("google", False, np.int32, True),
    ("hf", True, np.int64, False),       # gathers, Range positions, int64 ids
    ("hf", True, np.int32, True),
])
def test_embed_layernorm_fuses(rng, seed, style, segments, dtype, ln_op):
    model = embed_model(rng, style, segments, dtype, ln_op=ln_op)
    fused, _ = fuse(model, LayerNormFusion(), EmbedLayerNormFusion())
    c = census(fused)
    assert c[(MS, "EmbedLayerNormalization")] == 1, c
    for op in ("Gather", "OneHot", "LayerNormalization", "Add", "MatMul", "ReduceMean"):
        assert c[("", op)] == 0, c
    casts = (2 if segments else 1) if dtype == np.int64 else 0
    assert c[("", "Cast")] == casts, c
    assert_same(model, fused, embed_feeds(rng, dtype, segments), seed)


@pytest.mark.parametrize("style", ["google", "hf"])
def test_embed_layernorm_positions_not_from_zero_is_not_fused(rng, seed, style):
    model = embed_model(rng, style, pos_start=1)
    fused, report = fuse(model, LayerNormFusion(), EmbedLayerNormFusion())
    assert count(fused, "EmbedLayerNormalization", MS) == 0
    assert missed(report, "embed_layernorm")
    assert_same(model, fused, embed_feeds(rng), seed)


def test_embed_layernorm_sum_read_outside_stays_correct(rng, seed):
    model = embed_model(rng, "google", sum_out="emb_sum")
    fused, _ = fuse(model, LayerNormFusion(), EmbedLayerNormFusion())
    assert {o.name for o in fused.graph.output} == {"emb", "emb_sum"}
    assert_same(model, fused, embed_feeds(rng), seed)


def test_embed_layernorm_from_layernorm_without_beta(rng, seed):
    model = embed_model(rng, "hf", ln_op=True, with_beta=False)
    fused, _ = fuse(model, EmbedLayerNormFusion())
    assert count(fused, "EmbedLayerNormalization", MS) == 1, census(fused)
    assert_same(model, fused, embed_feeds(rng), seed)
