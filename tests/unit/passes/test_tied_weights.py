"""TiedWeights: a decoder MatMul by a transposed copy of the embedding table reads the table
itself through Gemm(transB=1) (passes/tied_weights.py): stored once, same outputs.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.passes.cleanup import Cleanup
from bertfuse.passes.fp16 import Fp16Pass
from bertfuse.passes.shared_weights import SharedWeights
from bertfuse.passes.tied_weights import TiedWeights
from support.builders.onnx_graphs import G, census
from support.passes_common import B, H, S, assert_same, count, fuse, run

V = 40


def tied_model(rng, rank3=True, bias=True, bias_first=False, logits_read=False, off=False):
    """emb = table[ids]; logits = x @ tableᵀ (+ b), the transpose stored as its own
    initializer, as an export folds it. off: the copy differs in one value (not tied)."""
    g = G("tied")
    ids = g.input("ids", np.int32, ["B", "S"])
    x = g.input("x", np.float32, ["B", "S", H] if rank3 else ["N", H])
    table = rng.standard_normal((V, H)).astype(np.float32)
    g.op("Gather", g.const(table, prefix="table"), ids, axis=0, out="emb")
    g.output("emb")
    wt = np.ascontiguousarray(table.T).copy()
    if off:
        wt[0, 0] += 1.0
    y = g.op("MatMul", x, g.const(wt, prefix="decoder"))
    if logits_read:
        g.op("ReduceSum", y, g.ints(-1), keepdims=0, out="raw_sum")
        g.output("raw_sum")
    if bias:
        b = g.const(rng.standard_normal(V).astype(np.float32), prefix="bias")
        y = g.op("Add", b, y) if bias_first else g.op("Add", y, b)
    g.op("Identity", y, out="logits")
    g.output("logits")
    return g.model()


def feeds(rng, rank3=True):
    shape = (B, S, H) if rank3 else (B * S, H)
    return {"ids": rng.integers(0, V, (B, S)).astype(np.int32),
            "x": rng.standard_normal(shape).astype(np.float32)}


def big(model) -> list:
    return [i for i in model.graph.initializer if np.prod(i.dims) >= V * H]


@pytest.mark.parametrize("rank3", [True, False])
@pytest.mark.parametrize("bias,bias_first", [(True, False), (True, True), (False, False)])
def test_decoder_reads_the_table_once(rng, seed, rank3, bias, bias_first):
    model = tied_model(rng, rank3, bias, bias_first)
    assert len(big(model)) == 2
    fused, report = fuse(model, TiedWeights())
    assert [d.fused for d in report.diagnostics if d.component == "tied_weights"] == [True]
    (table,) = big(fused)
    (gemm,) = [n for n in fused.graph.node if n.op_type == "Gemm"]
    assert gemm.input[1] == table.name and len(gemm.input) == (3 if bias else 2)
    assert count(fused, "MatMul") == 0 and count(fused, "Add") == 0
    assert count(fused, "Reshape") == (2 if rank3 else 0), census(fused)
    assert_same(model, fused, feeds(rng, rank3), seed)


def test_raw_logits_read_elsewhere_keep_their_bias_add(rng, seed):
    model = tied_model(rng, logits_read=True)
    fused, _ = fuse(model, TiedWeights())
    assert len(big(fused)) == 1 and count(fused, "Gemm") == 1
    assert count(fused, "Add") == 1  # the bias stays outside: the raw product is read too
    assert_same(model, fused, feeds(rng), seed)


def test_a_weight_that_is_not_the_transpose_is_left_alone(rng, seed):
    model = tied_model(rng, off=True)
    fused, report = fuse(model, TiedWeights())
    assert len(big(fused)) == 2 and count(fused, "MatMul") == 1 and count(fused, "Gemm") == 0
    assert not [d for d in report.diagnostics if d.component == "tied_weights"]
    assert_same(model, fused, feeds(rng), seed)


def test_fp16_keeps_one_table(rng, seed):
    model = tied_model(rng)
    fused, _ = fuse(model, TiedWeights(), Fp16Pass(), Cleanup(), SharedWeights())
    (table,) = big(fused)
    assert table.data_type == 10  # FLOAT16
    f = feeds(rng)
    want, got = run(model, f), run(fused, f | {"x": f["x"].astype(np.float16)})
    for name in want:
        d = np.abs(got[name].astype(np.float64) - want[name])
        assert d.max() <= 4e-2 * max(1.0, np.abs(want[name]).max()), (name, d.max(), seed)
