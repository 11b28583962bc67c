"""Page-locked host staging buffers, from the CUDA runtime ONNX Runtime already loaded.

A request's inputs reach the device with one synchronous cudaMemcpy (OrtValue.update_inplace).
From pageable memory the driver first copies them into its own pinned bounce buffer; from
page-locked memory the copy engine reads them directly. Without libcudart (CPU-only builds)
callers fall back to ordinary NumPy arrays.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

_LIBS = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
_cudart: ctypes.CDLL | None = None


def _runtime() -> ctypes.CDLL | None:
    global _cudart
    if _cudart is None:
        for name in _LIBS:
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            lib.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                          ctypes.c_uint]
            lib.cudaFreeHost.argtypes = [ctypes.c_void_p]
            _cudart = lib
            break
    return _cudart


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
