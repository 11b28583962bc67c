"""What a `bertfuse kernels check` case is, shared by check.py (dense, attention, FP8 cases and
the runner) and check_packed.py (the packed path's cases): a one-node model, its feeds and
its NumPy reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx

Feeds = dict[str, np.ndarray]


@dataclass
class Case:
    op: str
    label: str
    model: onnx.ModelProto
    feeds: Feeds
    reference: Callable[[Feeds], list[np.ndarray]]  # the expected outputs for given feeds
    feeds2: Feeds | None = None  # the replay's new inputs (default: every feed rolled by one row)
    exact: Callable[[Feeds], np.ndarray] | None = None  # FP8: unquantized reference, reported only

    def replay_feeds(self) -> Feeds:
        if self.feeds2 is not None:
            return self.feeds2
        return {k: np.ascontiguousarray(np.roll(v, 1, axis=0)) for k, v in self.feeds.items()}


def normal16(rng: np.random.Generator, shape, std: float = 1.0, mean: float = 0.0) -> np.ndarray:
    return (rng.standard_normal(shape) * std + mean).astype(np.float16)
