"""The padded session (runtime/padded.py) on the CPU EP with buckets asked for: parity with
plain ORT, outputs, warm-up, threads, the all-masked row, closing; and the CPU defaults
(each request at its own shape).
"""

from __future__ import annotations

import gc
import itertools
import threading
import weakref

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.errors import BertfuseError  # noqa: E402
from bertfuse.runtime.device import GATE  # noqa: E402
from bertfuse.runtime.request_checks import ClosedError, RequestError  # noqa: E402
from bertfuse.runtime.session import Session  # noqa: E402
from support.runtime_common import (KINDS, MAX_BATCH, MAX_SEQ, OUTPUTS, ROW_TOL, TOL,  # noqa: E402
                            _assert_same, _run_threads, _thread_requests, _valid, make_request,
                            max_diff, new_session, plain_run, record_modes, row_diff,
                            with_empty_rows)


PARITY_SHAPES = [(1, 1), (MAX_BATCH, 1), (1, MAX_SEQ), (MAX_BATCH, MAX_SEQ), (3, 5), (5, 37),
                 (2, 64), (7, 3), (4, 8), (6, 100), (1, 17), (8, 2)]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_session_matches_plain_ort(precision, sessions, references):
    s, ref = sessions[precision], references[precision]
    assert list(s.sessions) == ["raw", "keylen", "nomask"]
    assert (s.max_batch, s.max_seq) == (MAX_BATCH, MAX_SEQ)
    rng = np.random.default_rng(10)
    buckets = set()
    for batch, seq in PARITY_SHAPES:
        # Batch 1: one request per padding kind, so the only row gets each of them.
        rotations = [KINDS[i:] + KINDS[:i] for i in range(len(KINDS))] if batch == 1 else [KINDS]
        for kinds in rotations:
            feeds = make_request(rng, batch, seq, kinds)
            got = s.run(**feeds)
            assert set(got) == set(OUTPUTS)
            assert got["sequence_output"].shape == (batch, seq, 128)
            assert got["pooled_output"].shape == (batch, 128)
            d = max_diff(got, plain_run(ref, feeds), feeds["input_mask"])
            assert d <= TOL[precision], f"{precision} [{batch}, {seq}] kinds {kinds}: {d:.3g}"
            buckets.add(s.bucket_for(batch, seq))
    assert len(buckets) >= 8, buckets  # the shapes really spread over the buckets
    assert {(1, 8), (8, 8), (1, 128), (8, 128)} <= buckets


def test_session_defaults_and_missing_inputs(sessions, references):
    """mask None = all ones; segment_ids None = zeros."""
    s, ref = sessions["fp32"], references["fp32"]
    rng = np.random.default_rng(11)
    feeds = make_request(rng, 3, 20)
    ones = np.ones_like(feeds["input_mask"])
    zeros = np.zeros_like(feeds["segment_ids"])
    got = s.run(feeds["input_ids"])
    want = plain_run(ref, {**feeds, "input_mask": ones, "segment_ids": zeros})
    assert max_diff(got, want, ones) <= TOL["fp32"]
    # int64 and Python lists are accepted too.
    got = s.run(feeds["input_ids"].astype(np.int64).tolist(),
                feeds["input_mask"].astype(np.int64), feeds["segment_ids"].astype(np.uint8))
    assert max_diff(got, plain_run(ref, feeds), feeds["input_mask"]) <= TOL["fp32"]


def test_results_survive_the_next_request(sessions):
    s = sessions["fp32"]
    rng = np.random.default_rng(21)
    a, b = make_request(rng, 3, 12), make_request(rng, 4, 16)  # same bucket (4, 16)
    assert s.bucket_for(3, 12) == s.bucket_for(4, 16)
    got_a = s.run(**a)
    kept = {k: v.copy() for k, v in got_a.items()}
    s.run(**b)
    for k in OUTPUTS:  # a returned array must not change under the caller
        np.testing.assert_array_equal(got_a[k], kept[k])


