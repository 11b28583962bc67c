"""The bucket's CUDA graph captured by bertfuse around ORT's run (runtime/graphs.py) against
ONNX Runtime's own graph replay, in one process (GPU host).

For each workload and form (fp16; FP8 as fp8_ab.py builds it), two runtime Sessions of the same
model and bucket: one with `BERTFUSE_OWN_GRAPHS=0` (ORT captures and replays, `gpu_graph_id`: the
runtime before this change) and one as shipped (bertfuse captures). Timed in alternating rounds,
p50 in us:
- run:      Session.run(..., to_host=False), each session's request path (the own one also
            with outputs to the host, pooled_output alone and all: copied into their host
            mirrors inside the native call, and `fetched apart` after it as before); the own one
            through
            the fast lane's native launch of the graph that starts with the host->device copy,
            and with that copy queued apart from Python before the plain graph (`copy apart`)
- replay:   the replay alone (Session.replay_call): ORT's run call, or the own graph's
            cudaGraphLaunch + cudaStreamSynchronize
- staged replay: the graph that starts with the host->device copy, launched and waited for
- native:   the floor under the fast lane: its one native call (bf_stage_launch: staging into
            the bucket's pinned buffer, then the staged graph's launch and sync), no Python
            around it; `stage only`: the same call with no graph to launch (the staging alone)
and the GPU span of one own-graph replay under CUPTI. The two sessions' outputs are compared
(max |diff|; the same op library and GEMM choices in one process, so expected equal). Last,
shenma-3l fp16 with every bucket of max batch 32, max seq 128 warmed in both forms and 60
random requests compared bit for bit (every_bucket).

    python3 benchmarks/runtime/own_graph.py --skeletons out/skeletons [--iters 2000]

Writes $OUT/own_graph.json; the table is printed last.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

import numpy as np
from gpu_setup import parse_args, start_ort
from timeline import analyse, cases, traced


def every_bucket(model: str, requests: int = 60) -> dict:
    """Sessions with many buckets, all warmed (so ORT's arena is shared by every captured
    graph): random requests of random shapes and paddings through the own graphs and ORT's,
    compared bit for bit."""
    from bertfuse.io.inputs import random_inputs
    from bertfuse.runtime import Session

    kw = dict(max_batch=32, max_seq=128, device="cuda")
    os.environ["BERTFUSE_OWN_GRAPHS"] = "0"
    ort_graphs = Session(model, **kw)
    os.environ["BERTFUSE_OWN_GRAPHS"] = "1"
    own = Session(model, **kw)
    buckets = own.warmup()
    ort_graphs.warmup()
    rng = np.random.default_rng(6)
    worst, equal = 0.0, 0
    for i in range(requests):
        batch, seq = int(rng.integers(1, 33)), int(rng.integers(1, 129))
        f = random_inputs(batch, seq, 1000, 2, seed=i)
        mask = (np.arange(seq)[None, :] < rng.integers(1, seq + 1, (batch, 1))).astype(np.int32)
        req = (f["input_ids"], mask, f["segment_ids"])
        got, want = own.run(*req), ort_graphs.run(*req)
        d = max(float(np.max(np.abs(got[n].astype(np.float64) - want[n]))) for n in want)
        worst, equal = max(worst, d), equal + (d == 0.0)
    graphs = sum(len(b.graphs) for b in own._buckets.values())
    native = sum(b.lane is not None and any(b.lane[0].graphs) for b in own._buckets.values())
    out = {"buckets": len(buckets), "own_graphs": graphs, "graph_notes": str(own.graph_notes),
           "buckets_launched_natively": native,
           "requests": requests, "bit_equal": equal, "max_diff": worst}
    print(json.dumps(out), flush=True)
    own.close()
    ort_graphs.close()
    return out


def main() -> int:
    args = parse_args(__doc__)
    ort = start_ort()
    from bertfuse.bench.timing import time_interleaved
    from bertfuse.runtime import Session
    from bertfuse.runtime.pinned import address

    rows, shenma = [], ""
    for config, batch, seq, label, model, f in cases(args.skeletons):
        if label == "FP8" and config == "base" and batch == 1:
            continue
        if (config, label) == ("shenma-3l", "fp16"):
            shenma = model
        req = (f["input_ids"], f["input_mask"], f["segment_ids"])
        kw = dict(max_batch=batch, max_seq=seq, batch_buckets=(batch,), seq_buckets=(seq,),
                  device="cuda")
        os.environ["BERTFUSE_OWN_GRAPHS"] = "0"
        ort_graphs = Session(model, **kw)
        os.environ["BERTFUSE_OWN_GRAPHS"] = "1"
        own = Session(model, **kw)
        want = ort_graphs.run(*req)
        own.run(*req)  # the bucket is made on the checked path; the next call takes the lane
        got = own.run(*req)
        bucket = own._buckets[own.bucket_for(batch, seq)]
        mode = own.session_for(f["input_mask"], bucket, batch, seq)
        if mode not in bucket.graphs:  # said, and the next workload tried
            print(json.dumps({"workload": f"{config} b{batch} s{seq}", "form": label,
                              "error": str(own.graph_notes)}), flush=True)
            ort_graphs.close()
            own.close()
            continue
        diff = {n: float(np.max(np.abs(got[n].astype(np.float64) - want[n]))) for n in want}
        if bucket.lane is None or not any(bucket.lane[0].graphs):
            raise SystemExit(f"{config} {label}: the fast lane has no graph to launch")
        fn, lanes = own._stager._fn, {True: bucket.lane}
        bare = own._stager.lane(own, bucket, graphs=False)
        lanes[False] = (bare, ctypes.addressof(bare))
        ids, mask, segs = req
        head = (address(ids), ids.itemsize, address(mask), mask.itemsize, address(segs),
                segs.itemsize, batch, seq, 1)

        def native() -> None:  # the fast lane's one native call, no Python around it
            if fn(*head, lanes[True][1], 0) < 8:
                raise SystemExit("the native call did not launch")

        def stage_only() -> None:
            if fn(*head, lanes[False][1], 0) < 0:
                raise SystemExit("staging refused the request")

        def fetched(**kw) -> None:  # outputs copied after the call, as before the mirrors
            own._stager.mirrors = lambda *a: 0
            own.run(*req, **kw)
            del own._stager.mirrors

        def copy_apart() -> None:  # the fast lane as before the graph took the copy in
            bucket.lane = lanes[False]
            own.run(*req, to_host=False)
            bucket.lane = lanes[True]

        t = time_interleaved({"ort run": lambda: ort_graphs.run(*req, to_host=False),
                              "ort replay": ort_graphs.replay_call(f["input_mask"]),
                              "own run": lambda: own.run(*req, to_host=False),
                              "own run, pooled to host": lambda: own.run(
                                  *req, outputs=["pooled_output"]),
                              "own run, pooled, fetched apart": lambda: fetched(
                                  outputs=["pooled_output"]),
                              "own run, all to host": lambda: own.run(*req),
                              "own run, all, fetched apart": fetched,
                              "own run, copy apart": copy_apart,
                              "own replay": own.replay_call(f["input_mask"]),
                              "staged replay": bucket.staged[mode].launch,
                              "native": native, "stage only": stage_only},
                             args.iters, rounds=20)
        span = analyse(traced(bucket.graphs[mode].launch))
        row = {"workload": f"{config} b{batch} s{seq}", "form": label, "mode": mode,
               "staged_graph": mode in bucket.staged,
               **{f"{k}_p50_us": v[0] for k, v in t.items()},
               "span_us": span["span_us"], "busy_us": span["busy_us"],
               "events": span["events"], "max_diff_own_vs_ort_graphs": diff,
               "kernels_line": own.kernels.line()}
        rows.append(row)
        print(json.dumps(row), flush=True)
        ort_graphs.close()
        own.close()
    shapes = every_bucket(shenma)
    with open(os.path.join(os.environ.get("OUT", "."), "own_graph.json"), "w") as fh:
        json.dump({"onnxruntime": ort.__version__, "iters": args.iters, "rows": rows,
                   "every_bucket": shapes}, fh, indent=1)
    keys = ("ort run", "own run, copy apart", "own run", "own run, pooled to host",
            "own run, pooled, fetched apart", "own run, all to host",
            "own run, all, fetched apart", "native", "stage only", "ort replay", "own replay",
            "staged replay")
    print("\n| workload | form | " + " | ".join(keys) + " | GPU span | ort run - span | "
          "own run - span | max diff |")
    print("|---|---|" + "---|" * (len(keys) + 4))
    for r in rows:
        print(f"| {r['workload']} | {r['form']} | "
              + " | ".join(f"{r[k + '_p50_us']:.1f}" for k in keys)
              + f" | {r['span_us']:.1f} | {r['ort run_p50_us'] - r['span_us']:.1f} | "
              f"{r['own run_p50_us'] - r['span_us']:.1f} | "
              f"{max(r['max_diff_own_vs_ort_graphs'].values()):.2e} |")
    print(f"\nevery bucket of shenma-3l fp16 (max batch 32, max seq 128): {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
