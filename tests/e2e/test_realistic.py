"""The one realistic case: the shenma-3l search ranker (3 layers, hidden 768, vocab 21128),
from a Google-layout checkpoint to a fully fused ONNX, verified against TensorFlow."""

from __future__ import annotations

import json

import onnx

from bertfuse.cli import main


def test_shenma_3l_converts_fully_fused_and_exact(tmp_path, capsys):
    src, out = tmp_path / "shenma-3l", tmp_path / "shenma-3l.onnx"
    assert main(["example", "--config", "shenma-3l", "-o", str(src), "--head"]) == 0
    capsys.readouterr()
    assert main(["convert", str(src), "-o", str(out), "--json", "--batch", "20", "--seq", "64",
                 "--strict"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passes"]["encoder"]["fully_fused"], report["passes"]["encoder"]
    for o in report["parity"]["outputs"]:
        assert o["max_abs"] <= 1e-4, o
    ops = [n.op_type for n in onnx.load(str(out), load_external_data=False).graph.node]
    layers = 3
    assert ops.count("Attention") == layers
    assert ops.count("SkipLayerNormalization") == 2 * layers
    assert ops.count("BiasGelu") == layers
    assert ops.count("EmbedLayerNormalization") == 1
    # 7 per layer + embedding + pooler (Gather, Gemm, Tanh) + head (Gemm, Relu, Gemm)
    assert len(ops) == 7 * layers + 4 + 3, ops


def test_wrong_input_roles_are_caught_by_the_parity_gate(savedmodel_dir, tmp_path, capsys):
    """TF and ONNX agree with each other under a wrong --inputs mapping; the mask check
    does not."""
    out = tmp_path / "swapped.onnx"
    roles = savedmodel_dir.inputs
    swapped = (f"input_ids={roles['input_ids']},input_mask={roles['segment_ids']},"
               f"segment_ids={roles['input_mask']}")
    assert main(["convert", str(savedmodel_dir.path), "-o", str(out), "--inputs", swapped]) == 1
    err = capsys.readouterr().err
    assert "mask invariance" in err and "--inputs" in err
    assert not out.exists()


def test_large_models_are_written_with_external_data(ckpt_erf, tmp_path, monkeypatch):
    """Past protobuf's 2 GB limit the weights go to OUT.onnx.data; the threshold is lowered
    here so a tiny model takes that path."""
    import numpy as np
    import onnxruntime as ort

    from bertfuse.io import model as modelio
    from bertfuse.io.inputs import random_inputs

    monkeypatch.setattr(modelio, "EXTERNAL_DATA_THRESHOLD", 1_000_000)
    out = tmp_path / "big.onnx"
    assert main(["convert", str(ckpt_erf.path), "-o", str(out)]) == 0  # verified via a file
    data = tmp_path / "big.onnx.data"
    assert data.exists() and data.stat().st_size > out.stat().st_size
    assert not list(tmp_path.glob(".big.onnx.*"))  # no temp files left behind
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    feeds = random_inputs(2, 16, ckpt_erf.vocab, pad_anywhere=True, seed=3)
    outs = sess.run(None, feeds)
    assert all(np.isfinite(o).all() for o in outs)
