"""What bringing outputs back to the host costs, and what `outputs=` saves (GPU).

For the padded runtime (and the packed one on the uniform mix), timed in alternating rounds:
- device: run(..., to_host=False), outputs stay on the GPU;
- whole buckets: to_host=False, then OrtValue.numpy() of every output, sliced (what
  Session.run did before it copied only the request's rows);
- to_host: run(...) as it is now (only rows [:batch] cross the bus);
- pooled only: run(..., outputs=["pooled_output"]).
Also checks that the row-sliced copies equal the whole-bucket ones (max diff).

    python3 benchmarks/runtime/host_outputs.py --skeleton out/skeletons/shenma-3l_raw.skel.onnx
"""

from __future__ import annotations

import numpy as np

from bertfuse.bench.models import packed_form
from bertfuse.bench.packed import uniform_case
from bertfuse.bench.timing import time_interleaved
from bertfuse.runtime import PackedSession, Session


def whole_buckets(session, ids, mask, segs) -> dict[str, np.ndarray]:
    dev = session.run(ids, mask, segs, to_host=False)
    b, s = mask.shape
    out = {}
    for name in ("sequence_output", "pooled_output"):
        host = dev[name].numpy()
        out[name] = host[:b, :s] if host.ndim == 3 else host[:b]
    return out


def main() -> None:
    args, fused, (ids, mask, segs) = uniform_case(None, __doc__, iters=300)
    b, s = mask.shape
    kw = dict(max_batch=32, max_seq=s, batch_buckets=(32,), seq_buckets=(s,), device="cuda")
    print(f"request: batch {b} in a bucket of 32, seq {s}, fill {mask.mean():.2f}", flush=True)
    for kind, sess in (("padded", Session(fused, **kw)),
                       ("packed", PackedSession(packed_form(fused), **kw))):
        calls = {
            "device": lambda: sess.run(ids, mask, segs, to_host=False),
            "whole buckets": lambda: whole_buckets(sess, ids, mask, segs),
            "to_host": lambda: sess.run(ids, mask, segs),
            "pooled only": lambda: sess.run(ids, mask, segs, outputs=["pooled_output"]),
        }
        timed = time_interleaved(calls, args.iters)
        new, old = sess.run(ids, mask, segs), whole_buckets(sess, ids, mask, segs)
        worst = max(float(np.abs(new[k] - old[k]).max()) for k in old)
        for name, (p50, p99) in timed.items():
            print(f"| {kind} | {name} | {p50:.1f} | {p99:.1f} |", flush=True)
        print(f"{kind}: row-sliced vs whole-bucket copies, max diff {worst}", flush=True)


if __name__ == "__main__":
    main()
