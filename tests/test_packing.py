"""The packed form (issue 5) on the CPU: packing arithmetic, checked through NumPy references
of PackedAttention/RestorePadding, and graph structure. The kernels exist on CUDA only;
`bertfuse bench` (bertfuse/bench/packed.py) checks them against the padded model on the GPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bertfuse.cli import main
from bertfuse.custom_ops import attention, packed_attention
from bertfuse.packing_layout import PACKED_INPUTS, choose_shape, pack_into, packed_shapes


def _mask(rng: np.random.Generator, batch: int, seq: int, kind: str) -> np.ndarray:
    lengths = {"mixed": rng.integers(1, seq + 1, batch), "full": np.full(batch, seq),
               "ones": np.ones(batch, int)}[kind]
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    if kind == "mixed":  # holes and left padding too
        mask[0] = rng.integers(0, 2, seq)
        mask[0, rng.integers(seq)] = 1
        mask[-1] = mask[-1][::-1]
    return mask


@pytest.mark.parametrize("kind", ["mixed", "full", "ones"])
@pytest.mark.parametrize("batch,seq,bucket", [(3, 7, (4, 8)), (4, 8, (4, 8)), (1, 5, (1, 32)),
                                              (20, 64, (20, 64)), (13, 100, (32, 128))])
def test_pack_into_forms_well_made_sequences(kind, batch, seq, bucket, rng):
    mask = _mask(rng, batch, seq, kind)
    shape = choose_shape(packed_shapes(*bucket), batch, int(mask.sum()))
    p = pack_into(mask, shape)
    offset = p["token_offset"].reshape(-1)
    cum = p["cumulative_sequence_length"]
    assert all(v.dtype == np.int32 for v in p.values())
    assert p["token_index"].shape == (shape.tokens,) and cum[-1] == shape.tokens
    assert sorted(offset.tolist()) == list(range(shape.rows * shape.seq))  # a permutation
    assert (np.diff(cum) >= 1).all()  # no empty sequence, filler rows included
    assert (np.diff(cum)[:batch] == mask.sum(axis=1)).all()
    kept = np.flatnonzero(np.pad(mask, ((0, 0), (0, shape.seq - seq))).reshape(-1))
    assert (p["token_index"][:len(kept)] == kept).all()
    assert p["token_index"].max() < shape.batch * shape.seq  # gathers stay inside input_ids


def test_pack_into_picks_the_smallest_token_bucket():
    shapes = packed_shapes(20, 64)
    assert [s.tokens for s in shapes] == sorted(s.tokens for s in shapes)
    mask = np.zeros((20, 64), np.int32)
    mask[:, :10] = 1
    chosen = choose_shape(shapes, 20, 200)
    assert chosen.tokens >= 200 + chosen.rows - 20
    assert chosen == shapes[1]  # 200 tokens: one step (160) is too few, two are enough
    assert choose_shape(shapes, 20, 20 * 64) == shapes[-1]


@pytest.mark.parametrize("kind", ["mixed", "full", "ones"])
def test_packed_attention_reference_equals_padded_attention(kind, rng):
    """The packed layout the runtime builds, run through NumPy references of PackedAttention
    and RestorePadding, gives the padded Attention's result on every kept position."""
    batch, seq, hidden, heads = 5, 12, 16, 2
    mask = _mask(rng, batch, seq, kind)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    w = (rng.standard_normal((hidden, 3 * hidden)) * 0.3).astype(np.float32)
    bias = rng.standard_normal(3 * hidden).astype(np.float32)
    want = attention.reference(x, w, bias, mask, num_heads=heads)

    shape = choose_shape(packed_shapes(8, 16), batch, int(mask.sum()))
    p = pack_into(mask, shape)
    grid = np.zeros((shape.batch, shape.seq, hidden), np.float32)
    grid[:batch, :seq] = x
    packed = grid.reshape(-1, hidden)[p["token_index"]]
    out = packed_attention.reference(packed, w, bias, p["cumulative_sequence_length"],
                                     num_heads=heads)
    got = packed_attention.restore_padding(out, p["token_offset"])[:batch, :seq]
    keep = mask != 0
    assert np.abs(got[keep] - want[keep]).max() <= 1e-5
    assert (got[~keep] == 0).all()


def test_packed_convert_structure(ckpt_erf, tmp_path, capsys):
    out = tmp_path / "packed.onnx"
    assert main(["convert", str(ckpt_erf.path), "-o", str(out), "--packed"]) == 0
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("PackedAttention") == 2 and "Attention" not in ops
    assert ops.count("RestorePadding") == 1 and ops.count("SkipLayerNormalization") == 4
    inputs = [i.name for i in model.graph.input]
    assert "input_mask" not in inputs and set(PACKED_INPUTS) <= set(inputs)
    assert [o.name for o in model.graph.output][:2] == ["sequence_output", "pooled_output"]
    # RestorePadding feeds both the sequence output and the pooler.
    restore = next(n for n in model.graph.node if n.op_type == "RestorePadding")
    assert restore.output[0] == "sequence_output"
    assert "verified padded" in capsys.readouterr().out


