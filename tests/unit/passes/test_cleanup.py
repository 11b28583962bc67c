"""Cleanup: Identity, no-op Cast and Reshape chains.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from onnx import TensorProto

from bertfuse.passes.cleanup import Cleanup
from support.builders.onnx_graphs import G, census
from support.passes_common import assert_same, count, fuse, fused_in, missed


def test_cleanup_identity_cast_and_reshape_chain(rng, seed):
    g = G("cleanup")
    x = g.input("x", np.float32, ["A", "C", 4])
    t = g.op("Identity", g.op("Cast", x, to=TensorProto.FLOAT))
    t = g.op("Reshape", g.op("Reshape", t, g.ints(-1, 4)), g.ints(-1, 2, 4))
    g.op("Relu", t, out="y")
    g.output("y")
    model = g.model()
    fused, _ = fuse(model, Cleanup())
    assert census(fused) == Counter({("", "Reshape"): 1, ("", "Relu"): 1}), census(fused)
    assert_same(model, fused, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}, seed)


def test_cleanup_reshape_chain_with_zero_dim(rng, seed):
    g = G("cleanup")
    x = g.input("x", np.float32, ["A", "C", 4])
    g.op("Reshape", g.op("Reshape", x, g.ints(-1, 4)), g.ints(0, -1), out="y")
    g.output("y")
    model = g.model()
    fused, _ = fuse(model, Cleanup())
    assert count(fused, "Reshape") == 2, census(fused)
    assert_same(model, fused, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}, seed)


def test_cleanup_keeps_an_identity_from_input_to_output(rng, seed):
    g = G("cleanup")
    x = g.input("x", np.float32, ["A", 4])
    g.op("Identity", x, out="y")  # the model's output is its input, under another name
    g.output("y")
    g.op("Relu", g.op("Identity", x), out="z")
    g.output("z")
    model = g.model()
    fused, report = fuse(model, Cleanup())
    assert census(fused) == Counter({("", "Identity"): 1, ("", "Relu"): 1}), census(fused)
    assert [o.name for o in fused.graph.output] == ["y", "z"]
    (reason,) = missed(report, "cleanup")
    assert "kept for their names" in reason
    assert fused_in(report, "cleanup") == [None]  # the Identity before Relu went
    assert_same(model, fused, {"x": rng.standard_normal((3, 4)).astype(np.float32)}, seed)
