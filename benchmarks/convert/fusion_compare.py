"""What ORT's transformer optimizer (model_type bert_tf) fuses vs what bertfuse fuses, on
the same raw tf2onnx graphs. Usage:

    python benchmarks/convert/fusion_compare.py RAW.onnx [RAW2.onnx ...]

Raw graphs come from `bertfuse convert SRC --no-fuse --no-verify -o RAW.onnx` (or your own
tf2onnx export). Prints a markdown table: fused-op counts and total nodes for each tool.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter

import onnx

from bertfuse.passes.manager import run_passes

OPS = ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "LayerNormalization",
       "BiasGelu", "FastGelu", "Gelu")


def ort_fusion(path: str) -> tuple[Counter, int]:
    from onnxruntime.transformers import optimizer

    logging.disable(logging.WARNING)
    m = optimizer.optimize_model(path, model_type="bert_tf", num_heads=0, hidden_size=0)
    return Counter(n.op_type for n in m.model.graph.node), len(m.model.graph.node)


def bertfuse_fusion(path: str) -> tuple[Counter, int]:
    model, _ = run_passes(onnx.load(path))
    return Counter(n.op_type for n in model.graph.node), len(model.graph.node)


def main(paths: list[str]) -> None:
    print("| raw graph | tool | " + " | ".join(OPS) + " | nodes |")
    print("|---|---|" + "---|" * len(OPS) + "---|")
    for path in paths:
        raw_nodes = len(onnx.load(path, load_external_data=False).graph.node)
        for tool, fn in (("ORT bert_tf", ort_fusion), ("bertfuse", bertfuse_fusion)):
            counts, nodes = fn(path)
            print(f"| {path.rsplit('/', 1)[-1]} ({raw_nodes} nodes) | {tool} | "
                  + " | ".join(str(counts[o]) for o in OPS) + f" | {nodes} |")


if __name__ == "__main__":
    main(sys.argv[1:])
