"""LayerNorm without a kernel of its own, tried: statistics in the producing GEMM's epilogue,
normalised on read by the consumers, against the LayerNorm kernel between the GEMMs.

One BERT layer's four GEMMs (the attention itself left out: its output is a fixed input), fp16
with fp32 accumulation, at shenma-3l b20 s64 (M = 1280 tokens) and BERT-base b1 s128 (M = 128),
hidden H = 768, FFN I = 3072:

    down:  s1 = X @ Wd + bd + h1            X: the FFN's GELU output [M, I]; h1: LN1 of t
    LN2:   h2 = LN(s1) * g2 + b2
    qkv:   q  = h2 @ Wqkv + bqkv            [M, 3H]
    out:   t  = A @ Wo + bo + h2            A: the attention's output [M, H]
    LN1:   h1' = LN(t) * g1 + b1
    up:    u  = gelu(h1' @ Wup + bup)       [M, I], erf GELU

Forms (each chain captured in one CUDA graph, replayed; p50 of CUDA-event time per chain):

  cublas+LN   torch's cuBLAS GEMMs (addmm; GELU as cuBLASLt's epilogue) and one Triton kernel
              per LayerNorm reading the GEMM's output, its bias and the residual: the shape of
              bertfuse's ops today (cuBLASLt + the skip-LayerNorm kernel)
  triton+LN   the same chain with this file's Triton GEMM (bias, residual, GELU in its epilogue)
              and the same LayerNorm kernel: the GEMM alone changed, to separate it from the fold
  cublas, no LN (bound)  timing only, not a result: cuBLAS's four GEMMs with their biases and
              nothing else (no LayerNorm, no residual): what any LayerNorm folded into cuBLASLt's
              GEMMs could at best reach
  no-LN       the same Triton GEMM, no LayerNorm kernel. A GEMM that ends a residual block (down,
              out) writes the raw sum s (fp16) and, per row and N tile, the tile's mean and sum
              of squared deviations (Welford's M2, fp32). Its consumers merge a row's tiles
              (Chan's formula) into mean mu and 1/std r and normalise on read:
                - the next GEMM (qkv after down, up after out) runs on s with the LayerNorm's
                  gamma folded into its weights (W' = diag(g) W, offline) and the rank-1 mean
                  correction in its epilogue: y = r * (s @ W' - mu * colsum(W')) + (b @ W + bias)
                - the next residual (h2 in out, h1 in down) is (s - mu) * r * g + b, computed in
                  that GEMM's epilogue from s and the row's statistics
              Two kernels fewer per layer; each epilogue does more; s is read where h was.

Accuracy: every form's q, t-path and u against the same chain in fp32 (torch, float32 weights
as given), max and mean |diff|, beside the cublas+LN form's.

    python3 benchmarks/kernels/ln_epilogue.py [--iters 200 --rounds 20]   # GPU host: torch, triton
    TRITON_INTERPRET=1 python3 benchmarks/kernels/ln_epilogue.py --check  # CPU: Triton's
        interpreter, tiny shapes, the no-LN and triton+LN forms against fp32 (no timing)

Writes $OUT/ln_epilogue.json (per workload and form: p50 and p90 us per chain, errors); the
table last. Exit 1 when a form misses the fp16 limits (max 4e-2, mean 2e-3) against fp32.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import triton
import triton.language as tl

EPS = 1e-12  # BERT's LayerNorm epsilon
FP16_MAX, FP16_MEAN = 4e-2, 2e-3


# ---- kernels ------------------------------------------------------------------------------

@triton.jit
def _row_stats(pmean_ptr, pm2_ptr, rows, rmask, T, TP: tl.constexpr, per_tile, H, eps):
    """mu and 1/std of each row from its T tiles' (mean, M2), Chan's merge of equal counts."""
    t = tl.arange(0, TP)
    m = rmask[:, None] & (t[None, :] < T)
    means = tl.load(pmean_ptr + rows[:, None] * T + t[None, :], mask=m, other=0.0)
    m2s = tl.load(pm2_ptr + rows[:, None] * T + t[None, :], mask=m, other=0.0)
    mu = tl.sum(means, 1) / T
    d = tl.where(m, means - mu[:, None], 0.0)
    m2 = tl.sum(m2s, 1) + per_tile * tl.sum(d * d, 1)
    return mu, 1.0 / tl.sqrt(m2 / H + eps)


@triton.jit
def gemm_kernel(a_ptr, w_ptr, bias_ptr, out_ptr, M, N, K,
                fmean_ptr, fm2_ptr, fT, c_ptr,  # FOLD: A is a raw sum; its stats; colsum(W')
                res_ptr, rmean_ptr, rm2_ptr, rT, g_ptr, beta_ptr,  # RES: residual (raw + stats)
                omean_ptr, om2_ptr,  # STATS: this output's per-tile mean and M2
                eps,
                FOLD: tl.constexpr, FTP: tl.constexpr, RES: tl.constexpr, RTP: tl.constexpr,
                STATS: tl.constexpr, GELU: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """out = epilogue(A @ W), A [M, K] fp16, W [K, N] fp16, fp32 accumulation.
    RES: 0 none, 1 plain residual [M, N], 2 residual normalised on read (raw + stats, g, beta)."""
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = GROUP_M * grid_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    rmask, cmask = rows < M, cols < N
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        k0 = kt * BK
        a = tl.load(a_ptr + rows[:, None] * K + (k0 + ks)[None, :],
                    mask=rmask[:, None] & ((k0 + ks)[None, :] < K), other=0.0)
        w = tl.load(w_ptr + (k0 + ks)[:, None] * N + cols[None, :],
                    mask=((k0 + ks)[:, None] < K) & cmask[None, :], other=0.0)
        acc = tl.dot(a, w, acc)
    if FOLD:  # y = r * (s @ W' - mu * colsum(W')) + b'  (bias_ptr holds b')
        mu, r = _row_stats(fmean_ptr, fm2_ptr, rows, rmask, fT, FTP, K / fT, K, eps)
        c = tl.load(c_ptr + cols, mask=cmask, other=0.0)
        acc = r[:, None] * (acc - mu[:, None] * c[None, :])
    acc += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    omask = rmask[:, None] & cmask[None, :]
    if RES == 1:
        acc += tl.load(res_ptr + rows[:, None] * N + cols[None, :], mask=omask,
                       other=0.0).to(tl.float32)
    if RES == 2:
        mu2, r2 = _row_stats(rmean_ptr, rm2_ptr, rows, rmask, rT, RTP, N / rT, N, eps)
        raw = tl.load(res_ptr + rows[:, None] * N + cols[None, :], mask=omask,
                      other=0.0).to(tl.float32)
        g = tl.load(g_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        acc += (raw - mu2[:, None]) * r2[:, None] * g[None, :] + beta[None, :]
    if GELU:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    if STATS:  # N % BN == 0: every tile full
        tmean = tl.sum(acc, 1) / BN
        d = acc - tmean[:, None]
        tl.store(omean_ptr + rows * (N // BN) + pid_n, tmean, mask=rmask)
        tl.store(om2_ptr + rows * (N // BN) + pid_n, tl.sum(d * d, 1), mask=rmask)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.float16), mask=omask)


@triton.jit
def skip_ln_kernel(x_ptr, bias_ptr, res_ptr, g_ptr, beta_ptr, out_ptr, N, eps,
                   BIAS: tl.constexpr, RES: tl.constexpr, BLOCK: tl.constexpr):
    """out = LN(x (+ bias) (+ res)) * g + beta, one row per program, fp32 math."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(tl.float32)
    if RES:
        x += tl.load(res_ptr + row * N + cols, mask=m, other=0.0).to(tl.float32)
    if BIAS:
        x += tl.load(bias_ptr + cols, mask=m, other=0.0).to(tl.float32)
    mu = tl.sum(x, 0) / N
    d = tl.where(m, x - mu, 0.0)
    r = 1.0 / tl.sqrt(tl.sum(d * d, 0) / N + eps)
    g = tl.load(g_ptr + cols, mask=m, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (d * r * g + beta).to(tl.float16), mask=m)


