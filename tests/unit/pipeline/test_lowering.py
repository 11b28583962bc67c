"""`--ops contrib|bertfuse` on convert and optimize, and the API keyword, end to end on the tiny
checkpoint. The bertfuse form cannot run on ORT's CPU EP: convert gates the contrib form
against TensorFlow and then checks the bertfuse form equal to it with the NumPy references
(pipeline/lowering.py); here the written model is also run that way against TensorFlow itself."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import onnx
import pytest

import bertfuse
from bertfuse.cli import main
from bertfuse.ops.evaluator import evaluate
from bertfuse.errors import BertfuseError
from bertfuse.pipeline.fp8 import cosine
from bertfuse.pipeline.lowering import ROW_PREFIX

BF = "ai.bertfuse"
ARGS = ("--precision", "fp16", "--ops", "bertfuse")


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def test_convert_writes_the_bertfuse_form(ckpt_erf, convert_cached, seed):
    conv = convert_cached(ckpt_erf, *ARGS)
    assert conv.exit_code == 0, conv.report
    model = onnx.load(conv.onnx_path)
    ops = _ops(model)
    layers = ckpt_erf.config.num_hidden_layers
    assert ops[f"{BF}.BertAttention"] == ops[f"{BF}.DenseBias"] == layers
    assert ops[f"{BF}.DenseBiasGelu"] == layers and ops[f"{BF}.DenseBiasSkipLayerNorm"] == 2 * layers
    assert not {"com.microsoft.Attention", "com.microsoft.SkipLayerNormalization",
                "com.microsoft.BiasGelu", "MatMul"} & set(ops), ops
    stages = [s["name"] for s in conv.report["stages"]]
    assert stages.index("verify vs TensorFlow") < stages.index("bertfuse kernels") < \
        stages.index("check bertfuse ops vs contrib form (NumPy references)") < stages.index("write")
    rows = {r["name"]: r for r in conv.report["parity"]["outputs"]}
    for out in ("sequence_output", "pooled_output"):
        assert rows[out]["ok"]  # the contrib form vs TF
        row = rows[f"bertfuse ops vs contrib form: {out}"]
        assert row["ok"] and row["max_abs"] <= 4e-2 and row["mean_abs"] <= 2e-3, row
    assert conv.report["passes"]["encoder"]["fully_fused"]
    assert not [d for d in conv.report["passes"]["diagnostics"]
                if d["component"].startswith("kernels_") and not d["fused"]]
    # the written model itself, through the NumPy references, against TensorFlow
    feeds = ckpt_erf.feeds(3, 16, seed=seed % 1000)
    want, got = ckpt_erf.reference(feeds), evaluate(model, feeds)
    for name, ref in want.items():
        d = np.abs(got[name].astype(np.float64) - ref)
        assert d.max() <= 4e-2 and d.mean() <= 2e-3, (name, d.max(), d.mean(), seed)


def test_default_is_ort(tiny_onnx):
    assert not [n for n in onnx.load(tiny_onnx["fp16"]).graph.node if n.domain == BF]


@pytest.mark.parametrize("argv,needle", [
    (["--ops", "bertfuse"], "needs --precision fp16"),
    (["--precision", "fp16", "--ops", "bertfuse", "--no-fuse"], "needs the fusion passes"),
    (["--ops", "cuda"], "invalid choice"),
])
def test_refused_combinations_are_one_line_exit_2(ckpt_erf, tmp_path, capsys, argv, needle):
    out = tmp_path / "m.onnx"
    assert main(["convert", ckpt_erf.path, "-o", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_optimize_with_bertfuse_kernels(tiny_onnx, tmp_path, capsys):
    out = tmp_path / "k.onnx"
    assert main(["optimize", tiny_onnx["raw"], "-o", str(out), *ARGS, "--strict", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # the contrib form against the model as given (ONNX Runtime), then the bertfuse form
    # against the contrib form (NumPy references): both sets of rows, one parity report
    assert report["parity"]["reference"].endswith("(ONNX Runtime, CPU)")
    names = [r["name"] for r in report["parity"]["outputs"]]
    assert "sequence_output" in names and ROW_PREFIX + "sequence_output" in names, names
    assert all(r["ok"] for r in report["parity"]["outputs"])
    assert _ops(onnx.load(str(out)))[f"{BF}.BertAttention"] == 2
    assert main(["optimize", tiny_onnx["raw"], "-o", str(tmp_path / "x.onnx"),
                 "--ops", "bertfuse"]) == 2
    assert "needs --precision fp16" in capsys.readouterr().err


def test_optimize_packed_on_bertfuse_kernels_packs_on_the_device(tiny_onnx, tmp_path, capsys,
                                                                  rng):
    """`--packed --ops bertfuse`: the device-packed form, equal to the padded bertfuse form
    at kept positions (ReferenceEvaluator) and zero at padding."""
    padded_path, packed_path = tmp_path / "k.onnx", tmp_path / "p.onnx"
    assert main(["optimize", tiny_onnx["raw"], "-o", str(padded_path), *ARGS]) == 0
    capsys.readouterr()
    assert main(["optimize", tiny_onnx["raw"], "-o", str(packed_path), *ARGS, "--packed",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "packing (on the device)" in [st["name"] for st in report["stages"]]
    padded, packed = onnx.load(str(padded_path)), onnx.load(str(packed_path))
    ops = _ops(packed)
    assert ops[f"{BF}.PackTokens"] == 1 and ops[f"{BF}.UnpackTokens"] == 1
    assert ops[f"{BF}.PackedBertAttention"] == 2 and not ops[f"{BF}.BertAttention"]
    assert "token_bucket" in [i.name for i in packed.graph.input]
    # What PackedSession binds: int32 inputs in its buffers, the padded model's outputs.
    assert {i.type.tensor_type.elem_type for i in packed.graph.input} == {onnx.TensorProto.INT32}
    assert [(o.name, o.type.tensor_type.elem_type) for o in packed.graph.output] == \
        [(o.name, o.type.tensor_type.elem_type) for o in padded.graph.output]
    from bertfuse.runtime.request_checks import model_facts

    assert set(model_facts(packed).inputs) == {"input_ids", "segment_ids", "input_mask",
                                               "token_bucket"}
    batch, seq = 3, 8
    mask = (np.arange(seq)[None, :] < np.array([8, 3, 5])[:, None]).astype(np.int32)
    mask[2] = mask[2][::-1]  # left padding
    feeds = {i.name: (mask if "mask" in i.name else
                      rng.integers(0, 2 if "segment" in i.name else 50, (batch, seq)))
             .astype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
             for i in padded.graph.input}
    want = evaluate(padded, feeds)
    kept = int(mask.sum())
    for tokens in (kept, kept + 5):  # the bucket exactly, and filler rows past the kept tokens
        got = evaluate(packed, {**feeds, "token_bucket": np.zeros(tokens, np.int32)})
        seq_out = got["sequence_output"].astype(np.float32)
        ref = want["sequence_output"].astype(np.float32)
        keep = mask != 0
        assert np.abs(seq_out[keep] - ref[keep]).max() <= 4e-2
        assert not seq_out[~keep].any()


def test_api_keyword(tiny_onnx):
    model, report = bertfuse.optimize(tiny_onnx["raw"], precision="fp16", ops="bertfuse")
    assert _ops(model)[f"{BF}.DenseBiasSkipLayerNorm"] == 4 and report.parity.ok
    plain, _ = bertfuse.optimize(tiny_onnx["raw"], precision="fp16")
    assert not [n for n in plain.graph.node if n.domain == BF]
    for bad in ("cuda", 1, None):
        with pytest.raises(BertfuseError, match="ops"):
            bertfuse.optimize(tiny_onnx["raw"], precision="fp16", ops=bad)
    with pytest.raises(BertfuseError, match="fp16"):
        bertfuse.optimize(tiny_onnx["raw"], ops="bertfuse")


def test_convert_fp8_reports_its_accuracy_against_tf(ckpt_erf, convert_cached):
    conv = convert_cached(ckpt_erf, *ARGS, "--fp8")
    assert conv.exit_code == 0, conv.report
    model = onnx.load(conv.onnx_path)
    ops = _ops(model)
    layers = ckpt_erf.config.num_hidden_layers
    assert ops[f"{BF}.DenseBiasFp8"] == ops[f"{BF}.DenseBiasGeluFp8"] == layers
    assert ops[f"{BF}.DenseBiasSkipLayerNormFp8"] == 2 * layers and model.ir_version >= 9
    onnx.checker.check_model(model, full_check=True)
    rows = {r["name"]: r for r in conv.report["parity"]["outputs"]}
    # the stated numbers are the written model's, through the NumPy references, against TF
    # on the parity inputs (batch 5, seq 32, seed 0)
    feeds = ckpt_erf.feeds(5, 32, seed=0)
    want, got = ckpt_erf.reference(feeds), evaluate(model, feeds)
    for name, ref in want.items():
        row = rows[f"fp8 vs fp32: {name}"]
        d = np.abs(got[name].astype(np.float64) - ref)
        assert np.isclose(row["max_abs"], d.max()) and np.isclose(row["mean_abs"], d.mean())
        assert row["ok"] and "not held to the fp16 limits" in row["note"]
        assert d.mean() > rows[f"bertfuse ops vs contrib form: {name}"]["mean_abs"]
        cos = float(re.search(r"cosine ([0-9.]+)", row["note"]).group(1))
        assert np.isclose(cos, cosine(ref, got[name]), atol=1e-6) and 0.9 < cos < 1.0
    # the hand-offs: every GEMM reads its input in e4m3 from the op before (attention out, FFN
    # up and down of every layer, the QKV of layers 1..); the first QKV quantises its own
    e4m3 = {v.name for v in model.graph.value_info
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT8E4M3FN}
    assert sum(n.input[0] in e4m3 for n in model.graph.node) == 4 * layers - 1
    stages = [s["name"] for s in conv.report["stages"]]
    assert "fp8 weights (calibrated on the parity inputs)" in stages


def test_fp8_needs_bertfuse_kernels(ckpt_erf, tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert main(["convert", ckpt_erf.path, "-o", str(out), "--precision", "fp16", "--fp8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--fp8 needs --ops bertfuse" in err, err
    assert not out.exists()
    with pytest.raises(BertfuseError, match="fp8"):
        bertfuse.convert(ckpt_erf.path, precision="fp16", ops="bertfuse", fp8="yes")


def test_optimize_fp8_measures_against_the_model_as_given(tiny_onnx):
    model, report = bertfuse.optimize(tiny_onnx["raw"], precision="fp16", ops="bertfuse",
                                      fp8=True)
    assert _ops(model)[f"{BF}.DenseBiasGeluFp8"] == 2
    rows = [r for r in report.parity.outputs if r.name.startswith("fp8 vs fp32: ")]
    assert {r.name for r in rows} == {"fp8 vs fp32: sequence_output", "fp8 vs fp32: pooled_output"}
    assert all(r.ok and 0 < r.max_abs < 1 for r in rows), rows


def test_inspect_and_draw_know_the_bertfuse_ops(ckpt_erf, convert_cached, tmp_path, capsys):
    conv = convert_cached(ckpt_erf, *ARGS)
    assert main(["inspect", conv.onnx_path, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["encoder"]["fully_fused"] and len(summary["encoder"]["layers"]) == 2
    dot = tmp_path / "layer1.dot"
    assert main(["draw", conv.onnx_path, "--layer", "1", "-o", str(dot)]) == 0
    text = dot.read_text()
    assert "BertAttention" in text and "DenseBiasSkipLayerNorm" in text
