"""Device check and timing of the bertfuse dense ops (GPU host; torch, no ONNX Runtime).

    python3 benchmarks/kernels/kernels_gemm.py [--lib libbertfuse_ops.so] [--out DIR] [--no-fp8]

Without --lib, builds the dense kernels alone (csrc/dense.cu and what it uses, no ORT headers:
gemm_harness.py) with nvcc for the local GPU into a temp dir. Runs every dense op through its ctypes
check entry point on the shenma (M = 1280) and base (M = 128, 4096) GEMM shapes, compares with
a float64 reference (fp16 gate: max <= 4e-2, mean <= 2e-3; FP8 is gated against the float64
product of its own dequantized inputs and its error against the true product is reported),
and times each against torch equivalents: median per call over --iters replays of a CUDA
graph holding --reps calls (so host launch cost is out); with fast FP8 accumulation the FP8
gate is 10x looser. Writes kernels_gemm.json and the full table kernels_gemm.md under --out
($OUT) and prints one summary line per GEMM last. Exit 1 when a gate fails or an op errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from gemm_harness import (BIAS, EPS, GATE_MAX, GATE_MEAN, GELU, SLN, build, cells, checked, checked_row,
                          diff, e4m3, load, ptr, ref64, stream, summary, time_us)

# (name, K, N, kind, approximate)
GEMMS = [("qkv", 768, 2304, BIAS, 0), ("ffn_up erf", 768, 3072, GELU, 0),
         ("ffn_up tanh", 768, 3072, GELU, 1), ("ffn_down+sln", 3072, 768, SLN, 0),
         ("attn_out+sln", 768, 768, SLN, 0)]
WORKLOADS = [("shenma b20 s64", 1280), ("base b1 s128", 128), ("base b32 s128", 4096)]
# Production path first (0), then the alternatives bf_dense_forward measures (DenseVariant, dense.h:
# GELU erf 1 = plain GEMM + bias+GELU kernel, 2 = erff; SkipLayerNorm 1 = bias epilogue, 2 = skip
# as C); the tanh GELU has one path. Programmatic dependent launch is on unless BERTFUSE_PDL=0.
VARIANTS = {BIAS: [0], GELU: [0, 1, 2], SLN: [0, 1, 2]}
ACTS = {"erf, A&S erf (production)": 1, "tanh": 2, "erf, CUDA erff": 3}


def torch_candidates(x, w, bias, skip, gamma, beta, kind, approximate):
    n = w.shape[1]
    gelu = "tanh" if approximate else "none"
    if kind == BIAS:
        return {"torch addmm": lambda: torch.addmm(bias, x, w),
                "torch mm + bias": lambda: torch.mm(x, w) + bias}
    if kind == GELU:
        c = {"torch addmm + gelu": lambda: F.gelu(torch.addmm(bias, x, w), approximate=gelu)}
        if approximate and hasattr(torch, "_addmm_activation"):
            c["torch _addmm_activation(gelu)"] = lambda: torch._addmm_activation(bias, x, w, use_gelu=True)
        return c
    return {"torch addmm + skip + layer_norm":
            lambda: F.layer_norm(torch.addmm(bias, x, w) + skip, (n,), gamma, beta, EPS),
            "torch addmm(skip) + layer_norm":
            lambda: F.layer_norm(torch.addmm(skip, x, w) + bias, (n,), gamma, beta, EPS)}


def run_shape(lib, args, wl: str, M: int, name: str, K: int, N: int, kind: int, approximate: int,
              s: torch.cuda.Stream) -> list[dict]:
    torch.manual_seed(M * 7 + K + N + kind + approximate)
    h = dict(device="cuda", dtype=torch.float16)
    x = torch.randn(M, K, **h) if kind != SLN or K == 768 else F.gelu(torch.randn(M, K, **h))
    w = (torch.randn(K, N, **h) * 0.02)
    bias = torch.randn(N, **h) * 0.1
    skip = torch.randn(M, N, **h) if kind == SLN else None
    gamma = (1 + 0.1 * torch.randn(N, **h)) if kind == SLN else None
    beta = 0.1 * torch.randn(N, **h) if kind == SLN else None
    y = torch.empty(M, N, **h)
    torch.cuda.synchronize()  # the inputs were made on the default stream; the ops run on s
    ref = ref64(x, w, bias, skip, gamma, beta, kind, approximate)
    base = dict(workload=wl, M=M, gemm=name, K=K, N=N)
    rows = []

    def ours(variant: int):
        return lambda: checked(lib, lib.bf_check_dense(ptr(x), ptr(w), ptr(bias), ptr(skip), ptr(gamma),
                                                        ptr(beta), ptr(y), M, N, K, kind, approximate,
                                                        EPS, variant, 0, 1.0, stream()))

    for variant in VARIANTS[kind] if not (kind == GELU and approximate) else [0]:
        rows.append(checked_row(dict(base, impl=f"bertfuse v{variant}", precision="fp16"), ours(variant),
                                y, ref, args, s))
    # Which GEMM runs variant 0: cuBLASLt alone, each sm_90a configuration pinned, then the
    # automatic choice (timed once per shape) that the ORT ops make.
    if not (kind == GELU and approximate):
        configs = json.loads(lib.bf_sm90_configs().decode())
        for mode, cfg, label in [(1, -1, "cuBLASLt"), *((2, c, f"sm90 {n}") for c, n in enumerate(configs)),
                                 (0, -1, "auto")]:
            checked(lib, lib.bf_check_set_gemm(mode, cfg))
            rows.append(checked_row(dict(base, impl=f"bertfuse v0 GEMM {label}", precision="fp16"),
                                    ours(0), y, ref, args, s))
    if kind == SLN or (kind == GELU and not approximate):  # the kernel after the GEMM, no PDL
        checked(lib, lib.bf_check_set_pdl(0))
        rows.append(checked_row(dict(base, impl="bertfuse v0 without PDL", precision="fp16"), ours(0), y,
                                ref, args, s))
        checked(lib, lib.bf_check_set_pdl(int(os.environ.get("BERTFUSE_PDL", "1") != "0")))
    # v0 runs the fastest of cuBLASLt's valid algorithms, timed on its first call: against the
    # heuristic's first choice untimed (rank 0, every shape) and its next ones (M = 1280 only).
    for rank in range(0, args.algos if M == 1280 else 1):
        checked(lib, lib.bf_check_set_algo_rank(rank))
        rows.append(dict(base, impl=f"bertfuse v0 algo rank {rank}" + (" (heuristic's first, untimed)"
                                                                       if rank == 0 else ""),
                         precision="fp16", us=time_us(ours(0), args.reps, args.iters, s)))
    checked(lib, lib.bf_check_set_algo_rank(-1))
    # The algorithms that need no workspace.
    checked(lib, lib.bf_check_set_workspace_mb(0))
    rows.append(dict(base, impl="bertfuse v0 (no workspace)", precision="fp16",
                     us=time_us(ours(0), args.reps, args.iters, s)))
    checked(lib, lib.bf_check_set_workspace_mb(1 << 20))  # back to the default cap
    for label, fn in torch_candidates(x, w, bias, skip, gamma, beta, kind, approximate).items():
        with torch.cuda.stream(s):
            out = fn()
        s.synchronize()
        mx, mean, ok = diff(out, ref)
        rows.append(dict(base, impl=label, precision="fp16", max_diff=mx, mean_diff=mean, gate=ok,
                         us=time_us(fn, args.reps, args.iters, s)))
    rows.append(dict(base, impl="torch mm (GEMM floor)", precision="fp16",
                     us=time_us(lambda: torch.mm(x, w), args.reps, args.iters, s)))
    if kind == SLN:
        rows += layernorm_rows(lib, args, base, y, bias, skip, gamma, beta, s)
    if kind == GELU and not approximate:  # the elementwise pass alone, per GELU form, on X @ W
        z = torch.mm(x, w)
        out = torch.empty_like(z)
        torch.cuda.synchronize()
        for label, act in ACTS.items():
            fn = lambda act=act: checked(lib, lib.bf_check_bias_act(  # noqa: E731
                ptr(z), ptr(out), ptr(bias), M, N, act, stream()))
            rows.append(dict(base, impl=f"bertfuse bias+GELU kernel alone ({label})", precision="fp16",
                             us=time_us(fn, args.reps, args.iters, s)))
    if args.fp8 and K % 16 == 0:
        rows += run_fp8(lib, args, base, x, w, bias, skip, gamma, beta, kind, approximate, ref, s)
    return rows


def layernorm_rows(lib, args, base, y, bias, skip, gamma, beta, s) -> list[dict]:
    """The LayerNorm kernel alone (bias + residual added in it), against torch's; and with the
    e4m3 copy of its output an FP8 GEMM downstream would take (checked bit for bit)."""
    M, N = y.shape
    out = torch.empty_like(y)
    yq = torch.empty(M, N, device="cuda", dtype=torch.uint8)
    scale = 4.0 / 448.0

    def ln(q: bool):
        return lambda: checked(lib, lib.bf_check_layernorm(ptr(y), ptr(bias), ptr(skip), ptr(gamma), ptr(beta),
                                                           EPS, ptr(out), M, N, ptr(yq) if q else 0, scale,
                                                           stream()))
    with torch.cuda.stream(s):
        ln(True)()
        same = bool(torch.equal(yq, e4m3(out, scale).view(torch.uint8)))
    return [dict(base, impl="bertfuse layernorm(bias+skip) alone", precision="fp16",
                 us=time_us(ln(False), args.reps, args.iters, s)),
            dict(base, impl="bertfuse layernorm(bias+skip) + e4m3 copy", precision="fp16", gate=same,
                 **({} if same else {"error": "e4m3 copy differs from e4m3(y / scale)"}),
                 us=time_us(ln(True), args.reps, args.iters, s)),
            dict(base, impl="torch layer_norm(y+bias+skip) alone", precision="fp16",
                 us=time_us(lambda: F.layer_norm(y + bias + skip, (N,), gamma, beta, EPS),
                            args.reps, args.iters, s))]


def run_fp8(lib, args, base, x, w, bias, skip, gamma, beta, kind, approximate, ref, s) -> list[dict]:
    M, K = x.shape
    N = w.shape[1]
    x_scale = float(x.float().abs().max()) / 448.0  # per-tensor, calibrated on these inputs
    w_scale = float(w.float().abs().max()) / 448.0
    wt = e4m3(w.t().contiguous(), w_scale)  # [N, K]
    w_scale_t = torch.tensor([w_scale], device="cuda", dtype=torch.float32)
    xq = torch.empty(M, K, device="cuda", dtype=torch.uint8)
    y = torch.empty(M, N, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    deq_ref = ref64(e4m3(x, x_scale).float() * x_scale, wt.float().t() * w_scale, bias, skip, gamma,
                    beta, kind, approximate)
    rows = []
    for fast in (1, 0):
        def ours(fast=fast):
            checked(lib, lib.bf_check_dense_fp8(ptr(x), ptr(wt), ptr(w_scale_t), x_scale, ptr(xq), ptr(bias),
                                                ptr(skip), ptr(gamma), ptr(beta), ptr(y), M, N, K, kind,
                                                approximate, EPS, 0, fast, 0, 1.0, stream()))
        # The kernel against the float64 product of its own (dequantized) inputs: the fp16 gate
        # with full accumulation; Hopper's fast accumulation is looser (10x), which still
        # catches a wrong layout or scale (errors of order 1).
        row = checked_row(dict(base, impl=f"bertfuse fp8 fast_accum={fast}", precision="fp8", x_scale=x_scale,
                               w_scale=w_scale), ours, y, deq_ref, args, s, 10.0 if fast else 1.0)
        if "max_diff" in row:  # FP8's accuracy cost: against the unquantized product
            row["max_diff_vs_fp64"], row["mean_diff_vs_fp64"], _ = diff(y, ref)
        rows.append(row)
    rows += fp8_chain_rows(lib, args, base, x, wt, w_scale_t, x_scale, xq, bias, skip, gamma, beta, y,
                           kind, approximate, s)
    if hasattr(torch, "_scaled_mm"):
        xq8 = e4m3(x, x_scale)
        sa = torch.tensor(x_scale, device="cuda")
        sb = torch.tensor(w_scale, device="cuda")
        torch.cuda.synchronize()
        fn = lambda: torch._scaled_mm(xq8, wt.t(), scale_a=sa, scale_b=sb, bias=bias,  # noqa: E731
                                      out_dtype=torch.float16)
        rows.append(dict(base, impl="torch _scaled_mm + bias (GEMM only, X pre-quantized)",
                         precision="fp8", us=time_us(fn, args.reps, args.iters, s)))
    return rows


def fp8_chain_rows(lib, args, base, x, wt, w_scale_t, x_scale, xq, bias, skip, gamma, beta, y, kind,
                   approximate, s) -> list[dict]:
    """The FP8 op as a chain of FP8 ops runs it: X arrives as e4m3 (quantized by the op
    upstream, no quantize pass here), with and without writing Y's e4m3 copy for the next."""
    M, K = x.shape
    N = y.shape[1]
    yq = torch.empty(M, N, device="cuda", dtype=torch.uint8)
    yq_scale = 4.0 / 448.0
    with torch.cuda.stream(s):
        xq.copy_(e4m3(x, x_scale).view(torch.uint8))

    def op(with_yq: bool):
        return lambda: checked(lib, lib.bf_check_dense_fp8(
            0, ptr(wt), ptr(w_scale_t), x_scale, ptr(xq), ptr(bias), ptr(skip), ptr(gamma), ptr(beta),
            ptr(y), M, N, K, kind, approximate, EPS, 0, 1, ptr(yq) if with_yq else 0, yq_scale, stream()))
    row = dict(base, impl="bertfuse fp8, X e4m3 in, Yq e4m3 out", precision="fp8")
    if base["gemm"] == "qkv":  # said in the row, not left to the reader of the table
        row["note"] = "not a form the model runs: QKV's output goes to attention in fp16"
    try:
        with torch.cuda.stream(s):
            op(True)()
            same = bool(torch.equal(yq, e4m3(y, yq_scale).view(torch.uint8)))
        row.update(gate=same, **({} if same else {"error": "Yq differs from e4m3(Y / yq_scale)"}))
    except RuntimeError as exc:
        row.update(gate=False, error=str(exc))
    row["us"] = time_us(op(True), args.reps, args.iters, s)
    return [dict(base, impl="bertfuse fp8 without the quantize (X pre-quantized)", precision="fp8",
                 us=time_us(op(False), args.reps, args.iters, s)), row]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="libbertfuse_ops.so (default: build the dense kernels here)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--reps", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--algos", type=int, default=4,
                    help="also pin the heuristic's first N algorithms, untimed (M = 1280; rank 0 everywhere)")
    ap.add_argument("--no-fp8", dest="fp8", action="store_false")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("kernels_gemm: no CUDA device", file=sys.stderr)
        sys.exit(2)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                lib=args.lib or "built from csrc", iters=args.iters, reps=args.reps,
                gate=dict(max=GATE_MAX, mean=GATE_MEAN))
    os.makedirs(args.out, exist_ok=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bf_gemm_") as tmp:
        lib = load(args.lib or build(tmp))
        s = torch.cuda.Stream()
        for wl, M in WORKLOADS:
            for name, K, N, kind, approximate in GEMMS:
                rows += run_shape(lib, args, wl, M, name, K, N, kind, approximate, s)
                print(json.dumps(rows[-1]), flush=True)
                # Rewritten after every shape: a crash part-way still leaves what was measured.
                dest = os.path.join(args.out, "kernels_gemm.json")
                with open(dest + ".tmp", "w") as fh:
                    json.dump(dict(meta=meta, rows=rows), fh, indent=1)
                os.replace(dest + ".tmp", dest)
    with open(os.path.join(args.out, "kernels_gemm.md"), "w") as fh:
        fh.write("| workload | gemm | impl | us | max diff | mean diff | gate |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            impl = r["impl"] + (f" ({r['note']})" if "note" in r else "")
            fh.write("| " + " | ".join([r["workload"], r["gemm"], impl, str(r["us"]), *cells(r)]) + " |\n")
    mask = lib.bf_check_unsupported_mask()
    fell = [f"{['plain', 'bias', 'bias+tanh GELU'][b // 4]} epilogue{' + residual' if b & 1 else ''}"
            f" ({'fp8' if b & 2 else 'fp16'})" for b in range(12) if mask > 0 and mask >> b & 1]
    print("cuBLASLt had no algorithm for (ran as our kernels instead):", ", ".join(fell) or "none")
    choices = json.loads(lib.bf_gemm_choices().decode())
    with open(os.path.join(args.out, "gemm_choices.json"), "w") as fh:
        json.dump(choices, fh, indent=1)
    print("GEMM chosen per shape (auto; us: cuBLASLt, then each sm90 configuration):")
    for c in choices:
        print(f"  M={c['M']} N={c['N']} K={c['K']} gelu={c['gelu']}: {c['choice']}  {c['us']}")
    timings = json.loads(lib.bf_cublas_timings().decode())
    with open(os.path.join(args.out, "cublas_timings.json"), "w") as fh:
        json.dump(timings, fh, indent=1)
    print("cuBLASLt algorithm chosen per plan (index into the heuristic's valid list; us each):")
    for t in timings:
        print(f"  M={t['M']} N={t['N']} K={t['K']} epilogue={t['epilogue']} fp8={t['fp8']} "
              f"residual={t['residual']}: {t['chosen']}  {t['us']}")
    summary(rows)
    failed = [r for r in rows if r.get("gate") is False and r["impl"].startswith("bertfuse")]
    print(f"{len(failed)} bertfuse rows failed their gate" if failed else "all bertfuse rows within the gate")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
