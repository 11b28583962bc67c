"""A replica's inference statistics in the form of Triton's statistics extension (GET
/v2/models/NAME/stats): counts and cumulative nanoseconds, kept as the replica answers
/v1/infer and /v2's infer alike. No Ray here.

    request in ─► body read, parsed, checked ─► queue ─► model call ─► outputs ready
                 └──── compute_input ────────┘└─ queue ┘└ compute_infer ┘└ compute_output ┘
                 └──────────────────────── success (or fail) ───────────────────────┘

Per request, as Triton counts them: success / fail (a request answered with outputs / with
an error, 4xx included, from its first byte to its outputs or its error), and for each
successful one its queue (parsed -> its model call starts: waiting for company and for the
session), compute_input (request in -> parsed), compute_infer (its model call: a request in
a batch of several counts the whole call, as Triton's requests of one execution do) and
compute_output (the call returned -> its rows split out). inference_count: rows answered;
execution_count: model calls; batch_stats: per model call's row count, its calls and their
combine (compute_input), Session.run (compute_infer) and split (compute_output) times.
Each replica counts its own; the stats route sums the replicas' (oip_routes.py).
"""

from __future__ import annotations

import time
from typing import Any

STAGES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
# Triton's response carries the cache's two as well; bertfuse has no response cache
NO_CACHE = ("cache_hit", "cache_miss")


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


class InferStats:
    """Counters of one replica (its event loop only: no lock)."""

    def __init__(self) -> None:
        self.last_inference = 0  # ms since the epoch of the last success
        self.inference_count = 0
        self.execution_count = 0
        self.stages = {k: [0, 0] for k in STAGES}  # [count, ns]
        self.batches: dict[int, dict[str, list[int]]] = {}

    def _add(self, stage: str, seconds: float) -> None:
        entry = self.stages[stage]
        entry[0] += 1
        entry[1] += _ns(seconds)

    def success(self, rows: int, start: float, parsed: float, ran: tuple[float, float],
                end: float) -> None:
        """A request of `rows` answered: perf_counter times of its arrival, its check done,
        its model call's start and end, its outputs ready."""
        self.inference_count += rows
        self.last_inference = int(time.time() * 1000)
        for stage, took in (("success", end - start), ("compute_input", parsed - start),
                            ("queue", ran[0] - parsed), ("compute_infer", ran[1] - ran[0]),
                            ("compute_output", end - ran[1])):
            self._add(stage, took)

    def fail(self, start: float) -> None:
        self._add("fail", time.perf_counter() - start)

    def execution(self, rows: int, combine_s: float, run_s: float, split_s: float) -> None:
        """One model call of `rows` rows."""
        self.execution_count += 1
        entry = self.batches.setdefault(rows, {k: [0, 0] for k in STAGES[3:]})
        for stage, took in zip(STAGES[3:], (combine_s, run_s, split_s)):
            entry[stage][0] += 1
            entry[stage][1] += _ns(took)

    def snapshot(self) -> dict[str, Any]:
        """Plain data (summed across replicas by `merge`)."""
        return {"last_inference": self.last_inference, "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "stages": {k: list(v) for k, v in self.stages.items()},
                "batches": {str(r): {k: list(v) for k, v in b.items()}
                            for r, b in self.batches.items()}}


def merge(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """Several replicas' snapshots as one: counts and times summed, the latest inference."""
    out = InferStats().snapshot()
    for s in snapshots:
        out["last_inference"] = max(out["last_inference"], s["last_inference"])
        for key in ("inference_count", "execution_count"):
            out[key] += s[key]
        for stage, (count, ns) in s["stages"].items():
            out["stages"][stage][0] += count
            out["stages"][stage][1] += ns
        for rows, b in s["batches"].items():
            mine = out["batches"].setdefault(rows, {k: [0, 0] for k in STAGES[3:]})
            for stage, (count, ns) in b.items():
                mine[stage][0] += count
                mine[stage][1] += ns
    return out


def triton_stats(name: str, version: str, snap: dict[str, Any]) -> dict[str, Any]:
    """One entry of Triton's model_stats list."""
    pair = lambda v: {"count": v[0], "ns": v[1]}  # noqa: E731
    return {"name": name, "version": version, "last_inference": snap["last_inference"],
            "inference_count": snap["inference_count"],
            "execution_count": snap["execution_count"],
            "inference_stats": {**{k: pair(v) for k, v in snap["stages"].items()},
                                **{k: pair([0, 0]) for k in NO_CACHE}},
            "batch_stats": [{"batch_size": int(rows), **{k: pair(v) for k, v in b.items()}}
                            for rows, b in sorted(snap["batches"].items(),
                                                  key=lambda kv: int(kv[0]))],
            "memory_usage": []}
