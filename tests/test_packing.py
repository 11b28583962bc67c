"""The packed form (issue 5) on the CPU: packing arithmetic and graph structure. Its kernels
(PackedAttention, RestorePadding) exist on CUDA only; benchmarks/packed_bench.py checks its
numbers against the padded model on the GPU."""

from __future__ import annotations

import numpy as np
import onnx

from bertfuse.cli import main
from bertfuse.passes.packing import PACKED_INPUTS, pack_request


def test_pack_request_handles_padding_anywhere():
    mask = np.array([[1, 1, 1, 0], [0, 1, 0, 1], [1, 0, 0, 0]])
    p = pack_request(mask)
    assert p["token_index"].tolist() == [0, 1, 2, 5, 7, 8]
    assert p["cumulative_sequence_length"].tolist() == [0, 3, 5, 6]
    offset = p["token_offset"].reshape(-1)
    assert offset[:6].tolist() == [0, 1, 2, 5, 7, 8]
    assert sorted(offset.tolist()) == list(range(12))  # a permutation of all positions
    assert all(v.dtype == np.int32 for v in p.values())


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
    from bertfuse.runtime.session import use_packed

    low = np.zeros((4, 32), np.int32)
    low[:, :6] = 1
    assert use_packed(low, 0.5)
    assert not use_packed(np.ones((4, 32), np.int32), 0.5)  # full batches stay padded
    empty_row = low.copy()
    empty_row[2] = 0
    assert not use_packed(empty_row, 0.5)  # a row without tokens cannot be packed
    assert not use_packed(None, 0.5)
