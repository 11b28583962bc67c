"""The runtime's edges on the CPU EP: the all-masked row, nested pool calls, argument
checks, and closing sessions and pools.

Models: the ckpt_erf fixture converted by `bertfuse convert` (conftest's `tiny_onnx`). Every
result is compared with a plain onnxruntime InferenceSession on the request as sent.
"""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.errors import BertfuseError  # noqa: E402
from bertfuse.runtime.device import GATE  # noqa: E402
from bertfuse.runtime.pool import NestedCallError, SessionPool  # noqa: E402
from bertfuse.runtime.requests import ClosedError, ConfigError, unmask_empty_rows  # noqa: E402
from bertfuse.runtime.router import Session  # noqa: E402
from test_runtime import (MAX_BATCH, MAX_SEQ, OUTPUTS, POSITIONS, make_request,  # noqa: E402
                          new_session, plain_run, plain_session, record_modes)

# fp32: the -10000 that attention adds to every key of an all-masked row is rounded
# differently from the unmasked sum (about 3e-5 on this model); fp16: one output ulp.
ROW_TOL = {"fp32": 1e-4, "fp16": 4e-3}


@pytest.fixture(scope="module")
def references(tiny_onnx) -> dict:
    return {k: plain_session(tiny_onnx[k]) for k in ("fp32", "fp16")}


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


# ---------------------------------------------------------------------- the all-masked row


def test_unmask_empty_rows_copies_only_when_needed():
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.int32)
    assert unmask_empty_rows(mask) is mask
    holes = np.array([[0, 1, 0], [1, 0, 0]], np.int32)  # left padding, no empty row
    assert unmask_empty_rows(holes) is holes
    empty = np.array([[0, 0, 0], [0, 1, 1], [0, 0, 0]], np.int32)
    out = unmask_empty_rows(empty)
    assert out is not empty and (empty[[0, 2]] == 0).all()  # the caller's array untouched
    np.testing.assert_array_equal(out, [[1, 1, 1], [0, 1, 1], [1, 1, 1]])


# (batch, seq, empty rows): bucket padding in seq, in batch, both, none, a whole request.
EMPTY_CASES = [(3, 10, [1]), (4, 16, [0, 3]), (1, 5, [0]), (2, 100, [1]), (8, 128, [7]),
               (5, 37, [0, 1, 2, 3, 4]), (4, 16, [0, 1, 2, 3])]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("variants", [True, False], ids=["variants", "raw-only"])
def test_all_masked_row_is_what_plain_ort_gives(precision, variants, tiny_onnx, references):
    """Before the fix a row of mask zeros also attended to the bucket's padding keys:
    0.059 off plain ORT, and different in every bucket."""
    s = new_session(tiny_onnx[precision], right_padded="keylen", mask_variants=variants)
    rng = np.random.default_rng(30)
    for batch, seq, rows in EMPTY_CASES:
        feeds = with_empty_rows(rng, batch, seq, rows)
        sent = {k: v.copy() for k, v in feeds.items()}
        got = s.run(**feeds)
        want = plain_run(references[precision], feeds)
        d = row_diff(got, want, rows)
        assert d <= ROW_TOL[precision], (precision, batch, seq, rows, s.bucket_for(batch, seq), d)
        others = [r for r in range(batch) if r not in rows]
        if others:  # the other rows are served as before
            keep = feeds["input_mask"][others].astype(bool)
            seq_d = np.abs(got["sequence_output"][others] - want["sequence_output"][others])
            assert seq_d[keep].max() <= ROW_TOL[precision]
        for k in feeds:  # the request is not rewritten under the caller
            np.testing.assert_array_equal(feeds[k], sent[k])


