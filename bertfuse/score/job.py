"""The driver: Ray up (local, or a cluster joined with an address), the Ray Data pipeline, each
part committed as soon as all its rows are back, and the summary.

    parts not yet done ─► from_items ─► map_batches(read_parts)   Ray tasks read the row groups
                      ─► map_batches(Scorer, ActorPoolStrategy)   one Session per actor,
                                                                  CALLS_PER_ACTOR calls at once;
                                                                  a dead actor is restarted and
                                                                  its batches retried
                      ─► driver: rows gathered per part ─► OutputDir.commit (atomic, exactly once)

Ray Data shows the progress; a task's output reaches the driver only when the task succeeded,
so a retried batch is never seen twice (commit checks it anyway). A run that ends on a lost
node, or that stops sending rows for longer than the stall limit (watch.py: Ray Data raising
nothing), is cancelled and the parts not yet committed run again, up to max_retries times;
each such rerun is one line on stderr and one entry of the summary's `reruns`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator
import json
import warnings

import numpy as np

from bertfuse.errors import BertfuseError, require
from bertfuse.io.safety import pause_point
from bertfuse.ray_cluster import ray_for, task_error
from bertfuse.score.actor import (CRASH_ENV, HANG_ENV, KERNELS, Scorer, UnreadableInput,
                                  read_parts)
from bertfuse.score.output import PART, OutputDir, part_name
from bertfuse.score.placement import place_actors
from bertfuse.score.spec import ScoreJob
from bertfuse.score.stages import Stages, Timing
from bertfuse.score.watch import StallClock, Stalled, note, watched
from bertfuse.optional import optional

# A Ray Data batch is this many session batches: fewer, larger calls. On two H200s (shenma-3l
# fp16, 1M rows) 4,096-row calls kept each GPU's session 98% busy: 2 actors 1.98x one, where
# 2,048-row calls gave 1.77x (docs/journal/scoring.md).
ROWS_PER_TASK = 128
# Calls at once per actor (actor.Scorer): Ray Data fetches and batches the next block and
# stores the last one's output, and the Scorer prepares and converts rows, while the session
# thread runs the model; the Session itself runs one batch at a time on its own thread.
CALLS_PER_ACTOR = 2
# Driver threads writing parts (Parquet encoding releases the GIL): 4, up to 8 on a large
# machine, where a part's fp16 floats take ~20 us/row to encode (stages: commit_write).
WRITERS = max(4, min(8, (os.cpu_count() or 4) // 4))


class ScoreFailed(BertfuseError):
    """The job failed on the cluster (an actor died past its retries, an error in a task):
    the complete parts stay in OUT, and the same command resumes (exit 1)."""

    exit_code = 1


@dataclass
class ScoreSummary:
    output: str
    rows: int  # input rows
    scored: int  # rows in OUT/scores (this run and earlier ones)
    rejected: int  # rows in OUT/rejects
    parts: int
    parts_skipped: int  # complete before this run started (a restart)
    rows_this_run: int
    seconds: float
    rows_per_s: float  # rows_this_run / seconds (Ray start-up included)
    device: str
    actors: int
    first_result_s: float | None = None  # start until the first scored rows (start-up)
    steady_rows_per_s: float | None = None  # the rows after those, over the time after
    stages: dict[str, dict[str, float]] | None = None  # stages.py: seconds, us/row each
    # The kernels asked for, and the first actor's KernelChoice (runtime/kernel_choice.py) when
    # one ran: {"asked", "used", "reason", ...}
    kernels: dict[str, Any] | None = None
    # Why each rerun of the parts left happened (a lost node, a stall), as its stderr line
    reruns: list[str] | None = None
    # Complete parts found damaged when the job resumed (score/damage.py), scored again
    damaged: list[str] | None = None
    gpus: dict[str, Any] | None = None  # gpus' plan (GpuPlan.to_json); in the JSON where given

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if out["gpus"] is None:
            del out["gpus"]
        return out


def run_job(job: ScoreJob, progress: bool = True,
            status: Callable[[str], None] | None = None) -> ScoreSummary:
    """The job run to its end (or resumed); `status` is told each stage as it starts ('ray
    cluster', 'score'), after OUT is checked and locked."""
    require("ray")  # before OUT is made: without the ray extra, one line and nothing written
    say = status or (lambda stage: None)
    out = OutputDir(job)
    with out.locked():
        done = out.start()
        for line in out.damaged:
            note(line)
        todo = [p for p in job.parts if p.index not in done]
        start = time.perf_counter()
        device, actors, timing, stages = job.device, job.actors or 0, Timing(start), Stages()
        kernels: dict[str, Any] = {}
        reruns: list[str] = []
        if todo:
            say("ray cluster")
            with _ray(job.address, progress, job.gpus.count if job.gpus else None) as ray:
                device, actors = place_actors(job, ray)
                say("score")
                left, clock = todo, StallClock(job.stall_s)
                while left:
                    nodes = _alive_nodes(ray)
                    try:
                        ds = _dataset(job, left, device, actors)
                        blocks = watched(ds, clock, lambda: ds.iter_batches(
                            batch_size=None, batch_format="pyarrow"))
                        gather(blocks, out, job, timing, stages, kernels)
                        break
                    except (Stalled, *_cluster_errors()) as exc:
                        # A node lost mid-job ends Ray Data's whole dataset; a run that stopped
                        # sending rows is cancelled (its actors killed): either way the parts
                        # not yet committed go again on the nodes left (each written once)
                        stalled = isinstance(exc, Stalled)
                        if len(reruns) >= job.max_retries or not (
                                stalled or _node_lost(ray, nodes, exc)):
                            raise _failed(exc, out, job) from None
                        left = [p for p in left if not (out.scores / part_name(p.index)).is_file()]
                        cpus = int(ray.cluster_resources().get("CPU", 0))
                        actors = actors if device == "cuda" else max(1, min(actors, cpus - 1))
                        why = str(exc) if stalled else "a Ray node was lost"
                        reruns.append(f"{why}: the run is cancelled and the {len(left)} parts "
                                      f"left of {len(job.parts)} run again (rerun "
                                      f"{len(reruns) + 1} of at most {job.max_retries})")
                        note(reruns[-1])
        summary = _finish(job, out, done, todo, device, actors, time.perf_counter() - start)
        summary.first_result_s, summary.steady_rows_per_s = timing.result()
        summary.stages = stages.result(summary.rows_this_run)
        summary.kernels = kernels or {"asked": job.kernels}
        summary.reruns = reruns
        summary.damaged = out.damaged
        summary.gpus = job.gpus.to_json() if job.gpus else None
        out.write_manifest({"complete": True, "summary": summary.to_json()})
        return summary


def _alive_nodes(ray: Any) -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


# An actor whose node is gone is "unavailable" at once; the GCS declares the node dead only
# after its health checks fail (Ray's defaults: about 15-30 s). This long is waited for that.
NODE_DEATH_S = 60.0


def _node_lost(ray: Any, nodes: set[str], exc: BaseException) -> bool:
    """Whether one of `nodes` (alive when the attempt began) died: at once, or, for an error
    that says an actor or node cannot be reached, within NODE_DEATH_S."""
    rex = optional("ray", "exceptions", why="Ray Data (ray extra)")

    kinds = tuple(getattr(rex, n) for n in ("ActorUnavailableError", "NodeDiedError",
                                            "LocalRayletDiedError") if hasattr(rex, n))
    unreachable, e, seen = False, exc, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        unreachable |= isinstance(e, kinds)
        e = e.__cause__ or e.__context__
    deadline = time.monotonic() + (NODE_DEATH_S if unreachable else 0)
    while not nodes - _alive_nodes(ray):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def _cluster_errors() -> tuple[type, ...]:
    return (optional("ray.exceptions", "RayError", why="Ray Data (ray extra)"),
            optional("ray.data.exceptions", "UserCodeException", why="Ray Data (ray extra)"))


def _failed(exc: BaseException, out: OutputDir, job: ScoreJob) -> BertfuseError:
    """The task's own error, one line: an unreadable input is bad input (exit 2: rerunning
    will not help); anything else a cluster failure that the same command resumes (exit 1)."""
    done = len(list(out.scores.glob("part-*.parquet")))
    kept = f"{done} of {len(job.parts)} parts are complete in {job.output}"
    if isinstance(exc, Stalled):
        return ScoreFailed(f"scoring stalled on the Ray cluster: {exc}, "
                           f"max_retries {job.max_retries} spent; {kept}: run the same command "
                           "again to resume, with a larger --stall-s if the job is just slow")
    why = task_error(exc)
    unreadable = f"{UnreadableInput.__name__}: "
    if unreadable in why:
        return BertfuseError(f"{why.split(unreadable, 1)[1]}; {kept}")
    return ScoreFailed(f"scoring failed on the Ray cluster ({why}); {kept}: run the same "
                       "command again to resume")


def _finish(job: ScoreJob, out: OutputDir, done: set[int], todo: list, device: str,
            actors: int, seconds: float) -> ScoreSummary:
    scored, rejected = out.counts()
    if scored + rejected != job.rows:  # every part committed: anything else is a bug
        raise RuntimeError(f"{scored} scored + {rejected} rejected rows for {job.rows} input rows")
    this_run = sum(p.rows for p in todo)
    summary = ScoreSummary(job.output, job.rows, scored, rejected, len(job.parts), len(done),
                           this_run, round(seconds, 3),
                           round(this_run / seconds, 1) if seconds > 0 else 0.0,
                           device, actors)
    return summary


@contextmanager
def _ray(address: str | None, progress: bool, num_gpus: int | None) -> Iterator[Any]:
    """Ray as the caller has it (already initialized: used and left running), else a local
    instance of our own (with num_gpus GPUs, where given), or the cluster at `address`; shut
    down on every exit path."""
    ray = optional("ray", why="Ray Data (ray extra)")
    DataContext = optional("ray.data", "DataContext", why="Ray Data (ray extra)")

    ctx = DataContext.get_current()
    shown, ctx.enable_progress_bars = ctx.enable_progress_bars, progress
    try:
        with ray_for(address, logging_level=logging.WARNING, num_gpus=num_gpus):
            yield ray
    finally:
        ctx.enable_progress_bars = shown


def _dataset(job: ScoreJob, todo: list, device: str, actors: int) -> Any:
    ray = optional("ray", why="Ray Data (ray extra)")
    ActorPoolStrategy, TaskPoolStrategy = optional("ray.data", "ActorPoolStrategy",
                                                   "TaskPoolStrategy", why="Ray Data (ray extra)")

    items = [{"part": p.index, "file": p.file, "group_start": p.groups[0],
              "group_stop": p.groups[1], "offset": p.offset, "rows": p.rows,
              "first_row": p.first_row} for p in todo]
    columns = list(dict.fromkeys([*job.key_columns, *job.spec.columns]))
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    # Parts are the unit of output and restart; the actors' unit is this streaming split
    # (tasks of its own: the reads' pool of two does not fuse with it). Neither takes a CPU
    # slot: after a node's loss Ray restarts its actors on the nodes left, and a read or a
    # split waiting for a CPU that the actors hold stalls the job for ever, Ray Data raising
    # nothing (the actors wait for its rows). Seen with the split: repartition() takes no
    # num_cpus, so its logical operator's remote args are set (docs/journal/serving.md).
    ds = ds.map_batches(read_parts, batch_size=1, batch_format="numpy",
                        fn_kwargs={"files": job.files, "columns": columns}, num_cpus=0,
                        compute=TaskPoolStrategy(size=2))
    ds = ds.repartition(target_num_rows_per_block=job.batch_size * ROWS_PER_TASK)
    split = getattr(getattr(ds, "_logical_plan", None), "dag", None)
    if isinstance(getattr(split, "ray_remote_args", None), dict):
        split.ray_remote_args["num_cpus"] = 0
    with warnings.catch_warnings():  # max_restarts/max_task_retries have no named parameter
        warnings.simplefilter("ignore")
        return ds.map_batches(
            Scorer, batch_size=job.batch_size * ROWS_PER_TASK, batch_format="pyarrow",
            compute=ActorPoolStrategy(size=actors,
                                      max_concurrent_calls_per_actor=CALLS_PER_ACTOR,
                                      enable_true_multi_threading=True),
            num_gpus=1 if device == "cuda" else 0,
            num_cpus=1, max_restarts=job.max_retries, max_task_retries=job.max_retries,
            fn_constructor_kwargs={"model": os.path.abspath(job.model), "spec": job.spec,
                                   "keys": job.key_columns, "outputs": job.outputs,
                                   "ranks": job.output_ranks, "max_batch": job.batch_size,
                                   "device": device, "crash": os.environ.get(CRASH_ENV),
                                   "kernels": job.kernels, "hang": os.environ.get(HANG_ENV),
                                   "gpus": job.gpus})


def gather(blocks: Iterator[Any], out: OutputDir, job: ScoreJob, timing: Timing,
           stages: Stages, kernels: dict[str, Any] | None = None) -> None:
    """Gathers the scored rows (Arrow blocks, any cut) per part; a part is committed (on a
    writer thread, so that writing overlaps fetching) once all its rows are in. `kernels` is
    filled with the first actor's KernelChoice that a block carries. `blocks` is closed on
    every exit: Ray Data's iterator must not outlive this (and Ray) in a traceback."""
    blocks, cpu = iter(blocks), time.process_time()
    try:
        _gather(blocks, out, job, timing, stages, {} if kernels is None else kernels)
    finally:
        stages.add("driver_cpu", time.process_time() - cpu)  # every thread of the driver
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


def _gather(blocks: Iterator[Any], out: OutputDir, job: ScoreJob, timing: Timing,
            stages: Stages, kernels: dict[str, Any]) -> None:
    pa = optional("pyarrow", why="Parquet (ray extra)")

    pending: dict[int, list] = defaultdict(list)
    have: dict[int, int] = defaultdict(int)
    with ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="bertfuse-commit") as pool:
        writing: list[Future] = []
        while True:
            with stages.timed("driver_wait"):
                block = next(blocks, None)
            if block is None:
                break
            timing.got(block.num_rows)
            t0 = time.perf_counter()
            stages.add_actor(block)
            if not kernels:
                kernels.update(_kernels_of(block))
            parts = block.column(PART).to_numpy()
            for index in np.unique(parts):
                index = int(index)
                piece = block if parts[0] == parts[-1] == index and (parts == index).all() \
                    else block.filter(pa.array(parts == index))
                pending[index].append(piece)
                have[index] += piece.num_rows
                if have[index] >= job.parts[index].rows:
                    writing.append(pool.submit(out.commit, index, pending.pop(index), stages))
            stages.add("driver_split", time.perf_counter() - t0)
            writing = _reap(writing, wait=False)
            with stages.timed("driver_backpressure"):
                while len(writing) > 2 * WRITERS:  # writers behind: wait, rather than hold rows
                    writing = _reap(writing[:1], wait=True) + writing[1:]
        _reap(writing, wait=True)
    if pending:  # the dataset ended with parts short of rows: never committed half
        first = min(pending)
        raise RuntimeError(f"part {first}: {have[first]} of {job.parts[first].rows} rows "
                           "came back")


def _kernels_of(block: Any) -> dict[str, Any]:
    """The KernelChoice an actor put in its blocks (actor.KERNELS), {} where this piece of a
    block lacks it."""
    pc = optional("pyarrow.compute", why="Parquet (ray extra)")

    if KERNELS not in block.column_names:
        return {}
    found = pc.drop_null(block.column(KERNELS))
    return json.loads(found[0].as_py()) if len(found) else {}


def _reap(writing: list[Future], wait: bool) -> list[Future]:
    """The commits still running; a finished one's error is raised here."""
    left = []
    for f in writing:
        if wait or f.done():
            f.result()
            pause_point("score-committed")  # tests: kill the job here
        else:
            left.append(f)
    return left
