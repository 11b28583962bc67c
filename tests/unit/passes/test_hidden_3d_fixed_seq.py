"""Hidden3DPass on inputs of a fixed sequence length ([batch, 8], as bert-for-tf2's are): the
probe inputs then carry S = 8, and an unflatten to [B, 8, H] is back to [B, S, H].

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import numpy as np

from bertfuse.passes.hidden_3d import Hidden3DPass
from support.builders.onnx_graphs import G, census
from support.passes_common import B, H, assert_same, fuse, missed

FIXED = 8


def dense_model(rng, seq):
    """[B, S, H] -> Reshape[-1, H] -> MatMul + bias -> Reshape(Concat(Shape(mask), [H]))."""
    g = G("dense")
    x3 = g.input("x", np.float32, ["B", seq, H])
    mask = g.input("input_mask", np.int32, ["B", seq])
    h = g.op("Reshape", x3, g.ints(-1, H))
    h = g.op("Add", g.op("MatMul", h, rng.standard_normal((H, H)).astype(np.float32)),
             rng.standard_normal(H).astype(np.float32))
    g.op("Reshape", h, g.op("Concat", g.op("Shape", mask), g.ints(H), axis=0), out="y")
    g.output("y")
    return g.model()


def feeds(rng, seq):
    return {"x": rng.standard_normal((B, seq, H)).astype(np.float32),
            "input_mask": np.ones((B, seq), np.int32)}


def test_fixed_sequence_length_round_trip_goes(rng, seed):
    model = dense_model(rng, FIXED)
    fused, report = fuse(model, Hidden3DPass())
    assert census(fused)[("", "Reshape")] == 0, census(fused)
    assert not missed(report, "hidden_3d"), missed(report, "hidden_3d")
    assert_same(model, fused, feeds(rng, FIXED), seed)


def test_free_sequence_length_round_trip_still_goes(rng, seed):
    model = dense_model(rng, "S")
    fused, report = fuse(model, Hidden3DPass())
    assert census(fused)[("", "Reshape")] == 0, census(fused)
    assert_same(model, fused, feeds(rng, 5), seed)
