"""Shared pieces of benchmarks/kernels/kernels_gemm.py: building and loading the dense kernels' check
library, float64 references, the gate, CUDA-graph timing, and the summary table."""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "bertfuse", "kernels", "csrc")
U64, I32, F32 = ctypes.c_uint64, ctypes.c_int, ctypes.c_float
BIAS, GELU, SLN = 0, 1, 2
EPS = 1e-12
GATE_MAX, GATE_MEAN = 4e-2, 2e-3


def cublas_root() -> str:
    site = sysconfig.get_paths()["purelib"]
    for root in [os.environ.get("CUBLAS_ROOT", ""), os.environ.get("CUDA_HOME", ""), "/usr/local/cuda",
                 *glob.glob(os.path.join(site, "nvidia", "cu1*")), os.path.join(site, "nvidia", "cublas")]:
        if root and os.path.exists(os.path.join(root, "include", "cublasLt.h")):
            return root
    print("kernels_gemm: no cublasLt.h found (set CUBLAS_ROOT)", file=sys.stderr)
    sys.exit(2)


def build(tmp: str) -> str:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    major, minor = torch.cuda.get_device_capability()
    root = cublas_root()
    libdir = next(d for d in (os.path.join(root, "lib64"), os.path.join(root, "lib")) if os.path.isdir(d))
    lt = "cublasLt" if os.path.exists(os.path.join(libdir, "libcublasLt.so")) else ":libcublasLt.so.13"
    so = os.path.join(tmp, "libbf_dense_check.so")
    cmd = [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden",
           f"-arch=sm_{major}{minor}", "-I", os.path.join(root, "include"), "-o", so,
           *(os.path.join(CSRC, f) for f in ("dense.cu", "gemm_tuner.cu", "bias_act.cu", "config.cc",
                                             "check_dense.cu", "layernorm.cu")),
           os.path.join(CSRC, "gemm_sm90.cu"),  # the table only: the sm_90a GEMMs need --lib
           "-L", libdir, f"-l{lt}", "-Xlinker", f"-rpath,{libdir}"]
    print("building:", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        print("kernels_gemm: nvcc failed (see above)", file=sys.stderr)
        sys.exit(2)
    return so


def load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.bf_check_dense.argtypes = [U64] * 7 + [I32] * 5 + [F32, I32, U64, F32, U64]
    lib.bf_check_dense_fp8.argtypes = ([U64, U64, U64, F32, U64] + [U64] * 5 + [I32] * 5
                                       + [F32, I32, I32, U64, F32, U64])
    lib.bf_check_layernorm.argtypes = [U64] * 5 + [F32, U64, I32, I32, U64, F32, U64]
    lib.bf_check_set_algo_rank.argtypes = [I32]
    lib.bf_check_set_workspace_mb.argtypes = [I32]
    lib.bf_check_unsupported_mask.argtypes = []
    lib.bf_check_bias_act.argtypes = [U64, U64, U64, I32, I32, I32, U64]
    lib.bf_check_set_pdl.argtypes = [I32]
    lib.bf_dense_last_error.restype = ctypes.c_char_p
    lib.bf_check_set_gemm.argtypes = [I32, I32]
    lib.bf_gemm_choices.restype = ctypes.c_char_p
    lib.bf_cublas_timings.restype = ctypes.c_char_p
    lib.bf_sm90_configs.restype = ctypes.c_char_p
    for f in ("bf_check_dense", "bf_check_dense_fp8", "bf_check_layernorm", "bf_check_set_algo_rank",
              "bf_check_set_workspace_mb", "bf_check_unsupported_mask", "bf_check_bias_act",
              "bf_check_set_pdl", "bf_check_set_gemm"):
        getattr(lib, f).restype = I32
    return lib


def ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def checked(lib, rc: int) -> None:
    if rc != 0:
        raise RuntimeError(lib.bf_dense_last_error().decode())


def e4m3(t: torch.Tensor, scale: float) -> torch.Tensor:
    """What the kernels do: t * (1 / scale) in fp32 (scale rounded to fp32 first, as ctypes
    passes it, the reciprocal rounded once), saturated to +-448, rounded to e4m3."""
    inv = float(np.float32(1.0) / np.float32(scale))
    return (t.float() * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def ref64(x, w, bias, skip, gamma, beta, kind: int, approximate: int) -> np.ndarray:
    """float64 reference on the host from the (fp16 or dequantized) inputs."""
    f = lambda t: t.double().cpu().numpy()  # noqa: E731
    y = f(x) @ f(w) + f(bias)
    if kind == GELU and approximate:
        y = 0.5 * y * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (y + 0.044715 * y ** 3)))
    elif kind == GELU:
        y = 0.5 * y * (1.0 + torch.from_numpy(y / np.sqrt(2.0)).erf().numpy())
    elif kind == SLN:
        s = y + f(skip)
        mu = s.mean(-1, keepdims=True)
        var = ((s - mu) ** 2).mean(-1, keepdims=True)
        y = (s - mu) / np.sqrt(var + EPS) * f(gamma) + f(beta)
    return y


