"""What a killed or starved `bertfuse convert` (or optimize, export-triton) leaves behind.

* kill -9 at the check and at the write (real processes, paused by the BERTFUSE_TEST_PAUSE
  hook of bertfuse/io/safety.py): the scratch copy and the temp file lie beside the output
  (nothing in TMPDIR), named after their process; the next run there removes those of gone
  processes, and leaves every other file: one that only looks like a temporary, one of a
  live process, one of another host.
* A full disk (a file-size limit stands in: the same failed write(2), EFBIG instead of
  ENOSPC): one line naming the folder or file being written, exit 2, no temporary left.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from bertfuse.ray_cluster import process_start
from support.hostile_workspace import ORT_TMP_FILES
from support.paths import ROOT

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
       "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
# `.NAME.bertfuse-SPACE-PID-START-XXXXXXXX.tmp` and `.bertfuse-SPACE-PID-START-check-XXXXXXXX`
OURS = re.compile(r"\.(?:\w+\.onnx\.)?bertfuse-(?P<space>[0-9a-f]{8})-(?P<pid>\d+)-"
                  r"(?P<start>\d+)-(?:check-)?[a-z0-9_]{8}(?:\.tmp)?")


def _convert(ckpt, out: Path) -> list[str]:
    return [sys.executable, "-m", "bertfuse", "convert", str(ckpt), "-o", str(out),
            "--batch", "2", "--seq", "8"]


def _killed_at(stage: str, argv: list[str], tmpdir: Path, flag: Path) -> int:
    """A run paused at `stage`, then killed with SIGKILL: no cleanup of its own runs."""
    env = {**ENV, "TMPDIR": str(tmpdir), "BERTFUSE_TEST_PAUSE": f"{stage}:{flag}"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), f"never reached {stage!r}: {proc.communicate(timeout=60)}"
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    flag.unlink()
    assert proc.returncode == -signal.SIGKILL
    return proc.pid


def _ours(tmpdir: Path) -> list[Path]:
    """What the runs left in TMPDIR, ONNX Runtime's own session id file aside."""
    return [p for p in tmpdir.iterdir() if p.name not in ORT_TMP_FILES]


def test_kill_9_leftovers_are_swept_by_the_next_run_and_nothing_else(ckpt_erf, tmp_path):
    out_dir, tmpdir, flags = tmp_path / "out", tmp_path / "tmp", tmp_path / "flags"
    for d in (out_dir, tmpdir, flags):
        d.mkdir()
    out = out_dir / "model.onnx"

    # 1. killed in the check: its scratch copy of the model is left, beside the output
    pid_a = _killed_at("check-tmp", _convert(ckpt_erf.path, out), tmpdir, flags / "a")
    left = list(out_dir.iterdir())
    assert len(left) == 1 and left[0].is_dir() and (left[0] / "model.onnx").stat().st_size > 0, \
        f"beside the output: {left}; in TMPDIR: {list(tmpdir.iterdir())}"
    named = OURS.fullmatch(left[0].name)
    assert named and int(named["pid"]) == pid_a, left[0].name
    assert _ours(tmpdir) == []  # no byte outside the output's folder
    space = named["space"]

    # Beside it: files that only look like bertfuse's, a temp of a live process (this one),
    # one of a process of another host, and one whose PID now names another process.
    me, start = os.getpid(), process_start(os.getpid())
    keep = [".model.onnx.abcd1234.tmp", ".model.onnx.bertfuse-notes.tmp",
            f"model.onnx.bertfuse-{space}-{pid_a}-{named['start']}-abcdefgh.tmp.bak",
            f".model.onnx.bertfuse-{space}-{me}-{start}-live0000.tmp",
            f".model.onnx.bertfuse-{'0' * 8}-{pid_a}-{named['start']}-other000.tmp"]
    gone = [f".model.onnx.bertfuse-{space}-{me}-{int(start) + 1}-reused00.tmp"]
    for name in keep + gone:
        (out_dir / name).write_text("mine")

    # 2. killed in the write: the check's leftover and the reused PID's temp went before it
    pid_b = _killed_at("save-tmp", _convert(ckpt_erf.path, out), tmpdir, flags / "b")
    names = {p.name for p in out_dir.iterdir()}
    assert not left[0].exists() and not (set(gone) & names), names
    new = names - set(keep)
    assert len(new) == 1 and int(OURS.fullmatch(new.pop())["pid"]) == pid_b, names

    # 3. a run to the end: the write's leftover is gone, the output there, the rest untouched
    ran = subprocess.run(_convert(ckpt_erf.path, out), capture_output=True, text=True,
                         env={**ENV, "TMPDIR": str(tmpdir)}, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(keep + ["model.onnx"])
    assert all((out_dir / n).read_text() == "mine" for n in keep)
    assert _ours(tmpdir) == []


def test_kill_9_of_optimize_is_swept_by_the_next_run(ckpt_erf, convert_cached, tmp_path):
    model = convert_cached(ckpt_erf, "--no-fuse", "--no-verify")
    assert model.exit_code == 0
    out_dir, tmpdir = tmp_path / "out", tmp_path / "tmp"
    out_dir.mkdir()
    tmpdir.mkdir()
    argv = [sys.executable, "-m", "bertfuse", "optimize", model.onnx_path, "-o",
            str(out_dir / "fused.onnx")]
    for stage in ("check-tmp", "save-tmp"):
        pid = _killed_at(stage, argv, tmpdir, tmp_path / "flag")
        left = list(out_dir.iterdir())  # this run's only: the earlier one's went first
        assert len(left) == 1 and int(OURS.fullmatch(left[0].name)["pid"]) == pid, left
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                         env={**ENV, "TMPDIR": str(tmpdir)})
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert [p.name for p in out_dir.iterdir()] == ["fused.onnx"] and _ours(tmpdir) == []