def test_packed_fp16_restores_before_the_output_cast(ckpt_erf, tmp_path, capsys):
    """fp16: the pooler reads the fp16 hidden states, not the fp32 output, so the padding
    must be restored before the Cast (a Gather on packed [T, H] would be wrong)."""
    out = tmp_path / "packed16.onnx"
    assert main(["convert", str(ckpt_erf.path), "-o", str(out), "--packed",
                 "--precision", "fp16"]) == 0
    model = onnx.load(str(out))
    restore = next(n for n in model.graph.node if n.op_type == "RestorePadding")
    readers = [n.op_type for n in model.graph.node if restore.output[0] in n.input]
    assert sorted(readers) == ["Cast", "Gather"], readers


def test_runtime_packs_only_low_fill_requests():
    from bertfuse.runtime.router import tokens_to_pack as use_packed

    low = np.zeros((4, 32), np.int32)
    low[:, :6] = 1
    assert use_packed(low, 0.5)
    assert not use_packed(np.ones((4, 32), np.int32), 0.5)  # full batches stay padded
    empty_row = low.copy()
    empty_row[2] = 0
    assert not use_packed(empty_row, 0.5)  # a row without tokens cannot be packed
    assert not use_packed(None, 0.5)


def test_packed_session_stages_a_request_into_its_bucket(rng):
    """PackedSession's host side (CUDA is needed only to run): a smaller request lands in
    the bucket's staging views zero-padded, with the packing of its mask."""
    from bertfuse.packing_layout import capture_mask as _capture_mask
    from bertfuse.runtime.packed import PackedSession

    mask = _mask(rng, 3, 12, "mixed")
    ids = rng.integers(1, 100, (3, 12)).astype(np.int32)
    segs = np.ones((3, 12), np.int32)
    shape = choose_shape(packed_shapes(4, 16), 3, int(mask.sum()))
    views = {"input_ids": np.full((4, 16), 7, np.int32),
             "segment_ids": np.full((4, 16), 7, np.int32),
             "token_index": np.empty(shape.tokens, np.int32),
             "token_offset": np.empty((shape.rows, 16), np.int32),
             "cumulative_sequence_length": np.empty(shape.rows + 1, np.int32)}
    PackedSession._stage(views, {"input_ids": ids, "input_mask": mask, "segment_ids": segs},
                         shape)
    assert (views["input_ids"][:3, :12] == ids).all() and views["input_ids"][3:].sum() == 0
    assert views["input_ids"][:, 12:].sum() == 0 and views["segment_ids"][:, 12:].sum() == 0
    assert (views["segment_ids"][:3, :12] == 1).all()
    for name, value in pack_into(mask, shape).items():
        assert (views[name] == value).all(), name
    # Every token bucket can be captured with the runtime's capture mask.
    for b, s in ((1, 32), (20, 64), (32, 128), (32, 32), (8, 512)):
        for sh in packed_shapes(b, s):
            p = pack_into(_capture_mask(sh), sh)
            assert p["cumulative_sequence_length"][-1] == sh.tokens


def test_packed_bench_tables_from_rows():
    from bertfuse.bench.packed import format_tables

    row = {"workload": "uniform [8,64] b20 s64", "mix": "mixed", "fill": 0.6,
           "precision": "fp16", "padded_p50_us": 300.0, "packed_p50_us": 200.0, "speedup": 1.5,
           "packed_nograph_p50_us": 450.0, "routed_p50_us": 210.0, "max_diff": 1e-2,
           "mean_diff": 4e-4}
    failed = {"workload": "skewed b32 s128", "mix": "all full", "fill": 1.0,
              "precision": "fp32", "error": "CUDA out of memory"}
    sweep = [{"workload": "uniform [8,64] b20 s64", "fill": 0.5, "padded_p50_us": 300.0,
              "packed_p50_us": 250.0, "speedup": 1.2}]
    load = {"workload": "uniform [8,64] b20 s64", "precision": "fp16", "streams": 2,
            "replica_max_diff": 0.0}
    for kind, rate in (("padded", 100000), ("packed", 150000), ("packed16", 160000),
                       ("routed", 140000)):
        load.update({f"{kind}_seq_per_s": rate, f"{kind}_p50_us": 380.4, f"{kind}_p99_us": 500.0})
        if kind != "padded":
            load[f"{kind}_speedup"] = round(rate / 100000, 2)
    text = format_tables({"rows": [row, failed], "sweep": sweep, "load": [load]})
    assert "| 300.0 | 200.0 | 1.5 | 450.0 | 210.0 | 66,667 | 100,000 |" in text
    assert "failed: CUDA out of memory" in text and "| 0.5 | 300.0 | 250.0 | 1.2 |" in text
    assert "| 2 | 100,000 (380/500) | 150,000 (380/500) | 160,000 (380/500) | " \
           "140,000 (380/500) | 1.5 | 1.6 | 1.4 | 0.00e+00 |" in text
