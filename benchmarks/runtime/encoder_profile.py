"""One request of each workload on bertfuse's ops, without a CUDA graph, inside an NVTX range
for Nsight Compute: where each kernel stands against the GPU's peaks (GPU host).

    ncu --clock-control none --nvtx --nvtx-include "request/" --section SpeedOfLight --csv \\
        python3 benchmarks/runtime/encoder_profile.py --skeletons out/skeletons > $OUT/ncu.csv
    python3 benchmarks/runtime/encoder_profile.py --summarize $OUT/ncu.csv

For each workload the config is refilled from its skeleton, fused (fp16, exact GELU), lowered to
bertfuse's ops, given FP8 weights as `convert --fp8` does, and each form is opened as a runtime
Session without CUDA graphs (so that each kernel is a launch the profiler sees), warmed up (the
GEMMs' algorithm timing happens there), then run once inside the NVTX range "request". The
summary groups the profiled kernels by name: calls, summed duration, and the duration-weighted
compute (SM) and memory throughput as percentages of the device's peak, as Nsight Compute's
Speed of Light section reports them.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections import defaultdict

from gpu_setup import lowered

WORKLOADS = [("shenma-3l", 20, 64), ("base", 32, 128)]


def models(skeleton: str) -> dict[str, str]:
    from bertfuse.bench.forms import fp8_model

    paths, k16, work = lowered(skeleton, "encoder-profile-")
    fp8, note = fp8_model(paths["bertfuse16"], k16, work)
    if fp8 is None:
        raise SystemExit(f"encoder_profile: {note}")
    return {"fp16": k16, "FP8": fp8}


def profile(skeletons: str) -> None:
    import onnxruntime as ort
    import torch

    from bertfuse.io.inputs import random_inputs
    from bertfuse.runtime import Session

    ort.preload_dlls()
    for config, batch, seq in WORKLOADS:
        forms = models(os.path.join(skeletons, f"{config}_raw.skel.onnx"))
        f = random_inputs(batch, seq, 1000, 2, seed=batch + seq)
        req = (f["input_ids"], f["input_mask"], f["segment_ids"])
        for form, path in forms.items():
            s = Session(path, max_batch=batch, max_seq=seq, batch_buckets=(batch,),
                        seq_buckets=(seq,), device="cuda", cuda_graph=False)
            for _ in range(3):
                s.run(*req, to_host=False)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("request")
            torch.empty(1, device="cuda").fill_(1.0)  # a marker kernel: where this request starts
            s.run(*req, to_host=False)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            print(f"profiled {config} b{batch} s{seq} {form}", file=sys.stderr, flush=True)
            s.close()


METRICS = {"Duration": "us", "Compute (SM) Throughput": "sm", "Memory Throughput": "mem",
           "DRAM Throughput": "dram"}


LABELS = [f"{c} b{b} s{q} {form}" for c, b, q in WORKLOADS for form in ("fp16", "FP8")]
MARKER = "FillFunctor"  # the kernel profile() launches before each request


def summarize(path: str) -> None:
    """The CSV's kernels in launch order, split into requests at the marker kernels (labelled in
    the order profile() runs them), one table per request."""
    rows: dict[str, dict] = {}
    with open(path, newline="") as fh:
        lines = [ln for ln in fh if ln.startswith('"')]
    for r in csv.DictReader(lines):
        key = r["ID"]
        k = rows.setdefault(key, {"name": r["Kernel Name"]})
        metric = METRICS.get(r["Metric Name"])
        if metric:
            value = float(r["Metric Value"].replace(",", ""))
            if r["Metric Name"] == "Duration":
                value = value / 1000.0 if r["Metric Unit"] in ("nsecond", "ns") else \
                    value * 1000.0 if r["Metric Unit"] in ("msecond", "ms") else value
            k[metric] = value
    requests: list[list[dict]] = []
    for key in sorted(rows, key=int):
        if MARKER in rows[key]["name"]:
            requests.append([])
        elif requests:
            requests[-1].append(rows[key])
    for label, kernels in zip(LABELS, requests):
        print(f"\n{label}: {len(kernels)} kernels, {sum(k.get('us', 0.0) for k in kernels):.1f} us")
        table(kernels)


def table(kernels: list[dict]) -> None:
    agg: dict[str, dict] = defaultdict(lambda: {"calls": 0, "us": 0.0, "sm": 0.0, "mem": 0.0,
                                                "dram": 0.0})
    for k in kernels:
        a = agg[k["name"][:60]]
        a["calls"] += 1
        a["us"] += k.get("us", 0.0)
        for m in ("sm", "mem", "dram"):
            a[m] += k.get(m, 0.0) * k.get("us", 0.0)
    print("| kernel | calls | us | compute (SM) % of peak | memory % of peak | DRAM % of peak |")
    print("|---|---|---|---|---|---|")
    for name, a in sorted(agg.items(), key=lambda kv: -kv[1]["us"]):
        w = a["us"] or 1.0
        print(f"| {name} | {a['calls']} | {a['us']:.1f} | {a['sm'] / w:.1f} | {a['mem'] / w:.1f} | "
              f"{a['dram'] / w:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skeletons", default="out/skeletons")
    ap.add_argument("--summarize", metavar="NCU_CSV", help="summarize an ncu --csv output instead")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize)
    else:
        profile(args.skeletons)
    return 0


if __name__ == "__main__":
    sys.exit(main())
