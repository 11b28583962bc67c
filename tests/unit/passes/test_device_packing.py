"""The device-packed form on bertfuse kernels (passes/device_packing.py) and the NumPy references
of its ops (ops/bertfuse/packed_ops.py): PackTokens, PackedBertAttention, UnpackTokens.

No GPU here: the packed model runs in onnx's ReferenceEvaluator with every custom node's
reference, against the padded bertfuse-kernels model it came from. The CUDA kernels are
checked against the same references on the GPU (benchmarks/kernels/kernels_packed.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bertfuse.ops import BERTFUSE_CONTRACTS
from bertfuse.ops.bertfuse import bert_attention
from bertfuse.ops.bertfuse import packed_ops
from bertfuse.ops.evaluator import evaluate
from bertfuse.ops.packing_layout import choose_shape, pack_into, packed_shapes
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan
from bertfuse.passes.device_packing import PackingKernelsPass
from support.builders.onnx_graphs import bert
from support.passes_common import B, S, bert_feeds, fuse
from unit.passes.test_bertfuse_encoder import contrib_fp16, kernels

PACKED_OPS = ("PackTokens", "PackedBertAttention", "UnpackTokens")


def _mask(rng: np.random.Generator, batch: int, seq: int, rows: int | None = None) -> np.ndarray:
    """Right padding, holes, left padding; rows past `rows` empty (a smaller request)."""
    mask = (np.arange(seq)[None, :] < rng.integers(1, seq + 1, batch)[:, None]).astype(np.int32)
    mask[0, rng.integers(seq)] = 0
    mask[0, 0] = 1
    mask[-1] = mask[-1][::-1]
    if rows is not None:
        mask[rows:] = 0
    return mask


# ---- references --------------------------------------------------------------------------


@pytest.mark.parametrize("batch,seq", [(5, 12), (20, 64), (1, 3)])
def test_pack_tokens_agrees_with_the_host_packing(batch, seq, rng):
    """Over the kept tokens, PackTokens' layout is the --packed form's (packing_layout)."""
    mask = _mask(rng, batch, seq)
    kept = int(mask.sum())
    shape = choose_shape(packed_shapes(batch, seq), batch, kept)
    host = pack_into(mask, shape)
    index, slot, cu = packed_ops.pack_tokens(mask, shape.tokens)
    assert index.dtype == slot.dtype == cu.dtype == np.int32
    assert (index[:kept] == host["token_index"][:kept]).all() and not index[kept:].any()
    assert (cu == host["cumulative_sequence_length"][:batch + 1]).all() and cu[-1] == kept
    flat = slot.reshape(-1)
    assert (flat[index[:kept]] == np.arange(kept)).all()  # slot inverts index
    assert ((flat >= 0) == (mask.reshape(-1) != 0)).all()


def test_pack_tokens_cuts_at_the_bucket(rng):
    mask = _mask(rng, 6, 10)
    kept = int(mask.sum())
    index, slot, cu = packed_ops.pack_tokens(mask, kept - 4)
    full_index, full_slot, _ = packed_ops.pack_tokens(mask, kept)
    assert (index == full_index[:kept - 4]).all()
    assert (slot == np.where(full_slot < kept - 4, full_slot, -1)).all()
    assert cu[-1] == kept - 4 and (np.diff(cu) >= 0).all()
    with pytest.raises(ValueError, match="int32"):
        packed_ops.pack_tokens(mask.astype(np.int64), kept)


@pytest.mark.parametrize("rows", [None, 3])
def test_packed_attention_equals_padded_bert_attention(rows, rng):
    """At every kept position, packed attention is BertAttention on the padded layout with the
    raw mask; filler rows are zeros, and so are padded positions once unpacked."""
    batch, seq, heads, hidden = 5, 12, 2, 16
    mask = _mask(rng, batch, seq, rows)
    kept = int(mask.sum())
    tokens = kept + 7
    index, slot, cu = packed_ops.pack_tokens(mask, tokens)
    qkv = rng.standard_normal((tokens, 3 * hidden))
    context = packed_ops.packed_bert_attention(qkv, slot, cu, num_heads=heads, scale=0.3)
    assert not context[kept:].any()
    padded = np.zeros((batch, seq, 3 * hidden))
    padded[mask != 0] = qkv[:kept]
    want = bert_attention.reference(padded, mask, num_heads=heads, scale=0.3)
    got = packed_ops.unpack_tokens(context, slot)
    keep = mask != 0
    real_rows = keep.any(axis=1)[:, None] & keep  # a row keeping nothing has no packed tokens
    assert np.abs(got[real_rows] - want[real_rows]).max() <= 1e-12
    assert not got[~keep].any()


def test_packed_attention_takes_the_packed_forms_filler_sequences(rng):
    """The --packed form's own layout (filler rows as sequences of their own) works as is."""
    mask = _mask(rng, 4, 8)
    shape = choose_shape(packed_shapes(4, 8), 4, int(mask.sum()))
    host = pack_into(mask, shape)
    qkv = rng.standard_normal((shape.tokens, 3 * 8))
    cu = host["cumulative_sequence_length"]
    got = packed_ops.packed_bert_attention(qkv, host["token_offset"], cu, num_heads=1)
    for a, e in zip(cu[:-1], cu[1:]):
        want = bert_attention.reference(qkv[None, a:e], num_heads=1)[0]
        assert np.abs(got[a:e] - want).max() <= 1e-12
    with pytest.raises(ValueError, match="non-decreasing"):
        packed_ops.packed_bert_attention(qkv, host["token_offset"], cu[::-1].copy(), num_heads=1)
    with pytest.raises(ValueError, match="longer than S"):
        packed_ops.packed_bert_attention(qkv, np.zeros((1, 2), np.int32),
                                         np.array([0, 5], np.int32), num_heads=1)