# ---- launches -----------------------------------------------------------------------------

CONFIGS = [  # (BM, BN, BK, warps, stages): tried per GEMM shape, the fastest kept
    (64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 64, 64, 4, 3), (128, 128, 64, 8, 3),
    (128, 128, 32, 4, 4), (64, 256, 64, 8, 3), (32, 64, 128, 4, 3), (16, 64, 128, 4, 4),
    (32, 128, 64, 4, 4), (16, 128, 64, 4, 4),
]
CHECK_CONFIGS = [(16, 32, 32, 4, 1)]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class Gemm:
    """One GEMM launch with a fixed config; epilogue by keyword."""

    def __init__(self, cfg: tuple[int, int, int, int, int]):
        self.bm, self.bn, self.bk, self.warps, self.stages = cfg

    def tiles(self, n: int) -> int:
        return n // self.bn

    def __call__(self, a, w, bias, out, *, fold=None, res=None, res_stats=None, g=None,
                 beta=None, stats=None, gelu=False):
        M, K = a.shape
        N = w.shape[1]
        dummy = bias
        fmean, fm2, fT, c = (fold if fold else (dummy, dummy, 1, dummy))
        rmean, rm2, rT = (res_stats if res_stats else (dummy, dummy, 1))
        omean, om2 = stats if stats else (dummy, dummy)
        grid = (triton.cdiv(M, self.bm) * triton.cdiv(N, self.bn),)
        gemm_kernel[grid](
            a, w, bias, out, M, N, K, fmean, fm2, fT, c,
            res if res is not None else dummy, rmean, rm2, rT,
            g if g is not None else dummy, beta if beta is not None else dummy,
            omean, om2, EPS,
            FOLD=fold is not None, FTP=_pow2(fT), RES=0 if res is None else (2 if res_stats else 1),
            RTP=_pow2(rT), STATS=stats is not None, GELU=gelu,
            BM=self.bm, BN=self.bn, BK=self.bk, GROUP_M=8,
            num_warps=self.warps, num_stages=self.stages)
        return out


