"""Progress on stderr (runtime/progress.py's StageLines, cli/args.py's -q/-v): on a pipe one
line per finished stage with its seconds, read here from real processes; nothing with -q or
--json; sub-steps with -v; a failing stage leaves only the one-line error; a spinner on a
terminal that is cleared at the end."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bertfuse.runtime.progress import NORMAL, QUIET, VERBOSE, StageLines
from support.paths import ROOT

LINE = re.compile(r"^bertfuse (\w[\w ]*): (.+) (\d+\.\d)s \((\d+\.\d)s in all\)$")


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "bertfuse", *map(str, argv)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("progress") / "tiny"
    return out, _run("example", "--config", "tiny", "-o", out)


def test_example_on_a_pipe_prints_its_stage_with_seconds(example):
    out, proc = example
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and LINE.match(lines[0]), proc.stderr
    assert LINE.match(lines[0]).group(1) == "example"


def test_convert_on_a_pipe_prints_one_line_per_stage(example, tmp_path):
    src, _ = example
    proc = _run("convert", src, "-o", tmp_path / "m.onnx")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    stages = [LINE.match(ln) for ln in lines]
    assert all(stages), proc.stderr
    names = [m.group(2) for m in stages]
    assert names[:2] == ["load TF model", "tf2onnx export"] and names[-1] == "write", names
    assert "verify vs TensorFlow" in names
    totals = [float(m.group(4)) for m in stages]
    assert totals == sorted(totals)  # the running total only grows
    assert "wrote" in proc.stdout  # the report stays on stdout


@pytest.mark.parametrize("flag", ["-q", "--json"])
def test_quiet_and_json_print_no_progress(example, tmp_path, flag):
    src, _ = example
    proc = _run("verify", _model(example, tmp_path),
                "--against", src, flag)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


def test_verbose_adds_the_sub_steps(example, tmp_path):
    src, _ = example
    proc = _run("convert", src, "-o", tmp_path / "m.onnx", "-v", "--no-verify")
    assert proc.returncode == 0, proc.stderr
    assert "bertfuse convert:   pass: attention" in proc.stderr
    assert "--quiet" in _run("convert", "--help").stdout


def test_a_failing_stage_leaves_only_the_error_line(tmp_path):
    pb = tmp_path / "garbage.pb"
    pb.write_bytes(b"not a graph \xff\xfe" * 20)
    proc = _run("convert", pb, "-o", tmp_path / "m.onnx")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("bertfuse: error")


def _model(example, tmp_path) -> Path:
    src, _ = example
    path = tmp_path / "v.onnx"
    if not path.exists():
        assert _run("convert", src, "-o", path, "-q", "--no-verify").returncode == 0
    return path


# ---------------------------------------------------------------------- StageLines itself


def _clock(lines: StageLines, times: list[float]) -> None:
    ticks = iter(times)
    lines._clock = lambda: next(ticks)
    lines._start = lines._since = 0.0


def test_stage_lines_time_each_stage_and_skip_a_failed_one():
    out = io.StringIO()
    say = StageLines("serve", NORMAL, stream=out, tty=False)
    _clock(say, [0.0, 1.5, 1.5])
    say("start Ray")
    say("replica: 1/2 warm")  # a sub-step: only with -v
    say("warm replicas")  # ends "start Ray" at 1.5
    say.close(ok=False)  # "warm replicas" failed: no line
    assert out.getvalue() == "bertfuse serve: start Ray 1.5s (1.5s in all)\n"


def _said(verbosity: int, tty: bool, *messages: str) -> str:
    out = io.StringIO()
    with StageLines("score", verbosity, stream=out, tty=tty) as say:
        for message in messages:
            say(message)
    return out.getvalue()


def test_stage_lines_verbose_and_quiet():
    said = _said(VERBOSE, False, "start Ray", "actor: 1 ready")
    assert "bertfuse score:   actor: 1 ready" in said and said.rstrip().endswith("in all)")
    assert _said(QUIET, False, "start Ray") == ""


def test_stage_lines_spinner_on_a_terminal_is_cleared():
    assert "in all" not in _said(NORMAL, True, "load TF model", "passes")  # no stage lines
