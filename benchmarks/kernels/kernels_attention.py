"""BertAttention CUDA kernel on the GPU: parity against a float64 NumPy reference, then timing
against torch SDPA (same key mask) and a naive torch attention. No ONNX Runtime needed.

    python3 benchmarks/kernels/kernels_attention.py                 # nvcc-builds csrc/attention{,_tiled,_general}.cu in a temp dir
    python3 benchmarks/kernels/kernels_attention.py --lib build/libbertfuse_ops.so

Gate per case: max |diff| <= 4e-2 and mean |diff| <= 2e-3 against the reference, no NaN.
Times are per call, from CUDA-graph replays of --graph-calls back-to-back calls (CUDA events,
median of --iters replays after warm-up), so host launch cost is not in them; the profiler's summed
kernel time per call (CUPTI via torch.profiler) is shown beside them where available. Writes
$OUT/kernels_attention.json (or --out) and prints the tables last. Exit 0 when every check
passes, 1 when one fails, 2 on bad arguments or a missing GPU/tool.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
try:
    from bertfuse.io.safety import handle_signals, temp_dir, write_text
except ImportError:  # run from a checkout without bertfuse installed
    sys.path.insert(0, str(ROOT))
    from bertfuse.io.safety import handle_signals, temp_dir, write_text

CSRC = ROOT / "bertfuse" / "kernels" / "csrc"
SOURCES = [CSRC / "attention.cu", CSRC / "attention_tiled.cu", CSRC / "attention_general.cu",  # the op's paths
           # the check entry points (and the packing kernels they also wrap), the e4m3 quantize
           # pass the op falls back to, and the switches (config.cc)
           CSRC / "check_attention.cu", CSRC / "packed_attention.cu", CSRC / "pack.cu",
           CSRC / "bias_act.cu", CSRC / "config.cc"]
MASK_FILTER = -10000.0
GATE_MAX, GATE_MEAN = 4e-2, 2e-3


class Unavailable(Exception):
    """No GPU, no nvcc, no library: one line, exit 2."""


# ---- library -------------------------------------------------------------------------------

def nvcc_path() -> str:
    for cand in (os.environ.get("CUDA_HOME", "") + "/bin/nvcc", "/usr/local/cuda/bin/nvcc", shutil.which("nvcc")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise Unavailable("nvcc not found (set CUDA_HOME or put nvcc on PATH), or pass --lib")


def build(tmp: Path, arch: str) -> Path:
    from gemm_harness import cublas_root  # imports torch: only where a GPU build runs

    root = Path(cublas_root())
    libdir = next(d for d in (root / "lib64", root / "lib") if d.is_dir())
    lt = "cublasLt" if (libdir / "libcublasLt.so").exists() else ":libcublasLt.so.13"
    lib = tmp / "libbf_attention.so"
    cmd = [nvcc_path(), "-O3", "-std=c++17", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden",
           "-I", str(root / "include"), "-o", str(lib), *map(str, SOURCES), "-L", str(libdir), f"-l{lt}",
           "-Xlinker", f"-rpath,{libdir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Unavailable("nvcc failed:\n" + proc.stderr[-4000:])
    return lib


def load(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib))
    u, i = ctypes.c_uint64, ctypes.c_int
    dll.bf_check_attention_config.argtypes = [u, u, i, i, i, i, i, ctypes.c_float, u, u, i, i]
    dll.bf_check_attention_config.restype = i
    dll.bf_check_attention_split.argtypes = [u, u, i, i, i, i, i, ctypes.c_float, u, u, i]
    dll.bf_check_attention_split.restype = i
    dll.bf_attention_unsupported.argtypes = [i, i, i, i, i]
    dll.bf_attention_unsupported.restype = ctypes.c_char_p
    return dll


# ---- inputs and reference -------------------------------------------------------------------

def make_case(rng: np.random.Generator, b: int, s: int, heads: int, mask_kind: str, all_masked_row: bool):
    """qkv [B,S,3H] fp16 and the mask (None, int32 [B,S] raw 0/1 or int32 [B] key lengths)."""
    qkv = (rng.standard_normal((b, s, 3 * heads * 64)) * 1.5).astype(np.float16)
    lens = rng.integers(1, s + 1, size=b).astype(np.int32)
    lens[0] = s  # one full row
    if all_masked_row:
        lens[-1] = 0
    if mask_kind == "none":
        return qkv, None
    if mask_kind == "keylen":
        return qkv, lens
    raw = (np.arange(s)[None, :] < lens[:, None]).astype(np.int32)
    if s > 4:  # padding in the middle of some rows too (TF takes input_mask as given)
        holes = rng.random((b, s)) < 0.1
        raw[holes & (np.arange(b)[:, None] % 3 == 1)] = 0
    return qkv, raw


def keep_mask(mask: np.ndarray | None, b: int, s: int) -> np.ndarray:
    if mask is None:
        return np.ones((b, s), bool)
    if mask.ndim == 1:
        return np.arange(s)[None, :] < mask[:, None]
    return mask > 0


def reference(qkv: np.ndarray, mask: np.ndarray | None, heads: int, scale: float) -> np.ndarray:
    b, s, h3 = qkv.shape
    h = h3 // 3
    x = qkv.astype(np.float64).reshape(b, s, 3, heads, h // heads).transpose(2, 0, 3, 1, 4)  # [3,B,N,S,D]
    scores = x[0] @ x[1].transpose(0, 1, 3, 2) * scale
    scores += np.where(keep_mask(mask, b, s), 0.0, MASK_FILTER)[:, None, None, :]
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return (p @ x[2]).transpose(0, 2, 1, 3).reshape(b, s, h)


# ---- torch side ------------------------------------------------------------------------------

SPLIT = -2  # in a config's passes: each query tile's keys split between two warps


def config_name(warps: int, passes: int) -> str:
    return f"w{warps}s" if passes == SPLIT else f"w{warps}p{passes}"


def launcher(dll, torch, qkv, mask, heads: int, scale: float, out, config: tuple[int, int]):
    """config: (warps per CTA, passes per warp); (0, 0) is what the op picks; (W, SPLIT) the
    keys-split kernel with W query tiles (2W warps) per CTA."""
    mask_ptr = 0 if mask is None else mask.data_ptr()
    rank = 0 if mask is None else mask.dim()
    b, s, _ = qkv.shape
    warps, passes = config

    def call():
        stream = torch.cuda.current_stream().cuda_stream
        if passes == SPLIT:
            rc = dll.bf_check_attention_split(qkv.data_ptr(), mask_ptr, rank, b, s, heads, 64, scale,
                                              out.data_ptr(), stream, warps)
        else:
            rc = dll.bf_check_attention_config(qkv.data_ptr(), mask_ptr, rank, b, s, heads, 64, scale,
                                               out.data_ptr(), stream, warps, passes)
        if rc != 0:
            raise RuntimeError(f"bf_check_attention returned {rc}")
    return call


def torch_baselines(torch, qkv, mask, heads: int, scale: float):
    """(sdpa, naive) callables producing [B,S,H] from qkv [B,S,3H], with the same additive mask."""
    import torch.nn.functional as F

    b, s, h3 = qkv.shape
    keep = torch.from_numpy(keep_mask(None if mask is None else mask.cpu().numpy(), b, s)).cuda()
    add = torch.where(keep, 0.0, MASK_FILTER).to(qkv.dtype)[:, None, None, :] if mask is not None else None
    add32 = None if add is None else add.float()

    def heads_of():
        return qkv.view(b, s, 3, heads, h3 // 3 // heads).permute(2, 0, 3, 1, 4)  # [3,B,N,S,D] view

    def sdpa():
        q, k, v = heads_of()
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=scale)
        return o.transpose(1, 2).reshape(b, s, h3 // 3)

    def naive():
        q, k, v = heads_of()
        sc = torch.matmul(q, k.transpose(-1, -2)).float() * scale
        if add32 is not None:
            sc = sc + add32
        p = torch.softmax(sc, -1).to(qkv.dtype)
        return torch.matmul(p, v).transpose(1, 2).reshape(b, s, h3 // 3)
    return sdpa, naive


def kernel_us(torch, fn, calls: int = 50) -> float | None:
    """Summed GPU kernel time per call from torch's profiler (CUPTI; sees ctypes launches too).
    None when the profiler gives no kernel events here."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        total = sum(e.time_range.elapsed_us() for e in prof.events()
                    if getattr(e.device_type, "name", "") == "CUDA")
        return total / calls if total > 0 else None
    except Exception as exc:  # the profiler's API moves between torch releases: report, go on
        print(f"kernel_us: profiler unavailable ({exc})", file=sys.stderr)
        return None


