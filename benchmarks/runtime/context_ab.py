"""What the process around a session costs its p50, in one process (GPU host).

`bertfuse bench` times bertfuse's row interleaved with a dozen other sessions and the peers,
30 calls a round, and its p50 has sat 25-40 us above `host_path.py`'s for the same session
alone. This script separates the candidates on shenma-3l b20 s64 (kernels='auto', CUDA graphs,
fast lane, to_host=False):

- threads: the same session opened with ORT's default intra-op pool (one thread per core,
  spinning) and with one thread and spinning off;
- alone: those two, interleaved with each other only (20 rounds);
- crowd: the same two interleaved, 30 calls a round as bench does, with six more Sessions of
  the model (kernels 'ort' and 'auto', each mask form) and the torch SDPA + CUDA graph peer;
- crowd, gc frozen: the same after gc.freeze() (bench holds torch, transformers and a dozen
  ONNX models: a larger heap for the collector to walk).

    python3 benchmarks/runtime/context_ab.py --skeletons out/skeletons [--iters 3000]

Writes $OUT/context_ab.json; the table is printed last.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import sys
import tempfile
from typing import Iterator

from gpu_setup import parse_args, start_ort

CONFIG, BATCH, SEQ = "shenma-3l", 20, 64


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Sessions opened inside get one intra-op thread and no spinning."""
    from bertfuse.runtime import device

    plain = device.make_session
    device.make_session = functools.partial(plain, intra_op_threads=1,
                                            config={"session.intra_op.allow_spinning": "0"})
    try:
        yield
    finally:
        device.make_session = plain


def main() -> int:
    args = parse_args(__doc__)
    ort = start_ort()
    from bertfuse.bench.models import prepare_models
    from bertfuse.bench.padded import _metadata
    from bertfuse.bench.peers import bert_config, torch_graph_call
    from bertfuse.bench.timing import time_interleaved
    from bertfuse.io.inputs import random_inputs
    from bertfuse.runtime import Session

    paths = prepare_models(os.path.join(args.skeletons, f"{CONFIG}_raw.skel.onnx"),
                           tempfile.mkdtemp(prefix="ctx-"), ort_models=False)
    model = paths["bertfuse16"]
    f = random_inputs(BATCH, SEQ, 1000, 2, seed=BATCH + SEQ)
    req = (f["input_ids"], f["input_mask"], f["segment_ids"])

    def session(**kw) -> Session:
        s = Session(model, max_batch=BATCH, max_seq=SEQ, batch_buckets=(BATCH,), seq_buckets=(SEQ,),
                    device="cuda", **kw)
        s.run(*req)
        s.run(*req)
        return s

    s_default = session(kernels="auto")
    with one_thread():
        s_one = session(kernels="auto")
    mine = {"default threads": lambda: s_default.run(*req, to_host=False),
            "1 thread, no spin": lambda: s_one.run(*req, to_host=False)}
    phases = {}
    phases["alone"] = time_interleaved({**mine,
                                        "default threads, replay": s_default.replay_call(f["input_mask"]),
                                        "1 thread, replay": s_one.replay_call(f["input_mask"])},
                                       args.iters, rounds=20)
    print("alone", json.dumps(phases["alone"]), flush=True)

    crowd = [session(kernels=k, right_padded=m) for k in ("ort", "auto")
             for m in ("auto", "keylen", "keyseq")]
    calls = dict(mine)
    for i, s in enumerate(crowd):
        calls[f"crowd {i}"] = (lambda s=s: s.run(*req, to_host=False))
    cfg = bert_config(_metadata(paths["raw32"]))
    calls["torch SDPA peer"] = torch_graph_call(cfg, f)[0]
    rounds = max(1, args.iters // 30)
    phases["crowd"] = time_interleaved(calls, args.iters, rounds=rounds)
    print("crowd", json.dumps({k: phases["crowd"][k] for k in mine}), flush=True)
    gc.collect()
    gc.freeze()
    phases["crowd, gc frozen"] = time_interleaved(calls, args.iters, rounds=rounds)
    print("crowd, gc frozen", json.dumps({k: phases["crowd, gc frozen"][k] for k in mine}), flush=True)
    gc.unfreeze()

    out = {"onnxruntime": ort.__version__, "workload": f"{CONFIG} b{BATCH} s{SEQ}",
           "kernels": s_default.kernels.line(), "iters": args.iters,
           "phases": {p: {k: {"p50_us": v[0], "p99_us": v[1]} for k, v in t.items()}
                      for p, t in phases.items()}}
    with open(os.path.join(os.environ.get("OUT", "."), "context_ab.json"), "w") as fh:
        json.dump(out, fh, indent=1)
    print("\n| phase | default threads p50 / p99 | 1 thread, no spin p50 / p99 |")
    print("|---|---|---|")
    for p, t in phases.items():
        print(f"| {p} | " + " | ".join(f"{t[k][0]:.1f} / {t[k][1]:.1f}" for k in mine) + " |")
    rp = phases["alone"]
    print(f"| alone, ORT replay only | {rp['default threads, replay'][0]:.1f} | {rp['1 thread, replay'][0]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
