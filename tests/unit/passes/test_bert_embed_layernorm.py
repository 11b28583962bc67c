"""BertEmbedLayerNormFusion (passes/bert_embed_layernorm.py) and BertEmbedLayerNorm's reference
(ops/bertfuse/embed_layernorm.py): the contrib EmbedLayerNormalization of a lowered model
becomes bertfuse's op where nothing reads its extra outputs; the lowered model runs in the
ReferenceEvaluator against the contrib form it came from."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from bertfuse.ops.bertfuse import embed_layernorm as bert_embed
from bertfuse.ops.contrib import embed_layernorm as contrib
from bertfuse.ops.evaluator import evaluate
from bertfuse.passes.bert_embed_layernorm import BertEmbedLayerNormFusion
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import lowering_plan
from bertfuse.runtime.request_checks import model_facts
from support.passes_common import bert_feeds, fuse
from unit.passes.test_bertfuse_encoder import assert_fp16_same, contrib_fp16


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_reference_is_the_layernorm_of_the_three_lookups(rng):
    ids, segs = rng.integers(0, 6, (2, 3)).astype(np.int32), rng.integers(0, 2, (2, 3)).astype(np.int32)
    word, pos, seg = (rng.standard_normal((n, 8)).astype(np.float16) for n in (6, 4, 2))
    gamma, beta = rng.standard_normal(8).astype(np.float16), rng.standard_normal(8).astype(np.float16)
    e = word.astype(np.float64)[ids] + pos.astype(np.float64)[np.arange(3)] + \
        seg.astype(np.float64)[segs]
    want = (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + 1e-12) * gamma + beta
    got = bert_embed.reference64(ids, segs, word, pos, seg, gamma, beta)
    assert got.dtype == np.float64 and np.allclose(got, want, rtol=0, atol=1e-9)
    pos_ids = np.array([[3, 0, 1]], np.int32)  # broadcast over the batch
    e2 = e - pos.astype(np.float64)[np.arange(3)] + pos.astype(np.float64)[pos_ids[0]]
    got2 = bert_embed.reference64(ids, segs, word, pos, seg, gamma, beta, pos_ids)
    assert np.allclose(got2, (e2 - e2.mean(-1, keepdims=True)) /
                       np.sqrt(e2.var(-1, keepdims=True) + 1e-12) * gamma + beta, atol=1e-9)
    with pytest.raises(IndexError, match="input_ids"):
        bert_embed.reference64(ids + 6, segs, word, pos, seg, gamma, beta)


def test_the_embedding_becomes_bertfuses_op_and_agrees(rng):
    contrib_model = contrib_fp16(rng)
    lowered, report = run_passes(contrib_model, lowering_plan())
    onnx.checker.check_model(lowered)
    assert _ops(lowered).count("BertEmbedLayerNorm") == 1
    assert "EmbedLayerNormalization" not in _ops(lowered)
    node = next(n for n in lowered.graph.node if n.op_type == "BertEmbedLayerNorm")
    assert len(node.input) <= 8 and len(node.output) == 1
    assert [d.fused for d in report.diagnostics
            if d.component == "kernels_embed_layernorm"] == [True]
    feeds = bert_feeds(rng)
    assert_fp16_same(evaluate(contrib_model, feeds), evaluate(lowered, feeds), seed=0)
    # the runtime reads the tables' sizes off either op: the same facts
    assert model_facts(lowered).vocab_size == model_facts(contrib_model).vocab_size == 40


def test_a_read_mask_index_keeps_the_contrib_op_and_says_which_node(rng):
    model = contrib_fp16(rng)
    g = gs.import_onnx(model)
    embed = next(n for n in g.nodes if n.op == "EmbedLayerNormalization")
    if len(embed.outputs) < 2:
        embed.outputs.append(gs.Variable("mask_index", dtype=np.int32))
    g.outputs.append(embed.outputs[1].to_variable(dtype=np.int32, shape=["batch"]))
    model = gs.export_onnx(g)
    out, report = fuse(model, BertEmbedLayerNormFusion())
    (miss,) = report.diagnostics
    assert not miss.fused and embed.name in miss.reason and "mask_index" in miss.reason
    assert "BertEmbedLayerNorm" not in _ops(out)


def test_the_op_model_builds_every_slot_form():
    for types, rows in ((2, None), (None, 1), (3, 4)):
        m = bert_embed.make_model(4, 9, 16, 10, 12, types, rows)
        onnx.checker.check_model(m)
        names = [i.name for i in m.graph.input]
        assert ("segment_ids" in names) == (types is not None)
        assert ("position_ids" in names) == (rows is not None)
    assert contrib.DEFAULT_EPSILON == bert_embed.CONTRACT.attributes[0].default
