"""The CI contract: every command with --json prints one JSON report on stdout on every exit
(0, 1, 2, 3) with schema_version, command and ok, and on a failure the error (its kind, the
line stderr shows, the exit code); each report validates against the JSON Schema shipped in
the package (bertfuse/schemas/). -q prints the paths written and nothing else.

One tiny checkpoint (`bertfuse example`), converted twice (the raw export, the fused model
with its parity inputs and TF outputs saved) for the whole module: the other commands run
on those files, verify on the saved outputs without TensorFlow."""

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
from bertfuse.io.schemas import first_error, schema_names
from support.paths import ROOT

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _run(argv: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _report(code: int, out: str, err: str, schema: str) -> dict:
    """stdout as one JSON report, valid against `schema`, that agrees with the exit code and
    with the one line on stderr."""
    assert "Traceback" not in err, err
    report = json.loads(out)
    where = first_error(report, schema)
    assert where is None, f"{schema}: {where}\n{out[:3000]}"
    assert report["schema_version"] == 1 and report["ok"] is (code == 0), (code, out[:2000])
    if code:
        assert report["error"]["exit_code"] == code, report["error"]
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if lines:  # diff's exit 1 prints none: its report is the verdict
            assert len(lines) == 1 and lines[0].endswith(report["error"]["message"]), (lines,
                                                                                      report)
    return report


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("json_contract")
    w: dict = {"root": root, "tiny": root / "tiny", "raw": root / "raw.onnx",
               "fused": root / "fused.onnx", "in": root / "in.npz", "tf": root / "tf.npz"}
    w["example"] = _run(["example", "--config", "tiny", "-o", w["tiny"], "--json"])
    assert w["example"][0] == 0, w["example"]
    # A real process: what reaches the terminal with -q, fd 2 included (TF's C++ lines).
    w["convert_q"] = subprocess.run(
        [sys.executable, "-m", "bertfuse", "convert", str(w["tiny"]), "-o", str(w["raw"]),
         "--no-fuse", "--batch", "2", "--seq", "8", "-q"], capture_output=True, text=True,
        env=ENV, timeout=300)
    w["convert"] = _run(["convert", w["tiny"], "-o", w["fused"], "--batch", "2", "--seq", "8",
                         "--save-inputs", w["in"], "--save-outputs", w["tf"], "--json"])
    assert w["convert"][0] == 0, w["convert"][2]
    return w


# --------------------------------------------------------------------------- -q


def test_quiet_convert_prints_the_path_alone(work):
    proc = work["convert_q"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"wrote {work['raw']}"] and proc.stderr == ""


def test_quiet_optimize_and_verify(work, tmp_path):
    out = tmp_path / "opt.onnx"
    assert _run(["optimize", work["raw"], "-o", out, "-q"])[1:] == (f"wrote {out}\n", "")
    code, stdout, err = _run(["verify", work["fused"], "--load-inputs", work["in"],
                              "--load-outputs", work["tf"], "-q"])
    assert (code, stdout, err) == (0, "", "")


def test_log_level_info_lets_the_libraries_lines_through(work, tmp_path):
    """The -q run above left stderr empty; --log-level info shows TensorFlow's own lines
    (its deprecation warnings, which tf2onnx's freezing triggers) beside the progress."""
    proc = subprocess.run(
        [sys.executable, "-m", "bertfuse", "convert", str(work["tiny"]), "-o",
         str(tmp_path / "m.onnx"), "--no-fuse", "--no-verify", "--log-level", "info"],
        capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    theirs = [ln for ln in proc.stderr.splitlines() if not ln.startswith("bertfuse convert:")]
    assert any(ln.startswith("WARNING:tensorflow:") for ln in theirs), proc.stderr


# --------------------------------------------------------------------------- exit 0


def test_convert_and_example_reports(work):
    _report(*work["example"], "example.json")
    report = _report(*work["convert"], "convert.json")
    assert report["written"] and report["parity"]["ok"]


@pytest.mark.parametrize("name", ["optimize", "verify", "strip-weights", "inspect",
                                  "summarize", "summarize-o", "diff", "draw", "tokenize",
                                  "export-triton", "kernels-info"])
def test_exit_0_report_validates(work, tmp_path, name):
    w = work
    argv = {"optimize": ["optimize", w["raw"], "-o", tmp_path / "o.onnx"],
            "verify": ["verify", w["fused"], "--load-inputs", w["in"], "--load-outputs",
                       w["tf"]],
            "strip-weights": ["strip-weights", w["fused"], "-o", tmp_path / "s.onnx"],
            "inspect": ["inspect", w["fused"]],
            "summarize": ["summarize", w["fused"]],
            "summarize-o": ["summarize", w["fused"], "-o", tmp_path / "s.json"],
            "diff": ["diff", w["fused"], w["fused"]],
            "draw": ["draw", w["fused"], "-o", tmp_path / "l.dot"],
            "tokenize": ["tokenize", "--vocab", w["tiny"] / "vocab.txt", "what is bert?"],
            "export-triton": ["export-triton", w["fused"], "-o", tmp_path / "repo", "--kind",
                              "cpu"],
            "kernels-info": ["kernels", "info", "--arch", "90"]}[name]  # no GPU needed
    command = " ".join(argv[:2]) if argv[0] == "kernels" else argv[0]
    report = _report(*_run([*argv, "--json"]), command.replace(" ", "-") + ".json")
    assert report["command"] == command
    if name == "summarize":  # the summary itself, valid as a golden file
        assert first_error(report["summary"], "summary.json") is None


# --------------------------------------------------------------------------- exit 1


def test_convert_parity_refusal_prints_the_report(work, tmp_path):
    out = tmp_path / "m.onnx"
    code, stdout, err = _run(["convert", work["tiny"], "-o", out, "--batch", "2", "--seq", "8",
                              "--atol", "0", "--json"])
    report = _report(code, stdout, err, "convert.json")
    assert code == 1 and report["error"]["kind"] == "parity" and not out.exists()
    assert not report["parity"]["ok"] and [s["name"] for s in report["stages"]][:2] == [
        "load TF model", "tf2onnx export"]


def test_verify_parity_failure(work):
    code, stdout, err = _run(["verify", work["fused"], "--load-inputs", work["in"],
                              "--load-outputs", work["tf"], "--atol", "0", "--json"])
    report = _report(code, stdout, err, "verify.json")
    assert code == 1 and report["error"]["kind"] == "parity" and not report["parity"]["ok"]


def test_strict_refusal_prints_the_report(work, tmp_path):
    """A model whose last attention's softmax runs over the wrong axis: that layer cannot
    fuse, and --strict refuses it with the run so far."""
    model = onnx.load(str(work["raw"]))
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"][-1]
    del softmax.attribute[:]
    softmax.attribute.append(onnx.helper.make_attribute("axis", 1))
    bent, out = tmp_path / "bent.onnx", tmp_path / "m.onnx"
    onnx.save(model, str(bent))
    code, stdout, err = _run(["optimize", bent, "-o", out, "--strict", "--json"])
    report = _report(code, stdout, err, "optimize.json")
    assert code == 1 and report["error"]["kind"] == "strict" and not out.exists()
    assert "layer 1" in report["error"]["message"] and report["passes"]["diagnostics"]


def test_diff_fail_on(work):
    code, stdout, err = _run(["diff", work["fused"], work["raw"], "--json"])
    report = _report(code, stdout, err, "diff.json")
    assert code == 1 and report["error"]["kind"] == "fail_on" and report["failing"]


# --------------------------------------------------------------------------- exit 2 and 3


@pytest.mark.parametrize("argv", [
    ["example", "--config", "nope", "-o", "{root}/x"],
    ["convert", "{root}/nope", "-o", "{root}/x.onnx"],
    ["convert", "{tiny}", "-o", "{root}/x.onnx", "--precision", "int9"],  # a refused option
    ["optimize", "{root}/nope.onnx", "-o", "{root}/x.onnx"],
    ["verify", "{fused}", "--load-inputs", "{root}/nope.npz", "--load-outputs", "{tf}"],
    ["strip-weights", "{root}/nope.onnx", "-o", "{root}/x.onnx"],
    ["inspect", "{root}/nope.onnx"], ["summarize", "{root}/nope.onnx"],
    ["diff", "{fused}", "{root}/nope.onnx"], ["draw", "{fused}", "-o", "{root}/x.bmp"],
    ["tokenize", "--vocab", "{root}/nope.txt", "x"],
    ["export-triton", "{root}/nope.onnx", "-o", "{root}/repo"],
    ["kernels", "info"], ["kernels", "build"], ["kernels", "check"],
    ["bench", "--skeletons", "{root}/nope"],
    ["score", "--model", "{root}/nope.onnx", "--input", "{root}/x.parquet", "--output",
     "{root}/scored"],
    ["serve", "{root}/nope.onnx"],
], ids=lambda a: "-".join(a[:2]) if a[0] == "kernels" else a[0] + ("-usage" if "int9" in a
                                                                    else ""))
def test_exit_2_report_validates(work, argv):
    if argv[:2] == ["kernels", "info"] and _has_gpu():
        pytest.skip("kernels info answers on a GPU host")
    code, stdout, err = _run([a.format(**work) for a in argv] + ["--json"])
    report = _report(code, stdout, err, "-".join(argv[:2]) + ".json" if argv[0] == "kernels"
                     else argv[0] + ".json")
    assert code == 2 and report["error"]["kind"] in ("bad_input", "usage", "kernels",
                                                     "missing_dependency"), report


def test_a_missing_optional_package_is_a_report(work, tmp_path):
    """TensorFlow is installed here: a real process that cannot import it."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys\nsys.modules['tensorflow'] = None\n"
         "from bertfuse.cli import main\nsys.exit(main(sys.argv[1:]))", "convert",
         str(work["tiny"]), "-o", str(tmp_path / "m.onnx"), "--json"],
        capture_output=True, text=True, env=ENV, timeout=120)
    report = _report(proc.returncode, proc.stdout, proc.stderr, "convert.json")
    assert proc.returncode == 2 and report["error"]["kind"] == "missing_dependency", report
    assert "tensorflow" in report["error"]["message"]


def test_a_bug_is_exit_3_with_a_report(work, monkeypatch):
    """A bug of ours (here: summarize raising what it never should) still leaves CI a
    report: kind internal, exit 3."""
    import bertfuse.cli.inspect  # where the inspect command finds summarize

    def broken(model):
        raise KeyError("a bug")

    monkeypatch.setattr(bertfuse.cli.inspect, "summarize", broken)
    code, stdout, err = _run(["inspect", work["fused"], "--json"])
    report = _report(code, stdout, err, "inspect.json")
    assert code == 3 and report["error"]["kind"] == "internal"


def test_every_command_has_a_schema():
    from bertfuse.cli.registry import commands

    names = set(schema_names())
    wanted = {f"{c.name}.json" for c in commands() if c.name != "kernels"} | {
        f"kernels-{a}.json" for a in ("build", "check", "info")}
    assert wanted <= names, wanted - names


def _has_gpu() -> bool:
    from bertfuse.kernels.library import KernelLibraryError, detect_sm

    try:
        detect_sm()
        return True
    except KernelLibraryError:
        return False
