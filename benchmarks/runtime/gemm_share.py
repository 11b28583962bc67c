"""A session's warm-up with the cuBLASLt choice shared across op instances, or timed by each
(GPU host). Run once per setting, each in its own process (the library reads it once):

    BERTFUSE_GEMM_SHARE=1 python3 benchmarks/runtime/gemm_share.py --skeletons out/skeletons
    BERTFUSE_GEMM_SHARE=0 python3 benchmarks/runtime/gemm_share.py --skeletons out/skeletons

Per workload, the config's bertfuse-kernels model (fp16, refilled from its skeleton) is opened as
a runtime Session with one bucket of the request's shape and warmed up: the wall time of that
(session, the first runs with each GEMM's algorithm timing, the CUDA graph's capture), how many
cuBLASLt timings the library has made so far (bf_cublas_timings), how many distinct GEMM kernels
are among the request's 15 costliest (CUPTI), and ORT's replay p50. The pooled outputs are saved
($OUT/gemm_share_<setting>.npz); where the other setting's file is already there, their max
|diff| is printed (a different algorithm may round differently, within fp16's step).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

import numpy as np
from gpu_setup import lowered, parse_args, print_table, save, start_ort, workloads

COLUMNS = [  # the table printed last: (header, key in a row, format)
    ("warm-up (s)", "warmup_s", ".3f"),
    ("cuBLASLt timings so far", "cublas_timings_so_far", ""),
    ("distinct GEMM kernels", "distinct_gemm_kernels", ""),
    ("replay p50 (us)", "replay_p50_us", ".1f"),
    ("GPU (us)", "gpu_us", ".1f"),
]


def models(skeleton: str) -> dict[str, str]:
    _, k16, _ = lowered(skeleton, "gemm-share-")
    return {"fp16": k16}


def main() -> int:
    args = parse_args(__doc__)
    start_ort()
    from bertfuse.bench.timing import kernel_profile, time_calls
    from bertfuse.kernels.library import locate
    from bertfuse.runtime import Session

    setting = os.environ.get("BERTFUSE_GEMM_SHARE", "1")
    rows, outs, lib = [], {}, None
    for config, batch, seq, paths, f in workloads(args.skeletons, models):
        req = (f["input_ids"], f["input_mask"], f["segment_ids"])
        t0 = time.perf_counter()
        s = Session(paths["fp16"], max_batch=batch, max_seq=seq, batch_buckets=(batch,),
                    seq_buckets=(seq,), device="cuda")
        s.warmup([(batch, seq)])
        warm_s = time.perf_counter() - t0
        if lib is None:  # the library ORT loaded (the same handle)
            lib = ctypes.CDLL(str(locate()))
            lib.bf_cublas_timings.restype = ctypes.c_char_p
        timings = json.loads(lib.bf_cublas_timings().decode())
        label = f"{config} b{batch} s{seq}"
        outs[label.replace(" ", "_")] = s.run(*req)["pooled_output"]
        call = s.replay_call(f["input_mask"])
        p50, _ = time_calls(call, args.iters)
        gpu, count, top, _ = kernel_profile(call)
        gemms = sorted({name for name, _ in top if name.startswith("nvjet")})
        row = {"workload": label, "share": setting, "warmup_s": warm_s,
               "cublas_timings_so_far": len(timings), "distinct_gemm_kernels": len(gemms),
               "gemm_kernels": gemms, "replay_p50_us": p50, "gpu_us": gpu, "kernels": count}
        rows.append(row)
        print(json.dumps(row), flush=True)
        s.close()
    save(f"gemm_share_{setting}.json", {"rows": rows})
    out_dir = os.environ.get("OUT", ".")
    np.savez(os.path.join(out_dir, f"gemm_share_{setting}.npz"), **outs)
    other = os.path.join(out_dir, f"gemm_share_{'0' if setting != '0' else '1'}.npz")
    if os.path.exists(other):
        with np.load(other) as o:
            for k, v in outs.items():
                if k in o:
                    print(f"{k}: pooled_output max |diff| against the other setting "
                          f"{float(np.abs(v.astype(np.float64) - o[k]).max()):.3g}")
    print_table([{"workload": r["workload"], f"BERTFUSE_GEMM_SHARE={setting}": r} for r in rows],
                (f"BERTFUSE_GEMM_SHARE={setting}",), COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
