"""The op library the platform wheel ships, and whether it runs here (library.resolve takes it
before the cache's):

    bertfuse/kernels/prebuilt/libbertfuse_ops.so   the platform wheel's (docs/prebuilt-kernels.md)

It is taken when its bf_library_info() says it runs here: a CUDA target for the local GPU's SM
(archs.py) and an ONNX Runtime API no newer than the installed onnxruntime's. Reading that info
loads the library, which needs CUDA 13's runtime and cuBLASLt: its RUNPATH points at pip's
site-packages/nvidia/cu13/lib beside it; where pip put them elsewhere on sys.path (a venv over
the system's site-packages), they are loaded first from there, as onnxruntime.preload_dlls
does. $BERTFUSE_PACKAGED_KERNELS=0 skips it (e.g. to run a library of one's own build from the
cache). Only the standard library and archs.py: library.py imports this.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from pathlib import Path
from typing import Any, Callable

from bertfuse.kernels.archs import usable

PACKAGED_ENV = "BERTFUSE_PACKAGED_KERNELS"
PACKAGED_DIR = Path(__file__).resolve().parent / "prebuilt"
# What the prebuilt library links besides libc and libstdc++ (docs/prebuilt-kernels.md).
CUDA_SONAMES = ("libcudart.so.13", "libcublasLt.so.13")


def pip_cuda_trees() -> list[Path]:
    """Every CUDA tree pip installed on sys.path, site-packages/nvidia/cu13 (or cu12): one where
    the `kernels` extra (nvidia-cuda-nvcc, -runtime, -crt, -cccl, nvidia-nvvm, nvidia-cublas)
    went into one environment; several in a venv made with --system-site-packages, e.g. nvcc in
    the venv and cuBLAS and the runtime beside the system's torch."""
    spec = importlib.util.find_spec("nvidia")
    trees = []
    for base in (spec.submodule_search_locations or []) if spec else []:
        for name in ("cu13", "cu12"):
            root = Path(base) / name
            if root.is_dir() and root not in trees:
                trees.append(root)
    return trees


@functools.lru_cache(maxsize=1)
def preload_cuda() -> list[str]:
    """CUDA 13's runtime and cuBLASLt from pip's nvidia/cu13 trees on sys.path, loaded with
    RTLD_GLOBAL so that the prebuilt library's needs are met by soname wherever pip put them;
    the paths loaded (none where the system's loader finds them anyway, or nowhere)."""
    loaded = []
    for soname in CUDA_SONAMES:
        for tree in pip_cuda_trees():
            path = tree / "lib" / soname
            if path.is_file():
                try:
                    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue
                loaded.append(str(path))
                break
    return loaded


def packaged_choice(sm: int, ort_api: int | None, path: Path,
                    read_info: Callable[[Path], dict[str, Any]]
                    ) -> tuple[Path | None, str, dict[str, Any]]:
    """(the packaged library `path` where it runs here, else None; why; its bf_library_info(),
    read by `read_info`, which raises where the library cannot be loaded)."""
    if os.environ.get(PACKAGED_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return None, f"packaged library skipped (${PACKAGED_ENV}={os.environ[PACKAGED_ENV]})", {}
    if not path.is_file():
        return None, "no packaged library (this bertfuse is the pure-Python wheel or a checkout)", {}
    preload_cuda()
    try:
        info = read_info(path)
    except Exception as exc:  # noqa: BLE001 (KernelLibraryError: dlopen's one line)
        why = str(exc).split("; rebuild")[0]
        return None, (f"packaged library not loadable here ({why}): it needs CUDA 13's runtime "
                      "and cuBLAS (pip install nvidia-cuda-runtime nvidia-cublas)"), {}
    ok, why = usable(info, sm, ort_api)
    if not ok:
        return None, f"packaged library passed over: {why}", info
    return path, f"packaged library: {why}", info