def test_all_masked_row_does_not_depend_on_the_bucket(tiny_onnx):
    """One request through sessions whose buckets differ (exact, seq-padded, both padded):
    the all-masked row's outputs agree to kernel rounding."""
    shapes = [dict(batch_buckets=(3,), seq_buckets=(10,), max_batch=3, max_seq=10),
              dict(batch_buckets=(4,), seq_buckets=(16,)),
              dict(batch_buckets=(8,), seq_buckets=(64,))]
    feeds = with_empty_rows(np.random.default_rng(31), 3, 10, [2])
    results = [new_session(tiny_onnx["fp32"], **kw).run(**feeds) for kw in shapes]
    for got in results[1:]:
        assert row_diff(got, results[0], [2]) <= 1e-5


def test_all_masked_row_takes_the_narrow_mask_forms(tiny_onnx):
    """Unmasked, the row is a full row: a request that is otherwise right-padded keeps its
    key-length variant instead of falling back to the raw mask."""
    s = new_session(tiny_onnx["fp32"], right_padded="keylen")
    log = record_modes(s)
    feeds = make_request(np.random.default_rng(32), 3, 12, ("right",))
    feeds["input_mask"][1] = 0
    s.run(**feeds)
    s.replay_call(feeds["input_mask"])()
    assert log[-2:] == ["keylen", "keylen"], log


# ------------------------------------------------------------------------- nested pool calls


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_pool_job_calling_its_own_pool_is_refused(replicas, tiny_onnx):
    feeds = make_request(np.random.default_rng(33), 2, 5)
    with SessionPool(lambda: new_session(tiny_onnx["fp32"]), replicas=replicas) as pool:
        for nested in (lambda s: pool.run(**feeds), lambda s: pool.call(lambda r: 1),
                       lambda s: pool.submit(lambda r: 1)):
            future = pool.submit(nested)
            with pytest.raises(NestedCallError, match="job called a SessionPool"):
                future.result(timeout=60)  # a deadlock would time out here instead
        assert issubclass(NestedCallError, BertfuseError)
        assert set(pool.run(**feeds)) == set(OUTPUTS)  # it goes on serving
        # Another pool neither: the job would wait inside the capture gate's running count,
        # and the other pool's first request in a new bucket waits for that count to drop.
        with SessionPool(lambda: new_session(tiny_onnx["fp32"]), replicas=1) as other:
            future = pool.submit(lambda s: other.run(**feeds))
            with pytest.raises(NestedCallError):
                future.result(timeout=60)
            assert set(other.run(**feeds)) == set(OUTPUTS)


# ------------------------------------------------------------------------ argument checks


BAD_SESSION_ARGS = [
    ({"max_batch": -1}, "max_batch must be at least 1, not -1"),
    ({"max_batch": 0}, "max_batch must be at least 1"),
    ({"max_batch": 2.5}, "max_batch must be an integer"),
    ({"max_batch": True}, "max_batch must be an integer"),
    ({"max_seq": 0}, r"max_seq must be 1\.\.128"),
    ({"max_seq": -4}, r"max_seq must be 1\.\.128"),
    ({"max_seq": "64"}, "max_seq must be an integer"),
    ({"max_seq": POSITIONS + 1}, "position table has 128 rows"),
    ({"batch_buckets": (0, 4)}, "each of batch_buckets must be at least 1, not 0"),
    ({"seq_buckets": (16, -8)}, "each of seq_buckets must be at least 1"),
    ({"seq_buckets": 64}, "seq_buckets must be a sequence of integers"),
    ({"batch_buckets": (2.0,)}, "each of batch_buckets must be an integer"),
    ({"token_steps": 0}, "token_steps must be at least 1"),
    ({"variant_min_seq": -1}, "variant_min_seq must be at least 0"),
    ({"pack_below_fill": -0.1}, "pack_below_fill must be a fraction"),
    ({"pack_below_fill": float("nan")}, "pack_below_fill must be a fraction"),
    ({"cuda_graph": "no"}, "cuda_graph must be True or False"),
    ({"validate": 0}, "validate must be True or False"),
    ({"provider_options": ["x"]}, "provider_options must be a mapping"),
    ({"right_padded": "left"}, "right_padded must be 'auto'"),
    ({"device": "tpu"}, "device must be 'cuda' or 'cpu'"),
]


