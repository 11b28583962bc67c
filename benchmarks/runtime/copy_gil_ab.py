"""A/B on the GPU: the request copy queued through ctypes.PyDLL (keeps the GIL, as the runtime
does) against ctypes.CDLL (drops and retakes it), in one process, alternating rounds.

Each worker of a SessionPool runs full requests (`run(..., to_host=False)`) in a tight loop,
as in stream_overlap.py; requests per second for padded and packed at 2 and 4 replicas.

    python3 benchmarks/runtime/copy_gil_ab.py --skeleton out/skeletons/shenma-3l_raw.skel.onnx
"""

from __future__ import annotations

import ctypes

import numpy as np

from bertfuse.runtime import pinned
from bertfuse.bench.models import packed_form
from bertfuse.bench.packed import uniform_case
from bertfuse.runtime import PackedSession, Session, SessionPool
from stream_overlap import rate


def main() -> None:
    args, fused, (ids, mask, segs) = uniform_case(None, __doc__, iters=1000)
    b, s = mask.shape
    kw = dict(max_batch=b, max_seq=s, batch_buckets=(b,), seq_buckets=(s,), device="cuda")
    pinned._runtime()
    copies = {"PyDLL (keeps GIL)": pinned._queue_copy,
              "CDLL (drops GIL)": pinned._cudart.cudaMemcpyAsync}
    makers = {"padded": lambda: Session(fused, **kw),
              "packed": lambda: PackedSession(packed_form(fused), **kw)}

    def full_loop(sess, k):
        for _ in range(k):
            sess.run(ids, mask, segs, to_host=False)

    print("| kind | replicas | " + " | ".join(f"{c} req/s" for c in copies) + " |")
    print("|---|---|" + "---|" * len(copies))
    for kind, make in makers.items():
        for n in (2, 4):
            pool = SessionPool(make, n, prepare=lambda sess: sess.run(ids, mask, segs))
            got: dict[str, list[float]] = {c: [] for c in copies}
            for _ in range(3):
                for label, fn in copies.items():
                    pinned._queue_copy = fn
                    got[label].append(rate(pool, n, full_loop, args.iters))
            pool.close()
            print(f"| {kind} | {n} | " + " | ".join(
                f"{np.median(v):,.0f} ({', '.join(f'{x:,.0f}' for x in v)})"
                for v in got.values()) + " |", flush=True)
    pinned._queue_copy = copies["PyDLL (keeps GIL)"]
    assert isinstance(pinned._cudart, ctypes.CDLL)


if __name__ == "__main__":
    main()
