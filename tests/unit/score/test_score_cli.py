"""`bertfuse score` as a process, joining this module's local Ray (no Ray start per run): one
progress line per stage on a pipe (plan, ray cluster, score) and none with --json; --kernels
carried to the actors' Sessions and the first actor's choice in the summary (with --json nothing
on stderr, not a line of Ray's, and the report valid against its schema) (on the CPU: the
contrib ops, and why); a bad --kernels is one line, exit 2, before Ray; complete parts
damaged since their run are named and scored again on the next."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertfuse import cli
from bertfuse.errors import BertfuseError
from bertfuse.io.schemas import first_error
from support.paths import ROOT

pytest.importorskip("ray")

from bertfuse.score import score  # noqa: E402
from unit.score.test_score import cluster, tiny  # noqa: E402,F401  (module fixtures)

LINE = re.compile(r"^bertfuse score: (.+) (\d+\.\d)s \((\d+\.\d)s in all\)$")
ROWS = 300


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    rng = np.random.default_rng(5)
    ids = [rng.integers(1, 300, n).tolist() for n in rng.integers(1, 40, ROWS)]
    path = tmp_path_factory.mktemp("score_cli_in") / "small.parquet"
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32()))}), path,
                   row_group_size=100)
    return str(path)


def _score(cluster: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "bertfuse", "score", *args, "--address",
                           cluster, "--actors", "1"], env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_line_per_stage_on_a_pipe_and_the_kernels_chosen(cluster, tiny, small, tmp_path):
    ran = _score(cluster, "--model", tiny["model"], "--input", small, "--output",
                 str(tmp_path / "o"), "--ids-column", "ids")
    assert ran.returncode == 0, ran.stderr[-3000:]
    stages = [m.group(1) for m in map(LINE.match, ran.stderr.splitlines()) if m]
    assert stages == ["plan", "ray cluster", "score"], ran.stderr[-3000:]
    assert f"scored {ROWS} rows" in ran.stdout
    # the first actor's KernelChoice line: auto on the CPU keeps ONNX Runtime's contrib ops
    assert "kernels=auto: ort (bertfuse's ops run on CUDA only" in ran.stdout, ran.stdout


def test_json_is_quiet_and_reports_the_kernels(cluster, tiny, small, tmp_path):
    ran = _score(cluster, "--model", tiny["model"], "--input", small, "--output",
                 str(tmp_path / "o"), "--ids-column", "ids", "--kernels", "ort", "--json")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stderr.strip() == "", ran.stderr[-3000:]  # no progress, no line of Ray's
    summary = json.loads(ran.stdout)
    assert summary["scored"] == ROWS and first_error(summary, "score.json") is None
    k = summary["kernels"]
    assert (k["asked"], k["used"], k["reason"]) == ("ort", "ort", "asked"), k
    table = pq.read_table(tmp_path / "o" / "scores")
    assert table.column_names == ["row", "pooled_output"]  # the choice column is not written
    again = score(tiny["model"], small, tmp_path / "o", ids_column="ids", kernels="ort",
                  progress=False)  # all done before: no actor ran, the asked value only
    assert again.rows_this_run == 0 and again.kernels == {"asked": "ort"}


def test_quiet_prints_the_folder_written_and_not_a_line_of_rays(cluster, tiny, small,
                                                               tmp_path):
    ran = _score(cluster, "--model", tiny["model"], "--input", small, "--output",
                 str(tmp_path / "o"), "--ids-column", "ids", "-q")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (ran.stdout, ran.stderr) == (f"wrote {tmp_path / 'o'}/scores\n", "")


def test_a_bad_kernels_value_is_one_line_before_ray(tiny, small, tmp_path, capsys):
    code = cli.main(["score", "--model", tiny["model"], "--input", small, "--output",
                     str(tmp_path / "o"), "--ids-column", "ids", "--kernels", "fast"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "invalid choice: 'fast'" in err[0], err
    for bad in ("fast", None, 1):
        with pytest.raises(BertfuseError, match="kernels must be one of"):
            score(tiny["model"], small, tmp_path / "o", ids_column="ids", kernels=bad)
    assert not (tmp_path / "o").exists()


def test_a_damaged_complete_part_is_named_and_scored_again(cluster, tiny, small, tmp_path):
    """Parts damaged after the job wrote them (one truncated, one with its footer
    overwritten) are found when the same command runs again: each named on a line of its
    own, scored again, and every row is in the output exactly once (exit 0; before, every
    rerun failed with exit 3 on `Parquet magic bytes not found`, naming no file)."""
    out = tmp_path / "o"
    args = ("--model", tiny["model"], "--input", small, "--output", str(out), "--ids-column",
            "ids", "--part-rows", "100")
    first = _score(cluster, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    cut, footer = out / "scores" / "part-00001.parquet", out / "scores" / "part-00002.parquet"
    data = cut.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    data = footer.read_bytes()
    footer.write_bytes(data[:-8] + b"\0" * 8)  # footer length and magic bytes
    again = _score(cluster, *args, "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    named = [ln for ln in again.stderr.splitlines() if ln.startswith("bertfuse score: ")]
    assert len(named) == 2 and str(cut) in named[0] and str(footer) in named[1], named
    assert all("scored again" in ln for ln in named), named
    summary = json.loads(again.stdout)
    assert summary["rows_this_run"] == 200 and summary["parts_skipped"] == 1, summary
    assert summary["damaged"] == [ln.split("bertfuse score: ", 1)[1] for ln in named]
    rows = pq.read_table(out / "scores").column("row").to_numpy()
    assert np.array_equal(np.sort(rows), np.arange(ROWS)), rows
