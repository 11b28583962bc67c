"""Timing and comparing for the GPU benchmarks: host-clock p50/p99 (alone or interleaved),
GPU kernel time via CUPTI, and max/mean |diff| over valid positions."""

from __future__ import annotations

import collections
import time
from typing import Callable

import numpy as np

from bertfuse.optional import optional


def time_calls(fn: Callable[[], object], iters: int, warmup: int = 30) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    ts = np.empty(iters)
    for i in range(iters):
        t0 = time.perf_counter()
        fn()
        ts[i] = time.perf_counter() - t0
    return float(np.percentile(ts, 50) * 1e6), float(np.percentile(ts, 99) * 1e6)


def time_interleaved(fns: dict[str, Callable[[], object]], iters: int, rounds: int = 10,
                     warmup: int = 30) -> dict[str, tuple[float, float]]:
    """p50/p99 per function, timed in alternating rounds so that drift on a shared host
    falls on every variant alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    per_round = max(1, iters // rounds)
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {k: (float(np.percentile(v, 50) * 1e6), float(np.percentile(v, 99) * 1e6))
            for k, v in times.items()}


def compare(outs: dict[str, np.ndarray], ref: dict[str, np.ndarray],
            mask: np.ndarray) -> tuple[float, float]:
    worst, means = 0.0, []
    for name, r in ref.items():
        if name not in outs:
            continue
        o = np.asarray(outs[name], np.float64)
        d = np.abs(o - r)
        if d.ndim == 3:
            d = d[mask.astype(bool)]
        worst = max(worst, float(d.max()))
        means.append(float(d.mean()))
    return worst, float(np.mean(means)) if means else float("nan")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals: the time some kernel ran. Kernels
    launched with programmatic dependent launch start before their predecessor ends and wait
    inside, so their summed durations count the overlap twice; the union does not."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def kernel_profile(fn: Callable[[], object], reps: int = 20) -> tuple[float, int, list, float]:
    """GPU kernel time per call via CUPTI (torch.profiler sees ORT's kernels too): the sum of
    the kernels' durations, their count, the top 15 by name, and the busy time (busy_us)."""
    torch = optional("torch", why="the PyTorch peer, where installed")
    ProfilerActivity, profile = optional("torch.profiler", "ProfilerActivity", "profile",
                                         why="the PyTorch peer, where installed")

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    def dur(e) -> float:
        return getattr(e, "device_time_total", None) or e.cuda_time_total

    total = sum(dur(e) for e in events) / reps
    agg: collections.Counter = collections.Counter()
    for e in events:
        agg[e.name[:70]] += dur(e) / reps
    busy = busy_us([(e.time_range.start, e.time_range.end) for e in events]) / reps
    return (total, len(events) // reps, [(k, round(v, 1)) for k, v in agg.most_common(15)],
            busy)
