"""The packed model's request layout, shared by the packing pass and the runtime.

A packed model (passes/packing.py) runs the encoder on the real tokens only. Per request it
takes `token_index` [T] (flat positions of kept tokens, row by row), `token_offset` [rows, S]
(those positions first, then the padded ones) and `cumulative_sequence_length` [rows + 1].
To replay one CUDA graph per shape, the runtime pads T up to fixed token buckets with filler
sequences in rows past the request's batch (`PackedShape`). NumPy only: both passes/ and
runtime/ import this module, and it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PACKED_INPUTS = ("token_index", "token_offset", "cumulative_sequence_length")


@dataclass(frozen=True)
class PackedShape:
    """One fixed shape of the packed model, so a CUDA graph can be captured for it.

    input_ids/segment_ids are [batch, seq]; the encoder runs on `tokens` rows; token_offset is
    [rows, seq] with rows = batch + filler rows. A request with t real tokens is padded up to
    `tokens` with filler tokens that form sequences of their own (the rows past the request's
    batch), so every token the kernels touch belongs to some sequence and no row is empty.
    """

    batch: int
    seq: int
    tokens: int
    rows: int


def packed_shapes(batch: int, seq: int, steps: int = 8) -> list[PackedShape]:
    """The token buckets of one [batch, seq] bucket: `steps` equal steps up to batch x seq."""
    step = -(-batch * seq // steps)
    if seq == 1:  # every row is one token: nothing to pack, one bucket with one filler row
        return [PackedShape(batch, 1, batch + 1, batch + 1)]
    extra_rows = -(-step // seq) + 1
    while extra_rows * (seq - 1) < step:  # filler rows must hold a step's worth of tokens
        extra_rows += 1
    return [PackedShape(batch, seq, k * step + extra_rows, batch + extra_rows)
            for k in range(1, steps + 1)]


def device_shapes(batch: int, seq: int, steps: int = 8) -> list[PackedShape]:
    """The token buckets of one [batch, seq] bucket of the device-packed form
    (passes/device_packing.py): T in `steps` equal steps up to batch x seq, no filler rows
    (packed rows past the kept tokens belong to no sequence there)."""
    step = -(-batch * seq // steps)
    tokens = sorted({min(k * step, batch * seq) for k in range(1, steps + 1)})
    return [PackedShape(batch, seq, t, batch) for t in tokens]


def choose_device_shape(shapes: list[PackedShape], tokens: int) -> PackedShape:
    """The smallest device-packed token bucket that holds `tokens` kept tokens (rows the
    request leaves empty need no filler there)."""
    for shape in shapes:
        if shape.tokens >= tokens:
            return shape
    raise ValueError(f"{tokens} tokens do not fit {shapes[-1]}")


def choose_shape(shapes: list[PackedShape], batch: int, tokens: int) -> PackedShape:
    """The smallest shape that holds `tokens` real tokens of `batch` rows plus a filler token
    for each remaining row."""
    for shape in shapes:
        if shape.tokens >= tokens + shape.rows - batch:
            return shape
    raise ValueError(f"{tokens} tokens do not fit {shapes[-1]}")


def pack_into(mask: np.ndarray, shape: PackedShape,
              out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """token_index / token_offset / cumulative_sequence_length of `mask` ([b, s] 0/1, b and s
    within the shape), padded to `shape` with filler sequences; written into `out`'s arrays
    when given (the runtime's staging buffer). It is on the request path: few NumPy calls."""
    b, s = mask.shape
    keep = np.zeros((shape.rows, shape.seq), bool)
    np.not_equal(mask, 0, out=keep[:b, :s])
    lengths = np.add.reduce(keep, axis=1, dtype=np.int64)
    real = int(lengths.sum())
    filler_rows = shape.rows - b
    extra = shape.tokens - real
    if not filler_rows <= extra <= filler_rows * shape.seq:
        raise ValueError(f"{real} tokens in {b} rows do not pack into {shape}")
    each, rest = divmod(extra, filler_rows)
    lengths[b:] = each
    lengths[b:b + rest] += 1
    keep[b:] = np.arange(shape.seq) < lengths[b:, None]
    flat = keep.reshape(-1)
    kept = flat.nonzero()[0]  # row by row: the order the kernels expect
    if out is None:
        out = {"token_index": np.empty(shape.tokens, np.int32),
               "token_offset": np.empty((shape.rows, shape.seq), np.int32),
               "cumulative_sequence_length": np.empty(shape.rows + 1, np.int32)}
    offset = out["token_offset"].reshape(-1)
    offset[:shape.tokens] = kept
    offset[shape.tokens:] = (~flat).nonzero()[0]
    index = out["token_index"]
    index[:] = kept
    index[np.searchsorted(kept, shape.batch * shape.seq):] = 0  # filler past input_ids: token 0
    cumulative = out["cumulative_sequence_length"]
    cumulative[0] = 0
    np.cumsum(lengths, out=cumulative[1:])
    return out


def capture_mask(shape: PackedShape) -> np.ndarray:
    """A mask that fills the shape's token count exactly (filler rows one token each): the
    request a token bucket is captured with."""
    tokens = shape.tokens - (shape.rows - shape.batch)
    tokens = min(max(tokens, shape.batch), shape.batch * shape.seq)
    each, rest = divmod(tokens, shape.batch)
    lengths = each + (np.arange(shape.batch) < rest)
    return (np.arange(shape.seq)[None, :] < lengths[:, None]).astype(np.int32)
