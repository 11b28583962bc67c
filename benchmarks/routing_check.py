"""GPU check of the runtime's routing: low-fill requests to the packed form, the rest padded.

    python3 benchmarks/routing_check.py --skeleton .carry/base_raw.skel.onnx
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx

from bertfuse.passes.cleanup import Cleanup
from bertfuse.passes.manager import default_passes, run_passes
from bertfuse.passes.packing import PackingPass
from bertfuse.runtime.bench import time_calls
from bertfuse.runtime.session import Session
from bertfuse.runtime.weights import fill_weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skeleton", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    raw = onnx.load(args.skeleton)
    fill_weights(raw, 0)
    fused, _ = run_passes(raw, default_passes("fp16"))
    packed, _ = run_passes(fused, [PackingPass(), Cleanup()])
    b, s = args.batch, args.seq
    kw = dict(max_batch=b, max_seq=s, batch_buckets=(b,), seq_buckets=(s,), device="cuda")
    padded_only = Session(fused, **kw)
    routed = Session(fused, packed_model=packed, **kw)
    rng = np.random.default_rng(0)
    for label, lengths in (("fill 0.24", np.concatenate([rng.integers(8, 25, b - 4),
                                                         np.full(4, s)])),
                           ("full", np.full(b, s))):
        mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
        ids = rng.integers(1, 1000, (b, s)).astype(np.int32) * mask
        segs = np.zeros((b, s), np.int32)
        want = padded_only.run(ids, mask, segs)
        got = routed.run(ids, mask, segs)
        d = np.abs(got["sequence_output"].astype(np.float64) - want["sequence_output"])[mask != 0]
        t_pad, _ = time_calls(lambda: padded_only.run(ids, mask, segs, to_host=False), 200)
        t_route, _ = time_calls(lambda: routed.run(ids, mask, segs, to_host=False), 200)
        print(f"| {label} | padded {t_pad:.0f} us | routed {t_route:.0f} us | "
              f"x{t_pad / t_route:.2f} | max diff {d.max():.2e} |", flush=True)


if __name__ == "__main__":
    main()
