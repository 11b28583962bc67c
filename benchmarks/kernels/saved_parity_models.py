"""On a host with TensorFlow: TinyBERT- and MiniLM-shaped checkpoints (head sizes 26 and 32, 4
layers, 512 positions, random weights), each converted with `--precision fp16 --ops
bertfuse`, and TensorFlow's own fp32 outputs on padded requests of seq 64 and 384, for
benchmarks/kernels/saved_parity.py on the GPU host.

    python3 benchmarks/kernels/saved_parity_models.py [OUT_DIR]     # default out/e2e

Writes OUT_DIR/<name>_k.onnx and OUT_DIR/<name>_ref.npz (and the checkpoints beside them).
"""

from __future__ import annotations

import sys

import numpy as np

import bertfuse
from bertfuse.converter import load_source
from bertfuse.converter.config import BertConfig
from bertfuse.converter.example import write_example
from bertfuse.io.inputs import random_inputs
from bertfuse.pipeline.options import ConvertOptions

SPECS = {"tinybert": dict(hidden_size=312, num_attention_heads=12, intermediate_size=1200),
         "minilm": dict(hidden_size=384, num_attention_heads=12, intermediate_size=1536)}
SHAPES = ((20, 64), (4, 384))  # (batch, seq): the ranker's shape, and one past 128
VOCAB = 8000


def main(out: str) -> None:
    opts = ConvertOptions()
    for name, kw in SPECS.items():
        cfg = BertConfig(vocab_size=VOCAB, num_hidden_layers=4, max_position_embeddings=512, **kw)
        ckpt = write_example(cfg, f"{out}/{name}_ckpt", seed=1)
        bertfuse.convert(ckpt, f"{out}/{name}_k.onnx", precision="fp16", ops="bertfuse")
        src = load_source(str(ckpt), opts.kind, opts.signature, None, None, None)
        refs = {}
        try:
            for b, s in SHAPES:
                feeds = dict(random_inputs(b, s, VOCAB, seed=7))
                for k, v in feeds.items():
                    refs[f"b{b}s{s}/in/{k}"] = v
                for k, v in src.run_many([feeds])[0].items():
                    refs[f"b{b}s{s}/out/{k}"] = v
        finally:
            src.close()
        np.savez(f"{out}/{name}_ref.npz", **refs)
        print(f"{name}: {out}/{name}_k.onnx, {out}/{name}_ref.npz")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out/e2e")
