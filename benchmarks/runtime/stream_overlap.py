"""Do requests on several streams overlap on the GPU, and what does the host cost under load?

For padded and packed (3 layers b20 s64, fp16, uniform [8, 64] lengths, fill about 0.6),
with 1, 2, 4 replicas (SessionPool workers), each worker runs a tight loop of
- replay: ORT's run of its warm bucket's CUDA graph only (no request preparation);
- full: the whole request path, Session.run / PackedSession.run with to_host=False;
and the aggregate request rate is reported. A last check times a pure-Python loop while one
worker replays, against the same loop alone: whether ORT's run releases the GIL.

    python3 benchmarks/runtime/stream_overlap.py --skeleton out/skeletons/shenma-3l_raw.skel.onnx
"""

from __future__ import annotations

import threading
import time

from bertfuse.bench.models import packed_form
from bertfuse.bench.packed import uniform_case
from bertfuse.runtime import PackedSession, Session, SessionPool


def rate(pool: SessionPool, workers: int, loop, iters: int) -> float:
    """Requests per second with every worker running `loop(session, iters)` at once."""
    pool.call(lambda s: loop(s, 20))  # warm
    t0 = time.perf_counter()
    futures = [pool.submit(lambda s: loop(s, iters)) for _ in range(workers)]
    for f in futures:
        f.result()
    return workers * iters / (time.perf_counter() - t0)


def main() -> None:
    args, fused, (ids, mask, segs) = uniform_case(None, __doc__, iters=1500)
    b, s = mask.shape
    print(f"request: batch {b}, seq {s}, fill {mask.mean():.2f}", flush=True)
    kw = dict(max_batch=b, max_seq=s, batch_buckets=(b,), seq_buckets=(s,), device="cuda")
    makers = {"padded": lambda: Session(fused, **kw),
              "packed": lambda: PackedSession(packed_form(fused), **kw)}
    rows = []
    for kind, make in makers.items():
        for n in (1, 2, 4):
            pool = SessionPool(make, n, prepare=lambda sess: sess.run(ids, mask, segs))

            def replay_loop(sess, k):
                call = sess.replay_call(mask)  # the pool's prepare() warmed this bucket
                for _ in range(k):
                    call()

            def full_loop(sess, k):
                for _ in range(k):
                    sess.run(ids, mask, segs, to_host=False)

            r_replay = rate(pool, n, replay_loop, args.iters)
            r_full = rate(pool, n, full_loop, args.iters)
            rows.append((kind, n, r_replay, r_full))
            print(f"{kind} x{n}: replay {r_replay:,.0f} req/s ({1e6 / r_replay:.0f} us each), "
                  f"full {r_full:,.0f} req/s ({1e6 / r_full:.0f} us each)", flush=True)
            if kind == "packed" and n == 1:
                gil_check(pool, replay_loop)
            pool.close()
    print("\n| kind | streams | replay req/s (us each) | full request req/s (us each) |")
    print("|---|---|---|---|")
    for kind, n, r1, r2 in rows:
        print(f"| {kind} | {n} | {r1:,.0f} ({1e6 / r1:.0f}) | {r2:,.0f} ({1e6 / r2:.0f}) |")


def gil_check(pool: SessionPool, replay_loop) -> None:
    def spin(seconds: float) -> int:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n

    alone = spin(0.5)
    stop = threading.Event()

    def loop(sess):
        while not stop.is_set():
            replay_loop(sess, 10)

    future = pool.submit(loop)
    time.sleep(0.05)
    shared = spin(0.5)
    stop.set()
    future.result()
    print(f"GIL: a Python loop ran {shared / alone:.0%} of its speed alone while a worker "
          "replayed", flush=True)


if __name__ == "__main__":
    main()
