"""The README's Quick start, as written: its fenced blocks are read from README.md, not copied.

- The install block is CHECKED, not run (running it would reinstall the environment the suite
  runs in): each `pip install` line names an installable target, `.` (this clone: its
  pyproject.toml) or `$(ls dist/bertfuse-*.whl)` (a pattern that matches the file `pip wheel`
  writes for this version), and every extra it names exists in pyproject.toml.
- Every other shell line RUNS, one by one, with bash in an empty temporary folder, the venv's
  bin folder first on PATH (its `bertfuse`, this checkout on PYTHONPATH). The one change to the
  text: port 8000 becomes a free port, since another server may hold 8000.
- `bertfuse serve` runs in the background; once it prints its URL, the curl line and the
  Python block (tritonclient) run against it, and each answer must be the model's own outputs
  (a direct Session on the same text); then SIGTERM: exit 0, nothing left running, the port
  closed. One tiny model end to end: about 90 s on a loaded 2-core machine."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from bertfuse._version import __version__
from support.markdown import README, blocks, read, section
from support.paths import ROOT

pytest.importorskip("ray")
pytest.importorskip("tritonclient.http")

from unit.serve.test_serve import descendants, free_port, port_closed, wait_gone  # noqa: E402

TOL = 1e-5  # fp32: the same model and kernels, one row


def _quick_start() -> tuple[list[str], list[str], str]:
    """(the install lines, the shell lines to run, the Python block)."""
    line, text = section(read(README), "## Quick start")
    shown = blocks(text, line)
    shell = [b for b in shown if b.lang in ("", "sh", "bash", "shell", "console")]
    python = [b for b in shown if b.lang == "python"]
    assert len(python) == 1, "the Quick start has one Python block (tritonclient)"
    lines = [ln for b in shell for ln in re.sub(r"\\\n\s*", "", "\n".join(b.lines)).splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    install = [ln for ln in lines if ln.startswith("pip install")]
    return install, [ln for ln in lines if ln not in install], "\n".join(python[0].lines)


def test_the_install_lines_name_real_extras_and_targets():
    install, _, _ = _quick_start()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    # what `pip wheel -w dist .` writes, and with BERTFUSE_BUILD_KERNELS=1 the platform wheel
    wheels = [f"dist/bertfuse-{__version__}-py3-none-{tag}.whl"
              for tag in ("any", "manylinux_2_28_x86_64")]
    assert len(install) >= 2, install  # from the clone, and from a wheel
    for line in install:
        target = shlex.split(line, comments=True)[-1]
        m = re.fullmatch(r"(.+)\[([\w,-]+)\]", target)
        assert m, f"{line}: no '[extras]'"
        path, names = m.groups()
        for name in names.split(","):
            assert name in extras, f"{line}: pyproject.toml has no extra {name!r}"
        if path == ".":
            assert (ROOT / "pyproject.toml").is_file()
        else:
            glob = re.fullmatch(r"\$\(ls (\S+)\)", path)
            assert glob and any(fnmatch.fnmatch(w, glob.group(1)) for w in wheels), \
                f"{line}: none of {wheels}"


def _expected(folder: Path, text: str) -> dict[str, np.ndarray]:
    from bertfuse.runtime import Session
    from bertfuse.text import WordPiece

    model = folder / "model.onnx"
    vocab = next(folder.glob("*/vocab.txt"))
    batch = WordPiece(str(vocab), model=str(model))([text])
    with Session(str(model), device="cpu") as sess:
        return sess.run(**batch.feeds())


def test_the_quick_start_runs_as_written(tmp_path):
    _, lines, python = _quick_start()
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "BERTFUSE_TOKEN"}, "RAY_ADDRESS": "",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    assert any(ln.startswith("bertfuse serve") for ln in lines), lines
    server, said, answers = None, [], []
    try:
        for line in (ln.replace("8000", str(port)) for ln in lines):
            if line.startswith("bertfuse serve"):
                server = subprocess.Popen(shlex.split(line, comments=True), cwd=tmp_path,
                                          env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True)  # its own group: killpg
                threading.Thread(target=lambda: said.extend(server.stdout), daemon=True).start()
                deadline = time.monotonic() + 180
                while not said and server.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert said and f"http://127.0.0.1:{port}/" in said[0], \
                    f"no URL (exit {server.poll()}): {said} {server.stderr.read()[-2000:]}"
                continue
            done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            if line.startswith("curl"):
                answers.append(json.loads(done.stdout))
        assert len(answers) == 1, answers
        namespace: dict = {}
        exec(compile(python.replace("8000", str(port)), "README.md (Quick start)", "exec"),
             namespace)
        started = descendants(server.pid)
        server.send_signal(signal.SIGTERM)
        rc = server.wait(timeout=90)
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert rc == 0, server.stderr.read()[-2000:]
    assert not wait_gone(started), "processes left behind by bertfuse serve"
    assert port_closed(port)
    # the texts sent: the curl line's JSON, the Python block's array
    want = _expected(tmp_path, re.search(r'"text": \["([^"]+)"\]', " ".join(lines)).group(1))
    got = answers[0]["outputs"]  # an answer with outputs is a 200: errors carry "error" only
    assert sorted(got) == sorted(want), got.keys()
    for name, value in got.items():
        assert np.abs(np.asarray(value) - want[name]).max() <= TOL, name
    want = _expected(tmp_path, re.search(r'np\.array\(\["([^"]+)"\]', python).group(1))
    pooled = namespace["pooled"]  # tritonclient raises on any answer but 200
    assert pooled.dtype == np.float32 and pooled.shape == want["pooled_output"].shape
    assert np.abs(pooled - want["pooled_output"]).max() <= TOL