@pytest.mark.parametrize("kw,message", BAD_SESSION_ARGS, ids=[str(k) for k, _ in BAD_SESSION_ARGS])
def test_bad_session_arguments_are_refused(kw, message, tiny_onnx, monkeypatch):
    def no_session(*args, **kwargs):
        raise AssertionError("an ORT session was made for bad arguments")

    monkeypatch.setattr(ort, "InferenceSession", no_session)  # refused before any work
    with pytest.raises(ConfigError, match=message) as info:
        new_session(tiny_onnx["fp32"], **kw)
    assert isinstance(info.value, BertfuseError) and isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_bad_model_argument_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no model file at"):
        Session(str(tmp_path / "missing.onnx"), device="cpu")
    with pytest.raises(ConfigError, match="model must be a path or an onnx.ModelProto"):
        Session(42, device="cpu")


def test_good_session_arguments_still_accepted(tiny_onnx):
    s = Session(onnx.load(tiny_onnx["fp32"]), max_batch=np.int64(2), seq_buckets=[16],
                batch_buckets=(1, 2, 64), device="cpu", pack_below_fill=1.01)
    assert (s.max_batch, s.max_seq) == (2, POSITIONS)  # max_seq: the position table
    assert s.batch_buckets == [1, 2] and s.seq_buckets == [16, POSITIONS]
    assert Session(tiny_onnx["raw"], max_batch=1, device="cpu").max_seq == POSITIONS


BAD_WARMUPS = [([(0, 0)], r"warmup batch must be 1\.\.8 \(max_batch\), not 0"),
               ([(2, 0)], r"warmup seq must be 1\.\.128 \(max_seq\), not 0"),
               ([(MAX_BATCH + 1, 4)], r"warmup batch must be 1\.\.8"),
               ([(1, MAX_SEQ + 1)], r"warmup seq must be 1\.\.128"),
               ([(1.5, 4)], "warmup batch must be an integer"),
               ([(1, 2, 3)], r"must be a \(batch, seq\) pair"),
               ([4], r"must be a \(batch, seq\) pair"),
               ((2, 16), r"must be a \(batch, seq\) pair"),
               ("all", "must be a list of"), (8, "must be a list of")]


@pytest.mark.parametrize("buckets,message", BAD_WARMUPS, ids=[repr(b) for b, _ in BAD_WARMUPS])
def test_bad_warmup_arguments_are_refused(buckets, message, tiny_onnx):
    s = new_session(tiny_onnx["fp32"])
    with pytest.raises(ConfigError, match=message):
        s.warmup(buckets)
    with pytest.raises(ConfigError, match="packed must be True or False"):
        s.warmup([(1, 1)], packed="yes")
    assert not s._buckets  # nothing was made


def test_warmup_makes_the_buckets_that_serve_the_shapes(tiny_onnx):
    s = new_session(tiny_onnx["fp32"])
    s.warmup([(3, 10), (4, 16), (1, 100)])
    assert set(s._buckets) == {(4, 16), (1, 128)}
    s.run(**make_request(np.random.default_rng(34), 3, 9))
    assert set(s._buckets) == {(4, 16), (1, 128)}  # served by the warm bucket
    s.warmup([])
    assert len(s._buckets) == 2  # an empty list warms nothing more


# ---------------------------------------------------------------------------------- closing


