"""The default pipeline on whole tiny BERTs: fused op counts, the encoder table, parity.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from support.builders.onnx_graphs import MS, bert, census, mask_rows
from support.passes_common import B, S, assert_same, bert_feeds, fuse, fused_in


def test_encoder_table_reports_an_unfused_layer(rng, seed):
    model = bert(rng, layers=2, broken_layer=1)
    fused, report = fuse(model)
    table = report.table
    assert table.embed_layernorm
    assert len(table.layers) == 2
    l0, l1 = table.layers
    assert l0.fused and l0.attention and l0.skip_layernorm == 2 and l0.gelu
    assert not l1.fused and not l1.attention
    assert l1.leftovers.get("Softmax") == 1
    assert any("probabilities" in r for r in l1.reasons), l1.reasons
    assert not table.fully_fused
    lines = table.unfused()
    assert len(lines) == 1 and lines[0].startswith("layer 1: attention") and \
        "probabilities" in lines[0], lines
    feeds = {"input_ids": rng.integers(0, 40, (B, S)).astype(np.int32),
             "segment_ids": rng.integers(0, 2, (B, S)).astype(np.int32),
             "input_mask": mask_rows(B, S, rng)}
    assert_same(model, fused, feeds, seed)


@pytest.mark.parametrize("gelu_form", ["erf_x_half", "tanh_pow"])
def test_whole_bert_fully_fused(rng, seed, gelu_form):
    model = bert(rng, gelu_form=gelu_form)
    fused, report = fuse(model)
    c = census(fused)
    want = {(MS, "EmbedLayerNormalization"): 1, (MS, "Attention"): 2,
            (MS, "SkipLayerNormalization"): 4,
            (MS, "BiasGelu" if gelu_form.startswith("erf") else "FastGelu"): 2,
            ("", "Gemm"): 1, ("", "Gather"): 1, ("", "Tanh"): 1, ("", "MatMul"): 6}
    assert c == Counter(want), c
    assert report.table.fully_fused, report.table.unfused()
    assert_same(model, fused, bert_feeds(rng), seed)


def test_every_fusion_reports_its_layer(rng, seed):
    model = bert(rng, layers=2)
    fused, report = fuse(model)
    assert fused_in(report, "embed_layernorm") == [None]
    assert fused_in(report, "layernorm") == [None, 0, 0, 1, 1]  # the embeddings' first
    assert fused_in(report, "attention") == [0, 1]
    assert fused_in(report, "skip_layernorm") == [0, 0, 1, 1]
    assert fused_in(report, "gelu") == [0, 1]
    assert not [d for d in report.diagnostics if not d.fused and d.component in
                ("attention", "skip_layernorm", "gelu", "layernorm", "embed_layernorm")]
    records = {r.name: r.rewrites for r in report.records}
    assert records["skip_layernorm"] == 4 and records["gelu"] == 2, records
    assert_same(model, fused, bert_feeds(rng), seed)


def test_a_layer_whose_activation_is_not_gelu_is_reported_there(rng, seed):
    model = bert(rng, layers=3, not_gelu_layer=1)
    fused, report = fuse(model)
    l0, l1, l2 = report.table.layers
    assert l0.fused and l2.fused and not l1.fused
    assert l1.attention and l1.skip_layernorm == 2 and not l1.gelu
    assert l1.leftovers.get("Erf") == 1
    assert any(r.startswith("gelu: Erf is not part of") for r in l1.reasons), l1.reasons
    assert fused_in(report, "gelu") == [0, 2]
    lines = report.table.unfused()
    assert len(lines) == 1 and lines[0].startswith("layer 1: GELU not fused (gelu: "), lines
    assert_same(model, fused, bert_feeds(rng), seed)


def test_plans_name_every_form():
    from bertfuse.passes.plans import fp8_plan, fusion_plan, lowering_plan, packing_plan

    fp32 = [p.name for p in fusion_plan("fp32")]
    # multiple choice's flat rows are a graph input of their own while the fusions run
    assert fp32[:4] == ["choices", "cleanup", "einsum_matmul", "gemm_to_matmul"]
    assert fp32.index("layernorm") < fp32.index("attention") < fp32.index("skip_layernorm") < \
        fp32.index("hidden_3d") < fp32.index("tied_weights") < fp32.index("dense_gemm") < \
        len(fp32) - 1 - fp32[::-1].index("choices")
    assert [p.name for p in fusion_plan("fp16")] == fp32 + ["fp16", "cleanup", "shared_weights"]
    assert [p.name for p in lowering_plan()] == \
        ["bertfuse_kernels", "bert_embed_layernorm", "bert_pooler", "dense_fp32_output",
         "cleanup"]
    assert [p.name for p in fp8_plan({"x": 1.0})] == ["fp8_weights", "fp8_handoff", "cleanup"]
    assert fp8_plan({"x": 1.0})[0].x_amax == {"x": 1.0}
    assert [p.name for p in packing_plan(on_kernels=True)] == ["packing_kernels", "cleanup"]
    assert [p.name for p in packing_plan(on_kernels=False)] == ["packing", "cleanup"]
    a, b = fusion_plan("fp32"), fusion_plan("fp32")
    assert not {id(p) for p in a} & {id(p) for p in b}  # fresh passes: they keep run state


def test_a_later_plans_report_joins_the_first(rng):
    from bertfuse.passes.manager import run_passes
    from bertfuse.passes.plans import fusion_plan, lowering_plan

    contrib, report = run_passes(bert(rng, layers=2), fusion_plan("fp16"))
    before = (len(report.records), len(report.diagnostics), report.census_before)
    kmodel, more = run_passes(contrib, lowering_plan())
    report.join(more, kmodel)
    assert [r.name for r in report.records[before[0]:]] == \
        ["bertfuse_kernels", "bert_embed_layernorm", "bert_pooler", "dense_fp32_output",
         "cleanup"]
    assert report.diagnostics[before[1]:] == more.diagnostics
    assert any(d.component == "kernels_attention" and d.fused for d in report.diagnostics)
    assert report.census_before is before[2]  # still the first input's
    assert report.census_after == more.census_after and \
        report.census_after["ai.bertfuse.BertAttention"] == 2
    # the encoder table now describes the lowered model, from every diagnostic
    assert len(report.table.layers) == 2 and report.table.embed_layernorm
