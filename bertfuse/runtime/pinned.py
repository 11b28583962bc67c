"""Page-locked host staging and a stream of our own, from the CUDA runtime ORT already loaded.

A request's inputs reach the device in one copy. OrtValue.update_inplace does a synchronous
cudaMemcpy, and from pageable memory the driver first bounces through its own pinned buffer.
With a page-locked staging buffer and the session running on a stream we created (ORT's
`user_compute_stream`), the copy is queued on that stream ahead of the graph replay instead:
no extra synchronisation, ORT's own end-of-run sync covers both. Without libcudart (CPU-only
builds) callers fall back to NumPy arrays and update_inplace.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Callable

import numpy as np

from bertfuse.optional import optional

_LIBS = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
_cudart: ctypes.CDLL | None = None
_cudart_name = ""
# cudaMemcpyAsync only queues the copy (a few us): called through PyDLL it keeps the GIL.
# Through CDLL every call drops and retakes it, and with several threads serving, retaking
# it means waiting for another thread's Python work (measured: docs/journal/packed.md).
_queue_copy: Callable[..., int] | None = None


def _preload_cuda() -> None:
    """onnxruntime-gpu's own CUDA libraries (the nvidia-* wheels) first, so libcudart is found by
    name below where it lives only there; the CUDA EP would load them anyway, later."""
    try:
        ort = optional("onnxruntime", why="ONNX Runtime (cpu or gpu extra)")
    except ImportError:
        return
    if hasattr(ort, "preload_dlls") and "CUDAExecutionProvider" in ort.get_available_providers():
        ort.preload_dlls()


def _runtime() -> ctypes.CDLL | None:
    global _cudart
    if _cudart is None:
        _preload_cuda()
        for name in _LIBS:
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            lib.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                          ctypes.c_uint]
            lib.cudaFreeHost.argtypes = [ctypes.c_void_p]
            lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                                      ctypes.c_uint]
            lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_int, ctypes.c_void_p]
            lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_int]
            global _queue_copy, _cudart_name
            _queue_copy = ctypes.PyDLL(name).cudaMemcpyAsync
            _queue_copy.argtypes = lib.cudaMemcpyAsync.argtypes
            _cudart, _cudart_name = lib, name
            break
    return _cudart


def cudart_name() -> str | None:
    """The name the CUDA runtime was loaded by (graphs.py binds more of it), or None."""
    return _cudart_name if _runtime() is not None else None


def pinned_empty(shape: tuple[int, ...], dtype: np.dtype | type = np.int32) -> np.ndarray | None:
    """A page-locked NumPy array (freed with the array), or None where CUDA is unavailable."""
    lib = _runtime()
    if lib is None:
        return None
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    ptr = ctypes.c_void_p()
    if lib.cudaHostAlloc(ctypes.byref(ptr), max(nbytes, 1), 0) != 0 or not ptr.value:
        return None
    raw = (ctypes.c_char * max(nbytes, 1)).from_address(ptr.value)
    array = np.frombuffer(raw, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
    weakref.finalize(raw, lib.cudaFreeHost, ptr.value)
    return array


_NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit sync with the legacy default stream
_HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice
_DEVICE_TO_HOST = 2  # cudaMemcpyDeviceToHost


def new_stream() -> int | None:
    """A new non-blocking CUDA stream's handle (lives as long as the process), or None."""
    lib = _runtime()
    if lib is None:
        return None
    stream = ctypes.c_void_p()
    if lib.cudaStreamCreateWithFlags(ctypes.byref(stream), _NON_BLOCKING) != 0:
        return None
    return stream.value


def address(array: np.ndarray) -> int:
    """The address of a C-contiguous array's first byte. Through the buffer protocol where the
    array is writable (about 0.5 us), else array.ctypes.data (1-2 us: it builds a helper
    object each time); a request path takes several a call."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):  # read-only or empty
        return array.ctypes.data


def copy_to_device_async(device_ptr: int, host: np.ndarray, stream: int) -> None:
    """Queues host -> device on `stream`; `host` must stay untouched until the stream syncs."""
    lib = _runtime()
    status = _queue_copy(device_ptr, address(host), host.nbytes, _HOST_TO_DEVICE,
                         stream) if lib is not None else -1
    if status != 0:
        raise RuntimeError(f"cudaMemcpyAsync failed with CUDA error {status}")


def copy_to_host(host: np.ndarray, device_ptr: int) -> bool:
    """host <- the first host.nbytes at device_ptr, synchronously; False without libcudart."""
    lib = _runtime()
    if lib is None:
        return False
    status = lib.cudaMemcpy(host.ctypes.data, device_ptr, host.nbytes, _DEVICE_TO_HOST)
    if status != 0:
        raise RuntimeError(f"cudaMemcpy failed with CUDA error {status}")
    return True
