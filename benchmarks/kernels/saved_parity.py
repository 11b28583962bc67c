"""A converted model on the GPU through bertfuse's Session, against outputs saved elsewhere
(TensorFlow fp32 on the CPU host that converted it), with the time per request.

    python3 benchmarks/kernels/saved_parity.py MODEL.onnx REF.npz [--iters 200]

REF.npz holds, per request shape `b{B}s{S}`, its inputs `b{B}s{S}/in/<input>` and the reference
outputs `b{B}s{S}/out/<output>`. Prints one line per shape and output: max and mean |diff|
(fp16 limits: max <= 4e-2, mean <= 2e-3; NaN fails) and the p50 of Session.run; exit 1 when a
row fails. Where the model holds ai.bertfuse ops, the Session registers bertfuse's op library
(`bertfuse kernels build` first).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

MAX, MEAN = 4e-2, 2e-3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("ref")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    from bertfuse.runtime import Session

    ref = np.load(args.ref)
    shapes = sorted({k.split("/")[0] for k in ref.files})
    sess = Session(args.model, device="cuda", max_batch=max(int(s[1:].split("s")[0]) for s in shapes))
    ok = True
    for shape in shapes:
        feeds = {k.split("/")[2]: ref[k] for k in ref.files if k.startswith(f"{shape}/in/")}
        want = {k.split("/")[2]: ref[k] for k in ref.files if k.startswith(f"{shape}/out/")}
        got = sess.run(feeds["input_ids"], feeds.get("input_mask"), feeds.get("segment_ids"))
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            sess.run(feeds["input_ids"], feeds.get("input_mask"), feeds.get("segment_ids"))
            times.append(time.perf_counter() - t0)
        p50 = float(np.median(times)) * 1e6
        for name, w in want.items():
            d = np.abs(np.asarray(got[name], np.float64) - w)
            mx, mean = float(d.max()), float(d.mean())
            good = bool(np.isfinite(mx) and mx <= MAX and mean <= MEAN)
            ok &= good
            print(f"{'ok  ' if good else 'FAIL'} {shape:10s} {name:18s} max {mx:.2e} mean {mean:.2e} "
                  f"p50 {p50:8.1f} us")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
