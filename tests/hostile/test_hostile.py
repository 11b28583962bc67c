"""Hostile input to every command: a clear refusal, never damage.

Each CLI case (tests/support/hostile_cases.py) runs `bertfuse.cli.main` in-process in a private
workspace (the current directory) with a private TMPDIR, and asserts: the exit code; exactly one
stderr line holding the case's needle (exit 2), none on success; no traceback; no file left
behind in the workspace or the temp dir; and every file that was there byte-identical after
(symlinks, fifos and directories included). Real processes cover what capsys cannot see: TF/ORT
C++ logs on fd 2, and SIGTERM/SIGHUP/SIGINT at the export, check and write stages. Inputs come
from conftest's session fixtures (one tiny checkpoint, converted once). The runtime API's cases
are in test_hostile_runtime.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from bertfuse.cli import main
from support.hostile_cases import ALL_CASES, LIBRARY, Case
from support.hostile_workspace import (Workspace, assert_clean_outcome, assert_nothing_left,
                               derive_models, digest, error_lines)


@pytest.fixture(scope="session")
def hostile_lib(tmp_path_factory, ckpt_erf, frozen_pb, savedmodel_dir, convert_cached
                ) -> dict[str, Path]:
    """Every library input of the case table, made once (the conversion shared with other
    modules through convert_cached)."""
    fused = convert_cached(ckpt_erf)
    raw = convert_cached(ckpt_erf, "--no-fuse", "--no-verify")
    assert fused.exit_code == 0 and raw.exit_code == 0
    lib = tmp_path_factory.mktemp("hostile_lib")
    p = {name: lib / file for name, file in LIBRARY.items()}
    shutil.copytree(ckpt_erf.path, p["ckpt"])
    shutil.copy(fused.onnx_path, p["fused"])
    shutil.copy(raw.onnx_path, p["raw"])
    shutil.copy(frozen_pb.path, p["frozen"])
    shutil.copytree(savedmodel_dir.path, p["savedmodel"])
    derive_models(p["fused"], p)
    LIB_DIGEST.update(digest(lib))
    return p


LIB_DIGEST: dict[str, str] = {}  # the library as made, checked by the module's last test


@pytest.fixture
def ws(tmp_path, hostile_lib, monkeypatch) -> Workspace:
    root = tmp_path / "w"
    root.mkdir()
    monkeypatch.chdir(root)  # a relative or empty -o lands here, never in the repository
    return Workspace(root, hostile_lib)


@pytest.fixture
def private_tmp(tmp_path, hostile_lib, monkeypatch) -> Path:
    """TMPDIR for the case alone (env and tempfile's cache), outside the workspace."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


# ------------------------------------------------------------------------------ CLI table


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.name, marks=marks)


def _has_cuda() -> bool:
    from bertfuse.bench.models import no_cuda as _no_cuda

    return _no_cuda() is None


@pytest.mark.parametrize("case", [_param(c) for c in ALL_CASES])
def test_cli(case: Case, ws: Workspace, private_tmp: Path, capsys):
    if case.name == "bench-no-gpu" and _has_cuda():
        pytest.skip("a CUDA GPU is here")
    ws.setup(case.setup)
    argv = [ws.fmt(t) for t in case.argv]
    before = digest(ws.root)
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse or sys.exit escaping main(): not a clean refusal
        cap = capsys.readouterr()
        pytest.fail(f"main() raised SystemExit({exc.code}); stderr:\n{cap.err}")
    cap = capsys.readouterr()
    assert_clean_outcome(rc, cap.out, cap.err, case.code, case.needle)
    assert_nothing_left(before, digest(ws.root), set(case.creates), private_tmp)


def test_case_table_is_large_and_distinct():
    names = [c.name for c in ALL_CASES]
    assert len(names) == len(set(names))
    commands = {c.argv[0] for c in ALL_CASES}
    assert {"example", "convert", "optimize", "verify", "strip-weights", "inspect", "summarize",
            "diff", "draw", "bench"} <= commands
    assert len({repr((c.argv, c.setup)) for c in ALL_CASES}) == len(ALL_CASES)