def skip_ln(x, g, beta, out, res=None, bias=None):
    M, N = x.shape
    skip_ln_kernel[(M,)](x, bias if bias is not None else g, res if res is not None else x, g,
                         beta, out, N, EPS, BIAS=bias is not None, RES=res is not None,
                         BLOCK=_pow2(N), num_warps=4)
    return out


# ---- the layer ----------------------------------------------------------------------------

class Layer:
    """Weights (fp32 masters, fp16 copies, the folded forms) and inputs of one layer."""

    def __init__(self, M: int, H: int, I: int, device: str, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)

        def rnd(*shape, scale=1.0, shift=0.0):
            return (torch.randn(*shape, generator=gen) * scale + shift)

        self.M, self.H, self.I = M, H, I
        f = {  # fp32 masters; weights ~ BERT's init scale, LN gammas near 1 with spread
            "Wd": rnd(I, H, scale=0.02), "bd": rnd(H, scale=0.02),
            "Wqkv": rnd(H, 3 * H, scale=0.02), "bqkv": rnd(3 * H, scale=0.02),
            "Wo": rnd(H, H, scale=0.02), "bo": rnd(H, scale=0.02),
            "Wup": rnd(H, I, scale=0.02), "bup": rnd(I, scale=0.02),
            "g1": rnd(H, scale=0.1, shift=1.0), "b1": rnd(H, scale=0.05),
            "g2": rnd(H, scale=0.1, shift=1.0), "b2": rnd(H, scale=0.05),
        }
        # The previous block's raw residual sum t0 as trained BERTs have it: a per-row offset
        # and a few outlier channels much larger than the rest (what makes the mean correction
        # matter); h1 = LN1(t0), the input every form starts from (no-LN: t0 and its statistics)
        t0 = rnd(M, H) + rnd(M, 1, scale=2.0)
        t0[:, :4] *= 12.0
        f["X"] = torch.nn.functional.gelu(rnd(M, I))  # the GELU output the down GEMM reads
        f["A"] = rnd(M, H, scale=0.5)                  # the attention's output
        f["t0"] = t0.half().float()
        f["h1"] = torch.nn.functional.layer_norm(f["t0"], (H,), f["g1"], f["b1"], EPS)
        self.f32 = {k: v.to(device) for k, v in f.items()}
        self.h = {k: v.to(device).half() for k, v in f.items()}
        # folded forms: qkv reads LN2's input, up reads LN1's
        for w, b, g, beta, name in (("Wqkv", "bqkv", "g2", "b2", "qkv"),
                                    ("Wup", "bup", "g1", "b1", "up")):
            W, B, G, BE = (self.f32[k] for k in (w, b, g, beta))
            wf = (G[:, None] * W).half()
            self.h[f"W_{name}_f"] = wf
            self.h[f"c_{name}"] = wf.float().sum(0)  # colsum of the fp16 folded weights
            self.h[f"b_{name}_f"] = (BE @ W + B).float()

    def reference(self) -> dict[str, torch.Tensor]:
        """The chain in fp32."""
        f = self.f32
        ln = torch.nn.functional.layer_norm
        s1 = f["X"] @ f["Wd"] + f["bd"] + f["h1"]
        h2 = ln(s1, (self.H,), f["g2"], f["b2"], EPS)
        q = h2 @ f["Wqkv"] + f["bqkv"]
        t = f["A"] @ f["Wo"] + f["bo"] + h2
        h1n = ln(t, (self.H,), f["g1"], f["b1"], EPS)
        u = torch.nn.functional.gelu(h1n @ f["Wup"] + f["bup"])
        return {"q": q, "h2": h2, "h1": h1n, "u": u}


