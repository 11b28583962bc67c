"""Probe inputs for numeric checks, built from the graph's own inputs."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

PROBE_BATCH, PROBE_SEQ = 3, 7


def probe_feeds(graph: gs.Graph, fill: int = 1, batch: int = PROBE_BATCH,
                seq: int = PROBE_SEQ) -> dict[str, np.ndarray]:
    """Every graph input as an array of `fill` ([batch, seq] for 2-D integer inputs)."""
    feeds = {}
    for t in graph.inputs:
        dtype = np.dtype(t.dtype) if t.dtype is not None else np.dtype(np.int32)
        rank = len(t.shape) if t.shape is not None else 2
        shape = [batch, seq][:rank] + [1] * max(0, rank - 2)
        if t.shape is not None:
            shape = [d if isinstance(d, int) and d > 0 else s for d, s in zip(t.shape, shape)]
        feeds[t.name] = np.full(shape, fill, dtype=dtype)
    return feeds


def probe_mask(batch: int = PROBE_BATCH, seq: int = PROBE_SEQ, seed: int = 7) -> np.ndarray:
    """0/1 mask with zeros at the end, in the middle and at the start of rows."""
    rng = np.random.default_rng(seed)
    m = (rng.random((batch, seq)) > 0.4).astype(np.int64)
    m[:, 0] = 1
    m[0, -2:] = 0
    m[1 % batch, 2:4] = 0
    m[2 % batch, 0] = 0  # key 0 padded too: a mask subgraph may not special-case it
    m[m.sum(1) == 0, -1] = 1  # every row keeps at least one key
    return m