def diff(y: torch.Tensor, ref: np.ndarray, loose: float = 1.0) -> tuple[float, float, bool]:
    """max/mean |y - ref| and whether they pass the gate (scaled by `loose`); NaN never passes."""
    y64 = y.double().cpu().numpy()
    d = np.abs(y64 - ref)
    mx, mean = float(d.max()), float(d.mean())
    ok = bool(np.isfinite(y64).all()) and mx <= GATE_MAX * loose and mean <= GATE_MEAN * loose
    return mx, mean, ok


def time_us(fn, reps: int, iters: int, s: torch.cuda.Stream) -> float | str:
    """Median per-call GPU time: a CUDA graph of `reps` calls, replayed `iters` times."""
    try:
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(reps):
                fn()
        times = []
        with torch.cuda.stream(s):
            for _ in range(10):
                g.replay()
            for _ in range(iters):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(s)
                g.replay()
                b.record(s)
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3 / reps)
        return round(float(np.median(times)), 2)
    except Exception as exc:  # a failed capture is a result, not a crash
        return f"error: {str(exc).splitlines()[0][:100]}"


def checked_row(row: dict, fn, y: torch.Tensor, ref: np.ndarray, args, s, loose: float = 1.0) -> dict:
    """One call into y (NaN-filled first) checked against ref, then timed."""
    try:
        with torch.cuda.stream(s):
            y.fill_(float("nan"))
            fn()
        s.synchronize()
        row["max_diff"], row["mean_diff"], row["gate"] = diff(y, ref, loose)
    except RuntimeError as exc:
        row.update(gate=False, error=str(exc))
    row["us"] = time_us(fn, args.reps, args.iters, s)
    return row


def cells(r: dict) -> list[str]:
    """max diff, mean diff (FP8: also against the true product), gate."""
    if "max_diff" not in r:
        return ["", "", r.get("error", "")]
    mean = f"{r['mean_diff']:.3g}"
    if "max_diff_vs_fp64" in r:
        mean += f" (vs fp64: max {r['max_diff_vs_fp64']:.3g}, mean {r['mean_diff_vs_fp64']:.3g})"
    return [f"{r['max_diff']:.3g}", mean, "ok" if r["gate"] else "FAIL"]


def _best(rows: list[dict], pred) -> tuple[str, float | str]:
    timed = [r for r in rows if pred(r["impl"]) and isinstance(r["us"], float)]
    if not timed:
        return "", ""
    r = min(timed, key=lambda r: r["us"])
    return r["impl"], r["us"]


def summary(rows: list[dict]) -> None:
    """One line per (workload, GEMM): the full table is in kernels_gemm.md."""
    print("| workload | gemm | bertfuse v0 us | fastest bertfuse | fastest torch | torch mm floor | "
          "fp8 fa0 / fa1 / no-quantize / chain us | fp8 fa0 mean diff vs fp64 | v0 max / mean diff | gate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    keys = dict.fromkeys((r["workload"], r["gemm"]) for r in rows)
    for wl, gemm in keys:
        rs = [r for r in rows if r["workload"] == wl and r["gemm"] == gemm]
        by = {r["impl"]: r for r in rs}
        v0 = by.get("bertfuse v0", {})
        bb = _best(rs, lambda i: i.startswith("bertfuse v") and "workspace" not in i)
        bt = _best(rs, lambda i: i.startswith("torch") and "alone" not in i and "floor" not in i
                   and "_scaled_mm" not in i)
        fp8 = " / ".join(str(by.get(k, {}).get("us", "")) + (" (unused)" if "note" in by.get(k, {})
                                                              else "") for k in (
            "bertfuse fp8 fast_accum=0", "bertfuse fp8 fast_accum=1",
            "bertfuse fp8 without the quantize (X pre-quantized)", "bertfuse fp8, X e4m3 in, Yq e4m3 out"))
        fa0 = by.get("bertfuse fp8 fast_accum=0", {})
        fa0_mean = f"{fa0['mean_diff_vs_fp64']:.3g}" if "mean_diff_vs_fp64" in fa0 else ""
        diffs = f"{v0['max_diff']:.3g} / {v0['mean_diff']:.3g}" if "max_diff" in v0 else v0.get("error", "")
        gates = [r["gate"] for r in rs if r["impl"].startswith("bertfuse") and "gate" in r]
        print(f"| {wl} | {gemm} | {v0.get('us', '')} | {bb[1]} ({bb[0]}) | {bt[1]} ({bt[0]}) | "
              f"{by.get('torch mm (GEMM floor)', {}).get('us', '')} | {fp8} | {fa0_mean} | {diffs} | "
              f"{'ok' if gates and all(gates) else 'FAIL'} |")
