"""How far is the skip + bias + LayerNorm kernel from the memory system's floor? (GPU host; torch.)

    python3 benchmarks/kernels/ln_probe.py [--lib libbf_dense_check.so] [--out DIR]

For the encoder's [M, 768] rows (M = 128, 1280, 4096), median us per call over CUDA-graph
replays (gemm_harness.time_us) of:
  bertfuse LayerNorm   y = LN(x + bias + skip) (reads x and skip, writes y; fp16), in each of
                       its forms (bf_check_set_ln_cap): as the library picks, registers
                       uncapped, registers capped for 8 CTAs of 4 warps an SM; each checked
                       against a float64 reference (fp16 gate)
  torch add            y = x + skip (the same bytes moved, no reduction: the floor)
  torch layer_norm     F.layer_norm(x + skip) (two kernels), for reference
each twice: "hot" (the graph repeats one set of buffers, which stays in the 50 MB L2) and
"cold" (the graph cycles through enough buffer sets to pass the L2, as in a model where the
residual was written layers ago). GB/s counts the 3 x M x 768 x 2 bytes each call moves.
$OUT/ln_probe.json holds the rows; the table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from gemm_harness import EPS, GATE_MAX, GATE_MEAN, build, load, ptr, stream, time_us

N = 768
FORMS = {"bertfuse LayerNorm (picked)": 0, "bertfuse, uncapped": 1,
         "bertfuse, capped for 8 CTAs/SM": 2}


def check(fn, buf, bias, gamma, beta) -> tuple[float, float]:
    """One call of fn on buf (the set it uses next) against LN(x + bias + skip) in float64."""
    x, sk, y = buf
    y.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    s64 = x.double() + sk.double() + bias.double()
    want = F.layer_norm(s64, (N,), gamma.double(), beta.double(), EPS)
    d = (y.double() - want).abs()
    return float(d.max()), float(d.mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    rows, bad = [], False
    with tempfile.TemporaryDirectory(prefix="bf_ln_") as tmp:
        lib = load(args.lib or build(tmp))
        s = torch.cuda.Stream()
        dev = torch.device("cuda")
        bias, gamma, beta = (torch.randn(N, device=dev, dtype=torch.float16) * 0.1 for _ in range(3))
        for M in (128, 1280, 4096):
            per_set = 3 * M * N * 2
            sets = {"hot": 1, "cold": max(2, (160 << 20) // per_set)}
            for temp, n in sets.items():
                bufs = [tuple(torch.randn(M, N, device=dev, dtype=torch.float16) for _ in range(3))
                        for _ in range(n)]
                k = {"i": 0}

                def nxt():
                    k["i"] = (k["i"] + 1) % n
                    return bufs[k["i"]]

                def ours():
                    x, sk, y = nxt()
                    rc = lib.bf_check_layernorm(ptr(x), ptr(bias), ptr(sk), ptr(gamma), ptr(beta),
                                                EPS, ptr(y), M, N, 0, 1.0, stream())
                    if rc:
                        raise RuntimeError(str(lib.bf_dense_last_error()))

                def add():
                    x, sk, y = nxt()
                    torch.add(x, sk, out=y)

                def tln():
                    x, sk, y = nxt()
                    y.copy_(F.layer_norm(x + sk + bias, (N,), gamma, beta, EPS))

                timed = [(name, mode, ours) for name, mode in FORMS.items()]
                timed += [("torch add", None, add), ("torch layer_norm", None, tln)]
                for name, mode, fn in timed:
                    err = None
                    if mode is not None:
                        lib.bf_check_set_ln_cap(mode)
                        err = check(fn, bufs[(k["i"] + 1) % n], bias, gamma, beta)
                    us = time_us(fn, max(n, 20), args.iters, s)
                    row = {"M": M, "caches": temp, "impl": name, "us": us,
                           "GB/s": round(per_set / us / 1e3, 1) if isinstance(us, float) else None}
                    if err is not None:
                        row["max_diff"], row["mean_diff"] = err
                        bad = bad or not (err[0] <= GATE_MAX and err[1] <= GATE_MEAN)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                lib.bf_check_set_ln_cap(0)
                del bufs
    with open(os.path.join(args.out, "ln_probe.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    impls = list(FORMS) + ["torch add", "torch layer_norm"]
    print("\n| M | caches | " + " | ".join(impls) + " |")
    print("|---|---|" + "---|" * len(impls))
    for M in (128, 1280, 4096):
        for temp in ("hot", "cold"):
            r = {x["impl"]: x for x in rows if x["M"] == M and x["caches"] == temp}
            print(f"| {M} | {temp} | " + " | ".join(f"{r[i]['us']} ({r[i]['GB/s']})" for i in impls)
                  + " |")
    print("every bertfuse form within the fp16 gate" if not bad else "A FORM FAILED THE GATE")
    return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
