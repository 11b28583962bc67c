"""The lowering to bertfuse's ops (`--ops bertfuse`) checked on the CPU, for e2e tests."""

from __future__ import annotations

from collections import Counter

import onnx


def lowered(path: str, layers: int, head_gelus: int = 0) -> onnx.ModelProto:
    """A converted fp32 model through optimize's fp16 + lowering (which checks the lowered
    model against the fp32 one itself); asserts every encoder layer lowered and no miss."""
    from bertfuse.pipeline.lowering import kernels_misses
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import optimize_model

    model, report = optimize_model(path, None, opts=ConvertOptions(precision="fp16",
                                                                   ops="bertfuse"))
    ops = Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node)
    bf = "ai.bertfuse"
    assert ops[f"{bf}.BertAttention"] == layers, ops
    assert ops[f"{bf}.DenseBiasGelu"] == layers + head_gelus, ops
    assert ops[f"{bf}.DenseBiasSkipLayerNorm"] == 2 * layers, ops
    assert not {"com.microsoft.Attention", "com.microsoft.SkipLayerNormalization"} & set(ops), ops
    assert report.passes.to_json()["encoder"]["fully_fused"] and not kernels_misses(report.passes)
    return model
