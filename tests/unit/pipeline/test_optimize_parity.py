"""`bertfuse optimize` on a user's own tf2onnx export: a real `python -m tf2onnx.convert` of
the Model Garden EncoderScaffold fixture, whose exact GELU TensorFlow writes with Erfc, which
tf2onnx leaves unmapped (and ONNX, so ONNX Runtime, lacks). optimize rewrites it, fuses the
GELUs, compares the fused model with the model as given in ONNX Runtime on the CPU (the
parity report convert has), and writes nothing past the limits unless --force."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from bertfuse.cli import main
from support.paths import FIXTURES

MG = FIXTURES / "thirdparty" / "mg_encoder_scaffold"


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """The user's own export, as docs/convert.md's optimize recipe makes it."""
    pytest.importorskip("tf2onnx")
    path = tmp_path_factory.mktemp("optimize_parity") / "raw.onnx"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model",
                           str(MG / "model"), "--opset", "17", "--output", str(path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and path.exists(), done.stderr[-3000:]
    assert "Unsupported ops: Counter({'Erfc': 2})" in done.stderr  # tf2onnx's own word
    return path


def test_the_export_holds_erfc_that_onnx_runtime_cannot_load(raw):
    import onnxruntime as ort

    assert sum(n.op_type == "Erfc" for n in onnx.load(raw).graph.node) == 2
    with pytest.raises(Exception, match="Erfc"):
        ort.InferenceSession(str(raw), providers=["CPUExecutionProvider"])


def test_optimize_fuses_the_erfc_gelus_and_checks_against_the_model_given(raw, tmp_path):
    out = tmp_path / "fused.onnx"
    code, stdout, err = _cli("optimize", raw, "-o", out, "--json")
    assert code == 0, err
    report = json.loads(stdout)
    parity = report["parity"]
    assert parity["ok"] and parity["source_kind"] == "onnx"
    assert parity["reference"] == f"{raw} (ONNX Runtime, CPU)"
    assert parity["tolerance"] == {"max": 1e-4, "rtol": 0.0, "mean": 1e-4}
    assert sorted(o["name"] for o in parity["outputs"]) == ["pooled_output", "sequence_output"]
    assert all(0 < o["max_abs"] < 1e-4 for o in parity["outputs"])  # a real, fused difference
    assert "verify vs the given model" in [s["name"] for s in report["stages"]]
    assert any("2 Erfc node(s) rewritten as 1 - Erf" in n for n in report["notes"])
    fused = onnx.load(out)
    ops = [n.op_type for n in fused.graph.node]
    assert "Erfc" not in ops and ops.count("BiasGelu") == 2 and ops.count("Attention") == 2
    # ... and the fused model still matches the library's own outputs (saved where it was built)
    code, stdout, err = _cli("verify", out, "--load-inputs", MG / "reference.npz",
                             "--load-outputs", MG / "reference.npz", "--json")
    assert code == 0 and json.loads(stdout)["parity"]["ok"], err


def test_past_the_limits_nothing_is_written_unless_forced(raw, tmp_path):
    out = tmp_path / "fused.onnx"
    code, stdout, err = _cli("optimize", raw, "-o", out, "--atol", "1e-12", "--json")
    assert code == 1
    report = json.loads(stdout)
    assert not report["parity"]["ok"] and report["written"] is False and not out.exists()
    assert f"{out}: not written: parity check failed" in err and "--force" in err
    code, stdout, err = _cli("optimize", raw, "-o", out, "--atol", "1e-12", "--force", "--json")
    assert code == 1 and json.loads(stdout)["written"] is True and out.exists()


def test_no_verify_skips_the_comparison(raw, tmp_path):
    code, stdout, err = _cli("optimize", raw, "-o", tmp_path / "fused.onnx", "--no-verify",
                             "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["parity"] is None
    assert "verify vs the given model" not in [s["name"] for s in report["stages"]]


def test_a_packed_target_is_compared_before_packing(raw, tmp_path):
    """The packed form runs on CUDA only: the contrib form it is made from is what ran."""
    code, stdout, err = _cli("optimize", raw, "-o", tmp_path / "packed.onnx", "--packed",
                             "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["parity"]["ok"]
    assert any("the written form is then packed (CUDA only)" in n for n in report["notes"])
    names = [s["name"] for s in report["stages"]]
    assert names.index("verify vs the given model") < names.index("packing")


def test_fp16_is_held_to_the_fp16_limits(raw, tmp_path):
    code, stdout, err = _cli("optimize", raw, "-o", tmp_path / "fp16.onnx", "--precision",
                             "fp16", "--json")
    assert code == 0, err
    parity = json.loads(stdout)["parity"]
    assert parity["tolerance"] == {"max": 4e-2, "rtol": 0.0, "mean": 2e-3}
    assert parity["ok"] and max(o["max_abs"] for o in parity["outputs"]) > 1e-4  # fp16's own


def test_a_tf_op_tf2onnx_leaves_that_convert_maps_points_to_convert(tmp_path):
    """bert4keras' BroadcastArgs, left as is by tf2onnx: onnx's checker says only 'No Op
    registered'; optimize says to convert the TF model, whose export maps it."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Shape", ["input_ids"], ["s0"]),
         helper.make_node("BroadcastArgs", ["s0", "s0"], ["s"], name="model/BroadcastArgs"),
         helper.make_node("Cast", ["s"], ["sequence_output"], to=TensorProto.FLOAT)], "b4k",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "seq"])],
        [helper.make_tensor_value_info("sequence_output", TensorProto.FLOAT, [2])])
    path = tmp_path / "raw.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code, _, err = _cli("optimize", path, "-o", tmp_path / "fused.onnx")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "'model/BroadcastArgs' is TensorFlow's BroadcastArgs" in err
    assert "run `bertfuse convert` on the TF model instead" in err
    assert not (tmp_path / "fused.onnx").exists()