def test_to_host_false_gives_bucket_sized_device_values(sessions, references):
    s, ref = sessions["fp32"], references["fp32"]
    b = make_request(np.random.default_rng(22), 3, 12)
    dev = s.run(**b, to_host=False)
    assert (dev["batch"], dev["seq"]) == (3, 12)
    full = {k: dev[k].numpy() for k in OUTPUTS}
    assert full["sequence_output"].shape == (4, 16, 128) and full["pooled_output"].shape == (4, 128)
    got = {"sequence_output": full["sequence_output"][:3, :12].copy(),
           "pooled_output": full["pooled_output"][:3].copy()}
    assert max_diff(got, plain_run(ref, b), b["input_mask"]) <= TOL["fp32"]


def test_outputs_selects_what_is_returned(sessions, references):
    s, ref = sessions["fp32"], references["fp32"]
    b = make_request(np.random.default_rng(23), 3, 12)
    want = plain_run(ref, b)
    only = s.run(**b, outputs=["pooled_output"])
    assert list(only) == ["pooled_output"] and only["pooled_output"].shape == (3, 128)
    np.testing.assert_allclose(only["pooled_output"], want["pooled_output"], atol=TOL["fp32"])
    assert list(s.run(**b, outputs="sequence_output")) == ["sequence_output"]
    dev = s.run(**b, to_host=False, outputs=["pooled_output"])
    assert set(dev) == {"batch", "seq", "pooled_output"}
    for bad, message in ((["logits"], "no output 'logits'"), ([], "outputs is empty")):
        with pytest.raises(RequestError, match=message) as info:
            s.run(**b, outputs=bad)
        assert "pooled_output" in str(info.value)  # the message lists what there is


def test_replay_call_runs_what_run_would(models):
    """The benchmarks' bare replay: the same variant session and bucket run() uses."""
    s = new_session(models["fp32"], right_padded="keylen")
    log = record_modes(s)
    for kinds in (("right",), ("hole",)):
        b = make_request(np.random.default_rng(24), 3, 12, kinds)
        s.run(**b)
        s.replay_call(b["input_mask"])()
        assert log[-1] == log[-2], log


def test_session_rejects_bad_construction(models):
    with pytest.raises(BertfuseError, match="device must be 'cuda' or 'cpu'"):
        Session(models["fp32"], device="tpu")
    model = onnx.load(models["fp32"])
    model.graph.input[0].name = "ids"
    with pytest.raises(BertfuseError, match=r"model inputs \['ids'\]"):
        Session(model, device="cpu")


def test_threads_match_sequential(sessions):
    """4 threads x 50 mixed-shape requests sharing buckets, results read after all ran."""
    s = sessions["fp32"]
    reqs = _thread_requests(16)
    want = [{n: v.copy() for n, v in s.run(**f).items()} for f in reqs]
    _assert_same(_run_threads(s, reqs, copy_results=False), want)


def test_threads_match_sequential_own_buckets(sessions):
    """The same with each thread in its own batch bucket and copying what it gets at once,
    which the view bug above cannot disturb: the lock, the bucket table and the variant
    sessions under concurrent callers."""
    s = sessions["fp32"]
    ranges = [(1, 1), (2, 2), (3, 4), (5, 8)]
    assert len({s.bucket_for(hi, 1)[0] for _, hi in ranges}) == 4
    reqs = _thread_requests(17, ranges)
    want = [{n: v.copy() for n, v in s.run(**f).items()} for f in reqs]
    _assert_same(_run_threads(s, reqs, copy_results=True), want)


