"""Every random or probe input bertfuse makes, in one place (NumPy only).

    random_inputs   parity checks (convert, verify, diff --numeric): ids, segments, padding
    probe_feeds     the passes' numeric probes: every graph input filled with one value
    probe_mask      a 0/1 mask padded at the end, in the middle and at the start of rows
    shape_probe     the runtime's tiny run that reads output shapes
    variant_probe   the runtime's check of a mask variant against the raw mask
    padded_request  the benchmarks' right-padded request
    lengths_request the benchmarks' request with given row lengths

passes/, converter/, runtime/ and bench/ import from here; it imports nothing of bertfuse.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

PROBE_BATCH, PROBE_SEQ = 3, 7
Request = dict[str, np.ndarray]


def random_inputs(batch: int, seq: int, vocab: int, type_vocab: int = 2, seed: int | None = None,
                  pad_anywhere: bool = False) -> Request:
    """Fresh random ids with padding: zeros at the end of some rows (and, with pad_anywhere,
    holes in the middle and at the start of others). Row 0 is always full."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, max(vocab, 2), size=(batch, seq), dtype=np.int64).astype(np.int32)
    segs = rng.integers(0, max(type_vocab, 1), size=(batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    for b in range(1 if seq > 1 else batch, batch):  # one position: nothing to pad
        kind = b % 3 if pad_anywhere else 1
        if kind == 1:  # right padding
            mask[b, rng.integers(1, seq):] = 0
        elif kind == 2:  # a hole in the middle
            lo = rng.integers(1, max(seq - 1, 2))
            mask[b, lo:lo + rng.integers(1, max(seq - lo, 2))] = 0
        else:  # left padding
            mask[b, : rng.integers(1, seq)] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segs}


def probe_feeds(graph: Any, fill: int = 1, batch: int = PROBE_BATCH,
                seq: int = PROBE_SEQ) -> Request:
    """Every input of a graph (onnx-graphsurgeon's: .inputs with name, dtype, shape) as an
    array of `fill` ([batch, seq] for 2-D integer inputs; [batch, 1, seq] for 3-D ones, a
    multiple-choice model's [batch, choices, seq], which it flattens to [batch, seq])."""
    feeds = {}
    for t in graph.inputs:
        dtype = np.dtype(t.dtype) if t.dtype is not None else np.dtype(np.int32)
        rank = len(t.shape) if t.shape is not None else 2
        shape = [batch, seq][:rank] + [1] * max(0, rank - 2)
        if rank == 3 and dtype.kind in "iu":
            shape = [batch, 1, seq]
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


def shape_probe(names: Iterable[str], batch: int = 2, seq: int = 3) -> Request:
    """Zero ids and segments, a mask of ones: the smallest request that runs anywhere."""
    feeds = {n: np.zeros((batch, seq), np.int32) for n in names}
    feeds.get("input_mask", np.zeros(0))[...] = 1
    return feeds


def variant_probe(batch: int, seq: int, vocab: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, row lengths) for checking a mask variant in a [batch, seq] bucket: every row
    right-padded (when seq > 1) but the second, which is full. Seeded by the shape."""
    rng = np.random.default_rng(batch * 1000 + seq)
    lengths = rng.integers(1, max(seq, 2), batch)
    lengths[1:2] = seq
    ids = rng.integers(0, min(vocab or 100, 30000), (batch, seq)).astype(np.int32)
    return ids, lengths


def padded_request(batch: int, seq: int, vocab: int, seed: int = 1) -> Request:
    """Right padding in every row (each keeps at least half of seq), segments 0 then 1."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, size=(batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    for i in range(batch):
        mask[i, rng.integers(max(1, seq // 2), seq + 1):] = 0  # every row keeps a token
    seg = np.zeros((batch, seq), np.int32)
    seg[:, seq // 2:] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": seg}


def lengths_request(lengths: Sequence[int] | np.ndarray, seq: int, vocab: int,
                    seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, mask, segments): row r keeps its first lengths[r] tokens; ids are 0 past them."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = rng.integers(1, vocab, size=mask.shape).astype(np.int32) * mask
    segs = np.zeros(mask.shape, np.int32)
    segs[:, seq // 2:] = 1
    return ids, mask, segs
