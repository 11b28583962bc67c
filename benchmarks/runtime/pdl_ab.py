"""Programmatic dependent launch on against off inside the CUDA graph, in one process (GPU host).

For each workload, two `Session`s (kernels='auto', CUDA graphs) of the model refilled from its
skeleton: one whose graph was captured with PDL on (the default: the LayerNorm, GELU and
attention kernels launched with the programmatic-serialization attribute), one captured with it
off (`bf_check_set_pdl(0)` in the op library while that session captures; the attribute is
fixed in a graph once captured). Both are timed in alternating rounds on the same warm bucket:
the replay alone (ORT's run of the bound bucket) and the whole call (fast lane, to_host=False).
Outputs must be equal bit for bit: PDL changes when kernels start, not what they compute.

    python3 benchmarks/runtime/pdl_ab.py --skeletons out/skeletons [--iters 3000]

Writes $OUT/pdl_ab.json; the table is printed last. Exit 1 when the outputs differ.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

import numpy as np
from gpu_setup import WORKLOADS, fused_model, parse_args, start_ort


def main() -> int:
    args = parse_args(__doc__)
    ort = start_ort()
    from bertfuse.bench.timing import time_interleaved
    from bertfuse.io.inputs import random_inputs
    from bertfuse.kernels.library import locate
    from bertfuse.runtime import Session

    lib = None
    rows, models = [], {}
    for config, batch, seq in WORKLOADS:
        f = random_inputs(batch, seq, 1000, 2, seed=batch + seq)
        req = (f["input_ids"], f["input_mask"], f["segment_ids"])
        sessions, outs = {}, {}
        for label, on in (("PDL on", 1), ("PDL off", 0)):
            s = Session(fused_model(models, args.skeletons, config), max_batch=batch, max_seq=seq,
                        batch_buckets=(batch,), seq_buckets=(seq,), device="cuda", kernels="auto")
            if lib is None:  # the library ORT loaded for the first session: the same handle
                lib = ctypes.CDLL(str(locate()))
            lib.bf_check_set_pdl(on)
            s.run(*req)  # warms the bucket: the CUDA graph is captured under this setting
            outs[label] = s.run(*req)
            sessions[label] = s
        lib.bf_check_set_pdl(1)
        diff = max(float(np.abs(outs["PDL on"][k].astype(np.float64) - outs["PDL off"][k]).max())
                   for k in outs["PDL on"])
        calls = {}
        for label, s in sessions.items():
            calls[f"{label} replay"] = s.replay_call(f["input_mask"])
            calls[f"{label} call"] = (lambda s=s: s.run(*req, to_host=False))
        t = time_interleaved(calls, args.iters, rounds=20)
        row = {"workload": f"{config} b{batch} s{seq}", "kernels": sessions["PDL on"].kernels.line(),
               "max_diff": diff, **{f"{k} p50_us": v[0] for k, v in t.items()},
               **{f"{k} p99_us": v[1] for k, v in t.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        for s in sessions.values():
            s.close()
    with open(os.path.join(os.environ.get("OUT", "."), "pdl_ab.json"), "w") as fh:
        json.dump({"onnxruntime": ort.__version__, "rows": rows}, fh, indent=1)
    print("\n| workload | replay, PDL on | replay, PDL off | on - off | call, PDL on | call, PDL off | on - off | outputs equal |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ron, roff = r["PDL on replay p50_us"], r["PDL off replay p50_us"]
        con, coff = r["PDL on call p50_us"], r["PDL off call p50_us"]
        print(f"| {r['workload']} | {ron:.1f} | {roff:.1f} | {ron - roff:+.1f} | {con:.1f} | {coff:.1f} | "
              f"{con - coff:+.1f} | {'yes' if r['max_diff'] == 0 else r['max_diff']} |")
    bad = [r for r in rows if r["max_diff"] != 0]
    print(f"\n{len(bad)} workloads where the outputs differ" if bad else "\noutputs equal in every workload")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
