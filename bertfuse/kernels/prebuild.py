"""The platform wheel's op library: built once, at wheel-build time, for every GPU the wheel
serves, with pip's CUDA 13 toolchain and ONNX Runtime's pinned headers (setup.py calls
`build_prebuilt` when BERTFUSE_BUILD_KERNELS=1; docs/prebuilt-kernels.md).

- Targets: SASS for sm_80, sm_86, sm_89 and sm_90a, PTX for compute_90 (a newer GPU's driver
  compiles it at first load); $BERTFUSE_KERNELS_ARCHS (CMake's notation) overrides them.
- Headers: fetch_ort_headers.sh's (Debian trixie's libonnxruntime-dev 1.21.0), or
  $ORT_INCLUDE_DIR's, checked file by file against ort_headers.sha256: the build refuses any
  other headers, so every platform wheel is built against the same ORT API (21).
- Link: CUDA 13's runtime and cuBLASLt by soname, found at run time through a RUNPATH into
  pip's site-packages/nvidia/cu13/lib (or preloaded, packaged.py); the system's libstdc++,
  of which the library asks nothing newer than GCC 8's (csrc/glibcxx_compat.cc), and glibc
  nothing newer than 2.28 (manylinux_2_28; checked here with readelf).

Only the standard library and the kernel build's modules: the wheel build imports this from
the source tree, in pip's isolated build environment.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from bertfuse.kernels.build import (FETCH_SCRIPT, PORTABLE_RPATH, SOURCE_DIR, nvcc_build,
                                       header_api_version, header_dir, pip_cuda_root)
from bertfuse.kernels.library import LIB_NAME, KernelLibraryError, library_info
from bertfuse.io.safety import temp_dir
from bertfuse.kernels.packaged import preload_cuda

ARCHS = ["80-real", "86-real", "89-real", "90a-real", "90-virtual"]
ARCHS_ENV = "BERTFUSE_KERNELS_ARCHS"
MANIFEST = SOURCE_DIR / "ort_headers.sha256"
PLATFORM = "manylinux_2_28_x86_64"
# manylinux_2_28 (PEP 600; auditwheel's policy for x86_64): the newest symbol version of each
# library a wheel's binary may ask for, and the libraries it may need besides its own.
MAX_VERSIONS = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11), "GCC": (7, 0, 0)}
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0",
               "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2"}
CUDA_LIBS = {"libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"}


def wheel_archs() -> list[str]:
    env = os.environ.get(ARCHS_ENV, "").strip()
    return [a for a in re.split(r"[,;\s]+", env) if a] if env else list(ARCHS)


def pinned_headers() -> dict[str, str]:
    """{header file name: sha256} from ort_headers.sha256."""
    pins = {}
    for line in MANIFEST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split()
            pins[name] = digest
    return pins


def checked_headers(include: Path) -> list[str]:
    """What differs between `include` and the pinned headers (empty: they are the pinned ones)."""
    problems = []
    for name, digest in pinned_headers().items():
        path = include / name
        if not path.is_file():
            problems.append(f"{name} missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"{name} differs")
    return problems


def ort_headers(say: Callable[[str], None]) -> Path:
    """$ORT_INCLUDE_DIR, else fetch_ort_headers.sh's; either must be the pinned headers."""
    given = os.environ.get("ORT_INCLUDE_DIR")
    if given:
        include = header_dir(given)
        if include is None:
            raise KernelLibraryError(f"$ORT_INCLUDE_DIR {given} holds no onnxruntime_c_api.h")
    else:
        out = subprocess.run(["bash", str(FETCH_SCRIPT)], capture_output=True, text=True,
                             timeout=600)
        lines = out.stdout.strip().splitlines()
        include = header_dir(lines[-1]) if out.returncode == 0 and lines else None
        if include is None:
            why = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise KernelLibraryError(f"could not fetch ONNX Runtime's headers ({why[:300]}): set "
                                     "ORT_INCLUDE_DIR to a folder with the pinned headers "
                                     f"({MANIFEST.name})")
    problems = checked_headers(include)
    if problems:
        raise KernelLibraryError(f"ONNX Runtime's headers in {include} are not the pinned ones "
                                 f"({', '.join(problems[:3])}; {MANIFEST}): the platform wheel "
                                 "builds against those only")
    say(f"ONNX Runtime headers {include} (pinned, ORT API {header_api_version(include)})")
    return include