@pytest.mark.parametrize("op", PACKED_OPS)
def test_one_node_models_are_valid_and_run_in_the_evaluator(op, rng):
    model = packed_ops.make_model(op, hidden=16, num_heads=2)
    onnx.checker.check_model(model, full_check=True)
    c = BERTFUSE_CONTRACTS[op]
    assert [i.name for i in model.graph.input] == [t.name for t in c.inputs]
    assert [o.name for o in model.graph.output] == [t.name for t in c.outputs]
    mask = _mask(rng, 3, 5)
    index, slot, cu = packed_ops.pack_tokens(mask, int(mask.sum()) + 2)
    t = len(index)
    feeds = {"mask": mask, "token_bucket": np.zeros(t, np.int32), "token_slot": slot,
             "cumulative_sequence_length": cu,
             "qkv": rng.standard_normal((t, 48)).astype(np.float16),
             "packed": rng.standard_normal((t, 16)).astype(np.float16)}
    got = evaluate(model, feeds)
    assert all(v.dtype == np.dtype(c.output(k).dtypes[0]) for k, v in got.items())
    if op == "PackTokens":
        assert (got["token_index"] == index).all()
        assert (got["cumulative_sequence_length"] == cu).all()


# ---- the pass ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def padded_and_packed():
    rng = np.random.default_rng(1234)
    padded, _ = kernels(contrib_fp16(rng))
    packed, report = fuse(padded, PackingKernelsPass())
    return padded, packed, report


def test_pass_structure(padded_and_packed):
    _, packed, report = padded_and_packed
    onnx.checker.check_model(packed)
    ops = [n.op_type for n in packed.graph.node]
    assert ops.count("PackedBertAttention") == 2 and "BertAttention" not in ops
    assert ops.count("PackTokens") == ops.count("UnpackTokens") == 1
    fused = [d.layer for d in report.diagnostics if d.component == "packing_kernels" and d.fused]
    assert fused == [0, 1]
    inputs = [i.name for i in packed.graph.input]
    assert "input_mask" in inputs and inputs[-1] == "token_bucket"
    assert [o.name for o in packed.graph.output] == ["sequence_output", "pooled_output"]
    unpack = next(n for n in packed.graph.node if n.op_type == "UnpackTokens")
    readers = sorted(n.op_type for n in packed.graph.node if unpack.output[0] in n.input)
    assert readers == ["Cast", "Gather"]  # the fp32 output and the pooler, both unpacked


@pytest.mark.parametrize("extra", [0, 9])
def test_packed_model_equals_the_padded_one(padded_and_packed, extra, rng):
    """Kept positions equal the padded bertfuse model's (fp16 limits); padding is zero; pooled
    rows agree where token 0 is kept. extra > 0: a token bucket with filler rows."""
    padded, packed, _ = padded_and_packed
    feeds = bert_feeds(rng)
    mask = feeds["input_mask"]
    want = evaluate(padded, feeds)
    got = evaluate(packed, {**feeds, "token_bucket": np.zeros(int(mask.sum()) + extra, np.int32)})
    keep = mask != 0
    seq = np.abs(got["sequence_output"][keep].astype(np.float64) - want["sequence_output"][keep])
    assert np.isfinite(seq).all() and seq.max() <= 4e-2 and seq.mean() <= 2e-3
    assert not got["sequence_output"][~keep].any()
    first = keep[:, 0]
    pooled = np.abs(got["pooled_output"][first].astype(np.float64) - want["pooled_output"][first])
    assert first.any() and pooled.max() <= 4e-2
    assert got["sequence_output"].shape == (B, S, want["sequence_output"].shape[2])


