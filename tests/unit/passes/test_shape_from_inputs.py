"""ShapeFromInputs: a block kept alive only to be measured is cut, its shape rebuilt from a
[batch, seq] model input. ORT before/after on batch and sequence sizes other than the probes'."""

from __future__ import annotations

import numpy as np

from bertfuse.passes.shape_from_inputs import ShapeFromInputs
from support.builders.onnx_graphs import G
from support.passes_common import H, assert_same, count, fuse, fused_in, missed


def measured_model(dims: str = "bsh", with_ids: bool = True):
    """y = Reshape(x * 2 flattened, Shape(dead)) where `dead` (a Relu block) is read only by
    that Shape: dims 'bsh' gives dead [B,S,H]; 'b2sh' makes it [B,2S,H] (Concat on axis 1)."""
    g = G("measured")
    if with_ids:
        g.input("input_ids", np.int32, ["B", "S"])
    x = g.input("x", np.float32, ["B", "S", H])
    dead = g.op("Relu", g.op("Neg", x))
    if dims == "b2sh":
        dead = g.op("Concat", dead, dead, axis=1)
    flat = g.op("Reshape", g.op("Mul", x, 2.0), g.ints(-1, H))
    if dims == "b2sh":
        flat = g.op("Concat", flat, flat, axis=0)
    g.op("Reshape", flat, g.op("Shape", dead), out="y")
    g.output("y", shape=None)
    return g.model()


def feeds(rng, batch: int = 5, seq: int = 4):
    return {"input_ids": np.zeros((batch, seq), np.int32),
            "x": rng.standard_normal((batch, seq, H)).astype(np.float32)}


def test_dead_block_is_cut_and_its_shape_rebuilt(rng, seed):
    model = measured_model()
    fused, report = fuse(model, ShapeFromInputs())
    assert count(fused, "Relu") == 0 and count(fused, "Neg") == 0, fused.graph.node
    assert fused_in(report, "shape_from_inputs") == [None]
    assert [n.input[0] for n in fused.graph.node if n.op_type == "Shape"] == ["input_ids"]
    assert not missed(report, "shape_from_inputs")
    for batch, seq in ((5, 4), (1, 9)):
        assert_same(model, fused, feeds(rng, batch, seq), seed)


def test_shape_not_made_of_batch_and_seq_is_missed(rng, seed):
    model = measured_model("b2sh")
    fused, report = fuse(model, ShapeFromInputs())
    assert count(fused, "Relu") == 1  # the block stays: its shape is not rebuilt
    reasons = missed(report, "shape_from_inputs")
    assert len(reasons) == 1 and "not B, S, B*S or a constant" in reasons[0], reasons
    assert_same(model, fused, feeds(rng), seed)


def test_without_a_batch_seq_input_the_shape_is_missed(rng, seed):
    model = measured_model(with_ids=False)
    fused, report = fuse(model, ShapeFromInputs())
    assert count(fused, "Relu") == 1
    assert any("no [batch, seq]" in r for r in missed(report, "shape_from_inputs")), \
        report.diagnostics
    f = feeds(rng)
    del f["input_ids"]
    assert_same(model, fused, f, seed)
