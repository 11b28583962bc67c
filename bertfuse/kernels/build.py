"""Build libbertfuse_ops.so for the local GPU into the kernel cache (`bertfuse kernels build`).

CMake (CMakeLists.txt beside this file) when cmake is on PATH, else nvcc directly with the
same flags (one compile per source, in parallel, then one link). With $BERTFUSE_CUTLASS_DIR set
(a CUTLASS source root, or `pip` for pip's nvidia-cutlass) and compute capability 9.0, the
library also holds bertfuse's own sm_90a GEMMs (csrc/sm90/) and targets sm_90a. The build runs in a temporary directory removed on every exit path; the finished
library is renamed into the cache, so a failed or interrupted build leaves the cache as it was.
The build log goes to <cache>/<key>/build.log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path
from typing import Callable

from bertfuse.kernels.archs import parse_archs
from bertfuse.kernels.packaged import pip_cuda_trees
from bertfuse.kernels.library import (LIB_NAME, KernelLibraryError, cache_key,
                                         detect_sm, library_info, library_path)
from bertfuse.io.safety import replace_file, temp_dir, temp_file, write_text
from bertfuse.errors import install_hint
from bertfuse._version import __version__

SOURCE_DIR = Path(__file__).resolve().parent
FETCH_SCRIPT = SOURCE_DIR / "fetch_ort_headers.sh"
ORT_ENV = "ORT_INCLUDE_DIR"
CUTLASS_ENV = "BERTFUSE_CUTLASS_DIR"
# The platform wheel's library sits in site-packages/bertfuse/kernels/prebuilt/; pip's CUDA 13
# runtime and cuBLAS in site-packages/nvidia/cu13/lib.
PORTABLE_RPATH = "$ORIGIN/../../../nvidia/cu13/lib"


def header_dir(path: str | Path) -> Path | None:
    """The dir holding onnxruntime_cxx_api.h: `path` itself or its onnxruntime/ subdir, made
    absolute (cmake runs in the build dir, where a relative path would mean something else)."""
    base = Path(path).expanduser().resolve()
    for d in (base, base / "onnxruntime"):
        if (d / "onnxruntime_cxx_api.h").is_file() and (d / "onnxruntime_c_api.h").is_file():
            return d
    return None


def header_api_version(include: Path) -> int:
    m = re.search(r"^#define ORT_API_VERSION (\d+)", (include / "onnxruntime_c_api.h").read_text(),
                  re.MULTILINE)
    if not m:
        raise KernelLibraryError(f"{include}/onnxruntime_c_api.h has no ORT_API_VERSION")
    return int(m.group(1))


def find_ort_include(explicit: str | Path | None = None, fetch: bool = True) -> Path:
    """--ort-include, else $ORT_INCLUDE_DIR, else the headers fetch_ort_headers.sh caches."""
    given = explicit or os.environ.get(ORT_ENV)
    if given:
        found = header_dir(given)
        if found is None:
            what = "--ort-include" if explicit else f"${ORT_ENV}"
            raise KernelLibraryError(f"{what} {given} holds no onnxruntime_cxx_api.h and onnxruntime_c_api.h")
        return found
    if not fetch:
        raise KernelLibraryError(f"no ONNX Runtime headers: pass --ort-include DIR or set {ORT_ENV}")
    try:
        out = subprocess.run(["bash", str(FETCH_SCRIPT)], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        out = None
        why = str(exc)
    if out is not None:
        lines = out.stdout.strip().splitlines()
        found = header_dir(lines[-1]) if out.returncode == 0 and lines else None
        if found is not None:
            return found
        why = (out.stderr.strip().splitlines() or ["no output"])[-1]
    raise KernelLibraryError(f"could not fetch ONNX Runtime's headers ({why[:200]}): pass --ort-include "
                             f"DIR (an ONNX Runtime release's include/) or set {ORT_ENV}")


def pip_cuda_root() -> Path | None:
    """The pip CUDA tree that holds nvcc (bin/nvcc, include/, lib/), or None."""
    return next((t for t in pip_cuda_trees() if os.access(t / "bin" / "nvcc", os.X_OK)), None)


def _pip_siblings(toolkit: Path) -> list[Path]:
    """The other pip CUDA trees, where `toolkit` is one of them: their include/ and lib/ make
    up what the nvcc tree lacks (cuBLAS, the runtime)."""
    trees = pip_cuda_trees()
    resolved = [t.resolve() for t in trees]
    if toolkit.resolve() not in resolved:
        return []
    return [t for t, r in zip(trees, resolved) if r != toolkit.resolve()]


def find_nvcc() -> str:
    """The first nvcc (PATH, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, pip's) whose toolkit has
    cuBLASLt's headers (or $CUBLAS_ROOT has them), else the first nvcc found: a host may have
    a bare nvcc beside pip's complete toolchain."""
    pip_root = pip_cuda_root()
    found = []
    for cand in (shutil.which("nvcc"),
                 *(str(Path(h) / "bin" / "nvcc") for h in (os.environ.get("CUDA_HOME"),
                                                           os.environ.get("CUDA_PATH"),
                                                           "/usr/local/cuda", pip_root) if h)):
        if cand and os.access(cand, os.X_OK) and cand not in found:
            found.append(cand)
    if not found:
        raise KernelLibraryError("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, pip's "
                                 "nvidia-cuda-nvcc): building the bertfuse op library needs the CUDA "
                                 f"toolkit; {install_hint('kernels')} brings it as packages")
    roots = [_cublas_root()] if _cublas_root() else []
    for cand in found:
        toolkit = Path(cand).resolve().parent.parent
        if any((r / "include" / "cublasLt.h").is_file()
               for r in (*roots, toolkit, *_pip_siblings(toolkit))):
            return cand
    return found[0]


def _cublas_root() -> Path | None:
    root = os.environ.get("CUBLAS_ROOT")
    return Path(root) if root else None


def find_cutlass() -> Path | None:
    """CUTLASS's source root (include/cutlass/cutlass.h, tools/util/include/) when the sm_90a GEMMs
    are asked for: $BERTFUSE_CUTLASS_DIR, a CUTLASS checkout, or `pip` to take pip's
    nvidia-cutlass (cutlass_library/source). Unset: None, cuBLASLt GEMMs only. Opt-in because,
    as measured on the H200, cuBLASLt is faster at every BERT shape so far (docs/journal/
    kernels.md) and the CUTLASS files add minutes to the build."""
    env = os.environ.get(CUTLASS_ENV, "").strip()
    if not env:
        return None
    if env == "pip":
        spec = find_spec("cutlass_library")
        for loc in (spec.submodule_search_locations or []) if spec else []:
            root = Path(loc) / "source"
            if (root / "include" / "cutlass" / "cutlass.h").is_file():
                return root.resolve()
        raise KernelLibraryError(f"${CUTLASS_ENV}=pip but pip's nvidia-cutlass is not installed "
                                 "(pip install nvidia-cutlass)")
    root = Path(env).resolve()
    if not (root / "include" / "cutlass" / "cutlass.h").is_file():
        raise KernelLibraryError(f"${CUTLASS_ENV}={env} has no include/cutlass/cutlass.h")
    return root


def sm90_gemms(sm: int, cutlass: Path | None) -> bool:
    """Whether a build for `sm` holds the sm_90a GEMMs (and so targets sm_90a)."""
    return sm == 90 and cutlass is not None


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)
    if proc.returncode != 0:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        err = next((ln for ln in reversed(tail) if "error" in ln.lower()), tail[-1] if tail else "")
        raise KernelLibraryError(f"building the bertfuse op library failed ({Path(cmd[0]).name}): "
                                 f"{err.strip()[:300]}; full log: {log}")


