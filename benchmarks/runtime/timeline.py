"""Where wall time goes past the GPU's kernels, per workload (GPU host): the span of one
request's kernels on the GPU, the gaps inside it, and the host around it.

For each workload, the fp16 model on bertfuse's ops and the `--fp8` model (as fp8_ab.py builds
them from the skeleton) are opened as runtime Sessions (CUDA graph, warm bucket). Per form:
- the request's p50 through `Session.run(..., to_host=False)` and ORT's replay alone, timed in
  alternating rounds;
- 20 replays under CUPTI (torch.profiler): per request, the span from the first kernel's start
  to the last one's end, the busy time (the union of the kernels' intervals), the gaps (span -
  busy) and which neighbours they fall between, and the memsets and copies in the graph.
So wall = (replay - span: the graph launch and the sync, host side) + (span - busy: the gaps
between the graph's nodes on the GPU) + busy; and run - replay is the runtime's own host path.
CUPTI's tracing may itself widen the gaps a little; the spans are read against the replay p50
timed without it. The op library's record of what its cuBLASLt timing chose per GEMM shape
(bf_cublas_timings) is saved beside the rows.

    python3 benchmarks/runtime/timeline.py --skeletons out/skeletons [--iters 2000]

Writes $OUT/timeline.json; the table is printed last.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import sys
from typing import Iterator

import numpy as np
from fp8_ab import FORMS, models
from gpu_setup import WORKLOADS, parse_args, start_ort

SHOWN = {"fp16": FORMS[0], "FP8": FORMS[3]}
REPS = 20


def traced(fn, reps: int = REPS) -> list[list[tuple[float, float, str]]]:
    """(start, end, name) of every GPU activity per call, in start order, for `reps` calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    ev = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    n = len(ev) // reps
    if n == 0 or len(ev) % reps:
        raise SystemExit(f"timeline: {len(ev)} GPU events over {reps} calls: not one count per call")
    return [ev[i * n:(i + 1) * n] for i in range(reps)]


def analyse(calls: list[list[tuple[float, float, str]]]) -> dict:
    from bertfuse.bench.timing import busy_us

    spans, busies, pairs = [], [], collections.defaultdict(list)
    memsets, copies = [], []
    for ev in calls:
        spans.append(max(e for _, e, _ in ev) - ev[0][0])
        busies.append(busy_us([(s, e) for s, e, _ in ev]))
        reach = ev[0][1]  # the latest end so far: a gap opens past it
        for (_, _, before), (s, e, name) in zip(ev, ev[1:]):
            pairs[(_short(before), _short(name))].append(max(s - reach, 0.0))
            reach = max(reach, e)
        memsets.append([e - s for s, e, name in ev if name.startswith("Memset")])
        copies.append([e - s for s, e, name in ev if name.startswith("Memcpy")])
    top = sorted(((float(np.mean(v)), k, len(v) // len(calls)) for k, v in pairs.items()),
                 key=lambda r: -r[0] * r[2])
    return {"events": len(calls[0]), "span_us": float(np.median(spans)),
            "busy_us": float(np.median(busies)),
            "gaps_us": float(np.median(np.array(spans) - np.array(busies))),
            "memsets": len(memsets[0]), "memset_us": float(np.median([sum(m) for m in memsets])),
            "copies": len(copies[0]), "copy_us": float(np.median([sum(c) for c in copies])),
            "gap_pairs": [{"after": a, "before": b, "per_call": n, "mean_gap_us": round(g, 2)}
                          for g, (a, b), n in top[:10]]}


def _short(name: str) -> str:
    name = name[5:] if name.startswith("void ") else name
    name = name.replace("bertfuse::(anonymous namespace)::", "")
    return name.split("(")[0].split("<")[0][:60]


def cases(skeletons: str) -> Iterator[tuple[str, int, int, str, str, dict]]:
    """(config, batch, seq, form label, model path, random inputs) per workload and form; each
    config's models built once from its skeleton."""
    from bertfuse.io.inputs import random_inputs

    built: dict[str, dict[str, str]] = {}
    for config, batch, seq in WORKLOADS:
        if config not in built:
            built[config] = models(os.path.join(skeletons, f"{config}_raw.skel.onnx"))
        f = random_inputs(batch, seq, 1000, 2, seed=batch + seq)
        for label, form in SHOWN.items():
            yield config, batch, seq, label, built[config][form], f


def main() -> int:
    args = parse_args(__doc__)
    ort = start_ort()
    from bertfuse.bench.timing import time_interleaved
    from bertfuse.runtime import Session

    rows = []
    for config, batch, seq, label, model, f in cases(args.skeletons):
        req = (f["input_ids"], f["input_mask"], f["segment_ids"])
        s = Session(model, max_batch=batch, max_seq=seq, batch_buckets=(batch,),
                    seq_buckets=(seq,), device="cuda")
        s.run(*req)
        replay = s.replay_call(f["input_mask"])
        t = time_interleaved({"run": lambda: s.run(*req, to_host=False), "replay": replay},
                             args.iters, rounds=20)
        row = {"workload": f"{config} b{batch} s{seq}", "form": label,
               "run_p50_us": t["run"][0], "replay_p50_us": t["replay"][0],
               "kernels_line": s.kernels.line(), **analyse(traced(replay))}
        row["launch_sync_us"] = row["replay_p50_us"] - row["span_us"]
        row["host_path_us"] = row["run_p50_us"] - row["replay_p50_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        s.close()
    from bertfuse.kernels.library import locate

    lib = ctypes.CDLL(str(locate()))  # the library ORT loaded: the same handle, its records
    lib.bf_cublas_timings.restype = ctypes.c_char_p
    timings = json.loads(lib.bf_cublas_timings().decode())  # what the GEMM timing chose per shape
    with open(os.path.join(os.environ.get("OUT", "."), "timeline.json"), "w") as fh:
        json.dump({"onnxruntime": ort.__version__,
                   "BERTFUSE_GEMM_TIMING": os.environ.get("BERTFUSE_GEMM_TIMING"),
                   "rows": rows, "cublas_timings": timings}, fh, indent=1)
    for r in rows:
        print(f"\n{r['workload']} {r['form']}: largest gaps (mean us x per call)")
        for p in r["gap_pairs"][:6]:
            print(f"  {p['mean_gap_us']:6.2f} x {p['per_call']:3d}  {p['after']} -> {p['before']}")
    print("\n| workload | form | run p50 | replay p50 | GPU span | busy | gaps in span | events | "
          "memsets (us) | launch + sync | host path |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['form']} | {r['run_p50_us']:.1f} | {r['replay_p50_us']:.1f} | "
              f"{r['span_us']:.1f} | {r['busy_us']:.1f} | {r['gaps_us']:.1f} | {r['events']} | "
              f"{r['memsets']} ({r['memset_us']:.1f}) | {r['launch_sync_us']:.1f} | "
              f"{r['host_path_us']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
