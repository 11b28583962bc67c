"""Fp8Handoff (passes/fp8_handoff.py) on tiny FP8 encoders: which inputs arrive in e4m3 from
the op before, which stay quantised in the op and why, and that the numbers do not move."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bertfuse.ops.evaluator import evaluate
from bertfuse.passes.bertfuse_encoder import BertfuseKernels
from bertfuse.passes.cleanup import Cleanup
from bertfuse.passes.fp8_handoff import Fp8Handoff
from bertfuse.passes.fp8_weights import Fp8Weights
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan
from bertfuse.pipeline.fp8 import calibrate, dense_inputs, to_fp8
from support.builders.onnx_graphs import bert
from support.passes_common import attr, bert_feeds, fuse

E4M3 = onnx.TensorProto.FLOAT8E4M3FN


@pytest.fixture
def encoder(rng):
    contrib, _ = run_passes(bert(rng, layers=2, hidden=32, inter=64), fusion_plan("fp16"))
    kmodel, _ = fuse(contrib, BertfuseKernels())
    feeds = bert_feeds(rng)
    return kmodel, calibrate(contrib, dense_inputs(kmodel), feeds), feeds


def e4m3_values(model: onnx.ModelProto) -> set[str]:
    return {v.name for v in model.graph.value_info if v.type.tensor_type.elem_type == E4M3}


def test_dense_inputs_arrive_in_e4m3_and_the_numbers_do_not_move(encoder):
    kmodel, amax, feeds = encoder
    per_op, _ = run_passes(kmodel, [Fp8Weights(amax), Cleanup()])  # each op quantises its X
    chained, report = run_passes(per_op, [Fp8Handoff(), Cleanup()])
    onnx.checker.check_model(chained, full_check=True)
    nodes = {n.name: n for n in chained.graph.node}
    made = {out: n for n in chained.graph.node for out in n.output if out}
    handed = [n for n in chained.graph.node if n.op_type.endswith("Fp8") and n.input[0] in e4m3_values(chained)]
    # per layer: attention out (from the attention kernel), FFN up (from the attention-out
    # LayerNorm), FFN down (from the GELU); layer 1's QKV from layer 0's last LayerNorm
    assert sorted(n.op_type for n in handed) == ["DenseBiasFp8"] + ["DenseBiasGeluFp8"] * 2 + \
        ["DenseBiasSkipLayerNormFp8"] * 4
    assert sum(made[n.input[0]].op_type == "BertAttention" for n in handed) == 2
    # the GELU ops' Y and the attention's context, which nothing reads any more, are left off:
    # their last kernel writes only Yq
    dropped = [n for n in chained.graph.node if n.op_type in ("DenseBiasGeluFp8", "BertAttention")]
    assert len(dropped) == 4 and all(n.output[0] == "" and n.output[1] for n in dropped)
    assert all(n.output[0] for n in chained.graph.node if n not in dropped)
    for n in handed:
        p = made[n.input[0]]
        assert list(p.output).index(n.input[0]) == 1  # the producer's Yq slot
        assert attr(p, "yq_scale") == pytest.approx(attr(n, "x_scale"), rel=0, abs=0)
        assert p.output[0] in {i for m in chained.graph.node for i in m.input} or \
            p.op_type.startswith("DenseBiasGelu") or p.op_type == "BertAttention"  # Y feeds
        # the residual; the GELU's and the attention's Y nothing reads any more
    misses = [(d.layer, d.reason) for d in report.diagnostics if not d.fused]
    assert len(misses) == 1 and misses[0][0] == 0  # the first QKV, after the embedding op
    assert "EmbedLayerNorm" in misses[0][1] and "writes no e4m3 copy" in misses[0][1]
    assert any(name in misses[0][1] for name in nodes)  # it names the node
    # the hand-off writes the bytes the op's own quantise would: every output identical
    want, got = evaluate(per_op, feeds), evaluate(chained, feeds)
    for name in want:
        assert np.array_equal(want[name], got[name]), name


def test_the_fp8_plan_hands_off_and_a_wrong_scale_moves_the_numbers(encoder):
    kmodel, amax, feeds = encoder
    fp8 = to_fp8(kmodel, amax)
    assert len(e4m3_values(fp8)) == 7
    # a producer whose yq_scale disagrees with its reader's x_scale would change the result:
    # the scale is what ties the two together
    wrong = onnx.ModelProto()
    wrong.CopyFrom(fp8)
    scale = next(a for n in wrong.graph.node for a in n.attribute if a.name == "yq_scale")
    scale.f *= 4
    base, moved = evaluate(fp8, feeds), evaluate(wrong, feeds)
    assert any(not np.array_equal(base[k], moved[k]) for k in base)


def test_a_producer_already_writing_yq_with_another_scale_is_missed(encoder):
    kmodel, amax, _ = encoder
    per_op, _ = run_passes(kmodel, [Fp8Weights(amax), Cleanup()])
    first, _ = run_passes(per_op, [Fp8Handoff()])
    p = next(n for n in first.graph.node  # a producer whose Y is still written (a LayerNorm)
             if any(a.name == "yq_scale" for a in n.attribute) and n.output[0])
    reader = next(n for n in first.graph.node if n.input and n.input[0] == p.output[1])
    # a second FP8 reader of p's Y with another scale cannot share p's Yq
    for a in reader.attribute:
        if a.name == "x_scale":
            a.f *= 2
    reader.input[0] = p.output[0]
    _, report = run_passes(first, [Fp8Handoff()])
    reasons = [d.reason for d in report.diagnostics if not d.fused and reader.name in d.reason]
    assert reasons and "with yq_scale" in reasons[0] and p.name in reasons[0]
