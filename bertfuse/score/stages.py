"""Where a scoring job's time goes, per stage, for the summary (`stages`): what limits a run.

    actor   prepare  rows.py: rejects, padding          (summed over actors: actor-seconds)
            model    Session.run over the kept rows
            convert  outputs -> Arrow columns
    driver  wait     blocked on Ray Data for the next block (the pipeline behind the driver)
            split    a block cut into its parts' pieces  (driver main thread)
            backpressure  waiting for a free writer     (the writers behind)
            cpu      the driver process's CPU time, all its threads (Ray's own included)
    commit  gather   a part's pieces joined, rows checked (writer threads: thread-seconds)
            write    Parquet encoded and written, renamed into place

The actors' times travel with their rows: each block carries one float64 column per actor
stage, the stage's seconds spread evenly over the block's rows, so that whatever way Ray Data
cuts or joins blocks, the sum over the rows the driver receives is the actors' time. The
columns are never written (commit selects the key and output columns).
No Ray here.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from bertfuse.optional import optional

pa = optional("pyarrow", why="Parquet (ray extra)")
pc = optional("pyarrow.compute", why="Parquet (ray extra)")

ACTOR = ("prepare", "model", "convert")
PREFIX = "_bf_t_"


def actor_columns(times: dict[str, float], rows: int) -> dict[str, pa.Array]:
    """The actor's stage times for a block of `rows` rows, as its per-row columns."""
    return {PREFIX + s: pa.array(np.full(rows, times.get(s, 0.0) / max(rows, 1), np.float64))
            for s in ACTOR}


class Stages:
    """Seconds per stage, added from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - t0)

    def add_actor(self, block: pa.Table) -> None:
        """The actors' times a block carries (absent columns: nothing)."""
        for s in ACTOR:
            if PREFIX + s in block.column_names:
                self.add("actor_" + s, pc.sum(block.column(PREFIX + s)).as_py() or 0.0)

    def result(self, rows: int) -> dict[str, dict[str, float]]:
        """{stage: {"s": seconds, "us_per_row": ...}} over `rows` rows, in pipeline order."""
        order = [f"actor_{s}" for s in ACTOR] + ["driver_wait", "driver_split",
                                                 "driver_backpressure", "driver_cpu",
                                                 "commit_gather", "commit_write"]
        with self._lock:
            got = dict(self.seconds)
        names = [n for n in order if n in got] + sorted(set(got) - set(order))
        return {n: {"s": round(got[n], 3),
                    "us_per_row": round(got[n] / rows * 1e6, 2) if rows else 0.0}
                for n in names}


class Timing:
    """When the first scored rows reached the driver, and the rows and time after them."""

    def __init__(self, start: float) -> None:
        self.start, self.first, self.end, self.rows_after = start, None, None, 0

    def got(self, rows: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.rows_after += rows
        self.end = now

    def result(self) -> tuple[float | None, float | None]:
        if self.first is None:
            return None, None
        after = self.end - self.first
        return (round(self.first - self.start, 3),
                round(self.rows_after / after, 1) if after > 0 else None)
