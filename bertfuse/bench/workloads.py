"""The benchmark workloads: padded (model config, batch, seq) and padded-vs-packed (model
config, batch, seq, row lengths). Light to import: the CLI offers the names."""

from __future__ import annotations

from typing import Callable

import numpy as np

Lengths = Callable[[np.random.Generator, int, int], np.ndarray]

PADDED_WORKLOADS = {  # name: (model config, batch, seq)
    "shenma-3l b20 s64": ("shenma-3l", 20, 64),
    "base b1 s128": ("base", 1, 128),
    "base b32 s128": ("base", 32, 128),
    "large b1 s128": ("large", 1, 128),
    "base b8 s384": ("base", 8, 384),
    "minilm b32 s128": ("minilm", 32, 128),
    "tinybert b20 s64": ("tinybert", 20, 64),
}

PACKED_WORKLOADS: dict[str, tuple[str, int, int, Lengths]] = {
    # name: (model config, batch, seq, lengths(rng, batch, seq))
    "uniform [8,64] b20 s64": ("shenma-3l", 20, 64, lambda r, b, s: r.integers(8, 65, b)),
    "skewed b32 s128": ("base", 32, 128, lambda r, b, s: np.concatenate(
        [r.integers(8, 25, b - 4), np.full(4, s)])),
}
