"""The numeric attention match must not take a masked layer for an unmasked one.

bert4keras masks keys where the token id is 0 but always keeps key 0 ([CLS]):

    mask' = Concat(ones[:, :1], mask[:, 1:]) ─► (1 - mask') * -10000 ─► Add(scores) ─► Softmax

Attention's mask_index cannot say "keep key 0", so no mask input reproduces the layer; with
the all-ones probe inputs "no mask" would, and fusing that drops the mask. The layer reads the
mask input's values, so the match is refused, and the graph computes what it did.
ORT before/after on the same random inputs: passes/common.py.
"""

from __future__ import annotations

import numpy as np

from bertfuse.passes.attention import AttentionFusion
from support.builders.onnx_graphs import MS, G, attention, attention_weights
from support.passes_common import H, N, assert_same, count, fuse, missed
from unit.passes.test_attention import attn_feeds
from unit.passes.test_attention_match import _output_dense


def key0_kept_model(rng):
    g = G("attention")
    x = g.input("hidden", np.float32, ["BS", H])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    first = g.op("Slice", mask, g.ints(0), g.ints(1), g.ints(1))
    kept = g.op("Concat", g.op("Add", g.op("Mul", first, g.const(np.array(0, np.int32))),
                               g.const(np.array(1, np.int32))),
                g.op("Slice", mask, g.ints(1), g.ints(2**31 - 1), g.ints(1)), axis=1)
    ctx = attention(g, x, mask, attention_weights(rng, H), H, N, q_scale_2d=True,
                    adder_mask=kept)
    _output_dense(g, rng, ctx)
    return g.model()


def test_mask_keeping_key0_is_not_fused_as_unmasked(rng, seed):
    model = key0_kept_model(rng)
    fused, report = fuse(model, AttentionFusion())
    assert count(fused, "Attention", MS) == 0, report.diagnostics
    reasons = missed(report, "attention")
    assert any("masked by an input" in r for r in reasons), reasons
    feeds = attn_feeds(rng)
    feeds["input_mask"][:, 0] = 0  # key 0 padded: where the two readings differ
    feeds["input_mask"][:, 1] = 1
    assert_same(model, fused, feeds, seed)