# ------------------------------------------------------------- a fifo where a file belongs

FIFO_INPUTS = {
    "inspect": "inspect {p}",
    "summarize": "summarize {p}",
    "optimize": "optimize {p} -o {out}",
    "strip": "strip-weights {p} -o {out}",
    "diff": "diff {p} {fused}",
    "draw-before": "draw {fused} --before {p} -o {w}/d.dot",
    "verify": "verify {p} --against {ckpt}",
    "convert-config": "convert {ckpt} --config {p} -o {out}",
    "convert-source": "convert {p} -o {out}",
    "tokenize-vocab": "tokenize --vocab {p} x",
    "export-triton": "export-triton {p} -o {w}/repo",
}


class _Unblocker(threading.Thread):
    """After `after` s, opens the fifo for writing and closes it, so a reader blocked on it
    sees end-of-file: a hang becomes a failed test instead of a stuck run."""

    def __init__(self, fifo: Path, after: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.fifo, self.after, self.stop, self.fired = fifo, after, threading.Event(), False

    def run(self) -> None:
        if self.stop.wait(self.after):
            return
        while not self.stop.is_set():
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
                self.fired = True
            except OSError:  # no reader (yet)
                pass
            time.sleep(0.05)


@pytest.mark.parametrize("argv", list(FIFO_INPUTS.values()), ids=list(FIFO_INPUTS))
def test_fifo_input_is_refused_not_waited_on(argv, ws, private_tmp, capsys):
    ws.setup((("fifo", "p"),))
    tokens = [ws.fmt(t) for t in argv.split(" ")]
    before = digest(ws.root)
    guard = _Unblocker(ws.root / "p")
    guard.start()
    try:
        rc = main(tokens)
    finally:
        guard.stop.set()
        guard.join()
    cap = capsys.readouterr()
    assert not guard.fired, "bertfuse blocked reading the fifo"
    assert_clean_outcome(rc, cap.out, cap.err, 2, str(ws.root / "p"))
    assert_nothing_left(before, digest(ws.root), set(), private_tmp)


# ------------------------------------------------------------ unreadable / unwritable paths

AS_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes through "
                                                        "chmod 000 (CI runs as root)")
PERMISSIONS = {
    "inspect-unreadable-model": ("inspect {fused}", "{fused}"),
    "optimize-unreadable-model": ("optimize {raw} -o {out}", "{raw}"),
    "convert-unreadable-config": ("convert {ckpt} --config {cfg.json} -o {out}", "{cfg.json}"),
    "convert-unreadable-shard": ("convert {ckpt} -o {out}", "{ckpt}/" +
                                 "bert_model.ckpt.data-00000-of-00001"),
    "strip-unwritable-dir": ("strip-weights {fused} -o {ro}/x.onnx", "{ro}"),
}


@AS_ROOT
@pytest.mark.parametrize("argv, locked", list(PERMISSIONS.values()), ids=list(PERMISSIONS))
def test_permission_denied_is_bad_input(argv, locked, ws, private_tmp, capsys):
    ws.setup((("cfg", "cfg.json", {}), ("mkdir", "ro")))
    tokens = [ws.fmt(t) for t in argv.split(" ")]
    target = Path(ws.fmt(locked))
    mode = target.stat().st_mode
    target.chmod(0o500 if target.is_dir() else 0)
    try:
        before = digest(ws.root)
        rc = main(tokens)
        cap = capsys.readouterr()
        assert_clean_outcome(rc, cap.out, cap.err, 2, None)
        assert_nothing_left(before, digest(ws.root), set(), private_tmp)
    finally:
        target.chmod(mode)


# --------------------------------------------------------------------- real processes

