"""BertPoolerFusion (passes/bert_pooler.py) and BertPooler's reference (ops/bertfuse/pooler.py):
the pooler's Gather, Gemm and Tanh become one op; the lowered model runs in the
ReferenceEvaluator against the contrib form it came from."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from bertfuse.ops.bertfuse import pooler
from bertfuse.ops.evaluator import evaluate
from bertfuse.passes.bert_pooler import BertPoolerFusion
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import lowering_plan
from support.passes_common import bert_feeds, fuse
from unit.passes.test_bertfuse_encoder import contrib_fp16, kernels


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_reference_is_tanh_of_the_first_tokens_dense_layer(rng):
    x = rng.standard_normal((3, 5, 16)).astype(np.float16)
    w = (rng.standard_normal((16, 8)) * 0.3).astype(np.float16)  # [K, N] as MatMul's B
    b = rng.standard_normal(8).astype(np.float16)
    want = np.tanh(x[:, 0].astype(np.float64) @ w.astype(np.float64) + b)
    got = pooler.reference64(x, np.ascontiguousarray(w.T), b)
    assert np.allclose(got, want, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="Wt"):
        pooler.reference64(x, w, b)  # [K, N] where [N, K] is due (K != N here)


def test_the_pooler_becomes_one_op_and_agrees(rng):
    contrib = contrib_fp16(rng)
    lowered, report = run_passes(contrib, lowering_plan())
    onnx.checker.check_model(lowered)
    assert _ops(lowered).count("BertPooler") == 1
    assert not {"Gather", "Gemm", "Tanh"} & set(_ops(lowered))
    node = next(n for n in lowered.graph.node if n.op_type == "BertPooler")
    assert list(node.output)[1:] == ["pooled_output"]  # the output Cast folded in
    assert [d.fused for d in report.diagnostics if d.component == "kernels_pooler"] == [True]
    feeds = bert_feeds(rng)
    want, got = evaluate(contrib, feeds), evaluate(lowered, feeds)
    plain = evaluate(kernels(contrib)[0], feeds)  # the same encoder, the pooler unfused
    d = np.abs(got["pooled_output"].astype(np.float64) - want["pooled_output"])
    assert got["pooled_output"].dtype == np.float32 and d.max() <= 4e-2 and d.mean() <= 2e-3
    # only the roundings differ from the unfused pooler: the Gemm's fp16 output and the Cast
    assert np.abs(got["pooled_output"] - plain["pooled_output"]).max() <= 2e-3


def test_a_scaled_gemm_misses_and_other_tanhs_are_no_candidates(rng):
    kmodel, _ = kernels(contrib_fp16(rng))
    gemm = next(n for n in kmodel.graph.node if n.op_type == "Gemm")
    gemm.attribute.append(helper.make_attribute("alpha", 0.5))
    model, report = fuse(kmodel, BertPoolerFusion())
    (miss,) = report.diagnostics
    assert not miss.fused and gemm.name in miss.reason and "scales" in miss.reason
    assert "BertPooler" not in _ops(model)
    # a Tanh that is no pooler's records nothing
    g = helper.make_graph([helper.make_node("Tanh", ["x"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT16, [2])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT16, [2])])
    _, report = fuse(helper.make_model(g), BertPoolerFusion())
    assert report.diagnostics == []
