"""Where a packed request's time goes (GPU): kernel breakdown of packed vs padded for one
request, and the host-side cost of packing it.

    python3 benchmarks/runtime/packed_profile.py --skeleton out/skeletons/shenma-3l_raw.skel.onnx --batch 20 --seq 64
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import onnx

from bertfuse.bench.models import packed_form, prepare_models
from bertfuse.bench.timing import kernel_profile, time_calls
from bertfuse.io.inputs import lengths_request as request
from bertfuse.ops.packing_layout import choose_shape, pack_into
from bertfuse.runtime import PackedSession, Session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skeleton", required=True)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--fills", type=float, nargs="+", default=[0.15, 0.6])
    args = ap.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    paths = prepare_models(args.skeleton, tempfile.mkdtemp())
    fused = onnx.load(paths["bertfuse16"])
    b, s = args.batch, args.seq
    kw = dict(max_batch=b, max_seq=s, batch_buckets=(b,), seq_buckets=(s,), device="cuda")
    padded = Session(fused, **kw)
    packed = PackedSession(packed_form(fused), **kw)
    for fill in args.fills:
        lengths = np.clip(np.round(np.random.default_rng(3).normal(fill * s, 0.1 * s, b)), 1, s)
        ids, mask, segs = request(lengths.astype(int), s, 1000)
        for label, sess in (("padded", padded), ("packed", packed)):
            def call(sess=sess):
                return sess.run(ids, mask, segs, to_host=False)
            wall, _ = time_calls(call, 300)
            gpu, kernels, top, _ = kernel_profile(call)
            print(f"fill {mask.mean():.2f} {label}: wall {wall:.1f} us, GPU {gpu:.1f} us, "
                  f"{kernels} kernels", flush=True)
            for name, us in top:
                print(f"    {us:7.1f}  {name}")
        shape = choose_shape(packed.shapes_for(b, s), b, int(mask.sum()))
        t_pack, _ = time_calls(lambda: pack_into(mask, shape), 300)
        bucket = packed._bucket(shape)
        arrays = {"input_ids": ids, "input_mask": mask, "segment_ids": segs}
        t_stage, _ = time_calls(lambda: packed._stage(bucket.views, arrays, shape), 300)
        t_copy, _ = time_calls(lambda: bucket.device.update_inplace(bucket.host), 300)
        t_run, _ = time_calls(packed.replay_call(mask), 300)
        print(f"   host: pack_into {t_pack:.1f} us, stage {t_stage:.1f} us, copy {t_copy:.1f} us,"
              f" ORT run {t_run:.1f} us; shape {shape}", flush=True)


if __name__ == "__main__":
    main()
