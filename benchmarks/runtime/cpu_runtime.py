"""Where the runtime's gains are not: the CPU. Times one request shape after another through
ORT on the raw tf2onnx export, ORT's own transformer optimizer output, the bertfuse-fused model
in plain ORT, bertfuse's Session with its CPU defaults (each request at its own shape), and the
Session with the GPU's machinery asked for on the CPU (buckets + mask variants).

    bertfuse example --config shenma-3l -o ex
    bertfuse convert ex -o raw.onnx --no-fuse --no-verify && bertfuse optimize raw.onnx -o fused.onnx
    python benchmarks/runtime/cpu_runtime.py raw.onnx fused.onnx [--iters 30]

Interleaved rounds (bertfuse.bench.timing), p50 in ms; ORT's default threads.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import onnxruntime as ort

from bertfuse.bench.timing import time_interleaved
from bertfuse.io.inputs import padded_request
from bertfuse.runtime import Session
from bertfuse.runtime.request_checks import model_facts


def plain(path: str):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("raw")
    ap.add_argument("fused")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--shapes", default="4x40,20x64,1x128")
    args = ap.parse_args()
    import onnx
    from onnxruntime.transformers import optimizer

    facts = model_facts(onnx.load(args.fused, load_external_data=False))
    with tempfile.TemporaryDirectory() as tmp:
        opt = optimizer.optimize_model(args.raw, model_type="bert_tf", num_heads=12,
                                       hidden_size=768, use_gpu=False)
        opt_path = os.path.join(tmp, "ort_opt.onnx")
        opt.save_model_to_file(opt_path)
        t0 = time.perf_counter()
        default = Session(args.fused, max_batch=32, max_seq=128, device="cpu")
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        gpu_like = Session(args.fused, max_batch=32, max_seq=128, device="cpu",
                           pad_to_buckets=True, mask_variants=True)
        built_gpu_like = time.perf_counter() - t0
        print(f"Session(device='cpu') built in {built:.1f} s, {len(default.sessions)} ORT "
              f"session(s); with buckets + variants {built_gpu_like:.1f} s, "
              f"{len(gpu_like.sessions)} sessions")
        sessions = {"ORT raw": plain(args.raw), "ORT optimizer": plain(opt_path),
                    "bertfuse, plain ORT": plain(args.fused)}
        print("| shape | " + " | ".join(list(sessions) + ["Session (CPU default)",
                                                          "Session, buckets + variants"])
              + " |")
        for shape in args.shapes.split(","):
            batch, seq = map(int, shape.split("x"))
            feeds = padded_request(batch, seq, facts.vocab_size or 1000)
            fns = {k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()}
            fns["default"] = lambda: default.run(**feeds)
            fns["gpu_like"] = lambda: gpu_like.run(**feeds)
            timed = time_interleaved(fns, args.iters, rounds=5, warmup=3)
            print(f"| {batch}x{seq} | " + " | ".join(f"{p50 / 1000:.1f}"
                                                     for p50, _ in timed.values()) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
