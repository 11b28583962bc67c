"""Find and register libbertfuse_ops.so, the CUDA library behind the `ai.bertfuse` ops.

The platform wheel ships it prebuilt (resolve.py: taken first where it runs here); else it is
built per machine (`bertfuse kernels build`, see build.py) into a cache:

    <root>/ort-api<N>-sm<SM>/libbertfuse_ops.so   (+ info.json)

root is $BERTFUSE_KERNELS_DIR, else $XDG_CACHE_HOME/bertfuse/kernels, else
~/.cache/bertfuse/kernels. N is the ONNX Runtime C API version of the headers the library was
built against; onnxruntime 1.N offers API versions 1..N, so a library for API N loads in any
onnxruntime >= 1.N, and `locate` picks the highest N the installed onnxruntime offers. SM is
the GPU's compute capability (90 for H100/H200).

Nothing here imports TensorFlow or a GPU framework; the SM comes from libcudart through ctypes,
else nvidia-smi. `import bertfuse` does not import this module.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from bertfuse.errors import BertfuseError
from bertfuse.kernels.packaged import PACKAGED_DIR, packaged_choice
from bertfuse.optional import optional

DOMAIN = "ai.bertfuse"
DOMAIN_VERSION = 1
LIB_NAME = "libbertfuse_ops.so"
KERNELS_ENV = "BERTFUSE_KERNELS_DIR"
BUILD_HINT = "build it with `bertfuse kernels build` (needs nvcc, cmake and ONNX Runtime's headers)"
_KEY = re.compile(r"^ort-api(\d+)-sm(\d+)$")


class KernelLibraryError(BertfuseError):
    """The op library is missing, unloadable, or cannot run here (no GPU, CPU device)."""


# ------------------------------------------------------------------------------ cache layout


def cache_root() -> Path:
    env = os.environ.get(KERNELS_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "bertfuse" / "kernels"


def cache_key(ort_api: int, sm: int) -> str:
    return f"ort-api{int(ort_api)}-sm{int(sm)}"


def library_path(ort_api: int, sm: int, root: Path | None = None) -> Path:
    return (root or cache_root()) / cache_key(ort_api, sm) / LIB_NAME


def built_libraries(root: Path | None = None) -> list[tuple[int, int, Path]]:
    """(ort_api, sm, path) of every library in the cache, highest API first."""
    root = root or cache_root()
    found = []
    if root.is_dir():
        for d in root.iterdir():
            m = _KEY.match(d.name)
            if m and (d / LIB_NAME).is_file():
                found.append((int(m.group(1)), int(m.group(2)), d / LIB_NAME))
    return sorted(found, reverse=True)


# ------------------------------------------------------------------------------ what's here


def parse_compute_cap(text: str) -> int:
    """'9.0' (nvidia-smi's compute_cap) -> 90."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    if not m:
        raise ValueError(f"not a compute capability: {text!r}")
    return int(m.group(1)) * 10 + int(m.group(2))


def _cudart() -> ctypes.CDLL | None:
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    found = ctypes.util.find_library("cudart")
    if found:
        names.insert(0, found)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            names += [str(Path(home) / "lib64" / n) for n in ("libcudart.so", "libcudart.so.13", "libcudart.so.12")]
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _sm_from_cudart() -> int | None:
    """Device 0's compute capability via cudaDeviceGetAttribute (honours CUDA_VISIBLE_DEVICES)."""
    lib = _cudart()
    if lib is None:
        return None
    major, minor = ctypes.c_int(), ctypes.c_int()
    # cudaDevAttrComputeCapabilityMajor = 75, ...Minor = 76
    if lib.cudaDeviceGetAttribute(ctypes.byref(major), 75, 0) != 0 or \
            lib.cudaDeviceGetAttribute(ctypes.byref(minor), 76, 0) != 0:
        return None
    return major.value * 10 + minor.value


def _sm_from_nvidia_smi() -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    if out.returncode != 0 or not lines:
        return None
    try:
        return parse_compute_cap(lines[0])
    except ValueError:
        return None


@functools.lru_cache(maxsize=1)  # every bertfuse-kernels session asks; the GPU does not change
def detect_sm() -> int:
    """The local GPU's SM (e.g. 90); KernelLibraryError where there is no CUDA GPU."""
    sm = _sm_from_cudart() or _sm_from_nvidia_smi()
    if sm is None:
        raise KernelLibraryError("no CUDA GPU found (libcudart and nvidia-smi see none): the bertfuse "
                                 "op library runs only on a CUDA GPU")
    return sm


def installed_ort_api() -> int | None:
    """The highest C API version the installed onnxruntime offers (1.N -> N); None without it."""
    try:
        ort = optional("onnxruntime", why="the op library runs in ONNX Runtime")
    except ImportError:
        return None
    m = re.match(r"1\.(\d+)", getattr(ort, "__version__", ""))
    return int(m.group(1)) if m else None


# ------------------------------------------------------------------------------ locate / load


@dataclass
class Resolution:
    """source: 'packaged', 'cache' or 'none'; path: the library (None for 'none'); reason:
    one line saying why; packaged: why the packaged library was taken or passed over."""

    source: str
    path: Path | None
    reason: str
    packaged: str
    info: dict[str, Any] = field(default_factory=dict)


def resolve(sm: int | None = None, ort_api: int | None = None, root: Path | None = None,
            packaged: Path | None = None) -> Resolution:
    """The library for this GPU and onnxruntime: the platform wheel's (packaged.py) where it
    runs here, else the cache's with the highest ORT API the installed onnxruntime offers,
    else none. Never builds."""
    root = root or cache_root()
    sm = detect_sm() if sm is None else sm
    max_api = installed_ort_api() if ort_api is None else ort_api
    path, why, info = packaged_choice(sm, max_api, packaged or PACKAGED_DIR / LIB_NAME,
                                      library_info)
    if path is not None:
        return Resolution("packaged", path, why, why, info)
    for api, lib_sm, cached in built_libraries(root):
        if lib_sm == sm and (max_api is None or api <= max_api):
            return Resolution("cache", cached, f"{why}; took the cache's {cached.parent.name}",
                              why, info)
    within = f", ONNX Runtime API <= {max_api}" if max_api is not None else ""
    return Resolution("none", None, f"{why}; the cache {root} has none for sm{sm}{within}", why,
                      info)


def locate(sm: int | None = None, ort_api: int | None = None, root: Path | None = None) -> Path:
    """The library resolve() takes, or KernelLibraryError saying why none and how to build."""
    found = resolve(sm, ort_api, root)
    if found.path is not None:
        return found.path
    raise KernelLibraryError(f"the bertfuse op library is not built here ({found.packaged}; "
                             f"{found.reason.split('; ')[-1]}): {BUILD_HINT}")


def library_info(path: str | Path) -> dict[str, Any]:
    """bf_library_info() of a built library (loads it with ctypes; no ONNX Runtime needed)."""
    try:
        lib = ctypes.CDLL(str(path))
        fn = lib.bf_library_info
    except (OSError, AttributeError) as exc:
        raise KernelLibraryError(f"cannot load {path}: {str(exc).splitlines()[0][:300]}; "
                                 "rebuild with `bertfuse kernels build --force`") from None
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())


def op_names(path: str | Path) -> list[str] | None:
    """The ops the library puts in the ai.bertfuse domain (it is registered once with a throwaway
    onnxruntime.SessionOptions, which works on a CPU build too); None where it predates
    bf_op_names."""
    ort = optional("onnxruntime", why="the op library runs in ONNX Runtime")

    register(ort.SessionOptions(), path)
    fn = getattr(ctypes.CDLL(str(path)), "bf_op_names", None)  # the handle ORT already opened
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    return [n for n in fn().decode().split(",") if n]


def register(session_options: Any, path: str | Path | None = None) -> Path:
    """Registers the ai.bertfuse ops on an onnxruntime.SessionOptions; returns the library path."""
    path = Path(path) if path is not None else locate()
    if not path.is_file():
        raise KernelLibraryError(f"the bertfuse op library {path} does not exist: {BUILD_HINT}")
    try:
        session_options.register_custom_ops_library(str(path))
    except Exception as exc:  # ORT raises its own Fail/RuntimeException types
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise KernelLibraryError(f"ONNX Runtime cannot load the bertfuse op library {path}: {first}; "
                                 "rebuild it with `bertfuse kernels build --force`") from None
    return path
