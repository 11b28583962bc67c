"""Several replicas of a serving session, so that requests from several threads run on the GPU
at the same time instead of queuing behind one session's lock.

    thread 1 ─► lease replica A (stream A, its buffers, its CUDA graphs) ─► run ─► give back
    thread 2 ─► lease replica B (stream B, ...)                          ─► run ─► give back

A small model at a small batch leaves most of the GPU idle: its GEMMs fill one wave of SMs
or less, and each kernel costs its launch latency whatever its size. Two requests in flight
on two streams overlap those latencies and the host work of one request with the GPU work
of the other. Each replica holds its own copy of the weights (ORT sessions do not share
device initializers), so device memory grows with the replica count.

CUDA graph capture (ONNX Runtime begins it with cudaDeviceSynchronize and captures in
cudaStreamCaptureModeGlobal) must not overlap work from other threads: every replica's
first use of a bucket passes through one `CaptureGate`, which waits until no other request
is running. `warmup()` captures up front so serving never has to.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, Iterator


class CaptureGate:
    """Requests run side by side; a capture runs alone. A capturing thread that is inside a
    request steps out of the running count while it waits (no deadlock when two requests
    want to capture at once: the second waits for the first's request to end)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._capturing = False
        self._mine = threading.local()  # is this thread inside running()?

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._capturing)
            self._running += 1
        self._mine.inside = True
        try:
            yield
        finally:
            self._mine.inside = False
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        inside = getattr(self._mine, "inside", False)
        with self._cond:
            self._running -= inside
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._running == 0 and not self._capturing)
            self._capturing = True
        try:
            yield
        finally:
            with self._cond:
                self._capturing = False
                self._running += inside
                self._cond.notify_all()


class SessionPool:
    """`SessionPool(lambda: Session(model, ...), replicas=2)`: `run()` from any thread, on the
    first free replica. Works with `Session` and `PackedSession` alike."""

    def __init__(self, make: Callable[[], Any], replicas: int = 2) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, not {replicas}")
        self.gate = CaptureGate()
        self.replicas = []
        for _ in range(replicas):
            session = make()
            set_gate(session, self.gate)
            self.replicas.append(session)
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for session in self.replicas:
            self._free.put(session)

    @contextlib.contextmanager
    def lease(self) -> Iterator[Any]:
        """A replica for this thread alone until the block ends: device outputs of
        run(..., to_host=False) stay valid inside the block."""
        session = self._free.get()
        try:
            with self.gate.running():
                yield session
        finally:
            self._free.put(session)

    def run(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """One request on a free replica; outputs are host arrays (use lease() to keep them
        on the device)."""
        if kwargs.get("to_host") is False:
            raise ValueError("device outputs outlive the replica's lease: use "
                             "`with pool.lease() as s: s.run(..., to_host=False)`")
        with self.lease() as session:
            return session.run(*args, **kwargs)

    def warmup(self, *args: Any, **kwargs: Any) -> None:
        """Each replica's warmup(), one after the other (captures never overlap)."""
        for session in self.replicas:
            session.warmup(*args, **kwargs)


def set_gate(session: Any, gate: CaptureGate | None) -> None:
    """Routes a session's (and its packed form's) captures through `gate`."""
    session.capture_gate = gate
    if getattr(session, "packed", None) is not None:
        session.packed.capture_gate = gate


def capture_guard(gate: CaptureGate | None) -> contextlib.AbstractContextManager:
    return gate.capturing() if gate is not None else contextlib.nullcontext()
