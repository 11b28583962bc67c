"""Contracts and NumPy references of every op bertfuse emits (README.md: shapes, dtypes,
attributes): contrib/ (ONNX Runtime's com.microsoft ops), bertfuse/ (bertfuse's ai.bertfuse
ops, whose CUDA kernels are kernels/), contract (the OpContract type), evaluator (a model
run through the references with onnx's ReferenceEvaluator), packing_layout (the packed
request layout the packing pass and the runtime share).

``CONTRACTS`` maps op_type -> OpContract. Each op module also exposes ``reference(...)`` (float64
inside, result in the input dtype) and ``make_model(...)`` (a one-node ONNX model, opsets
ai.onnx 17 + com.microsoft 1). No TensorFlow anywhere: this must import on the GPU serving host.
"""

from __future__ import annotations

from bertfuse.ops.bertfuse import bert_attention, dense, dense_fp8, embed_layernorm as bert_embed, \
    packed_ops, pooler
from bertfuse.ops.contrib import attention, embed_layernorm, gelu, layernorm, packed_attention, \
    skip_layernorm
from bertfuse.ops.contract import BERTFUSE_DOMAIN, BERTFUSE_OPSET, MS_DOMAIN, MS_OPSET, ONNX_OPSET, AttrSpec, \
    OpContract, TensorSpec, one_node_model

CONTRACTS: dict[str, OpContract] = {
    c.op_type: c
    for c in (
        attention.CONTRACT,
        skip_layernorm.CONTRACT,
        embed_layernorm.CONTRACT,
        gelu.BIAS_GELU,
        gelu.FAST_GELU,
        gelu.GELU,
        gelu.GEMM_FAST_GELU,
        layernorm.CONTRACT,
        packed_attention.CONTRACT,
        packed_attention.RESTORE_PADDING,
    )
}

# bertfuse's own op library (domain ai.bertfuse, CUDA EP only): kept apart from CONTRACTS,
# whose entries are checked against ONNX Runtime's own schemas and kernels.
BERTFUSE_CONTRACTS: dict[str, OpContract] = {
    c.op_type: c
    for c in (
        dense.DENSE_BIAS,
        dense.DENSE_BIAS_GELU,
        dense.DENSE_BIAS_SKIP_LAYERNORM,
        bert_attention.CONTRACT,
        dense_fp8.DENSE_BIAS_FP8,
        dense_fp8.DENSE_BIAS_GELU_FP8,
        dense_fp8.DENSE_BIAS_SKIP_LAYERNORM_FP8,
        *packed_ops.CONTRACTS.values(),
        pooler.CONTRACT,
        bert_embed.CONTRACT,
    )
}

__all__ = [
    "BERTFUSE_CONTRACTS",
    "BERTFUSE_DOMAIN",
    "BERTFUSE_OPSET",
    "CONTRACTS",
    "MS_DOMAIN",
    "MS_OPSET",
    "ONNX_OPSET",
    "AttrSpec",
    "OpContract",
    "TensorSpec",
    "attention",
    "bert_attention",
    "dense",
    "dense_fp8",
    "embed_layernorm",
    "gelu",
    "layernorm",
    "one_node_model",
    "packed_attention",
    "packed_ops",
    "skip_layernorm",
]