def time_us(torch, fn, iters: int, calls: int) -> float:
    """Median per-call GPU time of `calls` back-to-back calls replayed from one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up (also lets torch pick its kernels before capture)
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for st, en in zip(starts, ends):
        st.record()
        graph.replay()
        en.record()
    torch.cuda.synchronize()
    return float(np.median([st.elapsed_time(en) for st, en in zip(starts, ends)])) * 1000.0 / calls


# ---- the run ---------------------------------------------------------------------------------

CHECKS = [  # (label, B, S, heads, mask kind, all-masked row, scale)
    ("b20 s64 raw", 20, 64, 12, "raw", False, 0.0),
    ("b20 s64 keylen", 20, 64, 12, "keylen", False, 0.0),
    ("b20 s64 nomask", 20, 64, 12, "none", False, 0.0),
    ("b20 s64 raw all-masked row", 20, 64, 12, "raw", True, 0.0),
    ("b20 s64 keylen len0 row", 20, 64, 12, "keylen", True, 0.0),
    ("b20 s64 raw scale0.2", 20, 64, 12, "raw", False, 0.2),
    *[(f"b{b} s{s} raw", b, s, 12, "raw", b > 1, 0.0) for b in (1, 32) for s in (1, 7, 64, 100, 128)],
    *[(f"b{b} s{s} keylen", b, s, 12, "keylen", False, 0.0) for b in (1, 32) for s in (7, 100)],
    ("b3 s128 h16 raw", 3, 128, 16, "raw", True, 0.0),
    # the keys-split kernel's edges: one real key in the second half (S = 17, 33, 65, 97)
    *[(f"b{b} s{s} raw", b, s, 12, "raw", b > 1, 0.0) for b in (1, 4) for s in (17, 33, 65, 97)],
]
TIMINGS = [  # (label, B, S, heads, mask kind)
    ("shenma b20 s64 raw", 20, 64, 12, "raw"),
    ("shenma b20 s64 keylen", 20, 64, 12, "keylen"),
    ("shenma b20 s64 nomask", 20, 64, 12, "none"),
    ("base b1 s128 raw", 1, 128, 12, "raw"),
    ("base b32 s128 raw", 32, 128, 12, "raw"),
    ("b8 s128 raw", 8, 128, 12, "raw"),
    ("b16 s128 raw", 16, 128, 12, "raw"),
    ("b32 s100 keylen", 32, 100, 12, "keylen"),
    # few CTAs, where the keys-split kernel may pay
    ("b1 s32 raw", 1, 32, 12, "raw"),
    ("b1 s64 raw", 1, 64, 12, "raw"),
    ("b1 s100 keylen", 1, 100, 12, "keylen"),
    ("b2 s128 raw", 2, 128, 12, "raw"),
    ("b4 s128 raw", 4, 128, 12, "raw"),
    ("b4 s64 raw", 4, 64, 12, "raw"),
    ("b1 s128 h16 raw", 1, 128, 16, "raw"),
]
# (warps per CTA, passes per warp): the op's pick first, then the fixed configurations.
CONFIGS = [(0, 0), (1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (1, SPLIT), (2, SPLIT), (4, SPLIT)]
UNSUPPORTED = [("head size 320", 2, 64, 2, 320, 2), ("mask rank 3", 2, 64, 12, 64, 3), ("S 0", 2, 0, 12, 64, 0)]


def run(args, torch, dll) -> dict:
    rng = np.random.default_rng(args.seed)
    log = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "checks": [], "timings": [],
           "unsupported": []}
    for label, b, s, heads, kind, dead_row, scale in CHECKS:
        qkv_np, mask_np = make_case(rng, b, s, heads, kind, dead_row)
        eff_scale = scale if scale > 0 else 1 / 8
        ref = reference(qkv_np, mask_np, heads, eff_scale)
        qkv = torch.from_numpy(qkv_np).cuda()
        mask = None if mask_np is None else torch.from_numpy(mask_np).cuda()
        for config in CONFIGS:
            if config[1] == SPLIT and s <= 16:  # no key in a second half: the split kernel refuses
                continue
            out = torch.full((b, s, heads * 64), float("nan"), dtype=torch.float16, device="cuda")
            rec = {"case": label, "B": b, "S": s, "heads": heads, "mask": kind, "config": list(config)}
            try:
                launcher(dll, torch, qkv, mask, heads, scale, out, config)()
            except RuntimeError as exc:  # the launcher refused: a failed check, not a crash
                log["checks"].append({**rec, "max_abs": float("nan"), "mean_abs": float("nan"), "ok": False,
                                      "error": str(exc)})
                continue
            torch.cuda.synchronize()
            diff = np.abs(out.cpu().numpy().astype(np.float64) - ref)
            mx, mean = float(np.max(diff)), float(np.mean(diff))  # NaN propagates into both
            log["checks"].append({**rec, "max_abs": mx, "mean_abs": mean,
                                  "ok": bool(mx <= GATE_MAX and mean <= GATE_MEAN)})
        try:  # for scale only: how far torch's own kernel is from the same reference
            sdpa, _ = torch_baselines(torch, qkv, mask, heads, eff_scale)
            log["checks"][-1]["sdpa_max_abs"] = float(np.max(np.abs(sdpa().float().cpu().numpy() - ref)))
        except RuntimeError as exc:
            log["checks"][-1]["sdpa_max_abs"] = f"sdpa failed: {exc}"
    for label, b, s, heads, h_dim, rank in UNSUPPORTED:
        why = dll.bf_attention_unsupported(b, s, heads, h_dim, rank)
        log["unsupported"].append({"case": label, "refused": why is not None,
                                   "reason": why.decode() if why else None, "ok": why is not None})
    for label, b, s, heads, kind in TIMINGS:
        qkv_np, mask_np = make_case(rng, b, s, heads, kind, False)
        qkv = torch.from_numpy(qkv_np).cuda()
        mask = None if mask_np is None else torch.from_numpy(mask_np).cuda()
        out = torch.empty((b, s, heads * 64), dtype=torch.float16, device="cuda")
        row = {"case": label, "B": b, "S": s, "heads": heads, "mask": kind}
        for w, p in CONFIGS:
            call = launcher(dll, torch, qkv, mask, heads, 0.0, out, (w, p))
            row[f"bertfuse_{config_name(w, p)}_us"] = time_us(torch, call, args.iters, args.graph_calls)
        sdpa, naive = torch_baselines(torch, qkv, mask, heads, 1 / 8)
        row["sdpa_us"] = time_us(torch, sdpa, args.iters, args.graph_calls)
        row["naive_us"] = time_us(torch, naive, args.iters, args.graph_calls)
        for name, fn in (("bertfuse", launcher(dll, torch, qkv, mask, heads, 0.0, out, (0, 0))), ("sdpa", sdpa),
                         ("naive", naive)):
            row[f"{name}_kernel_us"] = kernel_us(torch, fn)
        log["timings"].append(row)
    return log


def print_tables(log: dict) -> None:
    print(f"device: {log['device']}, torch {log['torch']}")
    print("| case | max abs | mean abs | ok (" + " / ".join(config_name(w, p) for w, p in CONFIGS)
          + "; w0p0 = the op's pick; wWs: keys split, past S 16) |")  # worst over the configurations
    print("|---|---|---|---|")
    for case in dict.fromkeys(c["case"] for c in log["checks"]):
        rows = [c for c in log["checks"] if c["case"] == case]
        worst = [float("nan") if any(r[k] != r[k] for r in rows) else max(r[k] for r in rows)
                 for k in ("max_abs", "mean_abs")]
        print(f"| {case} | {worst[0]:.2e} | {worst[1]:.2e} | " + "/".join("ok" if r["ok"] else "FAIL" for r in rows)
              + " |")
    for u in log["unsupported"]:
        print(f"unsupported {u['case']}: {'refused: ' + u['reason'] if u['refused'] else 'NOT refused (FAIL)'}")
    def us(v) -> str:
        return "-" if v is None else f"{v:.2f}"
    print("\nus per call: CUDA-graph replay (and profiler kernel time)")
    fixed = CONFIGS[1:]
    print("| case | bertfuse pick | " + " | ".join(config_name(w, p) for w, p in fixed)
          + " | torch SDPA | torch naive |")
    print("|---|---|" + "---|" * len(fixed) + "---|---|")
    for t in log["timings"]:
        print(f"| {t['case']} | {us(t['bertfuse_w0p0_us'])} ({us(t['bertfuse_kernel_us'])}) | "
              + " | ".join(us(t[f"bertfuse_{config_name(w, p)}_us"]) for w, p in fixed)
              + f" | {us(t['sdpa_us'])} ({us(t['sdpa_kernel_us'])}) | {us(t['naive_us'])} ({us(t['naive_kernel_us'])}) |")
    bad = [c for c in log["checks"] + log["unsupported"] if not c["ok"]]
    print(f"\n{len(bad)} failing checks" if bad else "\nall checks pass")


def check_paths(lib: Path | None, out: Path) -> None:
    if lib is not None and not lib.is_file():
        raise Unavailable(f"--lib {lib}: no such file")
    if not out.is_dir():
        raise Unavailable(f"--out {out}: not a directory")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, help="a built library exporting bf_check_attention (default: nvcc-build)")
    ap.add_argument("--arch", default=None, help="nvcc -arch (default: the GPU's, e.g. sm_90)")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--graph-calls", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    if args.iters < 1 or args.graph_calls < 1:
        raise Unavailable("--iters and --graph-calls must be >= 1")
    check_paths(args.lib, args.out)
    try:
        import torch
    except ImportError as exc:
        raise Unavailable(f"torch is needed: {exc}") from None
    if not torch.cuda.is_available():
        raise Unavailable("no CUDA GPU visible to torch")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        raise Unavailable(f"the kernel needs sm_80 or newer, this GPU is sm_{major}{minor}")
    with temp_dir(prefix="bf-attn-") as tmp:
        lib = args.lib or build(tmp, args.arch or f"sm_{major}{minor}")
        log = run(args, torch, load(lib))
    log["library"] = str(args.lib) if args.lib else "nvcc " + " ".join(p.name for p in SOURCES) + " (temp build)"
    write_text(args.out / "kernels_attention.json", json.dumps(log, indent=1))
    print_tables(log)
    return 0 if all(c["ok"] for c in log["checks"] + log["unsupported"]) else 1


if __name__ == "__main__":
    try:
        with handle_signals():
            sys.exit(main())
    except Unavailable as exc:
        print(f"kernels_attention: {exc}", file=sys.stderr)
        sys.exit(2)
