"""Packed-path kernels on the GPU (PackTokens, UnpackTokens, PackedBertAttention): parity against
the float64/NumPy references in bertfuse/ops/bertfuse/packed_ops.py, then timing against the padded
BertAttention kernel on the same real tokens, torch SDPA (padded, key mask) and torch's varlen
flash attention, and device packing against the host's NumPy packing. No ONNX Runtime needed.

    python3 benchmarks/kernels/kernels_packed.py                  # nvcc-builds the four .cu files in a temp dir
    python3 benchmarks/kernels/kernels_packed.py --lib build/libbertfuse_ops.so

Gates: PackTokens and UnpackTokens exactly equal to the reference (every output element written:
outputs start as NaN / 0xFF bytes); PackedBertAttention max |diff| <= 4e-2, mean <= 2e-3, filler
rows exactly 0, no NaN. Times are per call from CUDA-graph replays (see kernels_attention.py).
Writes $OUT/kernels_packed.json (or --out) and prints the tables last. Exit 0 when every check
passes, 1 when one fails, 2 on bad arguments or a missing GPU/tool.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from kernels_attention import GATE_MAX, GATE_MEAN, Unavailable, check_paths, kernel_us, nvcc_path, time_us, \
    torch_baselines

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bertfuse.bench.workloads import PACKED_WORKLOADS  # noqa: E402
from bertfuse.ops.bertfuse import packed_ops  # noqa: E402
from bertfuse.ops.packing_layout import choose_shape, pack_into, packed_shapes  # noqa: E402
from bertfuse.io.safety import handle_signals, temp_dir, write_text  # noqa: E402

CSRC = ROOT / "bertfuse" / "kernels" / "csrc"
SOURCES = [CSRC / "packed_attention.cu", CSRC / "pack.cu", CSRC / "attention.cu", CSRC / "attention_general.cu"]


def build(tmp: Path, arch: str) -> Path:
    lib = tmp / "libbf_packed.so"
    cmd = [nvcc_path(), "-O3", "-std=c++17", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden",
           "-o", str(lib), *map(str, SOURCES)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Unavailable("nvcc failed:\n" + proc.stderr[-4000:])
    return lib


def load(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib))
    u, i, f = ctypes.c_uint64, ctypes.c_int, ctypes.c_float
    for name, args in (("bf_check_packed_attention", [u, u, i, i, i, i, i, f, u, u, i]),
                       ("bf_check_pack_tokens", [u, i, i, i, u, u, u, u]),
                       ("bf_check_unpack_tokens", [u, i, u, i, i, ctypes.c_longlong, u, u]),
                       ("bf_check_attention_warps", [u, u, i, i, i, i, i, f, u, u, i])):
        getattr(dll, name).argtypes, getattr(dll, name).restype = args, i
    dll.bf_packed_attention_unsupported.argtypes = [i, i, i, i, i]
    dll.bf_packed_attention_unsupported.restype = ctypes.c_char_p
    return dll


def _ok(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} returned {rc}")


def _error(fn) -> str | None:
    """Runs a launcher; the refusal or CUDA error as a string (a failed check, not a crash)."""
    try:
        fn()
    except RuntimeError as exc:
        return str(exc)
    return None


def lengths_mask(lens: np.ndarray, b: int, s: int) -> np.ndarray:
    """[b, s] right-padded int32 mask; rows past len(lens) are empty (a smaller request)."""
    mask = np.zeros((b, s), np.int32)
    mask[:len(lens)] = np.arange(s)[None, :] < np.asarray(lens)[:, None]
    return mask


# ---- launchers (torch tensors in, device work queued on torch's current stream) ---------------

def stream(torch) -> int:
    return torch.cuda.current_stream().cuda_stream


def pack_call(dll, torch, mask, tokens: int, index, slot, cu):
    b, s = mask.shape
    return lambda: _ok(dll.bf_check_pack_tokens(mask.data_ptr(), b, s, tokens, index.data_ptr(), slot.data_ptr(),
                                                cu.data_ptr(), stream(torch)), "bf_check_pack_tokens")


def unpack_call(dll, torch, packed, slot, out):
    t, row_bytes = packed.shape[0], packed.shape[1] * packed.element_size()
    b, s = slot.shape
    return lambda: _ok(dll.bf_check_unpack_tokens(packed.data_ptr(), t, slot.data_ptr(), b, s, row_bytes,
                                                  out.data_ptr(), stream(torch)), "bf_check_unpack_tokens")


def packed_call(dll, torch, qkv, cu, s_max: int, heads: int, scale: float, out, warps: int = 0):
    t, r = qkv.shape[0], cu.shape[0] - 1
    return lambda: _ok(dll.bf_check_packed_attention(qkv.data_ptr(), cu.data_ptr(), t, r, s_max, heads, 64, scale,
                                                     out.data_ptr(), stream(torch), warps),
                       "bf_check_packed_attention")


def padded_call(dll, torch, qkv, lens, heads: int, out):
    b, s, _ = qkv.shape
    return lambda: _ok(dll.bf_check_attention_warps(qkv.data_ptr(), lens.data_ptr(), 1, b, s, heads, 64, 0.0,
                                                    out.data_ptr(), stream(torch), 0), "bf_check_attention")


def varlen_call(torch, qkv_real, cu_real, max_len: int, heads: int):
    """torch's flash attention on packed tokens (aten._flash_attention_forward with cu_seqlens);
    None when this torch build has no such kernel."""
    t = qkv_real.shape[0]
    q, k, v = qkv_real.view(t, 3, heads, 64).unbind(1)
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is None:
        return None

    def call():
        return op(q, k, v, cu_real, cu_real, max_len, max_len, 0.0, False, False, scale=0.125)[0]
    try:
        call()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the private op's signature moves between releases
        print(f"kernels_packed: torch varlen flash attention unavailable ({str(exc).splitlines()[0]})",
              file=sys.stderr)
        return None
    return call


# ---- checks ----------------------------------------------------------------------------------

def pack_cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray, int]]:
    b20 = lengths_mask(rng.integers(8, 65, 20), 20, 64)
    real = int(b20.sum())
    holes = b20.copy()
    holes[rng.random(holes.shape) < 0.1] = 0
    holes[15:] = 0  # a 15-row request in a 20-row bucket
    big = lengths_mask(rng.integers(1, 129, 64), 64, 128)
    odd = lengths_mask(rng.integers(0, 1501, 3), 3, 1500)
    return [("b20 s64 uniform, T = kept", b20, real),
            ("b20 s64 uniform, bucket T", b20, choose_shape(packed_shapes(20, 64), 20, real).tokens),
            ("b20 s64 uniform, T < kept (cut)", b20, real - 37),
            ("b20 s64 holes + empty rows", holes, int(holes.sum()) + 50),
            ("b32 s128 skewed", lengths_mask(PACKED_WORKLOADS["skewed b32 s128"][3](rng, 32, 128), 32, 128), 1400),
            ("b64 s128 (2 scan tiles)", big, int(big.sum()) + 3),
            ("b3 s1500 (rows straddle threads)", odd, int(odd.sum()) + 1),
            ("b1 s1", np.ones((1, 1), np.int32), 1),
            ("b7 s5 nothing kept", np.zeros((7, 5), np.int32), 3)]


def check_pack(dll, torch, rng) -> list[dict]:
    rows = []
    for label, mask_np, tokens in pack_cases(rng):
        b, s = mask_np.shape
        mask = torch.from_numpy(mask_np).cuda()
        index = torch.full((tokens,), -7, dtype=torch.int32, device="cuda")
        slot = torch.full((b, s), -7, dtype=torch.int32, device="cuda")
        cu = torch.full((b + 1,), -7, dtype=torch.int32, device="cuda")
        row = {"op": "PackTokens", "case": label, "B": b, "S": s, "T": tokens, "kept": int(mask_np.sum())}
        err = _error(pack_call(dll, torch, mask, tokens, index, slot, cu))
        if err:
            rows.append({**row, "error": err, "ok": False})
            continue
        got = [x.cpu().numpy() for x in (index, slot, cu)]
        want = packed_ops.pack_tokens(mask_np, tokens)
        bad = [n for n, g, w in zip(("token_index", "token_slot", "cu_seqlens"), got, want) if not np.array_equal(g, w)]
        rows.append({**row, "mismatch": bad, "ok": not bad})
    return rows


def check_unpack(dll, torch, rng) -> list[dict]:
    rows = []
    for label, b, s, hidden, dtype in (("b20 s64 H768 f16", 20, 64, 768, np.float16),
                                       ("b32 s128 H1024 f16", 32, 128, 1024, np.float16),
                                       ("b20 s64 H3 f16 (byte path)", 20, 64, 3, np.float16),
                                       ("b20 s64 H768 f32", 20, 64, 768, np.float32)):
        mask_np = lengths_mask(rng.integers(1, s + 1, b - 2), b, s)
        tokens = int(mask_np.sum()) + 11
        _, slot_np, _ = packed_ops.pack_tokens(mask_np, tokens)
        packed_np = rng.standard_normal((tokens, hidden)).astype(dtype)
        packed = torch.from_numpy(packed_np).cuda()
        slot = torch.from_numpy(slot_np).cuda()
        out = torch.full((b, s, hidden), float("nan"), dtype=packed.dtype, device="cuda")
        row = {"op": "UnpackTokens", "case": label, "B": b, "S": s, "T": tokens, "H": hidden}
        err = _error(unpack_call(dll, torch, packed, slot, out))
        if err:
            rows.append({**row, "error": err, "ok": False})
            continue
        ok = np.array_equal(out.cpu().numpy(), packed_ops.unpack_tokens(packed_np, slot_np))  # NaN never equal
        rows.append({**row, "ok": bool(ok)})
    return rows


def attention_cases(rng) -> list[tuple]:
    """(label, mask [R,S] of the sequences, T, cu override or None, heads, scale)."""
    uni = lengths_mask(rng.integers(8, 65, 20), 20, 64)
    real = int(uni.sum())
    shape = choose_shape(packed_shapes(20, 64), 20, real)
    layout = pack_into(uni, shape)  # the --packed form's layout: filler rows are sequences
    cases = [("b20 s64 uniform, T = kept", uni, real, None, 12, 0.0),
             ("b20 s64 uniform, bucket T (filler zeroed)", uni, shape.tokens, None, 12, 0.0),
             ("b20 s64 13-row request (empty sequences)", lengths_mask(rng.integers(8, 65, 13), 20, 64),
              real, None, 12, 0.0),
             ("b20 s64 packing_layout cu (filler sequences)", np.zeros((shape.rows, 64), np.int32), shape.tokens,
              layout["cumulative_sequence_length"], 12, 0.0),
             ("b20 s64 h16 scale 0.2", uni, real + 5, None, 16, 0.2)]
    for b, s in ((1, 1), (32, 7), (32, 16), (4, 100), (32, 128), (1, 128)):
        m = lengths_mask(np.maximum(rng.integers(0, s + 1, b), b == 1), b, s)
        cases.append((f"b{b} s{s} random lengths", m, int(m.sum()) + 2, None, 12, 0.0))
    return cases


def check_attention(dll, torch, rng) -> list[dict]:
    rows = []
    for label, mask_np, tokens, cu_override, heads, scale in attention_cases(rng):
        r, s = mask_np.shape
        _, slot_np, cu_np = packed_ops.pack_tokens(mask_np, tokens)
        if cu_override is not None:
            cu_np = np.asarray(cu_override, np.int32)
        qkv_np = (rng.standard_normal((tokens, 3 * heads * 64)) * 1.5).astype(np.float16)
        ref = packed_ops.packed_bert_attention(qkv_np.astype(np.float64), slot_np, cu_np, num_heads=heads,
                                               scale=scale or None)
        qkv, cu = torch.from_numpy(qkv_np).cuda(), torch.from_numpy(cu_np).cuda()
        filler = np.ones(tokens, bool)
        for a, e in zip(cu_np[:-1], cu_np[1:]):
            filler[a:e] = False
        for warps in (0, 1, 2, 4):
            out = torch.full((tokens, heads * 64), float("nan"), dtype=torch.float16, device="cuda")
            row = {"op": "PackedBertAttention", "case": label, "R": r, "S": s, "T": tokens, "heads": heads,
                   "warps": warps}
            err = _error(packed_call(dll, torch, qkv, cu, s, heads, scale, out, warps))
            if err:
                rows.append({**row, "error": err, "ok": False})
                continue
            got = out.cpu().numpy().astype(np.float64)
            diff = np.abs(got - ref)
            mx, mean = float(np.max(diff)), float(np.mean(diff))
            filler_zero = bool(np.all(got[filler] == 0.0))
            rows.append({**row, "max_abs": mx, "mean_abs": mean, "filler_zero": filler_zero,
                         "ok": bool(mx <= GATE_MAX and mean <= GATE_MEAN and filler_zero)})
        if cu_override is None and heads == 12 and scale == 0.0 and rows[-1]["ok"]:  # padded kernel, same tokens
            rows[-1]["vs_padded_kernel_max_abs"] = vs_padded(dll, torch, qkv, mask_np, slot_np, out, heads)
    return rows


def vs_padded(dll, torch, qkv, mask_np, slot_np, packed_out, heads: int) -> float:
    """max |packed - padded BertAttention (raw mask)| at the kept positions, both from the GPU."""
    r, s = mask_np.shape
    slot = torch.from_numpy(slot_np).cuda().long()
    keep = slot >= 0
    pad = torch.zeros((r, s, qkv.shape[1]), dtype=qkv.dtype, device="cuda")
    pad[keep] = qkv[slot[keep]]
    mask = torch.from_numpy(mask_np).cuda()
    out = torch.empty((r, s, heads * 64), dtype=qkv.dtype, device="cuda")
    _ok(dll.bf_check_attention_warps(pad.data_ptr(), mask.data_ptr(), 2, r, s, heads, 64, 0.0, out.data_ptr(),
                                     stream(torch), 0), "bf_check_attention")
    torch.cuda.synchronize()
    return float((out[keep].float() - packed_out[slot[keep]].float()).abs().max())


# ---- timings ---------------------------------------------------------------------------------

def timing_cases(rng) -> list[tuple[str, np.ndarray]]:
    uni = PACKED_WORKLOADS["uniform [8,64] b20 s64"]
    skew = PACKED_WORKLOADS["skewed b32 s128"]
    return [("uniform [8,64] b20 s64", lengths_mask(uni[3](rng, 20, 64), 20, 64)),
            ("b20 s64 all full", np.ones((20, 64), np.int32)),
            ("skewed b32 s128", lengths_mask(skew[3](rng, 32, 128), 32, 128)),
            ("base b1 s128 full", np.ones((1, 128), np.int32))]


def host_pack_us(mask: np.ndarray, shape, reps: int = 200) -> float:
    out = pack_into(mask, shape)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pack_into(mask, shape, out=out)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def time_all(args, dll, torch, rng) -> list[dict]:
    heads, hidden = 12, 768
    rows = []
    for label, mask_np in timing_cases(rng):
        b, s = mask_np.shape
        real = int(mask_np.sum())
        shape = choose_shape(packed_shapes(b, s), b, real)
        tokens = shape.tokens
        _, slot_np, cu_np = packed_ops.pack_tokens(mask_np, tokens)
        qkv = (torch.randn((tokens, 3 * hidden), device="cuda") * 1.5).half()
        cu, slot = torch.from_numpy(cu_np).cuda(), torch.from_numpy(slot_np).cuda()
        keep = slot >= 0
        qkv_pad = torch.zeros((b, s, 3 * hidden), dtype=torch.float16, device="cuda")
        qkv_pad[keep] = qkv[slot[keep].long()]
        lens = torch.from_numpy(mask_np.sum(1).astype(np.int32)).cuda()
        out_t = torch.empty((tokens, hidden), dtype=torch.float16, device="cuda")
        out_p = torch.empty((b, s, hidden), dtype=torch.float16, device="cuda")
        row = {"case": label, "B": b, "S": s, "kept": real, "fill": round(real / (b * s), 2), "T": tokens}
        t = lambda fn: time_us(torch, fn, args.iters, args.graph_calls)  # noqa: E731
        for warps in (0, 1, 2, 4):
            row[f"packed_w{warps}_us"] = t(packed_call(dll, torch, qkv, cu, s, heads, 0.0, out_t, warps))
        padded = padded_call(dll, torch, qkv_pad, lens, heads, out_p)
        row["padded_us"] = t(padded)
        row["sdpa_padded_us"] = t(torch_baselines(torch, qkv_pad, torch.from_numpy(mask_np).cuda(), heads, 0.125)[0])
        varlen = varlen_call(torch, qkv[:real], cu, s, heads)
        row["torch_varlen_us"] = None if varlen is None else t(varlen)
        row["packed_kernel_us"] = kernel_us(torch, packed_call(dll, torch, qkv, cu, s, heads, 0.0, out_t))
        row["padded_kernel_us"] = kernel_us(torch, padded)
        mask = torch.from_numpy(mask_np).cuda()
        idx_t, slot_t, cu_t = torch.empty(tokens, dtype=torch.int32, device="cuda"), torch.empty_like(slot), \
            torch.empty_like(cu)
        row["pack_tokens_us"] = t(pack_call(dll, torch, mask, tokens, idx_t, slot_t, cu_t))
        hid = torch.randn((tokens, hidden), device="cuda").half()
        row["unpack_tokens_us"] = t(unpack_call(dll, torch, hid, slot, out_p))
        row["host_pack_into_us"] = host_pack_us(mask_np, shape)
        rows.append(row)
    return rows


def print_tables(log: dict) -> None:
    def us(v) -> str:
        return "-" if v is None else f"{v:.2f}"
    print(f"device: {log['device']}, torch {log['torch']}")
    print("| op | case | result |")
    print("|---|---|---|")
    for c in log["checks"]:
        if "error" in c:
            res = c["error"]
        elif c["op"] == "PackedBertAttention":
            res = (f"w{c['warps']} max {c['max_abs']:.2e} mean {c['mean_abs']:.2e} filler "
                   f"{'0' if c['filler_zero'] else 'NOT 0'}")
            if "vs_padded_kernel_max_abs" in c:
                res += f", vs padded kernel {c['vs_padded_kernel_max_abs']:.2e}"
        else:
            res = "exact" if c["ok"] else f"MISMATCH {c.get('mismatch', '')}"
        print(f"| {c['op']} | {c['case']} | {res} {'ok' if c['ok'] else 'FAIL'} |")
    for u in log["unsupported"]:
        print(f"unsupported {u['case']}: {'refused: ' + u['reason'] if u['refused'] else 'NOT refused (FAIL)'}")
    print("\nus per call, CUDA-graph replay (profiler kernel time); host pack_into is NumPy on the host")
    print("| case | fill | T | packed auto | w1/w2/w4 | padded bertfuse | torch SDPA padded | torch varlen | "
          "PackTokens | UnpackTokens | host pack_into |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in log["timings"]:
        print(f"| {r['case']} | {r['fill']} | {r['T']} | {us(r['packed_w0_us'])} ({us(r['packed_kernel_us'])}) | "
              f"{us(r['packed_w1_us'])}/{us(r['packed_w2_us'])}/{us(r['packed_w4_us'])} | "
              f"{us(r['padded_us'])} ({us(r['padded_kernel_us'])}) | {us(r['sdpa_padded_us'])} | "
              f"{us(r['torch_varlen_us'])} | {us(r['pack_tokens_us'])} | {us(r['unpack_tokens_us'])} | "
              f"{us(r['host_pack_into_us'])} |")
    bad = [c for c in log["checks"] + log["unsupported"] if not c["ok"]]
    print(f"\n{len(bad)} failing checks" if bad else "\nall checks pass")


UNSUPPORTED = [("head size 32", 64, 2, 64, 24, 32), ("S_max 129", 64, 2, 129, 12, 64), ("T 0", 0, 2, 64, 12, 64)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, help="a built library exporting the bf_check_* entry points "
                                             "(default: nvcc-build the four .cu files)")
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
        raise Unavailable(f"the kernels need sm_80 or newer, this GPU is sm_{major}{minor}")
    rng = np.random.default_rng(args.seed)
    with temp_dir(prefix="bf-packed-") as tmp:
        dll = load(args.lib or build(tmp, args.arch or f"sm_{major}{minor}"))
        log = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "checks": check_pack(dll, torch, rng) + check_unpack(dll, torch, rng)
               + check_attention(dll, torch, rng), "unsupported": []}
        for label, t, r, s, heads, d in UNSUPPORTED:
            why = dll.bf_packed_attention_unsupported(t, r, s, heads, d)
            log["unsupported"].append({"case": label, "refused": why is not None,
                                       "reason": why.decode() if why else None, "ok": why is not None})
        log["timings"] = time_all(args, dll, torch, rng)
    log["library"] = str(args.lib) if args.lib else "nvcc " + " ".join(p.name for p in SOURCES) + " (temp build)"
    write_text(args.out / "kernels_packed.json", json.dumps(log, indent=1))
    print_tables(log)
    return 0 if all(c["ok"] for c in log["checks"] + log["unsupported"]) else 1


if __name__ == "__main__":
    try:
        with handle_signals():
            sys.exit(main())
    except Unavailable as exc:
        print(f"kernels_packed: {exc}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as exc:  # a launch refused or failed: a failed run, one line
        print(f"kernels_packed: {exc}", file=sys.stderr)
        sys.exit(1)
