"""The public API (bertfuse.convert / optimize / Session / SessionPool), the command line's
entry points (python -m bertfuse, --version, --help examples, optimize --inputs), missing
optional packages, the JSON report's schema and versions, and non-terminal output width."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import bertfuse
from bertfuse.errors import install_hint
from bertfuse.cli import main
from bertfuse.cli.parser import build_parser
from bertfuse.errors import BertfuseError, ParityError
from support.paths import ROOT

TF_NAMES = {"input_ids": "input_word_ids:0", "input_mask": "input_mask:0",
            "segment_ids": "input_type_ids:0"}


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from bertfuse.converter.example import write_example

    return write_example("tiny", str(tmp_path_factory.mktemp("api") / "tiny"), seed=0)


@pytest.fixture(scope="module")
def raw_export(tiny, tmp_path_factory) -> dict[str, Path]:
    """The unfused graph as a user's own tf2onnx export names it (TF tensor names), with
    int32 and with int64 inputs (Keras exports take int64)."""
    from hostile.test_bad_input import _with_tf_names

    root = tmp_path_factory.mktemp("own")
    model, _ = bertfuse.convert(tiny, fuse=False, verify=False)
    onnx.save(model, str(root / "canonical.onnx"))
    out = {}
    for dtype in ("int32", "int64"):
        out[dtype] = root / f"raw_{dtype}.onnx"
        _with_tf_names(root / "canonical.onnx", out[dtype], int64=dtype == "int64")
    return out


# --------------------------------------------------------------------------- import


def test_import_needs_neither_tensorflow_nor_onnxruntime():
    """`import bertfuse` and its public names work with TF, tf2onnx and ORT unimportable;
    the import itself loads no numpy/onnx (it stays fast)."""
    proc = _python(
        "import sys\n"
        "for m in ('tensorflow', 'tf2onnx', 'onnxruntime'): sys.modules[m] = None\n"
        "import bertfuse\n"
        "heavy = sorted(m for m in ('numpy', 'onnx', 'rich') if m in sys.modules)\n"
        "names = [bertfuse.convert, bertfuse.optimize, bertfuse.SessionPool, bertfuse.Session]\n"
        "print(heavy, bertfuse.__version__, len(names))\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[]", bertfuse.__version__, "4"]


def test_lazy_names_are_the_real_objects():
    from bertfuse.api import convert
    from bertfuse.runtime.pool import SessionPool

    assert bertfuse.convert is convert and bertfuse.SessionPool is SessionPool
    with pytest.raises(AttributeError):
        bertfuse.no_such_name  # noqa: B018


# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize("kwargs, needle", [
    ({"precision": "int8"}, "fp32, fp16, fp8"),
    ({"precision": None}, "fp32, fp16, fp8"),
    ({"inputs": {"ids": "x"}}, "unknown role 'ids'"),
    ({"inputs": "input_ids=x"}, "dict of role -> input name"),
    ({"inputs": {"input_ids": ""}}, "input_ids must name a model input"),
    ({"seed": -1}, "seed must be at least 0, not -1"),
    ({"seed": 1.5}, "seed must be an integer, not 1.5"),
    ({"atol": float("nan")}, "atol must be a finite number >= 0"),
    ({"rtol": -1e-3}, "rtol must be a finite number >= 0"),
    ({"batch": 0}, "batch must be at least 1, not 0"),
    ({"batch": 1024, "seq": 1024}, "at most 65536"),
    ({"verify": "no"}, "verify must be True or False"),
    ({"format": "torch"}, "format 'torch' is not one of"),
    ({"opset": 12}, "bertfuse writes opset 17 or 18"),
    ({"outputs": "pooled_output"}, "outputs must be a list of names"),
    ({"progress": 3}, "progress must be a callable"),
])
def test_convert_refuses_bad_arguments(tiny, tmp_path, kwargs, needle):
    out = tmp_path / "m.onnx"
    with pytest.raises(BertfuseError, match=None) as info:
        bertfuse.convert(tiny, out, **kwargs)
    assert needle in str(info.value)
    assert not out.exists()


@pytest.mark.parametrize("source", [None, 3, ""])
def test_convert_refuses_a_source_that_is_no_path(source):
    with pytest.raises(BertfuseError, match="source must be a path"):
        bertfuse.convert(source)


def test_optimize_refuses_bad_arguments(raw_export, tmp_path):
    with pytest.raises(BertfuseError, match="fp32, fp16, fp8"):
        bertfuse.optimize(raw_export["int32"], precision="int8")
    with pytest.raises(BertfuseError, match="unknown role 'token_ids'"):
        bertfuse.optimize(raw_export["int32"], inputs={"token_ids": "input_word_ids:0"})
    with pytest.raises(BertfuseError, match="the model has no input 'nope'"):
        bertfuse.optimize(raw_export["int32"], inputs={"input_ids": "nope"})
    before = raw_export["int32"].read_bytes()
    with pytest.raises(BertfuseError, match="refusing to overwrite it"):
        bertfuse.optimize(raw_export["int32"], raw_export["int32"])
    assert raw_export["int32"].read_bytes() == before
    model = onnx.load(str(raw_export["int32"]))
    copy = model.SerializeToString()
    bertfuse.optimize(model, inputs={})  # a ModelProto given is left as it was
    assert model.SerializeToString() == copy


# --------------------------------------------------------------------------- convert


def test_convert_returns_the_model_and_writes_only_when_asked(tiny, tmp_path):
    stages = []
    model, report = bertfuse.convert(tiny, seed=0, progress=stages.append)
    assert isinstance(model, onnx.ModelProto) and not report.written and report.output is None
    assert report.parity.ok and "verify vs TensorFlow" in stages
    assert not any(tmp_path.iterdir())
    ops = {n.op_type for n in model.graph.node}
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"} <= ops

    out = tmp_path / "tiny.onnx"
    written, report = bertfuse.convert(str(tiny), out, seed=0)
    assert report.written and out.is_file()
    on_disk = onnx.load(str(out))
    assert [n.op_type for n in on_disk.graph.node] == [n.op_type for n in written.graph.node]
    assert [i.name for i in on_disk.graph.input] == ["input_ids", "input_mask", "segment_ids"]


def test_convert_parity_failure_raises_and_writes_nothing(tiny, tmp_path):
    """atol=0 with the mean limit gone: fused float math differs from TF in the last bits."""
    out = tmp_path / "tiny.onnx"
    with pytest.raises(ParityError) as info:
        bertfuse.convert(tiny, out, atol=0.0, seed=0)
    assert "not written" in str(info.value) and not info.value.report.parity.ok
    assert not out.exists()
    model, report = bertfuse.convert(tiny, atol=0.0, seed=0, force=True)
    assert not report.parity.ok and isinstance(model, onnx.ModelProto)


def test_json_report_has_schema_and_tool_versions(tiny):
    from importlib import metadata

    import tensorflow as tf

    from bertfuse.pipeline.report import SCHEMA_VERSION

    _, report = bertfuse.convert(tiny, verify=False)
    data = json.loads(json.dumps(report.to_json(), default=str))
    assert data["schema_version"] == SCHEMA_VERSION == 1 and data["command"] == "convert"
    assert data["tools"] == {"bertfuse": bertfuse.__version__,
                             "tf2onnx": metadata.version("tf2onnx"),
                             "onnx": metadata.version("onnx"),
                             "onnxruntime": _ort_version(), "tensorflow": tf.__version__}
    for key in ("output", "written", "stages", "original_names", "passes", "parity"):
        assert key in data


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


# --------------------------------------------------------------------------- optimize --inputs


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_optimize_inputs_renames_to_the_roles_session_takes(raw_export, tmp_path, dtype):
    """An own export keeps its TF input names; with inputs= they become the canonical
    int32 roles, and bertfuse's Session runs the model like plain ORT runs the export."""
    import onnxruntime as ort

    from bertfuse.io.inputs import random_inputs

    raw = raw_export[dtype]
    if dtype == "int32":  # without inputs= the export's names stay
        kept, _ = bertfuse.optimize(raw)
        assert [i.name for i in kept.graph.input] == list(TF_NAMES.values())

    out = tmp_path / "fused.onnx"
    model, report = bertfuse.optimize(str(raw), out, inputs={"input_ids": "input_word_ids:0"})
    assert report.written and out.is_file()
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == \
        [(r, TensorProto.INT32) for r in TF_NAMES]
    assert report.original_names == TF_NAMES
    assert report.passes.table.fully_fused

    feeds = random_inputs(3, 16, 100, seed=0)
    plain = ort.InferenceSession(str(raw), providers=["CPUExecutionProvider"])
    want = plain.run(None, {TF_NAMES[r]: a.astype(dtype) for r, a in feeds.items()})
    with bertfuse.Session(str(out), max_batch=4, max_seq=16, device="cpu") as sess:
        got = sess.run(feeds["input_ids"], feeds["input_mask"], feeds["segment_ids"])
    names = [o.name for o in plain.get_outputs()]
    for name, expected in zip(names, want):
        keep = feeds["input_mask"].astype(bool) if expected.ndim == 3 else slice(None)
        assert np.abs(got[name][keep] - expected[keep]).max() <= 1e-4, name