def test_warmup_creates_every_bucket_and_nothing_after(models):
    s = Session(models["fp32"], max_batch=MAX_BATCH, max_seq=64, device="cpu",
                pad_to_buckets=True)
    assert s.batch_buckets == [1, 2, 4, 8] and s.seq_buckets == [32, 64]
    assert s.cuda_graph is False
    assert not s._buckets
    s.run(**_valid(3, 10))
    assert set(s._buckets) == {(4, 32)}  # lazily: only the request's bucket
    s.warmup()
    every = set(itertools.product(s.batch_buckets, s.seq_buckets))
    assert set(s._buckets) == every
    before = {k: (id(b), b.packed.data_ptr(), {n: v.data_ptr() for n, v in b.outputs.items()})
              for k, b in s._buckets.items()}
    rng = np.random.default_rng(17)
    shapes = [(1, 1), (MAX_BATCH, 64), (3, 33), (8, 1), (1, 64), (5, 32), (2, 63)]
    shapes += [(int(rng.integers(1, 9)), int(rng.integers(1, 65))) for _ in range(20)]
    for i, (batch, seq) in enumerate(shapes):
        feeds = make_request(rng, batch, seq, (KINDS, ("full",), ("right",))[i % 3])
        s.run(**feeds)
        assert len(s._buckets) == len(every), (batch, seq)
    after = {k: (id(b), b.packed.data_ptr(), {n: v.data_ptr() for n, v in b.outputs.items()})
             for k, b in s._buckets.items()}
    assert after == before  # the same buffers: nothing reallocated after warm-up


def test_warmup_of_given_buckets(models):
    s = new_session(models["fp32"])
    s.warmup([(2, 16), (8, 128)])
    assert set(s._buckets) == {(2, 16), (8, 128)}
    s.run(**_valid(2, 9))  # (2, 16)
    assert len(s._buckets) == 2


def test_warmup_makes_the_buckets_that_serve_the_shapes(tiny_onnx):
    s = new_session(tiny_onnx["fp32"])
    s.warmup([(3, 10), (4, 16), (1, 100)])
    assert set(s._buckets) == {(4, 16), (1, 128)}
    s.run(**make_request(np.random.default_rng(34), 3, 9))
    assert set(s._buckets) == {(4, 16), (1, 128)}  # served by the warm bucket
    s.warmup([])
    assert len(s._buckets) == 2  # an empty list warms nothing more


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


def test_cpu_defaults_run_each_request_at_its_own_shape(cpu, reference):
    assert list(cpu.sessions) == ["raw"] and not cpu.pad  # no variant sessions to build
    rng = np.random.default_rng(40)
    for batch, seq in ((4, 40), (1, 1), (8, 128), (3, 17)):
        feeds = make_request(rng, batch, seq)
        got = cpu.run(**feeds)
        assert got["sequence_output"].shape == (batch, seq, 128)
        assert cpu.bucket_for(batch, seq) == (batch, seq)
        # The same ORT session on the same shape as plain ORT: no padding changes the sums.
        assert max_diff(got, plain_run(reference, feeds), feeds["input_mask"]) <= 1e-6
    assert not cpu._buckets
    only = cpu.run(**make_request(rng, 2, 9), outputs="pooled_output")
    assert list(only) == ["pooled_output"]


def test_cpu_defaults_fill_missing_inputs_and_keep_device_outputs(cpu, reference):
    feeds = make_request(np.random.default_rng(41), 3, 11)
    ones = np.ones_like(feeds["input_mask"])
    want = plain_run(reference, {**feeds, "input_mask": ones,
                                 "segment_ids": np.zeros_like(ones)})
    assert max_diff(cpu.run(feeds["input_ids"].tolist()), want, ones) <= 1e-6
    dev = cpu.run(**feeds, to_host=False)
    assert (dev["batch"], dev["seq"]) == (3, 11)
    assert dev["sequence_output"].shape() == [3, 11, 128]
    got = {n: dev[n].numpy() for n in OUTPUTS}
    assert max_diff(got, plain_run(reference, feeds), feeds["input_mask"]) <= 1e-6
    cpu.replay_call(feeds["input_mask"])()  # the benchmarks' bare call runs here too
