"""GPU check that the runtime's mask variants give the raw mask's answers (fp32 and fp16).

    python3 benchmarks/runtime/variant_check.py --skeleton out/skeletons/shenma-3l_raw.skel.onnx

For right-padded, full and holed requests at several bucket shapes: the default runtime
(right_padded='auto', each bucket verifying its variants) against a raw-mask-only runtime,
max |diff| over kept positions, and any variant a bucket turned off.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import onnx

from bertfuse.bench.models import prepare_models
from bertfuse.bench.timing import compare
from bertfuse.io.inputs import lengths_request as request
from bertfuse.runtime import Session
from bertfuse.runtime.request_checks import model_facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skeleton", required=True)
    args = ap.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    paths = prepare_models(args.skeleton, tempfile.mkdtemp(), anchors=False)
    rng = np.random.default_rng(5)
    kw = dict(max_batch=32, max_seq=128, batch_buckets=(1, 4, 20, 32), seq_buckets=(32, 64, 128))
    for precision in ("bertfuse32", "bertfuse16"):
        model = onnx.load(paths[precision])
        vocab = model_facts(model).vocab_size
        auto, raw = Session(model, **kw), Session(model, mask_variants=False, **kw)
        forced = Session(model, right_padded="keyseq", **kw)  # [3B+2] at every length
        for batch, seq in ((20, 64), (3, 50), (1, 128), (32, 128), (32, 32)):
            for kind in ("right", "full", "hole"):
                lengths = rng.integers(1, seq + 1, batch) if kind != "full" else \
                    np.full(batch, seq)
                ids, mask, segs = request(lengths, seq, vocab)
                if kind == "hole":
                    mask[0, seq // 2] = 0
                want = {k: v.astype(np.float64) for k, v in raw.run(ids, mask, segs).items()}
                mx, _ = compare(auto.run(ids, mask, segs), want, mask)
                fx, _ = compare(forced.run(ids, mask, segs), want, mask)
                print(f"{precision} b{batch} s{seq} {kind:5s} max diff auto {mx:.2e} "
                      f"forced [3B+2] {fx:.2e}", flush=True)
        print(precision, "auto turned off:", auto.variant_notes or "none", flush=True)
        print(precision, "forced turned off:", forced.variant_notes or "none", flush=True)


if __name__ == "__main__":
    main()
