"""Where the runtime meets the device: ORT's providers and run options, ORT sessions with the
CUDA-graph fallback, host staging, uploads and fetches, the capture gate and thread claims.

Nothing here knows about buckets, mask variants or packing; padded.py and packed.py build
on it. pinned.py below it talks to libcudart directly.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Mapping, Protocol

import numpy as np

from bertfuse.errors import BertfuseError, install_hint
from bertfuse.io.ort import make_session
from bertfuse.runtime import graphs
from bertfuse.runtime.pinned import copy_to_device_async, copy_to_host, pinned_empty
from bertfuse.io.inputs import shape_probe
from bertfuse.kernels.model_ops import uses_library
from bertfuse.optional import optional


class ThreadError(BertfuseError, RuntimeError):
    """A session with CUDA graphs called from a second thread."""


class CaptureGate:
    """Requests run side by side; a capture (or a session's construction) runs alone.

    running(): an ORT call that may replay a graph or copy memory. Nested calls in one thread
    count once, and a thread that holds the capture passes straight through.
    capturing(): waits until no other thread is running, keeps new runs out until it ends,
    and is re-entrant. A thread inside running() steps out of the count while it waits, so
    two requests that both want to capture do not deadlock: the second waits for the first's
    request to end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the condition's: taken directly on the request path
        self._cond = threading.Condition(self._lock)
        self._running = 0  # threads inside running(), outermost call only
        self._capturing = False
        self._waiting = 0  # captures waiting for the running count to fall to zero
        self._mine = threading.local()  # .state: this thread's _ThreadState

    def state(self) -> "_ThreadState":
        """The calling thread's nesting and capture state (one thread-local lookup)."""
        try:
            return self._mine.state
        except AttributeError:
            st = self._mine.state = _ThreadState()
            return st

    def running(self) -> CaptureGate:
        """A context manager: the gate itself (one object, no generator: it is on every
        request's path). It counts the calling thread in (outermost call only) once no
        capture is on, and out again; wakes waiting captures only when there are any."""
        return self

    def __enter__(self) -> None:
        st = self.state()
        if st.depth == 0:
            if st.holds:
                st.counted = False
            else:
                with self._lock:
                    while self._capturing:
                        self._cond.wait()
                    self._running += 1
                st.counted = True
        st.depth += 1

    def __exit__(self, *exc: object) -> None:
        st = self._mine.state
        st.depth -= 1
        if st.depth == 0 and st.counted:
            with self._lock:
                self._running -= 1
                if self._waiting:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        st = self.state()
        if st.holds:
            yield
            return
        inside = int(st.depth > 0)
        with self._cond:
            self._running -= inside
            self._cond.notify_all()
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: self._running == 0 and not self._capturing)
            finally:
                self._waiting -= 1
            self._capturing = True
        st.holds = True
        try:
            yield
        finally:
            st.holds = False
            with self._cond:
                self._capturing = False
                self._running += inside
                self._cond.notify_all()


class _ThreadState:
    """One thread's part in the gate: running() nesting, whether its outermost running() was
    counted, and whether it holds the capture. A slotted object behind one thread-local
    attribute: the request path reads it twice, where several thread-local attributes cost
    about 0.9 us more a request (timeit, 2-core AMD EPYC)."""

    __slots__ = ("depth", "counted", "holds")

    def __init__(self) -> None:
        self.depth, self.counted, self.holds = 0, False, False


# One gate for the process: a global-mode stream capture fails work from every thread, so
# every bertfuse session (pooled or not) runs through it.
GATE = CaptureGate()


class GraphSession(Protocol):
    """What a thread claim reads of its session (padded.py, packed.py)."""

    cuda_graph: bool


class ThreadClaim:
    """The thread a session's CUDA graphs belong to. ONNX Runtime's CUDA EP keeps CUDA graphs
    per thread and rules out Run() from several threads with graphs on: a second thread would
    capture every graph again, and its capture can break another thread's run. So a session
    with graphs serves the first thread that runs or warms it; SessionPool serves many
    threads with one replica per worker thread."""

    __slots__ = ("owner",)

    def __init__(self) -> None:
        self.owner: int | None = None

    def claim(self, session: GraphSession) -> None:
        """Takes the calling thread for `session`, or raises ThreadError if another has it."""
        if not session.cuda_graph:
            return
        me = threading.get_ident()
        if self.owner is None:
            self.owner = me
        elif self.owner != me:
            raise ThreadError(f"this {type(session).__name__} captured its CUDA graphs on "
                              "another thread, and ONNX Runtime keeps graphs per thread: call "
                              "it from that thread only, or serve several threads with "
                              "bertfuse.runtime.pool.SessionPool")


