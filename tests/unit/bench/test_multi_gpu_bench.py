"""The multi-GPU benchmarks in their CPU smoke mode, end to end (CPU replicas and actors
stand in for GPUs): benchmarks/serve/multi_gpu.py against a real `bertfuse serve` of 2 CPU
replicas, one of them killed (kill -9) mid-load: the other keeps answering, the killed one's
in-flight requests fail with a reset or HAProxy's 5xx, every client request ends within its
timeout and nothing hangs; benchmarks/score/multi_gpu.py at N=1 on a generated corpus."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from support.builders.onnx_graphs import bert
from support.paths import ROOT

pytest.importorskip("ray")

FAILURES = {"reset", "http:500", "http:502", "http:503", "http:504"}  # what a kill may cost


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from bertfuse.passes.manager import run_passes

    path = tmp_path_factory.mktemp("multi_gpu") / "tiny.onnx"
    fused, _ = run_passes(bert(np.random.default_rng(0), layers=2, hidden=32, heads=2,
                               inter=64, vocab=1000, positions=64))  # ids < 1000: faults.py's
    onnx.save(fused, path)
    return str(path)


def _bench(script: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_serve_bench_smoke_with_a_replica_killed_mid_load(tiny, tmp_path):
    ran = _bench("serve/multi_gpu.py", "--model", tiny, "--device", "cpu", "--smoke",
                 "--gpus-list", "2", "--kill", "--out", str(tmp_path), timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads((tmp_path / "serve_multi_gpu.json").read_text())
    (r,) = report["results"]
    assert r["n"] == 2 and r["replicas"] == 2 and r["device"] == "cpu"
    assert r["closed"]["answered"] > 50 and r["closed"]["failed"] == 0 and r["closed_ended"]
    assert r["open"]["answered"] > 20 and r["open"]["failed"] == 0 and r["open"]["ended"]
    assert r["server_cpu_ms_per_request"] > 0 and r["host_cpu_ms_per_request"] > 0
    k = r["kill"]
    assert k["every_client_ended"] and k["serve_running"], k
    assert set(k["in_flight_or_after_kill"]) <= FAILURES | {"200"}, k  # no timeout: no hang
    assert k["after_settle"]["answered"] > 0 and k["after_settle"]["failed"] == 0, k
    assert k["longest_request_s"] < 20, k  # the smoke's request timeout
    assert "| 2 | 2 |" in ran.stdout  # the table


def test_score_bench_smoke_at_one(tiny, tmp_path):
    ran = _bench("score/multi_gpu.py", "--model", tiny, "--device", "cpu", "--smoke",
                 "--gpus-list", "1", "--out", str(tmp_path), timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (r,) = json.loads((tmp_path / "score_multi_gpu.json").read_text())["results"]
    assert (r["n"], r["actors"], r["device"], r["rows"]) == (1, 1, "cpu", 2000)
    assert r["rows_per_s"] > 0 and r["host_cpu_ms_per_1k_rows"] > 0
    assert "| 1 | 1 | 2,000 |" in ran.stdout and "| 1.00 |" in ran.stdout
