"""DenseFp32Output (passes/dense_fp32_output.py): the last DenseBiasSkipLayerNorm writes the fp32
graph output itself (slot 2, Y32), the fp16 pass's Cast folded in; the FP8 form keeps it and the
device-packed form unfolds it. Everything runs in the ReferenceEvaluator (ops/evaluator.py)."""

from __future__ import annotations

import numpy as np
import onnx

from bertfuse.ops.evaluator import evaluate
from bertfuse.passes.dense_fp32_output import DenseFp32Output
from bertfuse.passes.manager import run_passes
from bertfuse.passes.device_packing import PackingKernelsPass
from bertfuse.passes.plans import lowering_plan
from bertfuse.pipeline.fp8 import calibrate, dense_inputs, to_fp8
from support.passes_common import bert_feeds, fuse
from unit.passes.test_bertfuse_encoder import contrib_fp16, kernels


def _writer(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if name in n.output)


def test_the_output_cast_folds_into_the_last_layernorm(rng):
    contrib = contrib_fp16(rng)
    plain, _ = kernels(contrib)                      # the Cast still there
    folded, report = run_passes(contrib, lowering_plan())
    onnx.checker.check_model(folded)
    assert _writer(plain, "sequence_output").op_type == "Cast"
    last = _writer(folded, "sequence_output")
    assert last.op_type == "DenseBiasSkipLayerNorm" and list(last.output)[1:] == ["", "sequence_output"]
    # both output Casts fold: the last LayerNorm's and the pooler's (passes/bert_pooler.py)
    assert [n.op_type for n in plain.graph.node].count("Cast") == 2
    assert "Cast" not in [n.op_type for n in folded.graph.node]
    assert [d.fused for d in report.diagnostics if d.component == "kernels_fp32_output"] == \
        [True, True]
    # the pooler still reads the fp16 Y
    assert any(last.output[0] in n.input for n in folded.graph.node)
    feeds = bert_feeds(rng)
    want, got, before = evaluate(contrib, feeds), evaluate(folded, feeds), evaluate(plain, feeds)
    for name in want:
        d = np.abs(got[name].astype(np.float64) - want[name])
        assert got[name].dtype == np.float32 and np.isfinite(d).all() and d.max() <= 4e-2, name
    # Y32 is the value before its fp16 rounding: within half an fp16 step of the Cast's, not it
    y32, cast = got["sequence_output"], before["sequence_output"]
    step = np.abs(cast) * 2.0 ** -10 + 2.0 ** -24
    assert (np.abs(y32 - cast) <= step / 2 * 1.001).all()
    assert (y32.astype(np.float16).astype(np.float32) != y32).mean() > 0.9
    assert np.abs(got["pooled_output"] - before["pooled_output"]).max() <= 2e-3


def test_a_second_cast_of_the_same_y_stays_with_the_reason(rng):
    folded, _ = run_passes(contrib_fp16(rng), lowering_plan())
    again, report = fuse(folded, DenseFp32Output())
    assert report.diagnostics == []  # nothing left to fold, nothing recorded
    last = _writer(folded, "sequence_output")
    graph = again.graph
    graph.node.append(onnx.helper.make_node("Cast", [last.output[0]], ["extra"], to=1, name="extra_cast"))
    graph.output.append(onnx.helper.make_tensor_value_info("extra", onnx.TensorProto.FLOAT, None))
    _, report = fuse(again, DenseFp32Output())
    (miss,) = report.diagnostics
    assert not miss.fused and "already writes a Y32" in miss.reason and "extra_cast" in miss.reason


def test_fp8_keeps_y32_and_packing_unfolds_it(rng):
    contrib = contrib_fp16(rng)
    folded, _ = run_passes(contrib, lowering_plan())
    feeds = bert_feeds(rng)
    fp8 = to_fp8(folded, calibrate(contrib, dense_inputs(folded), feeds))
    last = _writer(fp8, "sequence_output")
    assert last.op_type == "DenseBiasSkipLayerNormFp8" and last.output[2] == "sequence_output"
    assert evaluate(fp8, feeds)["sequence_output"].dtype == np.float32

    packed, report = fuse(folded, PackingKernelsPass())
    assert all(d.fused for d in report.diagnostics)
    cast = _writer(packed, "sequence_output")
    assert cast.op_type == "Cast" and _writer(packed, cast.input[0]).op_type == "UnpackTokens"
    assert all(len(n.output) == 1 for n in packed.graph.node if n.op_type == "DenseBiasSkipLayerNorm")
    mask = feeds["input_mask"]
    want = evaluate(folded, feeds)
    got = evaluate(packed, {**feeds, "token_bucket": np.zeros(int(mask.sum()), np.int32)})
    keep = mask != 0
    d = np.abs(got["sequence_output"][keep].astype(np.float64) - want["sequence_output"][keep])
    assert np.isfinite(d).all() and d.max() <= 4e-2 and d.mean() <= 2e-3
