"""CUDA graphs that bertfuse captures itself around one ONNX Runtime run, and launches without it.

    a warm bucket (ORT's arena grown, the op library's GEMM timing done by plain runs)
      -> cudaStreamBeginCapture(the session's own stream, thread-local mode)
      -> ORT run_with_iobinding, its end-of-run sync off: the kernels are recorded, none runs
      -> cudaStreamEndCapture -> cudaGraphInstantiate                      = OwnGraph
    request: OwnGraph.launch (cudaGraphLaunch, cudaStreamSynchronize) after its inputs are
             queued host->device; on the fast lane (staging.py) a graph captured with that copy
             inside, launched by the native call through `handle` and `_Cuda.pointers`

Why: ONNX Runtime's own replay (`gpu_graph_id`) goes through its Run() call around the launch.
Measured on an H100 that call costs only 0.6-2.9 us, so a request gains 1.3-4.5 us, and the
copy inside the graph and the native launch a few us more (docs/journal/kernels.md).

What makes the recorded addresses stay right: the bucket's inputs and outputs are bound once to
buffers it owns; ORT's intermediates come from its arena, which the session's lock lets only one
run at a time use, and which never shrinks (bertfuse sets no shrinkage); the op library keeps
no lazily made device state in the arena (its scales are its own cudaMalloc, at load). Every
graph is launched once right after capture and must reproduce the plain run bit for bit, else
the bucket runs uncaptured and the session says why.

Used for models on bertfuse's op library on CUDA (runtime/device.SessionMaker decides);
`BERTFUSE_OWN_GRAPHS=0` keeps ONNX Runtime's graphs, for comparisons.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Callable

from bertfuse.runtime.pinned import cudart_name

_P = ctypes.c_void_p
_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal: other threads' CUDA calls stay legal
ENV = "BERTFUSE_OWN_GRAPHS"


class GraphError(RuntimeError):
    """A CUDA call of the capture or the launch failed (its CUDA error named)."""


class _Cuda:
    """The graph calls of the libcudart that ORT loaded: launches keep the GIL (they only
    queue), the sync drops it (it waits for the GPU)."""

    def __init__(self, name: str) -> None:
        lib, keep = ctypes.CDLL(name), ctypes.PyDLL(name)
        for fn, args in ((lib.cudaStreamBeginCapture, [_P, ctypes.c_int]),
                         (lib.cudaStreamEndCapture, [_P, ctypes.POINTER(_P)]),
                         (lib.cudaGraphInstantiate, [ctypes.POINTER(_P), _P, ctypes.c_ulonglong]),
                         (lib.cudaGraphExecDestroy, [_P]), (lib.cudaGraphDestroy, [_P]),
                         (lib.cudaStreamSynchronize, [_P]), (keep.cudaGraphLaunch, [_P, _P])):
            fn.argtypes, fn.restype = args, ctypes.c_int
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        self.lib, self.launch, self.sync = lib, keep.cudaGraphLaunch, lib.cudaStreamSynchronize
        # The launch, the sync and cudaMemcpyAsync as C function pointers, for the fast lane's
        # native call (staging.py).
        self.pointers = tuple(ctypes.cast(f, _P).value for f in (
            lib.cudaGraphLaunch, lib.cudaStreamSynchronize, lib.cudaMemcpyAsync))

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise GraphError(f"{what}: CUDA error {status} "
                             f"({self.lib.cudaGetErrorString(status).decode()})")


_cuda: _Cuda | None = None


def cuda() -> _Cuda | None:
    """The graph calls, or None where libcudart does not load (CPU-only hosts)."""
    global _cuda
    name = cudart_name() if _cuda is None else None
    if name:
        try:
            _cuda = _Cuda(name)
        except (OSError, AttributeError):  # a runtime without the graph calls
            return None
    return _cuda


def wanted() -> bool:
    """False when the environment asks for ONNX Runtime's own graphs."""
    return os.environ.get(ENV, "1").strip() not in ("0", "off", "false")


class OwnGraph:
    """One captured run: `OwnGraph.capture(stream, run)` records what `run()` queues on
    `stream`; `launch()` replays it and waits for it."""

    def __init__(self, cu: _Cuda, stream: int, graph: int, exe: int) -> None:
        self._cu, self._stream, self._exe = cu, stream, exe
        self._free = weakref.finalize(self, _destroy, cu, graph, exe)  # a session not closed

    @classmethod
    def capture(cls, stream: int, run: Callable[[], None]) -> "OwnGraph":
        cu = cuda()
        if cu is None:
            raise GraphError("libcudart is not loaded")
        cu.check(cu.sync(stream), "cudaStreamSynchronize before capture")
        cu.check(cu.lib.cudaStreamBeginCapture(stream, _THREAD_LOCAL), "cudaStreamBeginCapture")
        graph = _P()
        try:
            run()
        except BaseException:  # end the capture: a stream left capturing breaks later work
            if cu.lib.cudaStreamEndCapture(stream, ctypes.byref(graph)) == 0 and graph.value:
                cu.lib.cudaGraphDestroy(graph)
            raise
        status = cu.lib.cudaStreamEndCapture(stream, ctypes.byref(graph))
        if status != 0 and graph.value:
            cu.lib.cudaGraphDestroy(graph)
        cu.check(status, "cudaStreamEndCapture")
        exe = _P()
        status = cu.lib.cudaGraphInstantiate(ctypes.byref(exe), graph, 0)
        if status != 0:
            cu.lib.cudaGraphDestroy(graph)
            cu.check(status, "cudaGraphInstantiate")
        return cls(cu, stream, graph.value, exe.value)

    @property
    def handle(self) -> int:
        """The cudaGraphExec_t (the fast lane launches it natively, staging.py)."""
        if self._exe is None:
            raise GraphError("a released graph")
        return self._exe

    def launch(self) -> None:
        """Replays the graph on its stream (after what is queued there) and waits for it."""
        if self._exe is None:
            raise GraphError("launch of a released graph")
        cu = self._cu
        cu.check(cu.launch(self._exe, self._stream), "cudaGraphLaunch")
        cu.check(cu.sync(self._stream), "cudaStreamSynchronize after the graph")

    def release(self) -> None:
        """Frees the graph (idempotent); before the ORT session whose memory it records."""
        self._exe = None
        self._free()


def _destroy(cu: _Cuda, graph: int, exe: int) -> None:
    cu.lib.cudaGraphExecDestroy(exe)
    cu.lib.cudaGraphDestroy(graph)