def test_cli_optimize_inputs(raw_export, tmp_path, capsys):
    out = tmp_path / "fused.onnx"
    rc = main(["optimize", str(raw_export["int64"]), "-o", str(out), "--json",
               "--inputs", "input_ids=input_word_ids:0,segment_ids=input_type_ids:0"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    report = json.loads(cap.out)
    assert report["command"] == "optimize" and report["original_names"] == TF_NAMES
    assert [i.name for i in onnx.load(str(out)).graph.input] == list(TF_NAMES)
    rc = main(["optimize", str(raw_export["int64"]), "-o", str(tmp_path / "x.onnx"),
               "--inputs", "token=input_word_ids:0"])
    assert rc == 2 and "expected ROLE=NAME" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


# --------------------------------------------------------------------------- command line


def test_python_m_bertfuse_and_version():
    proc = subprocess.run([sys.executable, "-m", "bertfuse", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"bertfuse {bertfuse.__version__}"
    proc = subprocess.run([sys.executable, "-m", "bertfuse", "frobnicate"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_every_subcommand_help_shows_an_example():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        text = parser.format_help()
        assert "example:\n" in text and f"bertfuse {name} " in text, name


@pytest.mark.parametrize("argv", [["convert", "{tiny}", "-o", "{out}"],
                                  ["verify", "{out}", "--against", "{tiny}"],
                                  ["example", "--config", "tiny", "-o", "{dir}"]])
def test_missing_tensorflow_is_exit_2_with_the_install_hint(tiny, tmp_path, argv):
    """TF is installed here: a real process that cannot import it (None in sys.modules)."""
    args = [a.format(tiny=tiny, out=tmp_path / "m.onnx", dir=tmp_path / "ex") for a in argv]
    proc = _python("import sys\nsys.modules['tensorflow'] = None\n"
                   "from bertfuse.cli import main\nsys.exit(main(sys.argv[1:]))", *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and install_hint("tf") in lines[0], lines
    assert "internal error" not in lines[0] and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_missing_onnxruntime_is_exit_2_with_the_install_hint(raw_export, tmp_path):
    proc = _python("import sys\nsys.modules['onnxruntime'] = None\n"
                   "from bertfuse.cli import main\nsys.exit(main(sys.argv[1:]))",
                   "optimize", str(raw_export["int32"]), "-o", str(tmp_path / "m.onnx"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert install_hint("cpu") in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_api_missing_tensorflow_raises_missing_dependency(tiny):
    proc = _python("import sys\nsys.modules['tensorflow'] = None\nimport bertfuse\n"
                   "try:\n    bertfuse.convert(sys.argv[1])\n"
                   "except bertfuse.MissingDependency as exc:\n    print(exc)\n", str(tiny))
    assert proc.returncode == 0 and install_hint("tf") in proc.stdout, proc.stderr


# --------------------------------------------------------------------------- output width


def test_console_is_not_wrapped_when_not_a_terminal(monkeypatch):
    from rich.table import Table

    from bertfuse.cli.render import make_console

    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    table = Table(title="t")
    table.add_column("layer")
    table.add_column("not fused because")
    reason = "attention not fused (" + "the mask is not the padded form; " * 6 + ")"
    table.add_row("0", reason)
    make_console(file=buf).print(table)
    assert any(reason in line for line in buf.getvalue().splitlines())
    monkeypatch.setenv("COLUMNS", "60")  # an explicit width still wins
    buf = io.StringIO()
    make_console(file=buf).print(table)
    assert max(len(line) for line in buf.getvalue().splitlines()) <= 60


# ------------------------------------------------------------ quiet, hints, external data


def test_api_silences_native_logs_but_not_the_callers_progress(tiny, tmp_path):
    """TF's C++ lines (absl, cpu_feature_guard, I0000/E0000) never reach the API's caller;
    what the caller's progress callback prints does."""
    code = ("import sys, bertfuse\n"
            "bertfuse.convert(sys.argv[1], progress=lambda s: print('STAGE', s, "
            "file=sys.stderr))\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-c", code, str(tiny)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("STAGE ") for ln in lines), proc.stderr[-2000:]
    assert "STAGE load TF model" in lines
    with pytest.raises(BertfuseError, match="native_logs"):
        bertfuse.convert(tiny, native_logs="yes")


def _foreign(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "pytorch_model.bin").write_bytes(b"\x80\x02")
    nested = tmp_path / "hf_sm"
    (nested / "saved_model" / "1").mkdir(parents=True)
    (nested / "config.json").write_text("{}")
    (nested / "saved_model" / "1" / "saved_model.pb").write_bytes(b"")
    for name in ("pytorch_model.bin", "tf_model.h5", "model.safetensors"):
        (tmp_path / name).write_bytes(b"\x00" * 8)
    return {"bin": (tmp_path / "pytorch_model.bin", "from_pt=True"),
            "h5": (tmp_path / "tf_model.h5", "model.export(OUT)"),
            "safetensors": (tmp_path / "model.safetensors", "saved_model=True"),
            "hf folder": (hf, "without a SavedModel"),
            "hf nested": (nested, str(nested / "saved_model" / "1"))}


@pytest.mark.parametrize("case", ["bin", "h5", "safetensors", "hf folder", "hf nested"])
def test_sources_no_format_reads_get_a_pointed_hint(tmp_path, capsys, case):
    path, needle = _foreign(tmp_path)[case]
    rc = main(["convert", str(path), "-o", str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert "pass --format" not in err


def test_opset_13_is_bertfuses_own_limit(tiny, tmp_path, capsys):
    assert main(["convert", str(tiny), "-o", str(tmp_path / "m.onnx"), "--opset", "13"]) == 2
    err = capsys.readouterr().err
    assert "bertfuse writes opset 17 or 18" in err and "tf2onnx" not in err


def test_external_data_for_any_model(tiny, raw_export, tmp_path, capsys):
    out = tmp_path / "small.onnx"
    assert main(["convert", str(tiny), "-o", str(out), "--external-data", "--no-verify"]) == 0
    data = tmp_path / "small.onnx.data"
    assert data.stat().st_size > out.stat().st_size  # the weights are beside the model
    assert len(onnx.load(str(out)).graph.initializer) > 0
    opt = tmp_path / "opt.onnx"
    bertfuse.optimize(raw_export["int32"], opt, external_data=True)
    assert (tmp_path / "opt.onnx.data").exists()


def test_package_is_typed_and_the_sdist_carries_the_tests():
    import tomllib

    assert (ROOT / "bertfuse" / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["bertfuse"]
    manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
    for line in ("graft tests", "graft examples"):  # helpers, fixtures (reference.npz), e2e
        assert line in manifest
    assert "pip install '.[tf,cpu]'" in (ROOT / "docs" / "install.md").read_text()