def cuda_options(ort: Any, cuda_graph: bool, stream: int | None,
                 provider_options: Mapping[str, str] | None) -> dict[str, str]:
    """The CUDA EP's options as bertfuse runs it: CUDA graphs on or off, and on our own
    stream when there is one (the request's copy is queued on it ahead of the replay)."""
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise BertfuseError(f"device='cuda' needs onnxruntime-gpu ({install_hint('gpu')}); "
                            f"this onnxruntime has {ort.get_available_providers()}")
    opts = {"enable_cuda_graph": "1" if cuda_graph else "0"}
    if stream is not None:
        opts["user_compute_stream"] = str(stream)
    return {**opts, **(provider_options or {})}


def probe_output_dims(sess: Any, facts: Any, run_options: Any) -> dict[str, tuple]:
    """Output shapes as ('B', 'S', 768)-style templates, from one tiny CPU-side run."""
    b, s = 2, 3
    binding = sess.io_binding()
    for name, value in shape_probe(facts.inputs, b, s).items():
        binding.bind_cpu_input(name, value)
    for name in facts.outputs:
        binding.bind_output(name, "cpu")
    sess.run_with_iobinding(binding, run_options)
    return {name: tuple("B" if i == 0 and d == b else "S" if i == 1 and d == s else d
                        for i, d in enumerate(value.shape))
            for name, value in zip(facts.outputs, binding.copy_outputs_to_cpu())}


def replay(sess: Any, binding: Any, run_options: Any) -> None:
    """sess.run_with_iobinding(binding, run_options) without the Python wrapper's per-call
    checks, which are for WebGPU graph capture: on a run with no gpu_graph_id (no CUDA
    graph, or the CPU) they raise and catch an error inside, 80 us a call in ORT 1.31-1.32.
    A session that is not ORT's own class, or has its call replaced, keeps its own call."""
    own = type(sess).__module__.startswith("onnxruntime.") \
        and "run_with_iobinding" not in getattr(sess, "__dict__", {})
    inner, bound = getattr(sess, "_sess", None), getattr(binding, "_iobinding", None)
    if not own or inner is None or bound is None:  # (an ORT without these internals too)
        sess.run_with_iobinding(binding, run_options)
    else:
        inner.run_with_iobinding(bound, run_options)


def run_options(ort: Any, cuda_graph: bool, graph_id: int):
    """RunOptions replaying (or capturing) CUDA graph `graph_id`; -1 runs uncaptured."""
    ro = ort.RunOptions()
    if cuda_graph:
        ro.add_run_config_entry("gpu_graph_id", str(graph_id))
    return ro


