"""A launch setting of the op library on against off inside the CUDA graph, in one process (GPU host).

For each workload, two `Session`s (kernels='auto', CUDA graphs) of the model refilled from its
skeleton, each captured under one value of an op-library switch (set through its check entry
point while that session captures; a launch's shape and attributes are fixed in a graph once
captured):
  --switch pdl (default)  programmatic dependent launch on (the default: the LayerNorm, GELU and
                          attention kernels launched with the programmatic-serialization
                          attribute) against off (`bf_check_set_pdl(0)`);
  --switch ln-cap         the LayerNorm's register cap as the library picks it per shape (capped
                          where its CTAs would not all be resident at once) against never
                          (`bf_check_set_ln_cap(1)`).
Both are timed in alternating rounds on the same warm bucket: the replay alone (ORT's run of the
bound bucket) and the whole call (fast lane, to_host=False). Outputs must be equal bit for bit:
either switch changes when and where kernels run, not what they compute.

    python3 benchmarks/runtime/pdl_ab.py --skeletons out/skeletons [--iters 3000] [--switch ln-cap]

Writes $OUT/pdl_ab.json (ln_cap_ab.json); the table is printed last. Exit 1 when the outputs
differ.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

import numpy as np
from gpu_setup import WORKLOADS, fused_model, parse_args, start_ort

# switch -> (the library's setter, (label, value) on then off, the value to leave set, run file)
SWITCHES = {"pdl": ("bf_check_set_pdl", (("PDL on", 1), ("PDL off", 0)), 1, "pdl_ab.json"),
            "ln-cap": ("bf_check_set_ln_cap", (("LN cap picked", 0), ("LN uncapped", 1)), 0,
                       "ln_cap_ab.json")}


def main() -> int:
    args = parse_args(__doc__, lambda ap: ap.add_argument("--switch", choices=sorted(SWITCHES),
                                                          default="pdl"))
    setter, forms, default, run_file = SWITCHES[args.switch]
    (on_label, _), (off_label, _) = forms
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
        for label, value in forms:
            s = Session(fused_model(models, args.skeletons, config), max_batch=batch, max_seq=seq,
                        batch_buckets=(batch,), seq_buckets=(seq,), device="cuda", kernels="auto")
            if lib is None:  # the library ORT loaded for the first session: the same handle
                lib = ctypes.CDLL(str(locate()))
            getattr(lib, setter)(value)
            s.run(*req)  # warms the bucket: the CUDA graph is captured under this setting
            outs[label] = s.run(*req)
            sessions[label] = s
        getattr(lib, setter)(default)
        diff = max(float(np.abs(outs[on_label][k].astype(np.float64) - outs[off_label][k]).max())
                   for k in outs[on_label])
        calls = {}
        for label, s in sessions.items():
            calls[f"{label} replay"] = s.replay_call(f["input_mask"])
            calls[f"{label} call"] = (lambda s=s: s.run(*req, to_host=False))
        t = time_interleaved(calls, args.iters, rounds=20)
        row = {"workload": f"{config} b{batch} s{seq}", "kernels": sessions[on_label].kernels.line(),
               "max_diff": diff, **{f"{k} p50_us": v[0] for k, v in t.items()},
               **{f"{k} p99_us": v[1] for k, v in t.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        for s in sessions.values():
            s.close()
    with open(os.path.join(os.environ.get("OUT", "."), run_file), "w") as fh:
        json.dump({"onnxruntime": ort.__version__, "switch": args.switch, "rows": rows}, fh,
                  indent=1)
    a, b = on_label, off_label
    print(f"\n| workload | replay, {a} | replay, {b} | difference | call, {a} | call, {b} | "
          "difference | outputs equal |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ron, roff = r[f"{a} replay p50_us"], r[f"{b} replay p50_us"]
        con, coff = r[f"{a} call p50_us"], r[f"{b} call p50_us"]
        print(f"| {r['workload']} | {ron:.1f} | {roff:.1f} | {ron - roff:+.1f} | {con:.1f} | {coff:.1f} | "
              f"{con - coff:+.1f} | {'yes' if r['max_diff'] == 0 else r['max_diff']} |")
    bad = [r for r in rows if r["max_diff"] != 0]
    print(f"\n{len(bad)} workloads where the outputs differ" if bad else "\noutputs equal in every workload")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