class Chain:
    """One form's buffers and its call (all outputs preallocated, so the call is capturable)."""

    def __init__(self, layer: Layer, form: str, cfgs: dict[str, tuple]):
        self.layer, self.form = layer, form
        M, H, I = layer.M, layer.H, layer.I
        dev = layer.h["X"].device
        e = lambda *s, dt=torch.float16: torch.empty(*s, dtype=dt, device=dev)  # noqa: E731
        self.s1, self.h2, self.q = e(M, H), e(M, H), e(M, 3 * H)
        self.t, self.h1, self.u = e(M, H), e(M, H), e(M, I)
        self.g = {k: Gemm(v) for k, v in cfgs.items()}
        self.T = {k: H // self.g[k].bn for k in ("down", "out")}
        self.st = {k: (e(M, self.T[k], dt=torch.float32), e(M, self.T[k], dt=torch.float32))
                   for k in ("down", "out")}
        # no-LN's down reads h1 normalised on read from the previous layer's out: its raw sum and
        # statistics, made here from the fp32 h1 so that every form starts from the same h1
        if form == "no-LN":  # t0 and its statistics, as the previous out GEMM writes them
            T = self.T["out"]
            self.t_prev = layer.h["t0"]
            tiles = layer.f32["t0"].view(M, T, H // T)
            tm = tiles.mean(2)
            self.prev_stats = (tm.contiguous(), ((tiles - tm[..., None]) ** 2).sum(2).contiguous())

    def __call__(self) -> None:
        h, g = self.layer.h, self.g
        if self.form == "cublas+LN":
            torch.matmul(h["X"], h["Wd"], out=self.s1)
            skip_ln(self.s1, h["g2"], h["b2"], self.h2, res=h["h1"], bias=h["bd"])
            torch.addmm(h["bqkv"], self.h2, h["Wqkv"], out=self.q)
            torch.matmul(h["A"], h["Wo"], out=self.t)
            skip_ln(self.t, h["g1"], h["b1"], self.h1, res=self.h2, bias=h["bo"])
            # torch's addmm with GELU (cuBLASLt's GELU epilogue on CUDA)
            torch._addmm_activation(h["bup"], self.h1, h["Wup"], use_gelu=True, out=self.u)
        elif self.form == "triton+LN":
            g["down"](h["X"], h["Wd"], h["bd"], self.s1, res=h["h1"])
            skip_ln(self.s1, h["g2"], h["b2"], self.h2)
            g["qkv"](self.h2, h["Wqkv"], h["bqkv"], self.q)
            g["out"](h["A"], h["Wo"], h["bo"], self.t, res=self.h2)
            skip_ln(self.t, h["g1"], h["b1"], self.h1)
            g["up"](self.h1, h["Wup"], h["bup"], self.u, gelu=True)
        elif self.form == BOUND:  # timing only: the GEMMs alone, no LayerNorm, no residual
            torch.addmm(h["bd"], h["X"], h["Wd"], out=self.s1)
            torch.addmm(h["bqkv"], self.s1, h["Wqkv"], out=self.q)
            torch.addmm(h["bo"], h["A"], h["Wo"], out=self.t)
            torch._addmm_activation(h["bup"], self.t, h["Wup"], use_gelu=True, out=self.u)
        else:  # no-LN
            sd, so = self.st["down"], self.st["out"]
            g["down"](h["X"], h["Wd"], h["bd"], self.s1, res=self.t_prev,
                      res_stats=(*self.prev_stats, self.T["out"]), g=h["g1"], beta=h["b1"],
                      stats=sd)
            g["qkv"](self.s1, h["W_qkv_f"], h["b_qkv_f"], self.q,
                     fold=(*sd, self.T["down"], h["c_qkv"]))
            g["out"](h["A"], h["Wo"], h["bo"], self.t, res=self.s1,
                     res_stats=(*sd, self.T["down"]), g=h["g2"], beta=h["b2"], stats=so)
            g["up"](self.t, h["W_up_f"], h["b_up_f"], self.u,
                    fold=(*so, self.T["out"], h["c_up"]), gelu=True)

    def outputs(self) -> dict[str, torch.Tensor]:
        """q and u, and the two LayerNorms' outputs (no-LN: computed here from the raw sums and
        the statistics its kernels wrote, as its consumers compute them on read)."""
        out = {"q": self.q.float(), "u": self.u.float()}
        if self.form == "no-LN":
            L = self.layer.f32
            for raw, (tm, m2), T, gk, bk, name in (
                    (self.s1, self.st["down"], self.T["down"], "g2", "b2", "h2"),
                    (self.t, self.st["out"], self.T["out"], "g1", "b1", "h1")):
                n = self.layer.H // T
                mu = tm.mean(1)
                var = (m2.sum(1) + n * ((tm - mu[:, None]) ** 2).sum(1)) / self.layer.H
                out[name] = ((raw.float() - mu[:, None]) / torch.sqrt(var[:, None] + EPS)
                             * L[gk] + L[bk])
        else:
            out["h2"], out["h1"] = self.h2.float(), self.h1.float()
        return out


def errors(got: dict, want: dict) -> dict[str, dict[str, float]]:
    return {k: {"max": float((got[k] - want[k]).abs().max()),
                "mean": float((got[k] - want[k]).abs().mean())} for k in want}


def pick_configs(layer: Layer, timed: bool) -> dict[str, tuple]:
    """The fastest Triton config per GEMM of this layer (STATS producers: BN divides H)."""
    if not timed:
        return {k: CHECK_CONFIGS[0] for k in ("down", "qkv", "out", "up")}
    M, H, I = layer.M, layer.H, layer.I
    h = layer.h
    shapes = {"down": (h["X"], h["Wd"], H), "qkv": (h["h1"], h["Wqkv"], 3 * H),
              "out": (h["A"], h["Wo"], H), "up": (h["h1"], h["Wup"], I)}
    best = {}
    for name, (a, w, n) in shapes.items():
        out = torch.empty(M, n, dtype=torch.float16, device=a.device)
        times = {}
        for cfg in CONFIGS:
            if name in ("down", "out") and H % cfg[1]:
                continue
            gm = Gemm(cfg)
            bias = torch.zeros(n, device=a.device, dtype=torch.float16)
            try:
                gm(a, w, bias, out)
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 (a config this GPU cannot hold: out of shared memory)
                continue
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            for _ in range(50):
                gm(a, w, bias, out)
            end.record()
            torch.cuda.synchronize()
            times[cfg] = start.elapsed_time(end) / 50
        best[name] = min(times, key=times.get)
    return best


def capture(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_graphs(graphs: dict[str, torch.cuda.CUDAGraph], iters: int, rounds: int) -> dict:
    samples: dict[str, list[float]] = {k: [] for k in graphs}
    for g in graphs.values():
        for _ in range(50):
            g.replay()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, g in graphs.items():
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            for _ in range(iters):
                g.replay()
            end.record()
            torch.cuda.synchronize()
            samples[name].append(start.elapsed_time(end) * 1000 / iters)
    return {k: {"p50_us": float(torch.tensor(v).median()),
                "p90_us": float(torch.tensor(v).quantile(0.9))} for k, v in samples.items()}


BOUND = "cublas, no LN (bound)"
FORMS = ("cublas+LN", BOUND, "triton+LN", "no-LN")


def run(workloads, device: str, timed: bool, iters: int, rounds: int) -> dict:
    result = {}
    for name, M, H, I in workloads:
        layer = Layer(M, H, I, device)
        cfgs = pick_configs(layer, timed)
        want = layer.reference()
        forms = FORMS if timed else FORMS[2:]
        chains = {f: Chain(layer, f, cfgs) for f in forms}
        row = {"M": M, "H": H, "I": I, "configs": {k: list(v) for k, v in cfgs.items()},
               "forms": {}}
        for f, ch in chains.items():
            ch()
            row["forms"][f] = {"errors": errors(ch.outputs(), want) if f != BOUND else {}}
        if timed:
            graphs = {f: capture(ch) for f, ch in chains.items()}
            for f, t in time_graphs(graphs, iters, rounds).items():
                row["forms"][f].update(t)
        result[name] = row
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="CPU, under TRITON_INTERPRET=1: tiny shapes, accuracy only")
    ap.add_argument("--iters", type=int, default=200, help="replays per round")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    t0 = time.time()
    if a.check:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--check runs under Triton's interpreter: TRITON_INTERPRET=1")
            return 2
        workloads, device, timed = [("tiny", 48, 128, 256)], "cpu", False
    else:
        workloads = [("shenma-3l b20 s64", 1280, 768, 3072), ("base b1 s128", 128, 768, 3072)]
        device, timed = "cuda", True
    result = run(workloads, device, timed, a.iters, a.rounds)
    meta = {"torch": torch.__version__, "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name() if timed else "cpu (interpreter)",
            "date": time.strftime("%Y-%m-%d"), "iters": a.iters, "rounds": a.rounds}
    with open(os.path.join(a.out, "ln_epilogue.json"), "w") as f:
        json.dump({"meta": meta, "workloads": result}, f, indent=1)
    bad = []
    print(f"{meta['gpu']}; torch {meta['torch']}, triton {meta['triton']}")
    print("workload | form | p50 us per layer chain | p90 | max |diff| q / h2 / h1 / u vs fp32 "
          "| mean")
    for w, row in result.items():
        for f, r in row["forms"].items():
            e = r["errors"]
            mx = " / ".join(f"{e[k]['max']:.2e}" for k in ("q", "h2", "h1", "u")) if e else "-"
            mn = " / ".join(f"{e[k]['mean']:.1e}" for k in ("q", "h2", "h1", "u")) if e else "-"
            p50 = f"{r['p50_us']:.1f}" if "p50_us" in r else "-"
            p90 = f"{r['p90_us']:.1f}" if "p90_us" in r else "-"
            print(f"{w} | {f} | {p50} | {p90} | {mx} | {mn}")
            if any(not math.isfinite(v["max"]) or v["max"] > FP16_MAX or v["mean"] > FP16_MEAN
                   for v in e.values()):
                bad.append(f"{w} {f}")
        print(f"{w}: configs {row['configs']}")
    print(f"total {time.time() - t0:.0f} s")
    if bad:
        print("over the fp16 limits: " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
