"""runtime/device.py: the capture gate, thread claims, host staging.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from support.runtime_common import _raises, make_request, new_session  # noqa: E402


def test_a_graph_session_serves_one_thread(models):
    """With CUDA graphs (ORT keeps them per thread) a second thread is refused, clearly."""
    from bertfuse.runtime.device import ThreadError

    s = new_session(models["fp32"])
    s.cuda_graph = True  # the CPU EP has no graphs: only the thread check is under test
    feeds = make_request(np.random.default_rng(4), 2, 5)
    s.run(**feeds)
    errors: list = []
    t = threading.Thread(target=lambda: errors.append(_raises(lambda: s.run(**feeds))))
    t.start()
    t.join(30)
    assert isinstance(errors[0], ThreadError) and "SessionPool" in str(errors[0])
    s.run(**feeds)  # the owner thread still runs


def test_capture_gate_waits_for_running_requests_and_blocks_new_ones():
    from bertfuse.runtime.device import CaptureGate

    gate = CaptureGate()
    a_inside, a_release, log = threading.Event(), threading.Event(), []

    def holder() -> None:
        with gate.running():
            a_inside.set()
            a_release.wait(10)
            log.append("a done")

    def capturer() -> None:
        with gate.running():
            with gate.capturing():
                log.append("capture start")
                c.start()  # a new request must wait for the capture to end
                threading.Event().wait(0.1)
                log.append("capture end")

    def newcomer() -> None:
        with gate.running():
            log.append("c ran")

    a, b, c = (threading.Thread(target=f) for f in (holder, capturer, newcomer))
    a.start()
    assert a_inside.wait(10)
    b.start()
    threading.Event().wait(0.1)
    assert log == []  # the capture waits for the running request
    a_release.set()
    for t in (a, b):
        t.join(10)
    c.join(10)
    assert log == ["a done", "capture start", "capture end", "c ran"]


def test_capture_gate_two_capturers_inside_requests_do_not_deadlock():
    from bertfuse.runtime.device import CaptureGate

    gate = CaptureGate()
    barrier, done = threading.Barrier(2), []

    def both() -> None:
        with gate.running():
            barrier.wait(10)  # both are running before either captures
            with gate.capturing():
                assert gate._running == 0
                done.append(1)

    threads = [threading.Thread(target=both) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert done == [1, 1] and gate._running == 0 and not gate._capturing


def test_capture_gate_nests():
    """Nested runs count once; a capture inside a capture, or a run inside a capture (a
    bucket verifying itself), passes through instead of waiting on its own thread."""
    from bertfuse.runtime.device import CaptureGate

    gate = CaptureGate()
    with gate.running():
        with gate.running():
            assert gate._running == 1
            with gate.capturing():
                assert gate._running == 0 and gate._capturing
                with gate.capturing(), gate.running():
                    assert gate._running == 0
            assert gate._running == 1 and not gate._capturing
    assert gate._running == 0


def test_capture_gate_counts_each_thread_and_survives_errors():
    """running() is one shared object: the nesting is per thread, two threads inside count two,
    and an exception inside still counts its thread out."""
    from bertfuse.runtime.device import CaptureGate

    gate = CaptureGate()
    inside, release = threading.Barrier(2), threading.Event()

    def hold() -> None:
        with gate.running():
            inside.wait(10)
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    with gate.running():
        inside.wait(10)
        assert gate._running == 2
        release.set()
    t.join(10)
    assert gate._running == 0
    with pytest.raises(KeyError):
        with gate.running(), gate.running():
            raise KeyError("boom")
    assert gate._running == 0 and gate.state().depth == 0


def test_address_is_the_arrays_first_byte():
    from bertfuse.runtime.pinned import address

    a = np.arange(24, dtype=np.int64).reshape(4, 6)
    frozen = np.arange(6, dtype=np.int32)
    frozen.flags.writeable = False
    for arr in (a, a[1:], np.ascontiguousarray(a.astype(np.int32)), frozen,
                np.frombuffer(b"\x01\x00\x00\x00" * 3, np.int32)):
        assert address(arr) == arr.ctypes.data


def test_staging_falls_back_to_numpy_without_cuda():
    from bertfuse.runtime.device import staging

    host = staging((3, 2, 4), pinned=False)
    assert host.shape == (3, 2, 4) and host.dtype == np.int32 and not host.any()
    pinned = staging((3, 2, 4), pinned=True)  # page-locked where libcudart exists
    assert pinned.shape == (3, 2, 4) and not pinned.any()
