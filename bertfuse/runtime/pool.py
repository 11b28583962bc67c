"""Several replicas of a serving session, each owned by its own worker thread, so that requests
from any number of threads run on the GPU side by side instead of queuing on one lock.

    caller threads ─► submit(request) ─► shared queue ─┬─► worker 1: replica 1 (stream 1, its
                                                        │   buffers, its CUDA graphs) ─► future
                                                        └─► worker 2: replica 2 ...

A small model at a small batch leaves most of the GPU idle: its GEMMs fill one wave of SMs
or less, and each kernel costs its launch latency whatever its size. Two requests in flight
on two streams overlap those latencies, and one request's host work with another's GPU work.

Why workers own the replicas: ONNX Runtime's CUDA EP keeps CUDA graphs per thread (they live
in its per-thread context), and its docs rule out Run() on one session from several threads
with CUDA graphs. A replica that only ever runs on its worker thread captures each graph
once and replays it from then on. Capture (cudaDeviceSynchronize, then a global-mode stream
capture) must not overlap work from other threads either: captures pass the `CaptureGate`
(device.py), which waits until no other request runs. Each replica holds its own copy of the weights
(ORT sessions do not share device initializers), so device memory grows with replicas.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from bertfuse.checks import check_int
from bertfuse.errors import BertfuseError
from bertfuse.runtime.device import GATE
from bertfuse.runtime.request_checks import ConfigError


class NestedCallError(BertfuseError, RuntimeError):
    """A pool job submitting to a pool: it could wait forever (see SessionPool.submit)."""


_WORKERS: set[int] = set()  # thread ids of every pool's workers: submit() refuses them


class SessionPool:
    """`SessionPool(lambda: Session(model, ...), replicas=2, prepare=lambda s: s.warmup(...))`.

    `make` builds a replica and `prepare` (optional) warms it, both on the replica's worker
    thread, where its graphs must be captured. `run()` from any thread; works with
    `Session` and `PackedSession` alike."""

    def __init__(self, make: Callable[[], Any], replicas: int = 2,
                 prepare: Callable[[Any], None] | None = None) -> None:
        check_int("replicas", replicas, 1, error=ConfigError)
        self.replicas: list[Any] = [None] * replicas
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        started: list[Future] = [Future() for _ in range(replicas)]
        self._workers = [threading.Thread(target=self._serve, args=(i, make, prepare, started[i]),
                                          name=f"bertfuse-replica-{i}", daemon=True)
                         for i in range(replicas)]
        for worker in self._workers:
            worker.start()
        errors = [f.exception() for f in started]
        if any(errors):
            self.close()
            raise next(e for e in errors if e)

    def _serve(self, index: int, make: Callable[[], Any], prepare: Callable[[Any], None] | None,
               started: Future) -> None:
        _WORKERS.add(threading.get_ident())
        try:
            self._replica(index, make, prepare, started)
        finally:
            _WORKERS.discard(threading.get_ident())

    def _replica(self, index: int, make: Callable[[], Any],
                 prepare: Callable[[Any], None] | None, started: Future) -> None:
        session = None
        try:
            with GATE.capturing():  # building and warming a replica: ORT allocates, captures
                session = make()
                if prepare is not None:
                    prepare(session)
            self.replicas[index] = session
        except BaseException as exc:  # reported by the constructor
            started.set_exception(exc)
            if session is not None and hasattr(session, "close"):  # prepare() failed
                session.close()
            return
        started.set_result(None)
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                with GATE.running():  # fn may read device outputs after run() returns
                    result = fn(session)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
        close = getattr(session, "close", None)
        if close is not None:  # on the thread that built it, which owns its CUDA graphs
            close()

    def submit(self, fn: Callable[[Any], Any]) -> Future:
        """fn(replica) on the first free replica's thread. Device outputs of
        run(..., to_host=False) are valid inside fn only: the replica takes the next job next."""
        if self._closed:
            raise RuntimeError("this SessionPool is closed")
        if threading.get_ident() in _WORKERS:
            # Its own pool: with every replica busy (one replica: always) the job waits for
            # itself. Another pool: the job waits inside the gate's running count, and a
            # capture there waits for that count to drop.
            raise NestedCallError("a SessionPool job called a SessionPool; use the replica "
                                  "it is given (fn(replica)) instead")
        future: Future = Future()
        self._jobs.put((fn, future))
        return future

    def call(self, fn: Callable[[Any], Any]) -> Any:
        return self.submit(fn).result()

    def run(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """One request on a free replica; outputs are host arrays."""
        if kwargs.get("to_host") is False:
            raise ValueError("device outputs outlive the replica's turn: use "
                             "pool.call(lambda s: use(s.run(..., to_host=False)))")
        return self.call(lambda session: session.run(*args, **kwargs))

    @property
    def closed(self) -> bool:
        """True once close() has run (or the constructor failed): submit() refuses jobs."""
        return self._closed

    def close(self) -> None:
        """Stops the workers once the queued jobs are done, and closes the replicas (each on
        its own worker thread; from a pool job, its own replica closes after that job)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._workers:
            self._jobs.put(None)
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join()

    def __enter__(self) -> "SessionPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
