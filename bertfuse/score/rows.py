"""One batch of input rows -> the model's int32 inputs, and the rows that cannot be scored.

    Arrow table ─► ids column (list<int>) ─► null / empty / too long / bad ids / bad mask ─► reject
               └─► text column (str)     ─► null / empty / too long after WordPiece       ─► reject
                                          └─► kept rows: [n, S] ids, mask, segments (right-padded)

Everything here is per row and vectorised over the batch (offsets and flat values, no Python
loop per row on the ids path): a reject carries its reason, it never fails the batch.
No Ray here: the actor (actor.py) and the single-process benchmark loop both use it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bertfuse.optional import optional
from bertfuse.text import WordPiece

pa = optional("pyarrow", why="Parquet (ray extra)")
pc = optional("pyarrow.compute", why="Parquet (ray extra)")


@dataclass(frozen=True)
class InputSpec:
    """Where a row's input is (one of text_column / ids_column) and what the model accepts."""

    max_seq: int
    text_column: str | None = None
    text_pair_column: str | None = None
    vocab: str | None = None
    lower_case: bool | None = None
    truncate: bool = False
    ids_column: str | None = None
    mask_column: str | None = None
    segment_column: str | None = None
    vocab_size: int | None = None
    type_vocab_size: int | None = None

    @property
    def columns(self) -> list[str]:
        """The input columns a row is scored from."""
        names = (self.text_column, self.text_pair_column, self.ids_column, self.mask_column,
                 self.segment_column)
        return [n for n in names if n]


@dataclass
class Prepared:
    """The kept rows of a batch as model inputs; `reasons[i]` is None for a kept row."""

    ids: np.ndarray  # int32 [kept, S], right-padded with 0
    mask: np.ndarray
    segments: np.ndarray
    lengths: np.ndarray  # tokens per kept row (the ids' length; a mask may keep fewer)
    kept: np.ndarray  # indices of the kept rows in the batch
    reasons: list[str | None] = field(default_factory=list)


class RowPreparer:
    """`RowPreparer(spec)(table) -> Prepared`; the tokenizer is built once, on first text."""

    def __init__(self, spec: InputSpec) -> None:
        self.spec = spec
        self._tok: Any = None

    def __call__(self, table: pa.Table) -> Prepared:
        if self.spec.text_column:
            return self._text(table)
        return self._ids(table)

    # -- ids columns --------------------------------------------------------------------------

    def _ids(self, table: pa.Table) -> Prepared:
        s = self.spec
        n = table.num_rows
        reasons: list[str | None] = [None] * n
        lengths, values, null_rows, bad_elems = _list_column(table, s.ids_column)
        _reject(reasons, null_rows, f"null {s.ids_column}")
        _reject(reasons, lengths == 0, f"empty {s.ids_column}")
        for i in np.flatnonzero(lengths > s.max_seq):
            _set(reasons, i, f"too long: {lengths[i]} tokens > max_seq {s.max_seq}")
        _reject(reasons, bad_elems, f"null id in {s.ids_column}")
        _range(reasons, lengths, values, s.vocab_size, s.ids_column)
        extra = {}
        for role, name, upper in (("mask", s.mask_column, 2),
                                  ("segments", s.segment_column, s.type_vocab_size)):
            if not name:
                continue
            lens, vals, nulls, bad = _list_column(table, name)
            _reject(reasons, nulls, f"null {name}")
            _reject(reasons, bad, f"null value in {name}")
            for i in np.flatnonzero((lens != lengths) & ~nulls):
                _set(reasons, i, f"{name} has {lens[i]} values, {s.ids_column} {lengths[i]}")
            _range(reasons, lens, vals, upper, name)
            extra[role] = (lens, vals)
        if "mask" in extra:  # a row whose mask keeps no token has nothing to score
            lens, vals = extra["mask"]
            kept_tokens = np.bincount(np.repeat(np.arange(n), lens), weights=vals, minlength=n)
            _reject(reasons, (kept_tokens == 0) & (lens > 0), f"{s.mask_column} keeps no token")
        ok = np.array([r is None for r in reasons], bool)
        kept = np.flatnonzero(ok)
        width = int(lengths[kept].max()) if kept.size else 1
        ids = _padded(lengths, values, ok, width)
        mask = _padded(*extra["mask"], ok, width) if "mask" in extra else \
            (np.arange(width)[None, :] < lengths[kept][:, None]).astype(np.int32)
        segments = _padded(*extra["segments"], ok, width) if "segments" in extra else \
            np.zeros_like(ids)
        return Prepared(ids, mask, segments, lengths[kept].astype(np.int64), kept, reasons)

    # -- text columns -------------------------------------------------------------------------

    def _text(self, table: pa.Table) -> Prepared:
        s = self.spec
        n = table.num_rows
        reasons: list[str | None] = [None] * n
        texts = _strings(table, s.text_column, reasons)
        pairs = _strings(table, s.text_pair_column, reasons) if s.text_pair_column else None
        kept = np.array([i for i in range(n) if reasons[i] is None], np.int64)
        if not kept.size:
            empty = np.zeros((0, 1), np.int32)
            return Prepared(empty, empty, empty, np.zeros(0, np.int64), kept, reasons)
        batch = self.tokenizer([texts[i] for i in kept],
                               None if pairs is None else [pairs[i] for i in kept])
        lengths = batch.input_mask.sum(axis=1).astype(np.int64)
        long = lengths > s.max_seq  # tokenized to max_seq + 1 unless truncating
        for j in np.flatnonzero(long):
            _set(reasons, int(kept[j]), f"too long: more than max_seq {s.max_seq} tokens "
                                        "(--truncate cuts it to fit)")
        keep = ~long
        width = int(lengths[keep].max()) if keep.any() else 1
        return Prepared(batch.input_ids[keep, :width], batch.input_mask[keep, :width],
                        batch.segment_ids[keep, :width], lengths[keep], kept[keep], reasons)

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            s = self.spec
            self._tok = _tokenizer(s.vocab, s.lower_case, s.max_seq, s.truncate)
        return self._tok


