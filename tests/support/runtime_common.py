"""Helpers for the runtime tests: requests of every padding kind, plain ORT references,
CPU sessions with the GPU's machinery (buckets, mask variants) so CI exercises it.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.runtime.session import Session  # noqa: E402


VOCAB, TYPE_VOCAB, POSITIONS = 1000, 2, 128  # EXAMPLE_CONFIGS['tiny']


MAX_BATCH, MAX_SEQ = 8, 128


BATCH_BUCKETS, SEQ_BUCKETS = (1, 2, 4, 8), (8, 16, 32, 64)  # + the limit 128


TOL = {"fp32": 1e-5, "fp16": 1e-3}


KINDS = ("full", "right", "hole", "left")


OUTPUTS = ("sequence_output", "pooled_output")


def padded_mask(rng: np.random.Generator, batch: int, seq: int,
                kinds: tuple[str, ...] = KINDS) -> np.ndarray:
    """[batch, seq] int32: row r gets kinds[r % len(kinds)] padding (never an empty row;
    a kind a row is too short for falls back to a full row)."""
    mask = np.ones((batch, seq), np.int32)
    for r in range(batch):
        kind = kinds[r % len(kinds)]
        if kind == "right" and seq >= 2:
            mask[r, rng.integers(1, seq):] = 0
        elif kind == "hole" and seq >= 3:
            lo = int(rng.integers(1, seq - 1))
            mask[r, lo:int(rng.integers(lo + 1, seq))] = 0
        elif kind == "left" and seq >= 2:
            mask[r, :rng.integers(1, seq)] = 0
    return mask


def make_request(rng: np.random.Generator, batch: int, seq: int,
                 kinds: tuple[str, ...] = KINDS) -> dict[str, np.ndarray]:
    mask = padded_mask(rng, batch, seq, kinds)
    ids = rng.integers(1, VOCAB, size=(batch, seq)).astype(np.int32)
    ids[mask == 0] = 0
    segs = rng.integers(0, TYPE_VOCAB, size=(batch, seq)).astype(np.int32)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segs}


def plain_session(model: str | onnx.ModelProto):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def plain_run(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def max_diff(got: dict, want: dict, mask: np.ndarray) -> float:
    """Worst |diff|: sequence_output at valid positions, pooled_output everywhere."""
    worst = 0.0
    for name in OUTPUTS:
        assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
        d = np.abs(got[name].astype(np.float64) - want[name])
        if d.ndim == 3:
            d = d[mask.astype(bool)]
        worst = max(worst, float(d.max()))
    return worst


def new_session(path: str, **kw) -> Session:
    """A CPU session with the GPU's machinery (buckets, mask variants), so CI exercises it."""
    kw = {"max_batch": MAX_BATCH, "max_seq": MAX_SEQ, "batch_buckets": BATCH_BUCKETS,
          "seq_buckets": SEQ_BUCKETS, "device": "cpu", "pad_to_buckets": True,
          "mask_variants": True, **kw}
    return Session(path, **kw)


class ModeRecorder:
    """Stands in for one of Session.sessions' InferenceSessions; records which one ran."""

    def __init__(self, inner, mode: str, log: list[str]):
        self._inner, self._mode, self._log = inner, mode, log

    def run_with_iobinding(self, *args, **kw):
        self._log.append(self._mode)
        return self._inner.run_with_iobinding(*args, **kw)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def record_modes(s: Session) -> list[str]:
    log: list[str] = []
    s.sessions = {mode: ModeRecorder(sess, mode, log) for mode, sess in s.sessions.items()}
    return log


def _refuse_ort(monkeypatch, s: Session) -> None:
    def fail(*args, **kw):
        raise AssertionError("a refused request reached onnxruntime")

    for sess in s.sessions.values():
        monkeypatch.setattr(sess, "run_with_iobinding", fail)


def _valid(batch=2, seq=6):
    return make_request(np.random.default_rng(15), batch, seq, ("full", "right"))


def _with(**changes):
    def build():
        feeds = _valid()
        for role, fn in changes.items():
            feeds[role] = fn(feeds[role])
        return feeds
    return build


def _setitem(index, value):
    def fn(a):
        a = a.copy()
        a[index] = value
        return a
    return fn