class SessionMaker:
    """Opens the ORT sessions of one bertfuse session, with CUDA graphs while they work.

    Capture needs every node on the GPU. When a session cannot be made with graphs (or a
    caller's capture fails: `graph_off`), the maker turns graphs off for good and says why
    in `fallback_reason`; later sessions are plain IO binding."""

    def __init__(self, ort: Any, device: str, cuda_graph: bool, stream: int | None,
                 provider_options: Mapping[str, str] | None, own_graphs: bool = False,
                 intra_op_threads: int | None = None) -> None:
        self.ort = ort
        self.intra_op_threads = intra_op_threads
        self.cuda_graph = cuda_graph and device == "cuda"
        self.cuda_options = cuda_options(ort, self.cuda_graph, stream, provider_options) \
            if device == "cuda" else None
        self.fallback_reason = ""
        self.device = device
        self.kernels = False  # a model opened so far has ai.bertfuse ops: the op library
        # The caller captures graphs itself (graphs.py) where it can: decided at the first open.
        self._own_asked = own_graphs and stream is not None
        self.own_graphs: bool | None = None

    def open(self, model: bytes | str):
        """An InferenceSession of `model` (serialized bytes or a path)."""
        if not self.kernels:  # asked once per maker, not again for every bucket's session

            self.kernels = uses_library(model)
        if self.own_graphs is None:  # one decision for all of this maker's sessions
            self.own_graphs = bool(self.cuda_graph and self._own_asked and self.kernels
                                   and graphs.wanted() and graphs.cuda() is not None)
            if self.own_graphs:
                self.cuda_options = {**(self.cuda_options or {}), "enable_cuda_graph": "0"}
        with GATE.capturing():  # ORT allocates weights on the device: not during a capture
            try:
                return self._session(model)
            except BertfuseError:  # the op library's (CUDA only, not built): no graph retry
                raise
            except Exception as exc:
                if not self.cuda_graph:
                    raise
                self.graph_off(exc)
                return self._session(model)

    def _session(self, model: bytes | str) -> Any:
        return make_session(model, device=self.device, cuda_options=self.cuda_options,
                            register_kernels=self.kernels, intra_op_threads=self.intra_op_threads)

    def graph_off(self, exc: BaseException) -> None:
        """Capture impossible: plain IO binding from here on."""
        self.cuda_graph = self.own_graphs = False
        self.fallback_reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        self.cuda_options = {**(self.cuda_options or {}), "enable_cuda_graph": "0"}

    def run_options(self, graph_id: int):
        return run_options(self.ort, self.cuda_graph and not self.own_graphs, graph_id)

    def capture_options(self):
        """RunOptions for the run an own graph records: ORT's end-of-run sync is not allowed
        inside a capture (the graph's launch syncs instead)."""
        ro = run_options(self.ort, False, -1)
        ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
        return ro


def staging(shape: tuple[int, ...], pinned: bool) -> np.ndarray:
    """A zeroed int32 host buffer for requests, page-locked when asked and possible."""
    host = pinned_empty(shape, np.int32) if pinned else None
    if host is None:
        return np.zeros(shape, np.int32)
    host.fill(0)
    return host


def upload(device: Any, host: np.ndarray, stream: int | None) -> None:
    """host -> device: queued on `stream` (ORT's end-of-run sync covers it), else a
    synchronous copy."""
    if stream is not None:
        copy_to_device_async(device.data_ptr(), host, stream)
    else:
        device.update_inplace(host)


def fetch(value: Any, batch: int, seq: int, has_seq: bool) -> np.ndarray:
    """A bucket output's rows [:batch] (and positions [:seq] when has_seq) as a new host
    array. On the GPU only those rows cross the bus; on the CPU EP a copy of the slice."""
    if value.device_name() == "cuda":
        shape = value.shape()
        host = np.empty([batch] + list(shape[1:]), np.float32)
        if not copy_to_host(host, value.data_ptr()):
            host = value.numpy()[:batch]
    else:
        host = value.numpy()[:batch].copy()  # a view of the bucket's buffer otherwise
    return host[:, :seq] if has_seq else host


def device_copy(packed: Any, index: int, src: Any, batch: int, seq: int,
                is_mask: bool) -> None:
    """packed[index, :batch, :seq] <- src (a DLPack device array), via CuPy."""
    cupy = optional("cupy", why="CuPy's pinned memory, where installed")

    shape = tuple(packed.shape())
    mem = cupy.cuda.UnownedMemory(packed.data_ptr(), int(np.prod(shape)) * 4, packed)
    view = cupy.ndarray(shape, cupy.int32, cupy.cuda.MemoryPointer(mem, 0))
    rows = view[index, :batch, :seq]
    rows[...] = cupy.from_dlpack(src).astype(cupy.int32, copy=False)
    if is_mask:  # all-masked rows unmasked, as unmask_empty_rows does for host masks
        rows += (~rows.any(axis=1, keepdims=True)).astype(cupy.int32)
    cupy.cuda.get_current_stream().synchronize()


def device_memory_used(device: str) -> int | None:
    """Bytes in use on the device (cudaMemGetInfo), or None off the GPU."""
    if device != "cuda":
        return None
    try:
        cupy = optional("cupy", why="CuPy's pinned memory, where installed")

        free, total = cupy.cuda.runtime.memGetInfo()
        return int(total - free)
    except Exception:
        return None
