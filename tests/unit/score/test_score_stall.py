"""The stall watchdog (bertfuse/score/watch.py) on this module's local Ray (test_score's
fixtures): a real Ray Data run whose UDF blocks for ever, Ray raising nothing, is cancelled
after the stall limit (its actor killed) with Stalled; `bertfuse score` whose actor blocks
that way cancels the run, says so in one line and in the summary, reruns the parts left and
writes every row exactly once; the auto limits; a bad --stall-s / stall_s before Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bertfuse import cli
from bertfuse.errors import BertfuseError
from support.paths import ROOT
from support.processes import wait_gone

ray = pytest.importorskip("ray")

from bertfuse.score import score  # noqa: E402
from bertfuse.score.watch import (STALL_FLOOR_S, STARTUP_S, StallClock, Stalled,  # noqa: E402
                                  watched)
from unit.score.test_score import (ROWS, TOL, cluster, corpus, embeddings, ids_run,  # noqa: E402,F401
                                   scored, tiny)


def test_a_run_whose_udf_blocks_is_cancelled_after_the_limit(cluster, tmp_path):
    from ray.data import ActorPoolStrategy

    class _BlocksFromEight:  # defined here: Ray's workers get it by value, not by import
        """Never returns for a batch holding id 8 or more (a stall Ray never reports),
        having written its pid to `flag`."""

        def __init__(self, flag: str) -> None:
            self.flag = flag

        def __call__(self, batch: dict) -> dict:
            if int(batch["id"].max()) >= 8:
                Path(self.flag).write_text(str(os.getpid()))
                threading.Event().wait()
            return batch

    flag = tmp_path / "blocked"
    ds = ray.data.range(16, override_num_blocks=4).map_batches(
        _BlocksFromEight, fn_constructor_kwargs={"flag": str(flag)}, batch_size=None,
        compute=ActorPoolStrategy(size=1), num_cpus=1)
    clock, got = StallClock(3.0), []
    with pytest.raises(Stalled, match=r"stall limit 3 s") as raised:
        for block in watched(ds, clock, lambda: ds.iter_batches(batch_size=None,
                                                                batch_format="numpy")):
            got.extend(block["id"].tolist())
            stopped = time.monotonic()
    assert flag.exists(), "the UDF never blocked"
    assert set(got) <= set(range(8)) and got, got  # the blocks before the stuck one came back
    assert 3.0 <= raised.value.waited < 3.0 + 5  # the limit, plus the watchdog's polling
    assert time.monotonic() - stopped < 3.0 + 60  # cancelled: Ray Data's shutdown included
    # the run was cancelled, not left holding its CPU: the blocked actor is gone
    assert not wait_gone({int(flag.read_text())}, 30), "the blocked actor was not killed"
    assert clock.seen and clock.startup > 0


def test_the_auto_limits_come_from_the_jobs_own_waits():
    clock = StallClock()
    assert clock.limit(first=True) == STARTUP_S  # nothing seen yet: start-up is the model's load
    clock.waited(40.0, first=True)
    clock.waited(2.0, first=False)
    assert clock.limit(first=False) == STALL_FLOOR_S  # 10 x 2 s is under the floor
    assert clock.limit(first=True) == 120.0  # max(floor, 3 x 40 s)
    clock.waited(30.0, first=False)
    assert clock.limit(first=False) == 300.0  # 10 x the longest wait between blocks
    assert clock.limit(first=True) == 300.0  # never less than the limit between blocks
    fixed = StallClock(7.5)  # the user's limit between blocks; start-up keeps its allowance
    assert (fixed.limit(first=False), fixed.limit(first=True)) == (7.5, STARTUP_S)
    fixed.waited(4.0, first=True)
    assert (fixed.limit(first=False), fixed.limit(first=True)) == (7.5, 12.0)


def test_a_stalled_job_is_rerun_and_writes_every_row_once(cluster, tiny, corpus, ids_run,
                                                          tmp_path):
    """An actor's second call blocks for ever (HANG_ENV): the run is cancelled after
    --stall-s, one line says so, the parts left run again, the output equals the undisturbed
    run's, every row once; the blocked actor was killed."""
    flag, out = tmp_path / "hung", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BERTFUSE_TEST_SCORE_HANG": f"{flag}:2"}
    start = time.monotonic()
    ran = subprocess.run(
        [sys.executable, "-m", "bertfuse", "score", "--model", tiny["model"], "--input",
         corpus["path"], "--output", str(out), "--ids-column", "ids", "--segment-column",
         "segs", "--key-columns", "doc_id,qid", "--actors", "2", "--part-rows", "1000",
         "--batch-size", "8", "--stall-s", "8", "--address", cluster, "--json"],
        env=env, capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert flag.exists(), "no actor blocked"
    assert not wait_gone({int(flag.read_text())}, 30), "the blocked actor was not killed"
    notes = [ln for ln in ran.stderr.splitlines() if ln.startswith("bertfuse score: no rows")]
    assert notes and all("s (stall limit 8 s): the run is cancelled and the" in ln and
                         "parts left of 10 run again" in ln for ln in notes), ran.stderr[-3000:]
    summary = json.loads(ran.stdout)
    assert summary["reruns"] == [ln.split("bertfuse score: ", 1)[1] for ln in notes]
    assert (summary["scored"], summary["rejected"]) == (ROWS, 0)
    got, want = scored(out), scored(ids_run["out"])  # scored(): no row written twice
    assert got.column("doc_id").equals(want.column("doc_id"))
    assert np.abs(embeddings(got) - embeddings(want)).max() <= TOL
    print(f"stalled job: {time.monotonic() - start:.1f} s, {len(notes)} rerun(s)")


def test_a_bad_stall_limit_is_one_line_before_ray(tiny, corpus, tmp_path, capsys):
    for bad in ("0", "-1", "nan", "soon"):
        code = cli.main(["score", "--model", tiny["model"], "--input", corpus["path"],
                         "--output", str(tmp_path / "o"), "--ids-column", "ids", "--stall-s",
                         bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "--stall-s" in err[0], err
    for bad in (0, -3.0, float("inf"), True, "60"):
        with pytest.raises(BertfuseError, match="stall_s must be a number of seconds > 0"):
            score(tiny["model"], corpus["path"], tmp_path / "o", ids_column="ids", stall_s=bad)
    assert not (tmp_path / "o").exists()


def test_only_the_actors_take_a_cpu_slot(cluster, tiny, corpus, tmp_path):
    """The cause of the two-node stall: after the worker node's loss the 2 restarted actors
    held the head's 2 CPUs, and the streaming split's task (a CPU by Ray Data's default)
    waited for one for ever while the actors waited for its rows. Every operator of the plan
    but the actor pool asks for no CPU (built down to the physical operators, never run)."""
    from ray.data._internal.logical.optimizers import get_execution_plan

    from bertfuse.score.job import _dataset
    from bertfuse.score.spec import build_job

    job = build_job(tiny["model"], corpus["path"], tmp_path / "out", ids_column="ids",
                    part_rows=1000)
    op, cpus = get_execution_plan(_dataset(job, job.parts, "cpu", 2)._logical_plan)[0].dag, {}
    while op.input_dependencies:
        cpus[op.name] = op._ray_remote_args.get("num_cpus", 1)
        op = op.input_dependencies[0]
    assert cpus.pop("MapBatches(Scorer)") == 1 and cpus, cpus
    assert all(n == 0 for n in cpus.values()), cpus  # the reads and the split