def _file_size_limit(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_in_convert_names_the_folder_and_leaves_nothing(ckpt_erf, tmp_path):
    out_dir, tmpdir = tmp_path / "out", tmp_path / "tmp"
    out_dir.mkdir()
    tmpdir.mkdir()
    ran = subprocess.run(_convert(ckpt_erf.path, out_dir / "model.onnx"),
                         capture_output=True, text=True, env={**ENV, "TMPDIR": str(tmpdir)},
                         timeout=300, preexec_fn=_file_size_limit(64 * 1024))
    errors = [ln for ln in ran.stderr.splitlines() if ln.startswith("bertfuse: ")]
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith(f"bertfuse: error: {out_dir}: cannot write")
    assert "(File too large)" in errors[0] and "ulimit -f" in errors[0], errors
    assert list(out_dir.iterdir()) == [] and _ours(tmpdir) == []


SAVE = """
import resource, signal, sys
import numpy as np, onnx
from onnx import helper, numpy_helper
from bertfuse.errors import BertfuseError
from bertfuse.io.model import save_model
from bertfuse.io.sidecars import write_vocab
from bertfuse.pipeline.data import write_arrays
w = numpy_helper.from_array(np.ones((64, 256), np.float32), "w")
graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 256])],
                          [w])
model = helper.make_model(graph)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
for write in (lambda: save_model(model, sys.argv[1]),
              lambda: save_model(model, sys.argv[1], external_data=True),
              lambda: write_vocab(sys.argv[1], b"[PAD]\\n" * 10_000),
              lambda: write_arrays(sys.argv[1] + ".npz", {"input_ids": np.ones((64, 64))}),
              lambda: write_arrays(sys.argv[1] + ".json", {"input_ids": np.ones((64, 64))})):
    try:
        write()
        print("written")
    except BertfuseError as exc:
        print(exc)
"""


def test_a_full_disk_in_each_writer_names_the_file(tmp_path):
    """save_model (one file; model and .data), the vocab beside a model and --save-* data:
    one line each naming the file, nothing left."""
    target = tmp_path / "model.onnx"
    ran = subprocess.run([sys.executable, "-c", SAVE, str(target)], capture_output=True,
                         text=True, env=ENV, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    lines = ran.stdout.splitlines()
    assert lines[:2] == [f"{target}: cannot write the model (File too large); the file-size "
                         "limit (ulimit -f) or the file system's largest file is smaller than "
                         "the model: raise the limit, or write to another file system"] * 2
    assert lines[2].startswith(f"{tmp_path / 'model.vocab.txt'}: cannot write the model's "
                               "vocab (File too large)"), lines
    for line, suffix in zip(lines[3:], (".npz", ".json")):  # --save-inputs and the like
        assert line.startswith(f"{target}{suffix}: cannot write it (File too large)"), lines
    assert len(lines) == 5
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_in_export_triton_names_the_repository(ckpt_erf, convert_cached, tmp_path):
    """The copy into the repository fails: the line names the model's folder there, not the
    model it was copying (shutil names the source of a failed copy)."""
    model = convert_cached(ckpt_erf)
    assert model.exit_code == 0
    repo = tmp_path / "repo"
    ran = subprocess.run([sys.executable, "-m", "bertfuse", "export-triton", model.onnx_path,
                          "-o", str(repo), "--name", "bert"], capture_output=True, text=True,
                         env=ENV, timeout=120, preexec_fn=_file_size_limit(64 * 1024))
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert ran.stderr.strip() == (f"bertfuse: error: {repo / 'bert'}: cannot write the model's "
                                  "repository (File too large); the file-size limit (ulimit -f) "
                                  "or the file system's largest file is smaller than the model: "
                                  "raise the limit, or write to another file system")
    assert list(repo.iterdir()) == []
