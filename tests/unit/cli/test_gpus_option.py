"""`--gpus N|all` at `bertfuse serve` and `bertfuse score`: a bad value, or one that cannot be
planned (with --device cpu, --replicas/--actors, --address, or more GPUs than CUDA sees), is
one line and exit 2 before Ray starts, and with --json a report that says so."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertfuse import cli
from bertfuse import gpu_plan
from support.builders.onnx_graphs import bert


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    from bertfuse.passes.manager import run_passes

    root = tmp_path_factory.mktemp("gpus_option")
    fused, _ = run_passes(bert(np.random.default_rng(0), layers=1, hidden=16, heads=2,
                               inter=32, vocab=50, positions=16))
    onnx.save(fused, root / "tiny.onnx")
    pq.write_table(pa.table({"ids": pa.array([[1, 2, 3]], pa.list_(pa.int32()))}),
                   root / "in.parquet")
    return {"model": str(root / "tiny.onnx"), "input": str(root / "in.parquet"),
            "out": str(root / "out")}


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch, tmp_path):
    """This host, as far as the plan reads it: two GPUs, one NUMA node (no sysfs here)."""
    rows = [(0, "GPU-a", "00000000:17:00.0"), (1, "GPU-b", "00000000:2A:00.0")]
    monkeypatch.setattr(gpu_plan, "read_smi", lambda: rows)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def serve(files, *args):
    return ["serve", files["model"], *args]


def score(files, *args):
    return ["score", "--model", files["model"], "--input", files["input"], "--output",
            files["out"], "--ids-column", "ids", *args]


CASES = {
    "serve zero": (serve, ["--gpus", "0"], "expected a whole number of GPUs (1 or more) or "
                                           "'all', got '0'"),
    "serve word": (serve, ["--gpus", "most"], "got 'most'"),
    "serve cpu": (serve, ["--gpus", "1", "--device", "cpu"], "device 'cpu' runs on none"),
    "serve replicas": (serve, ["--gpus", "1", "--replicas", "2"], "give gpus or replicas"),
    "serve address": (serve, ["--gpus", "1", "--address", "auto"], "on a cluster (address)"),
    "serve too many": (serve, ["--gpus", "3"], "gpus 3: this host has 2 GPUs that CUDA sees"),
    "serve share": (serve, ["--gpus", "1", "--gpus-per-replica", "0.3"],
                    "gpus_per_replica 0.3 does not divide a GPU"),
    "score zero": (score, ["--gpus", "-1"], "got '-1'"),
    "score cpu": (score, ["--gpus", "all", "--device", "cpu"], "device 'cpu' runs on none"),
    "score actors": (score, ["--gpus", "1", "--actors", "1"], "give gpus or actors"),
    "score address": (score, ["--gpus", "1", "--address", "auto"], "on a cluster (address)"),
    "score too many": (score, ["--gpus", "3"], "gpus 3: this host has 2 GPUs that CUDA sees"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_gpus_it_cannot_plan_is_one_line_exit_2(files, case, capsys):
    argv, extra, words = CASES[case]
    assert cli.main(argv(files, *extra)) == 2
    captured = capsys.readouterr()
    err = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert len(err) == 1 and words in err[0] and "Traceback" not in captured.err, err
    assert cli.main([*argv(files, *extra), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)  # one report, whatever its indent
    assert report["ok"] is False and report["error"]["exit_code"] == 2 \
        and words in report["error"]["message"], report


def test_ray_is_not_started_by_a_refusal(files, capsys):
    import sys

    cli.main(serve(files, "--gpus", "3"))
    cli.main(score(files, "--gpus", "3"))
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()