def _cmake_build(build: Path, include: Path, sm: int, nvcc: str, log: Path) -> Path:
    cmake = shutil.which("cmake") or "cmake"  # build() checked it is there
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []

    cfg = [cmake, "-S", str(SOURCE_DIR), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
           f"-DBF_VERSION={__version__}",
           f"-DORT_INCLUDE_DIR={include}", f"-DCMAKE_CUDA_ARCHITECTURES={sm}",
           f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DCUDAToolkit_ROOT={Path(nvcc).parent.parent}"]
    if _cublas_root():
        cfg.append(f"-DCUBLAS_ROOT={_cublas_root()}")
    cutlass = find_cutlass()
    cfg.append(f"-DBF_CUTLASS_DIR={cutlass if sm90_gemms(sm, cutlass) else ''}")
    _run(cfg, log)
    _run([cmake, "--build", str(build), "-j", str(max(1, os.cpu_count() or 1))], log)
    return build / LIB_NAME


def gencode(archs: list[str]) -> list[str]:
    """nvcc's -gencode flags for targets in CMake's notation (archs.py): '80-real' -> SASS for
    sm_80, '90-virtual' -> PTX for compute_90, '90' -> both."""
    flags = []
    for t in parse_archs(",".join(archs)):
        codes = [f"compute_{t.name()}"] * t.ptx + [f"sm_{t.name()}"] * t.sass
        flags.append(f"-gencode=arch=compute_{t.name()},code=[{','.join(codes)}]")
    return flags


def nvcc_build(build: Path, include: Path, sm: int | None, nvcc: str, log: Path,
                archs: list[str] | None = None, portable: bool = False) -> Path:
    """The same library as CMakeLists.txt, for hosts without cmake. `archs` (CMake's notation,
    several at once, the sm_90a GEMMs left out) instead of `sm`; `portable`: the platform
    wheel's link (CUDA found through a RUNPATH relative to the library:
    docs/prebuilt-kernels.md) instead of this host's absolute paths."""
    cuda = Path(nvcc).parent.parent
    csrc = SOURCE_DIR / "csrc"
    sources = sorted(p for p in csrc.iterdir() if p.suffix in (".cc", ".cu"))
    cutlass = find_cutlass() if archs is None else None
    if archs is None:
        archs = [f"{sm}a" if sm90_gemms(sm, cutlass) else str(sm)]
    arch = ",".join(archs)
    # Each source's targets one after another, as many sources at once as there are cores;
    # where there are more cores than sources, nvcc also compiles a source's targets in parallel.
    threads = max(1, (os.cpu_count() or 1) // len(sources))
    flags = ["-std=c++17", "-O3", *gencode(archs), "--expt-relaxed-constexpr",
             *([f"--threads={threads}"] if threads > 1 and len(archs) > 1 else []),
             "-Xcompiler=-fPIC,-fvisibility=hidden,-fvisibility-inlines-hidden",
             f"-I{csrc}", f"-I{include}",
             f'-DBF_VERSION="{__version__}"', f'-DBF_CUDA_ARCHS="{arch}"', "-DNDEBUG"]
    if cutlass is not None and sm90_gemms(sm, cutlass):
        sources += sorted((csrc / "sm90").glob("*.cu"))
        flags += [f"-I{cutlass / 'include'}", f"-I{cutlass / 'tools' / 'util' / 'include'}",
                  "-DBF_HAVE_SM90_GEMM=1"]
    libdirs = [cuda / "lib64", cuda / "lib"]
    for tree in _pip_siblings(cuda):  # split pip trees: what the nvcc tree lacks
        if (tree / "include").is_dir():
            flags.append(f"-I{tree / 'include'}")
        libdirs.append(tree / "lib")
    root = _cublas_root()
    if root:
        flags.append(f"-I{root / 'include'}")
        libdirs[:0] = [root / "lib", root / "lib64"]
    # One compile per source, as many at once as there are cores: the CUTLASS files take most
    # of a minute each.
    objects = [build / f"{i:02d}_{p.stem}.o" for i, p in enumerate(sources)]
    logs = [build / f"{o.stem}.log" for o in objects]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        failures = [f for f in pool.map(lambda job: _compile([nvcc, *flags], *job, log),
                                        zip(sources, objects, logs)) if f]
    for part in logs:  # one build log, in source order
        if part.is_file():
            with log.open("a", encoding="utf-8") as out:
                out.write(part.read_text(errors="replace"))
    if failures:
        raise failures[0]
    cmd = [nvcc, "-shared", *gencode(archs), "-cudart=shared", "-Xlinker=--no-undefined",
           *map(str, objects)]
    lt = _versioned(libdirs, "libcublasLt")
    if lt is None:
        raise KernelLibraryError(f"libcublasLt not found in {', '.join(map(str, libdirs))}: set CUBLAS_ROOT")
    out = build / LIB_NAME
    rpath = ":".join(dict.fromkeys(str(d) for d in (lt.parent, cuda / "lib64", cuda / "lib",
                                                     *libdirs[2:])))
    if portable:  # no path of this host (manylinux: csrc/glibcxx_compat.cc)
        rpath = PORTABLE_RPATH
    cmd += ["-o", str(out), f"-L{cuda / 'lib64'}", f"-L{lt.parent}", f"-l:{lt.name}",
            f"-Xlinker=-rpath,{rpath}"]
    if not any((d / "libcudart.so").exists() for d in libdirs):
        # pip's nvidia-cuda-runtime ships libcudart.so.13 alone, which -cudart=shared cannot
        # find by name: link that file itself.
        rt = _versioned(libdirs, "libcudart")
        if rt is None:
            raise KernelLibraryError(f"libcudart not found in {', '.join(map(str, libdirs))}")
        cmd[cmd.index("-cudart=shared")] = "-cudart=none"
        cmd += [f"-L{rt.parent}", f"-l:{rt.name}"]
    _run(cmd, log)
    return out


def _compile(cmd: list[str], source: Path, obj: Path, part_log: Path, log: Path) -> Exception | None:
    """One `nvcc -c` of `source` into `obj`, its output in `part_log` (appended to `log` after);
    the error, naming `log`, returned rather than raised."""
    try:
        _run([*cmd, "-c", str(source), "-o", str(obj)], part_log)
    except KernelLibraryError as e:
        return KernelLibraryError(str(e).replace(str(part_log), str(log)))
    return None


def _versioned(dirs: list[Path], stem: str) -> Path | None:
    return next((d / n for d in dirs for n in (f"{stem}.so", f"{stem}.so.13", f"{stem}.so.12")
                 if (d / n).exists()), None)


def build(ort_include: str | Path | None = None, arch: int | None = None, force: bool = False,
          root: Path | None = None, builder: str = "auto",
          say: Callable[[str], None] = lambda msg: None) -> Path:
    """Builds (unless cached and not `force`) and returns the cached library's path."""
    sm = arch if arch is not None else detect_sm()
    include = find_ort_include(ort_include)
    api = header_api_version(include)
    target = library_path(api, sm, root)
    if target.is_file() and not force:
        say(f"cached: {target}")
        return target
    nvcc = find_nvcc()
    if builder == "auto":  # CMake's CUDA lookup expects a toolkit's layout, not pip's
        pip_root = pip_cuda_root()
        from_pip = pip_root is not None and Path(nvcc).resolve().is_relative_to(pip_root.resolve())
        builder = "cmake" if shutil.which("cmake") and not from_pip else "nvcc"
    elif builder == "cmake" and not shutil.which("cmake"):
        raise KernelLibraryError("cmake not found on PATH (use --builder nvcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    log = target.parent / "build.log"
    write_text(log, f"# bertfuse op library {cache_key(api, sm)}: {builder}, headers {include}\n")
    say(f"building {cache_key(api, sm)} with {builder} (headers {include}, ORT API {api}); log {log}")
    with temp_dir(prefix="bertfuse-kernels-") as tmp:
        if builder == "cmake":
            made = _cmake_build(tmp / "build", include, sm, nvcc, log)
        else:
            made = nvcc_build(tmp, include, sm, nvcc, log)
        if not made.is_file():
            raise KernelLibraryError(f"the build made no {LIB_NAME}; full log: {log}")
        with temp_file(target) as staged:
            shutil.copyfile(made, staged)
            os.chmod(staged, 0o755)
            info = library_info(staged)
            replace_file(staged, target)
    write_text(target.parent / "info.json", json.dumps({**info, "builder": builder,
                                                        "ort_include": str(include)}, indent=2) + "\n")
    say(f"built: {target}")
    return target