def _tokenizer(vocab: str, lower_case: bool | None, max_seq: int, truncate: bool) -> Any:
    """WordPiece cutting rows at max_seq tokens, or (not truncating) at one token more, so
    that a row too long to score shows as one (through max_length, which every path of
    WordPiece truncates to, its ASCII fast path included).

    WordPiece refuses a max_length past the positions of the bert_config.json beside the
    vocab (Google's layout), and max_seq is usually exactly that: one token more is then
    asked of a tokenizer over a private copy of the vocab, with the casing the real one
    decided (from that config). It only counts: no row longer than max_seq is scored."""
    tok = WordPiece(vocab, lower_case=lower_case, max_length=max_seq)
    if truncate:
        return tok
    with tempfile.TemporaryDirectory(prefix="bertfuse-vocab-") as tmp:
        copy = os.path.join(tmp, "vocab.txt")
        shutil.copyfile(vocab, copy)
        return WordPiece(copy, lower_case=tok.lower_case, max_length=max_seq + 1)


def _set(reasons: list[str | None], i: int, why: str) -> None:
    if reasons[i] is None:  # the first reason found is the one reported
        reasons[i] = why


def _reject(reasons: list[str | None], rows: np.ndarray, why: str) -> None:
    for i in np.flatnonzero(rows):
        _set(reasons, int(i), why)


def _list_column(table: pa.Table, name: str
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lengths, flat int64 values, null rows, rows holding a null value) of a list column;
    a null row has length 0 and no values."""
    col = table.column(name).combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        col = col.cast(pa.list_(col.type.value_type))
    nulls = col.is_null().to_numpy(zero_copy_only=False)
    lengths = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False) \
        .astype(np.int64)
    flat = pc.list_flatten(col)
    elem_null = flat.is_null().to_numpy(zero_copy_only=False)
    values = flat.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    bad = np.zeros(len(lengths), bool)
    bad[row_of[elem_null]] = True
    return lengths, values, nulls, bad


def _range(reasons: list[str | None], lengths: np.ndarray, values: np.ndarray,
           upper: int | None, name: str) -> None:
    """Rejects rows holding a value outside [0, upper), naming the first such value."""
    out = values < 0 if upper is None else (values < 0) | (values >= upper)
    if not out.any():
        return
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    bound = f"[0, {upper})" if upper is not None else ">= 0"
    for k in np.flatnonzero(out):
        _set(reasons, int(row_of[k]), f"{name} value {int(values[k])} not in {bound}")


def _padded(lengths: np.ndarray, values: np.ndarray, ok: np.ndarray, width: int) -> np.ndarray:
    """The kept rows' values as int32 [kept, width], right-padded with 0."""
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    take = ok[row_of]
    kept_lengths = lengths[ok]
    out = np.zeros((int(ok.sum()), width), np.int32)
    out[np.arange(width)[None, :] < kept_lengths[:, None]] = values[take]
    return out


def _strings(table: pa.Table, name: str, reasons: list[str | None]) -> list[Any]:
    """A text column as Python strings; null and blank rows are rejected."""
    values = table.column(name).to_pylist()
    for i, text in enumerate(values):
        if text is None:
            _set(reasons, i, f"null {name}")
        elif not text.strip():
            _set(reasons, i, f"empty {name}")
    return values
