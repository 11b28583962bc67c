"""Serving with bertfuse's runtime: buckets, IO binding, CUDA graphs (CPU fallback here).

    .venv/bin/python examples/serve_runtime.py [MODEL.onnx] [--device cuda]

Without MODEL, a tiny example is written and converted first. On CUDA, requests of different
shapes land in preallocated buckets, each replaying its CUDA graph; on the CPU each runs at
its own shape (what is fast there). Bad requests are refused before they reach a kernel.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def tiny_model(workdir: Path) -> str:
    import bertfuse
    from bertfuse.converter.example import write_example

    src = write_example("tiny", str(workdir / "tiny"))
    out = workdir / "tiny.onnx"
    bertfuse.convert(src, out, seed=0)
    return str(out)


def main() -> None:
    from bertfuse.runtime import RequestError, Session

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    device = "cuda" if "--device" in sys.argv and sys.argv[-1] == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        model = args[0] if args else tiny_model(Path(tmp))
        sess = Session(model, max_batch=8, max_seq=64, batch_buckets=(1, 4, 8),
                       seq_buckets=(16, 32, 64), device=device)
        sess.warmup()  # CUDA: every bucket allocated and captured; CPU: one largest request
        rng = np.random.default_rng(0)
        for batch, seq in ((1, 10), (3, 30), (8, 64)):
            ids = rng.integers(1, sess.facts.vocab_size, (batch, seq)).astype(np.int32)
            mask = np.ones((batch, seq), np.int32)
            mask[0, seq // 2:] = 0  # padding in the first row
            out = sess.run(ids, mask)
            print(f"request {batch}x{seq} -> runs at {sess.bucket_for(batch, seq)}: "
                  f"sequence_output {out['sequence_output'].shape}, "
                  f"pooled_output {out['pooled_output'].shape}")
        try:
            sess.run(np.full((1, 8), sess.facts.vocab_size, np.int32))
        except RequestError as exc:
            print(f"refused: {exc}")


if __name__ == "__main__":
    main()
