"""Fp16Pass: fp16 weights and activations, int32 ids in, fp32 outputs out.

ORT before/after on the same random inputs, ops counted: passes/common.py.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan
from support.builders.onnx_graphs import MS, G, attention, attention_weights, bert, census, mask_rows
from support.passes_common import B, H, N, S, attr, bert_feeds, run, vec


def test_fp16_int32_inputs_fp32_outputs_one_cast_each(rng, seed):
    model = bert(rng)
    fused, _ = run_passes(model, fusion_plan("fp16"))
    for i in fused.graph.input:
        assert i.type.tensor_type.elem_type == TensorProto.INT32, i.name
    outs = {o.name for o in fused.graph.output}
    for o in fused.graph.output:
        assert o.type.tensor_type.elem_type == TensorProto.FLOAT, o.name
    producers = {t: n for n in fused.graph.node for t in n.output}
    casts = [n for n in fused.graph.node if n.op_type == "Cast"]
    # exactly one Cast per output, and those are the only Casts (inputs are int32 already)
    assert sorted(n.output[0] for n in casts) == sorted(outs), [n.output for n in casts]
    for n in casts:
        assert attr(n, "to") == TensorProto.FLOAT
        assert not any(n.output[0] in m.input for m in fused.graph.node)  # at the very end
    # no Cast between fused ops: every com.microsoft op reads fp16 producers directly
    for n in fused.graph.node:
        if n.domain == MS:
            for t in n.input:
                assert t not in producers or producers[t].op_type != "Cast", (n.op_type, t)
    floats = [t for t in fused.graph.initializer if t.data_type == TensorProto.FLOAT]
    assert not floats, [t.name for t in floats]
    c = census(fused)
    assert c[(MS, "Attention")] == 2 and c[(MS, "EmbedLayerNormalization")] == 1
    feeds = bert_feeds(rng)
    want, got = run(model, feeds), run(fused, feeds)
    for name in want:
        assert got[name].dtype == np.float32
        diff = np.abs(got[name] - want[name]).max()
        assert diff < 5e-2, f"{name}: fp16 diff {diff:.3g} (seed {seed})"


def test_fp16_unfused_google_mask_loads(rng, seed):
    g = G("fp16_unfused")
    ids = g.input("input_ids", np.int32, ["B", "S"])
    mask = g.input("input_mask", np.int32, ["B", "S"])
    x = g.op("Gather", g.const(rng.standard_normal((40, H)).astype(np.float32)), ids, axis=0)
    x = g.op("Reshape", x, g.ints(-1, H))
    attention(g, x, mask, attention_weights(rng, H), H, N, mask_kind="google",
              probs_out="probs")  # probabilities read outside: attention stays unfused
    g.rename_last("ctx")
    g.output("ctx")
    g.output("probs")
    model = g.model()
    fused, _ = run_passes(model, fusion_plan("fp16"))
    feeds = {"input_ids": rng.integers(0, 40, (B, S)).astype(np.int32),
             "input_mask": mask_rows(B, S, rng)}
    want, got = run(model, feeds), run(fused, feeds)
    assert np.abs(got["ctx"] - want["ctx"]).max() < 5e-2


def test_fp16_clamped_constant_is_reported(rng, seed):
    g = G("fp16_clamp")
    ids = g.input("input_ids", np.int32, ["N", H])
    x = g.op("Cast", ids, to=TensorProto.FLOAT)
    big = np.full(H, -1e9, np.float32)  # a mask constant beyond fp16's range
    g.op("Max", g.op("Add", x, g.const(big)), g.const(vec(rng, H)), out="y")
    g.output("y")
    model = g.model()
    fused, report = run_passes(model, fusion_plan("fp16"))
    reasons = [d.reason for d in report.diagnostics if d.component == "fp16" and not d.fused]
    assert len(reasons) == 1 and "clamped" in reasons[0], reasons
    assert len([d for d in report.diagnostics if d.component == "fp16" and d.fused]) == 1
    feeds = {"input_ids": rng.integers(-50, 50, (B * S, H)).astype(np.int32)}
    want, got = run(model, feeds), run(fused, feeds)
    assert np.isfinite(got["y"]).all()
    assert np.abs(got["y"] - want["y"]).max() < 5e-2, f"seed {seed}"