def test_pass_misses_a_contrib_model_and_an_unfused_layer(rng):
    contrib = contrib_fp16(rng)
    model, report = fuse(contrib, PackingKernelsPass())
    assert [(d.fused, d.reason) for d in report.diagnostics] == \
        [(False, "needs BertAttention nodes (run the bertfuse_kernels pass first)")]
    assert [n.op_type for n in model.graph.node] == [n.op_type for n in contrib.graph.node]
    partly, _ = run_passes(bert(rng, layers=2, broken_layer=1), fusion_plan("fp16"))
    mixed, _ = kernels(partly)
    assert "BertAttention" in {n.op_type for n in mixed.graph.node}
    _, report = fuse(mixed, PackingKernelsPass())
    (miss,) = report.diagnostics
    assert not miss.fused and "not on bertfuse kernels" in miss.reason


def test_pass_misses_a_packed_model(padded_and_packed):
    _, packed, _ = padded_and_packed
    _, report = fuse(packed, PackingKernelsPass())
    assert [d.reason for d in report.diagnostics if not d.fused] == \
        ["needs BertAttention nodes (run the bertfuse_kernels pass first)"]


def test_pass_on_a_converted_checkpoint(ckpt_erf, convert_cached, seed):
    """The written --ops bertfuse model of a real TF checkpoint (tf2onnx's graph, not the
    builder's) packs, and its packed form equals it at every kept position."""
    conv = convert_cached(ckpt_erf, "--precision", "fp16", "--ops", "bertfuse")
    assert conv.exit_code == 0, conv.report
    padded = onnx.load(conv.onnx_path)
    packed, report = fuse(padded, PackingKernelsPass())
    layers = ckpt_erf.config.num_hidden_layers
    assert [d.layer for d in report.diagnostics if d.fused] == list(range(layers))
    onnx.checker.check_model(packed)
    feeds = ckpt_erf.feeds(3, 16, seed=seed % 1000)
    mask = feeds["input_mask"]
    want = evaluate(padded, feeds)
    got = evaluate(packed, {**feeds, "token_bucket": np.zeros(int(mask.sum()) + 4, np.int32)})
    keep = mask != 0
    seq = np.abs(got["sequence_output"][keep].astype(np.float64) - want["sequence_output"][keep])
    assert np.isfinite(seq).all() and seq.max() <= 4e-2 and seq.mean() <= 2e-3
    assert not got["sequence_output"][~keep].any()


def test_an_fp8_model_with_hand_offs_packs(rng):
    """The attention's e4m3 copy (fp8_handoff) has no packed twin: its FP8 reader takes the
    packed fp16 context and quantises it itself; the packed FP8 model equals the padded one
    at the kept positions as closely as the fp16 forms do."""
    from bertfuse.pipeline.fp8 import calibrate, dense_inputs, to_fp8

    contrib = contrib_fp16(rng)
    padded16, _ = kernels(contrib)
    feeds = bert_feeds(rng)
    padded = to_fp8(padded16, calibrate(contrib, dense_inputs(padded16), feeds))
    att_yq = {n.output[1] for n in padded.graph.node if n.op_type == "BertAttention" and len(n.output) > 1}
    assert len(att_yq) == 2
    packed, report = fuse(padded, PackingKernelsPass())
    assert all(d.fused for d in report.diagnostics if d.component == "packing_kernels")
    onnx.checker.check_model(packed, full_check=True)
    readers = [n for n in packed.graph.node if n.op_type == "DenseBiasSkipLayerNormFp8" and
               any(p.op_type == "PackedBertAttention" and n.input[0] == p.output[0]
                   for p in packed.graph.node)]
    assert len(readers) == 2 and not att_yq & {i for n in packed.graph.node for i in n.input}
    mask = feeds["input_mask"]
    want = evaluate(padded, feeds)
    got = evaluate(packed, {**feeds, "token_bucket": np.zeros(int(mask.sum()), np.int32)})
    keep = mask != 0
    seq = np.abs(got["sequence_output"][keep].astype(np.float64) - want["sequence_output"][keep])
    assert np.isfinite(seq).all() and seq.max() <= 4e-2 and seq.mean() <= 2e-3