def test_close_releases_and_later_calls_are_refused(tiny_onnx, references):
    s = new_session(tiny_onnx["fp32"])
    feeds = make_request(np.random.default_rng(35), 2, 5)
    kept = s.run(**feeds)
    alive = [weakref.ref(x) for x in s.sessions.values()]
    bucket = s._buckets[s.bucket_for(2, 5)]
    alive += [weakref.ref(bucket.host), weakref.ref(bucket.packed)]
    alive += [weakref.ref(v) for v in bucket.outputs.values()]
    del bucket
    s.close()
    s.close()  # idempotent
    gc.collect()
    assert [r() for r in alive] == [None] * len(alive)  # sessions, staging, device buffers
    for call in (lambda: s.run(**feeds), lambda: s.warmup(), lambda: s.warmup([(1, 1)]),
                 lambda: s.replay_call(feeds["input_mask"])):
        with pytest.raises(ClosedError, match="this Session is closed"):
            call()
    assert issubclass(ClosedError, BertfuseError)
    assert GATE._running == 0 and not GATE._capturing
    # Results already returned stay the caller's.
    want = plain_run(references["fp32"], feeds)
    np.testing.assert_allclose(kept["pooled_output"], want["pooled_output"], atol=1e-5)


def test_session_as_context_manager(tiny_onnx):
    feeds = make_request(np.random.default_rng(36), 2, 5)
    with new_session(tiny_onnx["fp32"]) as s:
        assert set(s.run(**feeds)) == set(OUTPUTS)
    with pytest.raises(ClosedError):
        s.run(**feeds)
    with pytest.raises(RuntimeError, match="inside"):
        with new_session(tiny_onnx["fp32"]) as s:
            raise RuntimeError("inside")  # the with's own error is not swallowed
    assert s._closed


def test_close_waits_for_a_running_request(tiny_onnx):
    """close() from another thread while a request runs: the request finishes, then the
    session closes; a request queued behind it is refused, not run on freed buffers."""
    s = new_session(tiny_onnx["fp32"])
    feeds = make_request(np.random.default_rng(37), 2, 5)
    s.run(**feeds)
    inside, release = threading.Event(), threading.Event()
    inner = s.sessions["raw"].run_with_iobinding

    class Slow:  # holds the session's lock inside ORT's run until released
        def run_with_iobinding(self, *args):
            inside.set()
            release.wait(30)
            return inner(*args)

    s.sessions = {**s.sessions, "raw": Slow()}
    results: list = []
    t = threading.Thread(target=lambda: results.append(s.run(**feeds)))
    t.start()
    assert inside.wait(30)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()  # waiting for the running request
    release.set()
    t.join(30)
    closer.join(30)
    assert set(results[0]) == set(OUTPUTS) and s._closed
    with pytest.raises(ClosedError):
        s.run(**feeds)


def test_pool_close_closes_its_replicas(tiny_onnx):
    feeds = make_request(np.random.default_rng(38), 2, 5)
    with SessionPool(lambda: new_session(tiny_onnx["fp32"]), replicas=2) as pool:
        assert set(pool.run(**feeds)) == set(OUTPUTS)
        replicas = list(pool.replicas)
    assert all(r._closed for r in replicas)
    with pytest.raises(ClosedError):
        replicas[0].run(**feeds)
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(**feeds)
    pool.close()  # idempotent


def test_pool_closes_a_replica_whose_prepare_failed(tiny_onnx):
    made: list[Session] = []

    def make() -> Session:
        made.append(new_session(tiny_onnx["fp32"]))
        return made[-1]

    with pytest.raises(ConfigError, match="warmup batch"):
        SessionPool(make, replicas=2, prepare=lambda s: s.warmup([(0, 1)]))
    assert len(made) == 2 and all(s._closed for s in made)


def test_packed_session_arguments_are_checked_before_cuda(ckpt_erf, convert_cached):
    """PackedSession runs on CUDA only, but its arguments are refused on any machine,
    before a session is made."""
    from bertfuse.runtime.packed import PackedSession

    conv = convert_cached(ckpt_erf, "--packed")
    assert conv.exit_code == 0, conv.report
    for kw, message in (({"max_batch": 0}, "max_batch must be at least 1"),
                        ({"max_seq": POSITIONS + 1}, "position table has 128 rows"),
                        ({"token_steps": 0}, "token_steps must be at least 1"),
                        ({"pinned": None}, "pinned must be True or False")):
        with pytest.raises(ConfigError, match=message):
            PackedSession(conv.onnx_path, **kw)
