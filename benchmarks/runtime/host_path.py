"""The request's host path on the GPU: the native fast lane against the checked path (GPU host).

For each workload, one `Session` (kernels='auto', CUDA graphs) of the model refilled from its
skeleton, timed in alternating rounds on the same warm bucket:
- fast lane: run(..., to_host=False) as shipped (runtime/staging.py, one native staging pass);
- checked path: the same call with the fast lane off (NumPy checks, mask form, staging);
- replay only: ORT's run of the bound bucket (GPU work, graph launch, ORT's own host time),
  what neither path can cut.
The two paths' outputs must be equal (max |diff| 0, fetched to the host). Also prints what
the op library's cuBLASLt timing chose per GEMM shape (bf_cublas_timings).

    python3 benchmarks/runtime/host_path.py --skeletons out/skeletons [--iters 3000]

Writes $OUT/host_path.json; the table is printed last. Exit 1 when the paths disagree or the
fast lane was not used.
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

    rows, models = [], {}
    for config, batch, seq in WORKLOADS:
        s = Session(fused_model(models, args.skeletons, config), max_batch=batch, max_seq=seq,
                    batch_buckets=(batch,), seq_buckets=(seq,), device="cuda", kernels="auto")
        f = random_inputs(batch, seq, 1000, 2, seed=batch + seq)  # right-padded rows
        req = (f["input_ids"], f["input_mask"], f["segment_ids"])
        stager = s._stager
        s.run(*req)  # warms the bucket
        got = s.run(*req)
        used = stager is not None and stager.serve(s, dict(zip(("input_ids", "input_mask", "segment_ids"), req)),
                                                   list(got), False) is not None
        s._stager = None
        want = s.run(*req)
        s._stager = stager
        diff = max(float(np.abs(got[k].astype(np.float64) - want[k]).max()) for k in got)

        def fast() -> None:
            s._stager = stager
            s.run(*req, to_host=False)

        def checked() -> None:
            s._stager = None
            s.run(*req, to_host=False)

        replay = s.replay_call(f["input_mask"])
        t = time_interleaved({"fast lane": fast, "checked path": checked, "replay only": replay},
                             args.iters, rounds=20)
        s._stager = stager
        row = {"workload": f"{config} b{batch} s{seq}", "kernels": s.kernels.line(), "fast_lane_used": used,
               "max_diff": diff, **{f"{k} p50_us": v[0] for k, v in t.items()},
               **{f"{k} p99_us": v[1] for k, v in t.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        s.close()
    lib = ctypes.CDLL(str(locate()))
    lib.bf_cublas_timings.restype = ctypes.c_char_p
    timings = json.loads(lib.bf_cublas_timings().decode())
    print("cuBLASLt algorithm chosen per plan (index into the heuristic's valid list; us each):")
    for c in timings:
        print(f"  M={c['M']} N={c['N']} K={c['K']} epilogue={c['epilogue']} residual={c['residual']}: "
              f"{c['chosen']}  {c['us']}")
    with open(os.path.join(os.environ.get("OUT", "."), "host_path.json"), "w") as fh:
        json.dump({"onnxruntime": ort.__version__, "rows": rows, "cublas_timings": timings}, fh, indent=1)
    print("\n| workload | fast lane p50 | checked path p50 | replay only p50 | fast - replay | checked - replay | outputs equal |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        fl, ck, rp = r["fast lane p50_us"], r["checked path p50_us"], r["replay only p50_us"]
        print(f"| {r['workload']} | {fl:.1f} | {ck:.1f} | {rp:.1f} | {fl - rp:.1f} | {ck - rp:.1f} | "
              f"{'yes' if r['max_diff'] == 0 else r['max_diff']} |")
    bad = [r for r in rows if r["max_diff"] != 0 or not r["fast_lane_used"]]
    print(f"\n{len(bad)} rows where the paths disagree or the fast lane was not used" if bad else "\nall rows agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
