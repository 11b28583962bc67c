"""`bertfuse serve` start-up on a pipe: one progress line per stage deploy() really runs (Ray
started here, Serve started, replicas deployed) before the URL line on stdout, none with -q (nor any line of Ray's);
SIGTERM then stops it with nothing left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from support.paths import ROOT

pytest.importorskip("ray")

from unit.serve.test_serve import descendants, free_port, tiny, wait_gone  # noqa: E402,F401

LINE = re.compile(r"^bertfuse serve: (.+) (\d+\.\d)s \((\d+\.\d)s in all\)$")


@pytest.mark.parametrize("flag", [None, "-q"])
def test_start_up_prints_a_line_per_stage_on_a_pipe(tiny, tmp_path, flag):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "RAY_ADDRESS": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertfuse", "serve", tiny["model"], "--port", str(free_port()),
         "--max-batch", "4", "--ingress", "proxy", "--kernels", "ort", "--no-warmup", *([flag] if flag else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not lines and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lines and lines[0].startswith("serving "), proc.poll()
        started = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert rc == 0, err[-3000:]
    stages = [m.group(1) for m in map(LINE.match, err.splitlines()) if m]
    want = [] if flag else ["ray cluster", "serve start", "deploy replicas"]
    assert stages == want, err[-3000:]
    if flag:  # -q: not a line on stderr, Ray's own included
        assert err.strip() == "", err[-3000:]
    totals = [float(m.group(3)) for m in map(LINE.match, err.splitlines()) if m]
    assert totals == sorted(totals)
    assert not wait_gone(started)


def test_a_failure_after_ray_started_names_rays_logs(tiny, tmp_path):
    """Ray's own lines never reach the terminal: when serve fails after Ray started (here
    its port is taken), the one line, and the --json report, name the folder they went to."""
    import socket

    from bertfuse.io.schemas import first_error

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "RAY_ADDRESS": ""}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        ran = subprocess.run(
            [sys.executable, "-m", "bertfuse", "serve", tiny["model"], "--port",
             str(taken.getsockname()[1]), "--ingress", "proxy", "--no-warmup", "--json"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    report = json.loads(ran.stdout)
    assert ran.returncode == 2 and first_error(report, "serve.json") is None, ran.stderr
    message = report["error"]["message"]
    assert ran.stderr.strip().endswith(message) and len(ran.stderr.splitlines()) == 1
    logs = re.search(r"\(Ray's logs: (.+)\)$", message)
    assert logs and os.path.isdir(logs.group(1)), message
