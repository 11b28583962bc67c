"""What a `bertfuse kernels check` case is, shared by check.py (dense, attention, FP8 cases and
the runner), check_packed.py (the packed path's cases) and check_e4m3.py (the e4m3 outputs'):
a one-node model, its feeds, its NumPy reference, and the fp16 gate it must pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx

Feeds = dict[str, np.ndarray]
MAX_ABS, MEAN_ABS = 4e-2, 2e-3  # the fp16 gate against the float64 reference


@dataclass
class Case:
    op: str
    label: str
    model: onnx.ModelProto
    feeds: Feeds
    reference: Callable[[Feeds], list[np.ndarray]]  # the expected outputs for given feeds
    feeds2: Feeds | None = None  # the replay's new inputs (default: every feed rolled by one row)
    exact: Callable[[Feeds], np.ndarray] | None = None  # FP8: unquantized reference, reported only
    # (max, mean, ok) of the outputs for given feeds, in place of the fp16 gate against
    # `reference` (e4m3 outputs: their own rounding rule)
    check: Callable[[list[np.ndarray], Feeds], tuple[float, float, bool]] | None = None

    def judge(self, got: list[np.ndarray], feeds: Feeds,
              want: list[np.ndarray] | None = None) -> tuple[float, float, bool]:
        """(max, mean, ok) of the outputs `got` for `feeds`: the case's own check, else the fp16
        gate against its reference (`want`, where the caller has it already)."""
        if self.check:
            return self.check(got, feeds)
        return gate(got, want if want is not None else self.reference(feeds))

    def replay_feeds(self) -> Feeds:
        if self.feeds2 is not None:
            return self.feeds2
        return {k: np.ascontiguousarray(np.roll(v, 1, axis=0)) for k, v in self.feeds.items()}


def normal16(rng: np.random.Generator, shape, std: float = 1.0, mean: float = 0.0) -> np.ndarray:
    return (rng.standard_normal(shape) * std + mean).astype(np.float16)


def diff(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    if not np.all(np.isfinite(got.astype(np.float64))):
        return float("nan"), float("nan")
    d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    return (float(d.max()), float(d.mean())) if d.size else (0.0, 0.0)


def gate(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, float, bool]:
    """(max, mean, ok) over all outputs: float outputs within the fp16 gate, integer ones exact,
    never a NaN."""
    if [g.shape for g in got] != [w.shape for w in want]:
        return float("nan"), float("nan"), False
    mx = mean = 0.0
    ok = True
    for g, w in zip(got, want):
        m, a = diff(g, w)
        if not np.isfinite(m):
            return float("nan"), float("nan"), False
        mx, mean = max(mx, m), max(mean, a)
        ok = ok and (m == 0 if np.issubdtype(w.dtype, np.integer) else m <= MAX_ABS and a <= MEAN_ABS)
    return mx, mean, bool(ok)
