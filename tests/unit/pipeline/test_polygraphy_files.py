"""Polygraphy's own files both ways (tests/fixtures/polygraphy, written by its `run`: see
build_polygraphy.py and meta.json): verify reads its --save-inputs and --save-outputs JSON,
and the inputs bertfuse saves as .json are what `polygraphy run --load-inputs` reads (run
where a venv with Polygraphy is at $BERTFUSE_POLYGRAPHY or /work/venvs/poly)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bertfuse.cli import main
from support.polygraphy_files import POLY, tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("polygraphy"))


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _polygraphy_bin() -> Path | None:
    for where in (os.environ.get("BERTFUSE_POLYGRAPHY"), "/work/venvs/poly"):
        if where and (Path(where) / "bin" / "polygraphy").is_file():
            return Path(where) / "bin" / "polygraphy"
    found = shutil.which("polygraphy")
    return Path(found) if found else None


def _verify(tiny: Path, *extra) -> tuple[int, dict, str]:
    code, out, err = _cli("verify", tiny, "--load-inputs", POLY / "inputs.json",
                          "--load-outputs", POLY / "outputs.json", "--json", *extra)
    return code, json.loads(out) if out.strip() else {}, err


def test_verify_reads_polygraphy_run_inputs_and_outputs(tiny):
    code, report, err = _verify(tiny)
    assert code == 0, err
    parity = report["parity"]
    assert parity["ok"] and (parity["batch"], parity["seq"]) == (2, 8)
    assert [o["name"] for o in parity["outputs"]] == ["sequence_output"]
    assert parity["outputs"][0]["max_abs"] < 1e-6  # the same ONNX Runtime run, same inputs


def test_polygraphy_outputs_are_the_reference(tiny, tmp_path):
    """A model that drifts from the one Polygraphy ran fails against its saved outputs."""
    model = onnx.load(tiny)
    table = next(t for t in model.graph.initializer if t.name == "word_embeddings")
    table.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(table) + 0.01, table.name))
    onnx.save(model, tmp_path / "drift.onnx")
    code, out, err = _cli("verify", tmp_path / "drift.onnx", "--load-inputs",
                          POLY / "inputs.json", "--load-outputs", POLY / "outputs.json", "--json")
    assert code == 1, err
    row = json.loads(out)["parity"]["outputs"][0]
    assert not row["ok"] and 0.009 < row["max_abs"] < 0.011


def test_saved_json_inputs_are_polygraphy_inputs(tiny, tmp_path):
    from bertfuse.io import polygraphy

    code, _, err = _verify(tiny, "--save-inputs", tmp_path / "again.json")
    assert code == 0, err
    saved = json.loads((tmp_path / "again.json").read_text())
    assert isinstance(saved, list) and len(saved) == 1
    assert {v["polygraphy_class"] for v in saved[0].values()} == {"ndarray"}
    given = polygraphy.read(json.loads((POLY / "inputs.json").read_text()), "given")
    again = polygraphy.read(saved, "saved")
    assert set(again) == set(given)
    for name in given:
        np.testing.assert_array_equal(again[name], given[name])
        assert again[name].dtype == np.int32
    code, out, err = _cli("verify", tiny, "--load-inputs", tmp_path / "again.json",
                          "--load-outputs", POLY / "outputs.json", "--json")
    assert code == 0 and json.loads(out)["parity"]["ok"], err  # and bertfuse reads it back


def test_polygraphy_run_loads_the_inputs_bertfuse_saved(tiny, tmp_path):
    binary = _polygraphy_bin()
    if binary is None:
        pytest.skip("no Polygraphy here (a venv at $BERTFUSE_POLYGRAPHY or /work/venvs/poly, "
                    "or polygraphy on PATH): pip install polygraphy onnxruntime numpy")
    code, _, err = _verify(tiny, "--save-inputs", tmp_path / "bf_inputs.json")
    assert code == 0, err
    done = subprocess.run([str(binary), "run", str(tiny), "--onnxrt",
                           "--load-inputs", str(tmp_path / "bf_inputs.json"),
                           "--load-outputs", str(POLY / "outputs.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "All outputs matched" in done.stdout + done.stderr
