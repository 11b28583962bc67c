"""The packed form on the CPU: packing arithmetic, checked through NumPy references
of PackedAttention/RestorePadding, and graph structure. The kernels exist on CUDA only;
`bertfuse bench` (bertfuse/bench/packed.py) checks them against the padded model on the GPU;
the runtime's side is in tests/unit/runtime/test_packed.py and test_router.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bertfuse.cli import main
from bertfuse.ops.contrib import attention
from bertfuse.ops.contrib import packed_attention
from bertfuse.ops.packing_layout import PACKED_INPUTS, choose_shape, pack_into, packed_shapes


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


@pytest.mark.parametrize("batch", [1, 5])
def test_packed_shapes_of_one_token_rows_return(batch):
    """seq 1: one bucket (every row is one token); it used to loop forever."""
    import threading

    got: list = []
    worker = threading.Thread(target=lambda: got.append(packed_shapes(batch, 1)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive() and got, "packed_shapes(batch, 1) does not return"
    shapes = got[0]
    for b in range(1, batch + 1):  # any smaller request of one-token rows packs
        mask = np.ones((b, 1), np.int32)
        shape = choose_shape(shapes, b, b)
        p = pack_into(mask, shape)
        assert p["cumulative_sequence_length"][-1] == shape.tokens
        assert (p["token_index"][:b] == np.arange(b)).all()


def test_device_shapes_step_up_to_the_bucket():
    """The device-packed form's token buckets: no filler rows, T up to batch x seq."""
    from bertfuse.ops.packing_layout import choose_device_shape, device_shapes

    shapes = device_shapes(20, 64)
    assert [s.tokens for s in shapes] == [160 * k for k in range(1, 9)]
    assert all(s.rows == 20 for s in shapes)
    assert choose_device_shape(shapes, 200) == shapes[1]
    assert choose_device_shape(shapes, 160) == shapes[0]  # empty rows need no filler token
    assert choose_device_shape(shapes, 20 * 64) == shapes[-1]
    assert [s.tokens for s in device_shapes(3, 1)] == [1, 2, 3]  # no repeats past b x s
    with pytest.raises(ValueError, match="do not fit"):
        choose_device_shape(shapes, 20 * 64 + 1)
