"""Is a slow bertfuse call the session or the host CPU? One process, shenma-3l b20 s64 (GPU host).

`bench` and `context_ab.py` saw the same call run at two speeds (about 225 and 250-265 us p50)
from one phase to the next. Here every call of `run(..., to_host=False)` (kernels='auto', CUDA
graphs, the fast lane) records its wall time, the calling thread's CPU time, the CPU it ran on
before and after, and a canary: a fixed 300-step Python loop timed just before the call, whose
time moves only with the host CPU's speed (clock, cache, a shared core). Phases: one session
unpinned; pinned to the CPU it ran on and to CPU 2; two sessions in rounds of 150 calls,
unpinned and pinned; alternating every call; ORT's replay alone, pinned and unpinned; and the
rounds of two again at the end.

    python3 benchmarks/runtime/host_state.py --skeletons out/skeletons

Writes $OUT/host_state.json (machine facts and every phase); the table is printed last.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable

import numpy as np
import psutil
from gpu_setup import parse_args, start_ort

CONFIG, BATCH, SEQ = "shenma-3l", 20, 64
_getcpu = ctypes.CDLL("libc.so.6").sched_getcpu


def machine() -> dict:
    facts: dict = {"cpus": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0))}
    try:
        facts["numa_nodes"] = sorted(n for n in os.listdir("/sys/devices/system/node")
                                     if n.startswith("node"))
        facts["topo"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True,
                                       text=True).stdout
        with open("/proc/cpuinfo") as fh:  # by hand: psutil has no CPU model name
            info = fh.readlines()
        facts["model"] = next(line for line in info if line.startswith("model name")).strip()
        facts["mhz"] = sorted({f"{f.current:.3f}" for f in psutil.cpu_freq(percpu=True)})[:6]
    except (OSError, StopIteration) as exc:
        facts["error"] = repr(exc)
    return facts


def canary() -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(300):
        x += i
    return time.perf_counter() - t0


def measure(fns: dict[str, Callable[[], object]], n: int, every: int = 150) -> dict:
    """The functions in turns of `every` calls, n calls each; per function: wall p10/p50/p90,
    thread CPU / wall, canary p50, calls whose CPU changed, CPUs seen."""
    rec: dict[str, list] = {k: [] for k in fns}
    while len(rec[next(iter(fns))]) < n:
        for k, fn in fns.items():
            for _ in range(every):
                c = canary()
                c0, t0, u0 = _getcpu(), time.perf_counter(), time.thread_time()
                fn()
                t1, u1, c1 = time.perf_counter(), time.thread_time(), _getcpu()
                rec[k].append((t1 - t0, u1 - u0, c, c0 != c1, c0))
    out = {}
    for k, r in rec.items():
        a = np.array([x[:4] for x in r], float)
        cpus = [x[4] for x in r]
        out[k] = {"p10": round(float(np.percentile(a[:, 0], 10)) * 1e6, 1),
                  "p50": round(float(np.median(a[:, 0])) * 1e6, 1),
                  "p90": round(float(np.percentile(a[:, 0], 90)) * 1e6, 1),
                  "cpu/wall": round(float(a[:, 1].sum() / a[:, 0].sum()), 2),
                  "canary_p50_ns": round(float(np.median(a[:, 2])) * 1e9),
                  "moved": int(a[:, 3].sum()), "ncpus": len(set(cpus)),
                  "top_cpu": max(set(cpus), key=cpus.count)}
    return out


def main() -> int:
    args = parse_args(__doc__)
    start_ort()
    from bertfuse.bench.models import prepare_models
    from bertfuse.io.inputs import random_inputs
    from bertfuse.runtime import Session

    facts = machine()
    print(json.dumps(facts, indent=1), flush=True)
    paths = prepare_models(os.path.join(args.skeletons, f"{CONFIG}_raw.skel.onnx"),
                           tempfile.mkdtemp(prefix="host-state-"), ort_models=False)
    f = random_inputs(BATCH, SEQ, 1000, 2, seed=BATCH + SEQ)
    req = (f["input_ids"], f["input_mask"], f["segment_ids"])

    def session() -> Session:
        s = Session(paths["bertfuse16"], max_batch=BATCH, max_seq=SEQ, batch_buckets=(BATCH,),
                    seq_buckets=(SEQ,), device="cuda", kernels="auto")
        for _ in range(50):
            s.run(*req, to_host=False)
        return s

    s1 = session()
    call1 = lambda: s1.run(*req, to_host=False)  # noqa: E731
    res = {"A one session, unpinned": measure({"s1": call1}, args.iters)}
    everywhere = os.sched_getaffinity(0)
    for cpu in (res["A one session, unpinned"]["s1"]["top_cpu"], 2):
        os.sched_setaffinity(0, {cpu})
        res[f"B one session, pinned cpu {cpu}"] = measure({"s1": call1}, args.iters)
    os.sched_setaffinity(0, everywhere)
    s2 = session()
    two = {"s1": call1, "s2": lambda: s2.run(*req, to_host=False)}
    res["C two sessions, rounds of 150, unpinned"] = measure(two, args.iters // 2)
    os.sched_setaffinity(0, {2})
    res["D two sessions, rounds of 150, pinned 2"] = measure(two, args.iters // 2)
    res["E two sessions, every call, pinned 2"] = measure(two, args.iters // 2, every=1)
    replay = s1.replay_call(f["input_mask"])
    res["F s1 replay only, pinned 2"] = measure({"r1": replay}, args.iters)
    os.sched_setaffinity(0, everywhere)
    res["G s1 replay only, unpinned"] = measure({"r1": replay}, args.iters)
    res["H two sessions, rounds of 150, unpinned again"] = measure(two, args.iters // 2)
    with open(os.path.join(os.environ.get("OUT", "."), "host_state.json"), "w") as fh:
        json.dump({"facts": facts, "res": res}, fh, indent=1)
    print("\n| phase | fn | p10 | p50 | p90 | thread cpu/wall | canary ns | moved | ncpus |")
    print("|---|---|---|---|---|---|---|---|---|")
    for phase, d in res.items():
        for k, v in d.items():
            print(f"| {phase} | {k} | {v['p10']} | {v['p50']} | {v['p90']} | {v['cpu/wall']} | "
                  f"{v['canary_p50_ns']} | {v['moved']} | {v['ncpus']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