def _proc_env(tmpdir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return {**env, "TMPDIR": str(tmpdir), **extra}


# TF and ORT log from C++ straight to fd 2: one stderr line must hold there too.
PROCESS_CASES = {
    "convert-config-mismatch": ("convert {ckpt} --config {cfg.json} -o {out}",
                                (("cfg", "cfg.json", {"num_hidden_layers": 3}),), "layer_2"),
    "optimize-skeleton": ("optimize {skel} -o {out}", (), "ONNX Runtime cannot load"),
    "diff-numeric-skeleton": ("diff {skel} {fused} --numeric", (), "skel.onnx"),
}


@pytest.mark.parametrize("argv, setup, needle", list(PROCESS_CASES.values()),
                         ids=list(PROCESS_CASES))
def test_real_process_one_stderr_line(argv, setup, needle, ws, private_tmp):
    ws.setup(setup)
    tokens = [ws.fmt(t) for t in argv.split(" ")]
    before = digest(ws.root)
    proc = subprocess.run([sys.executable, "-m", "bertfuse.cli", *tokens], capture_output=True,
                          text=True, timeout=300, cwd=ws.root, env=_proc_env(private_tmp))
    assert_clean_outcome(proc.returncode, proc.stdout, proc.stderr, 2, needle)
    assert proc.stdout == ""
    assert_nothing_left(before, digest(ws.root), set(), private_tmp)


# (command, stage it is paused at, signal): SIGTERM, SIGHUP and SIGINT at each of the export,
# check and write stages.
SIGNAL_ARGV = {
    "convert": "convert {ckpt} -o {out} --batch 2 --seq 8",
    "optimize": "optimize {raw} -o {out}",
    "optimize-in-place": "optimize {raw} --in-place",
    "strip": "strip-weights {fused} -o {out}",
}
SIGNAL_CASES = [
    ("convert", "tf2onnx export", signal.SIGTERM),
    ("convert", "tf2onnx export", signal.SIGHUP),
    ("convert", "tf2onnx export", signal.SIGINT),
    ("optimize", "check-tmp", signal.SIGTERM),
    ("optimize", "check-tmp", signal.SIGHUP),
    ("optimize-in-place", "check-tmp", signal.SIGINT),
    ("optimize", "save-tmp", signal.SIGTERM),
    ("optimize-in-place", "save-tmp", signal.SIGHUP),
    ("strip", "save-tmp", signal.SIGINT),
]
STAGE_TEMP = {"check-tmp": ".bertfuse-", "save-tmp": "."}  # name prefix, beside the output


@pytest.mark.parametrize("command, stage, signo", SIGNAL_CASES,
                         ids=[f"{c}-{s.split()[-1]}-{g.name}" for c, s, g in SIGNAL_CASES])
def test_signal_at_stage_leaves_nothing(command, stage, signo, ws, private_tmp, tmp_path):
    tokens = [ws.fmt(t) for t in SIGNAL_ARGV[command].split(" ")]
    flag = tmp_path / "paused"
    before = digest(ws.root)
    proc = subprocess.Popen([sys.executable, "-m", "bertfuse.cli", *tokens], cwd=ws.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_proc_env(private_tmp, BERTFUSE_TEST_PAUSE=f"{stage}:{flag}"))
    try:
        deadline = time.monotonic() + 240
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), f"never reached {stage!r}: {proc.communicate(timeout=60)}"
        if stage in STAGE_TEMP:  # the stage's temporary exists when the signal comes
            assert any(p.name.startswith(STAGE_TEMP[stage]) for p in ws.root.iterdir()), stage
        proc.send_signal(signo)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    word = "interrupted" if signo == signal.SIGINT else "terminated"
    lines = error_lines(err)  # the stages finished before the signal print their lines
    assert proc.returncode == 128 + signo, err
    assert lines == [f"bertfuse: {word}"], err
    assert_nothing_left(before, digest(ws.root), set(), private_tmp)


# ---------------------------------------------------------------------------- last

def test_library_inputs_untouched(hostile_lib):
    """The session's shared inputs are byte-identical after every case above."""
    assert LIB_DIGEST and digest(hostile_lib["ckpt"].parent) == LIB_DIGEST
