"""`bertfuse serve --help` says how many replicas serve starts, as serve/config.py decides
it: HAPROXY_GPUS_PER_REPLICA's share of a GPU each behind HAProxy, a whole one otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

from support.paths import ROOT

from bertfuse.serve.config import HAPROXY_GPUS_PER_REPLICA, ServeConfig, resolve

WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 8: "eight"}


def _help(*argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "bertfuse", *argv, "--help"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_serve_help_says_the_replicas_per_gpu_the_code_starts():
    per_gpu = {ingress: round(1 / resolve(ServeConfig(model="m.onnx"), ingress).gpus_per_replica)
               for ingress in ("haproxy", "proxy")}
    assert per_gpu["haproxy"] == round(1 / HAPROXY_GPUS_PER_REPLICA)
    for text in (_help("serve"), _help()):
        assert "one replica per GPU" not in text
        assert f"{WORDS[per_gpu['haproxy']]} replicas per GPU behind HAProxy" in text, text
        assert f"{WORDS[per_gpu['proxy']]} per GPU behind Serve's proxy" in text, text
