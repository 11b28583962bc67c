"""Would a request split into parts that run side by side inside one CUDA graph finish sooner?
(GPU host.)

    python3 benchmarks/runtime/split_graph.py --skeletons out/skeletons [--iters 3000]

At shenma-3l b20 s64 every kernel is latency-bound (GEMMs at 22-48% of compute peak at 1,280
tokens): a request's rows split in k parts, each part's encoder a branch of one graph, might
fill the SMs where one part alone leaves them idle. Per workload of batch >= 2, per model
(bertfuse's ops, fp16 and the FP8 plan): k runtime Sessions with a bucket of batch / k rows each
(each its own CUDA stream and ORT arena, mask variants off), captured into ONE graph:

    begin capture (stream 0) -> event fork -> streams 1..k-1 wait on it
      -> part i's ORT run queued on stream i (i = 0..k-1)
      -> streams 1..k-1 record their join events -> stream 0 waits on them -> end capture

k = 1 is the whole request captured the same way. Each graph is replayed (launch, then a sync of
stream 0) in alternating rounds: wall p50 / p99 per replay; GPU span (events around the launch
on stream 0); the parts' outputs against the whole's (the same rows, so only the GEMMs'
algorithm choice at another M may move a bit). The inputs stay on the device (uploaded once), so
this times the encoder only. $OUT/split_graph.json holds the rows; the table is printed last.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np
from gpu_setup import lowered, parse_args, save, start_ort, workloads

PARTS = (1, 2, 4)
_P = ctypes.c_void_p


def models(skeleton: str) -> dict[str, str]:
    from bertfuse.bench.forms import fp8_model

    paths, k16, work = lowered(skeleton, "split-graph-")
    out = {"fp16": k16}
    f8, _ = fp8_model(paths["bertfuse16"], k16, work)
    if f8 is not None:
        out["FP8"] = f8
    return out


class Events:
    """The CUDA event calls the capture needs (the libcudart ORT loaded)."""

    def __init__(self) -> None:
        from bertfuse.runtime.graphs import cuda

        self.cu = cuda()
        lib = self.cu.lib
        for fn, args in ((lib.cudaEventCreate, [ctypes.POINTER(_P)]),
                         (lib.cudaEventRecord, [_P, _P]),
                         (lib.cudaStreamWaitEvent, [_P, _P, ctypes.c_uint]),
                         (lib.cudaEventSynchronize, [_P]),
                         (lib.cudaEventElapsedTime, [ctypes.POINTER(ctypes.c_float), _P, _P])):
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.lib = lib

    def new(self) -> int:
        ev = _P()
        self.cu.check(self.lib.cudaEventCreate(ctypes.byref(ev)), "cudaEventCreate")
        return ev.value

    def record(self, ev: int, stream: int) -> None:
        self.cu.check(self.lib.cudaEventRecord(ev, stream), "cudaEventRecord")

    def wait(self, stream: int, ev: int) -> None:
        self.cu.check(self.lib.cudaStreamWaitEvent(stream, ev, 0), "cudaStreamWaitEvent")

    def elapsed_us(self, a: int, b: int) -> float:
        ms = ctypes.c_float()
        self.cu.check(self.lib.cudaEventSynchronize(b), "cudaEventSynchronize")
        self.cu.check(self.lib.cudaEventElapsedTime(ctypes.byref(ms), a, b), "elapsed")
        return ms.value * 1000.0


def part_sessions(path: str, rows: list[int], seq: int, req: list[np.ndarray]) -> list[Any]:
    """One warm Session per part (bucket [rows_i, seq]), each run once on its part's rows so
    its bucket's device inputs hold them."""
    from bertfuse.runtime import Session

    out, lo = [], 0
    for n in rows:
        s = Session(path, max_batch=n, max_seq=seq, batch_buckets=(n,), seq_buckets=(seq,),
                    device="cuda", mask_variants=False)
        s.run(*[a[lo:lo + n] for a in req], to_host=False)
        out.append(s)
        lo += n
    return out


def capture_parts(ev: Events, sessions: list[Any], seq: int):
    """One graph holding every part's run, each on its own session's stream."""
    from bertfuse.runtime.device import replay
    from bertfuse.runtime.graphs import OwnGraph

    first = sessions[0].stream
    fork, joins = ev.new(), [ev.new() for _ in sessions[1:]]

    def record() -> None:
        ev.record(fork, first)
        for s in sessions[1:]:
            ev.wait(s.stream, fork)
        for s in sessions:
            bucket = s._buckets[(s.max_batch, seq)]
            replay(s.sessions["raw"], bucket.bindings["raw"], s._maker.capture_options())
        for s, j in zip(sessions[1:], joins):
            ev.record(j, s.stream)
            ev.wait(first, j)

    for s in sessions:
        ev.cu.check(ev.cu.sync(s.stream), "cudaStreamSynchronize")
    return OwnGraph.capture(first, record)


def outputs(sessions: list[Any], seq: int) -> dict[str, np.ndarray]:
    got: dict[str, list] = {}
    for s in sessions:
        for name, value in s._buckets[(s.max_batch, seq)].outputs.items():
            got.setdefault(name, []).append(value.numpy().astype(np.float64))
    return {k: np.concatenate(v) for k, v in got.items()}


def main() -> int:
    args = parse_args(__doc__)
    ort = start_ort()
    from bertfuse.bench.timing import time_interleaved

    ev = Events()
    rows = []
    for config, batch, seq, paths, f in workloads(args.skeletons, models):
        if batch < 2:
            continue
        req = [f["input_ids"], f["input_mask"], f["segment_ids"]]
        for form, path in paths.items():
            opened, graphs, result = {}, {}, {}
            for k in PARTS:
                if batch % k:
                    continue
                opened[k] = part_sessions(path, [batch // k] * k, seq, req)
                graphs[k] = capture_parts(ev, opened[k], seq)
                graphs[k].launch()
                result[k] = outputs(opened[k], seq)
            times = time_interleaved({k: g.launch for k, g in graphs.items()}, args.iters,
                                     rounds=20, warmup=50)
            a, b = ev.new(), ev.new()
            row = {"workload": f"{config} b{batch} s{seq}", "form": form, "parts": {}}
            for k, g in graphs.items():
                stream = opened[k][0].stream
                spans = []
                for _ in range(200):
                    ev.record(a, stream)
                    ev.cu.check(ev.cu.launch(g.handle, stream), "cudaGraphLaunch")
                    ev.record(b, stream)
                    spans.append(ev.elapsed_us(a, b))
                diff = max(float(np.abs(result[k][n] - result[1][n]).max()) for n in result[1])
                row["parts"][k] = {"p50_us": times[k][0], "p99_us": times[k][1],
                                   "gpu_span_us": float(np.median(spans)),
                                   "max_diff_vs_whole": diff}
            rows.append(row)
            print(row, flush=True)
            for k, g in graphs.items():
                g.release()
                for s in opened[k]:
                    s.close()
    save("split_graph.json", {"onnxruntime": ort.__version__, "rows": rows})
    print("\n| workload | form | parts | replay p50 (us) | p99 | GPU span | x whole | "
          "max diff vs whole |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        whole = r["parts"][1]["p50_us"]
        for k, p in r["parts"].items():
            print(f"| {r['workload']} | {r['form']} | {k} | {p['p50_us']:.1f} | "
                  f"{p['p99_us']:.1f} | {p['gpu_span_us']:.1f} | {p['p50_us'] / whole:.2f} | "
                  f"{p['max_diff_vs_whole']:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
