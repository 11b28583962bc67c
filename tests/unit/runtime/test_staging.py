"""The native fast lane (runtime/staging.py, kernels/csrc/stage.cc) against the checked path.

stage.cc is host-only C++, so CI compiles it alone with the system's C++ compiler and holds it
to what the Python path does: the same staged buffer, the same mask form, every bad value sent
back to the checked path (which then raises its own error), and the same outputs end to end
through a CPU session with buckets.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from bertfuse.runtime import RequestError
from bertfuse.runtime.graphs import GraphError
from bertfuse.runtime.request_checks import upper_bound
from bertfuse.runtime.staging import FORMS, FastStager, stage_function
from bertfuse.runtime.variants import mask_mode
from support.paths import ROOT
from support.runtime_common import OUTPUTS, TYPE_VOCAB, VOCAB, make_request, new_session

STAGE_CC = ROOT / "bertfuse" / "kernels" / "csrc" / "stage.cc"


@pytest.fixture(scope="module")
def stage_fn(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build csrc/stage.cc with")
    so = tmp_path_factory.mktemp("stage") / "libstage.so"
    subprocess.run([cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-o",
                    str(so), str(STAGE_CC)], check=True, capture_output=True, timeout=120)
    fn = stage_function(str(so))
    assert fn is not None
    return fn


@pytest.fixture(scope="module")
def pair(tiny_onnx, stage_fn):
    """Two CPU sessions with buckets and mask variants: one with the fast lane, one without."""
    fast, slow = new_session(tiny_onnx["fp16"]), new_session(tiny_onnx["fp16"])
    assert fast._stager is None  # CPU: not made by default
    fast._stager = FastStager(stage_fn, fast.facts.inputs,
                              [upper_bound(fast.facts, n) for n in fast.facts.inputs])
    yield fast, slow
    fast.close()
    slow.close()


def _stage_both(session, stager, given):
    """(host buffer, form) from the checked path and from the fast lane, same bucket."""
    batch, seq = given["input_ids"].shape
    bucket = session.bucket(*session.bucket_for(batch, seq))
    checked = session.check(dict(given))
    bucket.fill(checked, batch, seq, session.validate)
    want = bucket.host.copy()
    mask = checked.get("input_mask")
    want_form = None if mask is None else mask_mode(mask)
    bucket.host.fill(-7)  # the fast lane must write every element
    lane = stager.lane(session, bucket)
    got = stager._fn(*_args(given), int(session.validate), ctypes.addressof(lane), 0)
    return want, want_form, bucket.host.copy(), got


def _args(given):
    ids, mask, seg = given["input_ids"], given.get("input_mask"), given.get("segment_ids")

    def ptr(a):
        return (a.ctypes.data, a.itemsize) if a is not None else (None, 0)

    return (*ptr(ids), *ptr(mask), *ptr(seg), *ids.shape)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (4, 16), (8, 64), (5, 100)])
def test_the_fast_lane_stages_what_the_checked_path_stages(pair, dtype, shape):
    fast, _ = pair
    rng = np.random.default_rng(shape[0] * 131 + shape[1])
    for trial in range(4):
        given = {k: v.astype(dtype) for k, v in make_request(rng, *shape).items()}
        if trial == 1:
            given["input_mask"][0] = 0  # an all-masked row: staged as ones by both
        if trial == 2:
            given["input_mask"] = None  # no mask: ones over the request, as the checked path
        if trial == 3:
            given["segment_ids"] = None
        want, want_form, got, form = _stage_both(fast, fast._stager, given)
        assert form >= 0
        np.testing.assert_array_equal(got, want)
        if want_form is not None:
            assert FORMS[form] == want_form


@pytest.mark.parametrize("rows", ["full", "right", "left", "hole"])
def test_the_mask_form_matches_mask_mode(pair, rows):
    fast, _ = pair
    rng = np.random.default_rng(7)
    given = make_request(rng, 4, 32, kinds=(rows,))
    want, want_form, got, form = _stage_both(fast, fast._stager, given)
    np.testing.assert_array_equal(got, want)
    assert FORMS[form] == want_form
    assert want_form == {"full": "nomask", "right": "keylen"}.get(rows, "raw")


@pytest.mark.parametrize("role,value", [("input_ids", VOCAB), ("input_ids", -1),
                                        ("segment_ids", TYPE_VOCAB), ("input_mask", 2),
                                        ("input_mask", -1), ("input_ids", 2**33)])
def test_a_bad_value_goes_back_to_the_checked_path(pair, role, value):
    fast, slow = pair
    given = {k: v.astype(np.int64) for k, v in make_request(np.random.default_rng(1), 2, 8).items()}
    given[role][1, 3] = value
    fast.run(**make_request(np.random.default_rng(2), 2, 8))  # the bucket is warm
    bucket = fast.bucket(*fast.bucket_for(2, 8))
    lane = fast._stager.lane(fast, bucket)
    assert fast._stager._fn(*_args(given), 1, ctypes.addressof(lane), 0) == -1
    with pytest.raises(RequestError) as fast_err:
        fast.run(**given)
    with pytest.raises(RequestError) as slow_err:
        slow.run(**given)
    assert str(fast_err.value) == str(slow_err.value)


def test_outputs_through_the_fast_lane_equal_the_checked_path(pair, monkeypatch):
    fast, slow = pair
    calls = []
    real = fast._stager.serve
    monkeypatch.setattr(fast._stager, "serve", lambda *a, **k: calls.append(r := real(*a, **k)) or r)
    rng = np.random.default_rng(5)
    for batch, seq in [(3, 20), (8, 64), (1, 5), (8, 64)]:
        req = make_request(rng, batch, seq)
        fast.run(**req)  # a cold bucket takes the checked path and warms it
        got, want = fast.run(**req), slow.run(**req)
        for name in OUTPUTS:
            np.testing.assert_array_equal(got[name], want[name])
    assert any(c is not None for c in calls), "no request took the fast lane"


def test_what_the_fast_lane_does_not_take_goes_the_checked_way(pair):
    fast, slow = pair
    req = make_request(np.random.default_rng(9), 2, 8)
    fast.run(**req)
    for odd in [{"input_ids": req["input_ids"].astype(np.int16)},  # another dtype
                {"input_ids": req["input_ids"].tolist()},  # a list
                {"input_ids": np.asfortranarray(req["input_ids"])},  # not C-contiguous
                {"input_ids": req["input_ids"].astype(">i4"),  # not the CPU's byte order
                 "input_mask": req["input_mask"].astype(">i8")},
                {"input_mask": req["input_mask"][:, :4]}]:  # shapes that disagree
        given = {**req, **odd}
        assert fast._stager.serve(fast, {k: given.get(k) for k in
                                         ("input_ids", "input_mask", "segment_ids")},
                                  list(OUTPUTS), True) is None
        try:
            want = slow.run(**given)
        except RequestError as exc:
            with pytest.raises(RequestError, match=re.escape(str(exc))):
                fast.run(**given)
        else:
            got = fast.run(**given)
            for name in OUTPUTS:
                np.testing.assert_array_equal(got[name], want[name])


def test_a_session_with_a_packed_model_keeps_its_routing(pair, monkeypatch):
    fast, _ = pair
    req = make_request(np.random.default_rng(4), 2, 8)
    fast.run(**req)
    given = {k: req.get(k) for k in ("input_ids", "input_mask", "segment_ids")}
    assert fast._stager.serve(fast, given, list(OUTPUTS), True) is not None
    monkeypatch.setattr(fast, "packed", object())  # session.Session decides what it packs
    assert fast._stager.serve(fast, given, list(OUTPUTS), True) is None


_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_SYNC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_COPY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                         ctypes.c_int, ctypes.c_void_p)


def _recording_lane(stager, session, bucket, launch_status=0, sync_status=0, copy_status=0):
    """The bucket's lane with a distinct graph handle per [fills the bucket][form] and launch,
    copy and sync functions that record their arguments (no GPU in CI: the CUDA calls
    themselves run in benchmarks/runtime/own_graph.py, which checks every bucket bit for
    bit); outputs 0 and 1 with mirrors at 0x5000 and 0x6000, output 2 without."""
    calls = []
    launch = _LAUNCH(lambda graph, stream: calls.append(("launch", graph, stream)) or launch_status)
    sync = _SYNC(lambda stream: calls.append(("sync", stream)) or sync_status)
    copy = _COPY(lambda dst, src, n, kind, stream: calls.append(("copy", dst, src, n, kind, stream))
                 or copy_status)
    lane = stager.lane(session, bucket)
    for i in range(6):
        lane.graphs[i] = 0x1000 + i
    lane.launch = ctypes.cast(launch, ctypes.c_void_p).value
    lane.sync = ctypes.cast(sync, ctypes.c_void_p).value
    lane.copy = ctypes.cast(copy, ctypes.c_void_p).value
    lane.stream = 0x77
    outs = [(0x5000, 0x8000, 96), (0x6000, 0x9000, 40), (None, 0xa000, 8)]
    for i, (host, dev, row) in enumerate(outs):
        lane.out_host[i], lane.out_dev[i], lane.out_row_bytes[i] = host, dev, row
    return lane, calls, (launch, sync, copy)  # the callbacks must outlive the calls


@pytest.mark.parametrize("batch,seq,rows", [(8, 64, "full"), (8, 64, "right"), (8, 64, "hole"),
                                            (3, 20, "full"), (3, 20, "right"), (3, 20, "hole")])
def test_the_native_launch_picks_the_graph_of_the_form_and_shape(pair, batch, seq, rows):
    fast, _ = pair
    fast.run(**make_request(np.random.default_rng(2), batch, seq))  # the bucket is warm
    bucket = fast.bucket(*fast.bucket_for(batch, seq))
    given = make_request(np.random.default_rng(3), batch, seq, kinds=(rows,))
    lane, calls, _keep = _recording_lane(fast._stager, fast, bucket)
    got = fast._stager._fn(*_args(given), 1, ctypes.addressof(lane), 0)
    form = mask_mode(given["input_mask"])
    full = (batch, seq) == (bucket.batch, bucket.seq)
    assert got == 8 + FORMS.index(form)
    launch = ("launch", 0x1000 + 3 * full + FORMS.index(form), 0x77)
    assert calls == [launch, ("sync", 0x77)]
    calls.clear()  # outputs 1 and 2 asked for: 1 copied (its batch rows), 2 has no mirror
    assert fast._stager._fn(*_args(given), 1, ctypes.addressof(lane), 0b110) == got
    assert calls == [launch, ("copy", 0x6000, 0x9000, batch * 40, 2, 0x77), ("sync", 0x77)]
    lane.graphs[3 * full + FORMS.index(form)] = None  # no graph for it: staged, not launched
    calls.clear()
    assert fast._stager._fn(*_args(given), 1, ctypes.addressof(lane), 0b11) == FORMS.index(form)
    assert calls == []


@pytest.mark.parametrize("statuses,what,order", [
    ((700, 0, 0), "cudaGraphLaunch: CUDA error 700", ["launch", "sync"]),
    ((0, 719, 0), "cudaStreamSynchronize after the graph: CUDA error 719",
     ["launch", "copy", "copy", "sync"]),
    ((0, 0, 1), "cudaMemcpyAsync of an output: CUDA error 1", ["launch", "copy", "sync"])])
def test_a_failed_native_launch_raises_the_cuda_error(pair, monkeypatch, statuses, what, order):
    fast, _ = pair
    req = make_request(np.random.default_rng(4), 4, 16)
    fast.run(**req)
    bucket = fast.bucket(*fast.bucket_for(4, 16))
    lane, calls, _keep = _recording_lane(fast._stager, fast, bucket, *statuses)
    bucket.lane = (lane, ctypes.addressof(lane))
    # Outputs 0 and 1 asked for with mirrors (a CPU session has none of its own to make).
    monkeypatch.setattr(fast._stager, "mirrors", lambda *a: 0b11)
    try:
        with pytest.raises(GraphError, match=re.escape(what)):
            fast.run(**req)
        assert [c[0] for c in calls] == order  # the wait comes even after a failed call
    finally:
        bucket.lane = None  # the CPU session's own lane again (no graphs)
    np.testing.assert_array_equal(fast.run(**req)["pooled_output"],
                                  fast._serve(fast.check(dict(req)), ["pooled_output"], True)
                                  ["pooled_output"])


@pytest.mark.parametrize("outputs,short", [(None, None), (["pooled_output"], None),
                                           (None, "sequence_output")])
def test_outputs_come_back_through_the_mirrors(pair, outputs, short):
    """The native call's path end to end on the CPU: its launch runs the bucket's variant
    through ORT (as the graph would, the input copy first), its copies move the asked-for
    outputs' batch rows into host mirrors, and run() returns them as the checked path does.
    `short`: that output's mirror holds fewer rows than the request (a large output's mirror
    is capped at MIRROR_BYTES): it is fetched after the call instead."""
    from bertfuse.runtime.device import replay, upload

    fast, slow = pair
    req = make_request(np.random.default_rng(8), 3, 20)
    fast.run(**req)
    bucket = fast.bucket(*fast.bucket_for(3, 20))
    lane, calls, _keep = _recording_lane(fast._stager, fast, bucket)
    modes = {}
    for full, shape in enumerate([(0, 0), (bucket.batch, bucket.seq)]):
        for f, form in enumerate(FORMS):
            modes[0x1000 + 3 * full + f] = fast.session_for(bucket.host, bucket, *shape, form)

    def run_graph(graph, stream):
        mode = modes[graph]
        upload(bucket.packed, bucket.host, None)
        replay(fast.sessions[mode], bucket.bindings[mode], bucket.run_options[mode])
        calls.append(("launch", mode))
        return 0

    def copy(dst, src, n, kind, stream):
        ctypes.memmove(dst, src, n)
        calls.append(("copy", dst, n))
        return 0

    run_cb, copy_cb = _LAUNCH(run_graph), _COPY(copy)
    lane.launch = ctypes.cast(run_cb, ctypes.c_void_p).value
    lane.copy = ctypes.cast(copy_cb, ctypes.c_void_p).value
    for i, (name, value) in enumerate(bucket.outputs.items()):
        rows = 2 if name == short else value.shape()[0]
        bucket.mirrors[name] = np.full((rows, *value.shape()[1:]), np.nan, np.float32)
        lane.out_host[i] = bucket.mirrors[name].ctypes.data
        lane.out_dev[i] = value.data_ptr()
        lane.out_row_bytes[i] = int(np.prod(value.shape()[1:])) * 4
    bucket.lane = (lane, ctypes.addressof(lane))
    try:
        got, want = fast.run(**req, outputs=outputs), slow.run(**req, outputs=outputs)
    finally:
        bucket.lane, bucket.mirrors = None, {}
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    copied = [c for c in calls if c[0] == "copy"]
    names, mirrored = list(bucket.outputs), [n for n in want if n != short]
    assert [c[1] for c in copied] == [lane.out_host[names.index(n)] for n in mirrored]
    assert [c[2] for c in copied] == [3 * lane.out_row_bytes[names.index(n)] for n in mirrored]


def test_an_output_off_the_gpu_gets_no_mirror(pair):
    fast, _ = pair
    value = next(iter(fast.bucket(*fast.bucket_for(3, 20)).outputs.values()))
    assert value.device_name() == "cpu"
    assert len(FastStager._mirror(value, 64)) == 0  # fetched, never mirrored
