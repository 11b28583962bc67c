"""Fp8Weights (passes/fp8_weights.py) and the calibration (fp8.py) on tiny fp16
encoders in the bertfuse form; the FP8 model runs through the NumPy references."""

from __future__ import annotations

import numpy as np
import onnx

from bertfuse.ops.bertfuse.dense_fp8 import E4M3_MAX
from bertfuse.ops.evaluator import evaluate
from bertfuse.pipeline.fp8 import calibrate, dense_inputs, to_fp8
from bertfuse.passes.bertfuse_encoder import BertfuseKernels
from bertfuse.passes.fp8_weights import Fp8Weights
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan
from support.builders.onnx_graphs import bert, census
from support.passes_common import attr, bert_feeds, fuse, run

BF = "ai.bertfuse"


def forms(rng, **kw):
    source = bert(rng, layers=2, **kw)
    contrib, _ = run_passes(source, fusion_plan("fp16"))
    kmodel, _ = fuse(contrib, BertfuseKernels())
    return source, contrib, kmodel


def test_every_dense_op_gets_fp8_weights_calibrated_on_the_inputs(rng, seed):
    source, contrib, kmodel = forms(rng, hidden=32, inter=64)
    feeds = bert_feeds(rng)
    names = dense_inputs(kmodel)
    assert len(names) == 8  # embeddings + per layer: attention out, LN1, GELU, LN2 (last unread)
    amax = calibrate(contrib, names, feeds)
    # the same maxima from the NumPy references on the same inputs
    ref = evaluate(contrib, feeds, outputs=names)
    for n in names:
        assert np.isclose(amax[n], np.abs(ref[n].astype(np.float32)).max(), rtol=2e-2), n
    fp8 = to_fp8(kmodel, amax)
    c = census(fp8)
    assert c[(BF, "DenseBiasFp8")] == 2 and c[(BF, "DenseBiasGeluFp8")] == 2
    assert c[(BF, "DenseBiasSkipLayerNormFp8")] == 4 and c[(BF, "BertAttention")] == 2
    assert not [op for (dom, op) in c if dom == BF and op in ("DenseBias", "DenseBiasGelu",
                                                               "DenseBiasSkipLayerNorm")]
    assert fp8.ir_version >= 9
    onnx.checker.check_model(fp8, full_check=True)
    per_op, _ = run_passes(kmodel, [Fp8Weights(amax)])  # before fp8_handoff renames the inputs
    for n in per_op.graph.node:
        if n.op_type.endswith("Fp8"):
            assert np.isclose(attr(n, "x_scale"), amax[n.input[0]] / E4M3_MAX, rtol=1e-6)
            assert attr(n, "fast_accum") == 1
        if n.op_type == "DenseBiasGeluFp8":  # the tanh GELU, cuBLASLt's epilogue
            assert attr(n, "approximate") == 1
    fp8_types = [i for i in fp8.graph.initializer if i.data_type == onnx.TensorProto.FLOAT8E4M3FN]
    assert len(fp8_types) == 8
    # accuracy: FP8's, against the fp32 source; a mis-calibrated scale (saturating) is worse
    want = run(source, feeds)
    got = evaluate(fp8, feeds)
    bad = evaluate(to_fp8(kmodel, {k: v / 8 for k, v in amax.items()}), feeds)
    fp16 = evaluate(kmodel, feeds)
    for name in want:
        # e4m3 keeps 3 mantissa bits: on this random graph (O(1) activations) about 10% of
        # the mean |output| (fp16: 0.1%); 8x too small a scale saturates and is far worse
        err = np.abs(got[name] - want[name])
        assert np.isfinite(err).all() and err.mean() < 0.2, (name, err.mean(), seed)
        assert err.mean() > 5 * np.abs(fp16[name] - want[name]).mean(), (name, seed)
        assert np.abs(bad[name] - want[name]).mean() > 3 * err.mean(), (name, seed)
    # the tanh GELU moves the FP8 outputs less than FP8 itself does (here, with O(1) random
    # activations, up to about half of it; on the BERT configs on the GPU FP8's error against
    # fp32 did not move measurably)
    erf = onnx.ModelProto()
    erf.CopyFrom(fp8)
    for n in erf.graph.node:
        for a in n.attribute:
            if n.op_type == "DenseBiasGeluFp8" and a.name == "approximate":
                a.i = 0
    erf_out = evaluate(erf, feeds)
    for name in want:
        moved = np.abs(erf_out[name] - got[name]).mean()
        assert moved < 0.75 * np.abs(got[name] - want[name]).mean(), (name, moved, seed)


def test_layers_and_misses(rng):
    _, contrib, kmodel = forms(rng, hidden=24, heads=2, inter=64)  # K = 24: not a multiple of 16
    amax = calibrate(contrib, dense_inputs(kmodel), bert_feeds(rng))
    ffn_down_1 = [n for n in kmodel.graph.node if n.op_type == "DenseBiasSkipLayerNorm"][3]
    amax.pop(ffn_down_1.input[0])  # layer 1's FFN-down input (K = 64) left uncalibrated
    fp8, report = run_passes(kmodel, [Fp8Weights(amax)])
    rows = [(d.layer, d.fused, d.reason) for d in report.diagnostics]
    k24 = [r for r in rows if "K = 24 is not a multiple of 16" in r[2]]
    assert sorted(r[0] for r in k24) == [0, 0, 0, 1, 1, 1]  # QKV (in its attention's layer),
    assert not any(r[1] for r in k24)                       # attention out, FFN up
    assert [r[:2] for r in rows if r[1]] == [(0, True)]      # layer 0's FFN down (K = 64)
    assert [(r[0], f"no calibration for {ffn_down_1.input[0]}" in r[2])
            for r in rows if not r[1] and r not in k24] == [(1, True)]
    c = census(fp8)
    assert c[(BF, "DenseBiasSkipLayerNormFp8")] == 1 and c[(BF, "DenseBiasSkipLayerNorm")] == 3