BAD_REQUESTS = [  # (id, feeds builder, message regex)
    ("float ids", _with(input_ids=lambda a: a.astype(np.float32)),
     r"input_ids must be an integer array, got float32"),
    ("float mask", _with(input_mask=lambda a: a.astype(np.float64)),
     r"input_mask must be an integer array, got float64"),
    ("1-D ids", _with(input_ids=lambda a: a[0], input_mask=lambda a: a[0],
                      segment_ids=lambda a: a[0]),
     r"input_ids must be \[batch, seq\], got shape \(6,\)"),
    ("3-D ids", _with(input_ids=lambda a: a[None]), r"input_ids must be \[batch, seq\]"),
    ("mask shorter than ids", _with(input_mask=lambda a: a[:, :-1]),
     r"input_mask has shape \(2, 5\), input_ids \(2, 6\)"),
    ("segments with another batch", _with(segment_ids=lambda a: a[:1]),
     r"segment_ids has shape \(1, 6\), input_ids \(2, 6\)"),
    ("batch > max_batch", lambda: _valid(MAX_BATCH + 1, 4), rf"batch 9 outside 1\.\.{MAX_BATCH}"),
    ("empty batch", lambda: _valid(0, 4), r"batch 0 outside"),
    ("empty sequence", _with(input_ids=lambda a: a[:, :0], input_mask=lambda a: a[:, :0],
                             segment_ids=lambda a: a[:, :0]), r"sequence length 0 outside"),
    ("ids >= vocab", _with(input_ids=_setitem((1, 2), VOCAB)),
     r"input_ids values must be in \[0, 1000\), got 0\.\.1000"),
    ("negative ids", _with(input_ids=_setitem((0, 0), -1)),
     r"input_ids values must be in \[0, 1000\), got -1\.\."),
    ("huge int64 ids", _with(input_ids=lambda a: _setitem((0, 1), 2**32 + 5)(
        a.astype(np.int64))), r"input_ids values must be in \[0, 1000\)"),
    ("segment ids >= type vocab", _with(segment_ids=_setitem((1, 0), TYPE_VOCAB)),
     r"segment_ids values must be in \[0, 2\)"),
    ("negative segment ids", _with(segment_ids=_setitem((1, 0), -1)),
     r"segment_ids values must be in \[0, 2\)"),
    ("mask value 2", _with(input_mask=_setitem((0, 3), 2)),
     r"input_mask values must be in \[0, 2\)"),
    ("mask value -1", _with(input_mask=_setitem((1, 5), -1)),
     r"input_mask values must be in \[0, 2\)"),
]


def _thread_requests(seed: int, batch_for_thread=None) -> list[dict]:
    """200 mixed-shape requests (every padding kind, some without a mask); request i belongs
    to thread i % 4. With batch_for_thread, thread k's batches come from its own range."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(200):
        lo, hi = batch_for_thread[i % 4] if batch_for_thread else (1, 4)
        batch, seq = int(rng.integers(lo, hi + 1)), int(rng.integers(1, 17))  # small: 2-CPU CI
        kinds = (KINDS, ("full",), ("full", "right"), ("hole", "left"))[(i // 4) % 4]
        feeds = make_request(rng, batch, seq, kinds)
        if i % 7 == 0:
            del feeds["input_mask"]
        reqs.append(feeds)
    return reqs


def _run_threads(s: Session, reqs: list[dict], copy_results: bool) -> list:
    got: list = [None] * len(reqs)
    errors: list = []
    barrier = threading.Barrier(4)

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for i in range(k, len(reqs), 4):  # interleaved: shapes and variants mix
                out = s.run(**reqs[i])
                got[i] = {n: v.copy() for n, v in out.items()} if copy_results else out
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(g is not None for g in got)
    return got


def _assert_same(got: list, want: list) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        for name in OUTPUTS:
            np.testing.assert_allclose(g[name], w[name], atol=1e-6, rtol=0,
                                       err_msg=f"request {i} {name}")


def _raises(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:
        return exc
    return None


ROW_TOL = {"fp32": 1e-4, "fp16": 4e-3}


def with_empty_rows(rng: np.random.Generator, batch: int, seq: int,
                    rows: list[int]) -> dict[str, np.ndarray]:
    """A request of every padding kind, with the given rows' masks all zeros (their ids
    random: a client that masked a row out need not have cleared it)."""
    feeds = make_request(rng, batch, seq)
    feeds["input_mask"][rows] = 0
    feeds["input_ids"][rows] = rng.integers(1, 1000, (len(rows), seq))
    return feeds


def row_diff(got: dict, want: dict, rows: list[int]) -> float:
    """Worst |diff| over the given rows: sequence_output at every position, pooled_output."""
    return max(float(np.abs(got[n][rows].astype(np.float64) - want[n][rows]).max())
               for n in OUTPUTS)
