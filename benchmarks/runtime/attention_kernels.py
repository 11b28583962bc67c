"""Which ORT attention kernel serves bertfuse's runtime best, per mask variant (GPU host).

    python3 benchmarks/runtime/attention_kernels.py --skeletons out/skeletons

For each workload and each `sdpa_kernel` provider option value (ORT's attention backend
bit mask; unset = ORT's choice), times the runtime on right-padded requests (key-length
variant) and with the raw 2-D mask, and records GPU kernel time via CUPTI.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import onnx

from bertfuse.bench.models import prepare_models
from bertfuse.bench.timing import kernel_profile, time_calls
from bertfuse.bench.workloads import PADDED_WORKLOADS as WORKLOADS
from bertfuse.io.inputs import padded_request as request
from bertfuse.runtime import Session
from bertfuse.runtime.request_checks import model_facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skeletons", required=True)
    ap.add_argument("--workloads", nargs="+", default=["shenma-3l b20 s64", "base b32 s128"])
    ap.add_argument("--values", nargs="+", default=["", "1", "2", "4", "8", "16", "128"])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    rows = []
    for name in args.workloads:
        config, batch, seq = WORKLOADS[name]
        paths = prepare_models(os.path.join(args.skeletons, f"{config}_raw.skel.onnx"),
                               tempfile.mkdtemp())
        vocab = model_facts(onnx.load(paths["bertfuse16"], load_external_data=False)).vocab_size
        feeds = request(batch, seq, vocab)
        for value in args.values:
            for variants in (True, False):
                opts = {"sdpa_kernel": value} if value else {}
                try:
                    s = Session(paths["bertfuse16"], max_batch=batch, max_seq=seq,
                                batch_buckets=(batch,), seq_buckets=(seq,), device="cuda",
                                provider_options=opts, mask_variants=variants,
                                right_padded="keylen")
                    s.warmup([(batch, seq)])
                    a = (feeds["input_ids"], feeds["input_mask"], feeds["segment_ids"])
                    fn = lambda: s.run(*a, to_host=False)  # noqa: E731
                    p50, p99 = time_calls(fn, args.iters)
                    gpu, kernels, top, _ = kernel_profile(fn)
                    att = [k for k, _ in top if "ttention" in k or "sdpa" in k or "fmha" in k
                           or "Softmax" in k][:1]
                    rows.append((name, value or "default", "keylen" if variants else "raw",
                                 round(p50, 1), round(gpu, 1), att[0][:60] if att else ""))
                except Exception as exc:
                    rows.append((name, value or "default", "keylen" if variants else "raw",
                                 None, None, f"failed: {str(exc).splitlines()[0][:80]}"))
                print(rows[-1], flush=True)
    with open(os.path.join(args.out, "attention_kernels.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    print("| workload | sdpa_kernel | mask | p50 (us) | GPU (us) | attention kernel |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")


if __name__ == "__main__":
    main()