def _readelf(args: list[str], path: Path) -> str:
    try:
        out = subprocess.run(["readelf", "-W", *args, str(path)], capture_output=True,
                             text=True, timeout=120)
    except OSError as exc:
        raise KernelLibraryError(f"readelf (binutils) is needed to check {path.name}: {exc}") \
            from None
    if out.returncode != 0:
        raise KernelLibraryError(f"readelf cannot read {path}: {out.stderr.strip()[:200]}")
    return out.stdout


def elf_facts(path: Path) -> dict:
    """The shared library's NEEDED entries, RUNPATH/RPATH, and the symbol versions it asks
    of each library ({'libc.so.6': ['GLIBC_2.14', ...]})."""
    dyn = _readelf(["-d"], path)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", dyn)
    versions: dict[str, list[str]] = {}
    current = None
    for line in _readelf(["-V"], path).splitlines():
        m = re.search(r"File: (\S+)\s+Cnt:", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: (\S+)\s+Flags:", line)
        if m and current:
            versions.setdefault(current, []).append(m.group(1))
    return {"needed": needed, "runpath": runpath, "versions": versions}


def manylinux_problems(path: Path) -> list[str]:
    """Why `path` does not fit manylinux_2_28 with CUDA 13 from pip (empty: it does)."""
    facts = elf_facts(path)
    problems = [f"needs {lib}" for lib in facts["needed"] if lib not in SYSTEM_LIBS | CUDA_LIBS]
    for lib, names in facts["versions"].items():
        for name in names:
            m = re.fullmatch(r"([A-Z]+)_([0-9.]+)", name)
            if not m or m.group(1) not in MAX_VERSIONS:
                continue
            version = tuple(int(x) for x in m.group(2).split("."))
            if version > MAX_VERSIONS[m.group(1)]:
                problems.append(f"asks {lib} for {name}")
    if facts["runpath"] != [PORTABLE_RPATH]:
        problems.append(f"RUNPATH {facts['runpath']}, not [{PORTABLE_RPATH}]")
    return problems


def build_prebuilt(dest: Path, log: Path, say: Callable[[str], None] = print) -> Path:
    """Builds the platform wheel's library into dest/libbertfuse_ops.so (nothing else goes
    there; the objects and logs stay in a temporary folder, the build log in `log`)."""
    root = pip_cuda_root()
    if root is None:
        raise KernelLibraryError("pip's CUDA 13 toolchain (the `kernels` extra: nvidia-cuda-nvcc, "
                                 "...) is not installed in the build environment")
    nvcc = str(root / "bin" / "nvcc")
    include = ort_headers(say)
    archs = wheel_archs()
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# bertfuse op library for the platform wheel: {','.join(archs)}, "
                   f"headers {include}\n")
    say(f"compiling the op library for {','.join(archs)} with {nvcc} "
        f"({os.cpu_count()} cores; log {log})")
    start = time.perf_counter()
    with temp_dir(prefix="bertfuse-prebuild-") as tmp:
        made = nvcc_build(tmp, include, None, nvcc, log, archs=archs, portable=True)
        problems = manylinux_problems(made)
        if problems:
            raise KernelLibraryError(f"the built library does not fit {PLATFORM}: "
                                     f"{'; '.join(problems[:5])}")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made, dest / LIB_NAME)
        os.chmod(dest / LIB_NAME, 0o755)
    say(f"built {dest / LIB_NAME} ({(dest / LIB_NAME).stat().st_size / 1e6:.1f} MB) in "
        f"{time.perf_counter() - start:.0f} s")
    try:  # pip's CUDA runtime of the build environment; the check above is what counts

        preload_cuda()
        say(f"bf_library_info: {library_info(dest / LIB_NAME)}")
    except KernelLibraryError:
        pass
    return dest / LIB_NAME
