"""Run a fused model without ONNX Runtime: onnx's ReferenceEvaluator with this folder's NumPy
references as the kernels of every custom node (com.microsoft and ai.bertfuse).

ORT's CPU EP has no kernel for the ai.bertfuse ops, so this is how a CPU host checks a
bertfuse-kernels model: the model and its ORT-contrib twin both run here, each custom node
through its reference, and must agree. fp16 MatMul/Gemm compute in float32 and round once
(what a GPU GEMM with fp32 accumulation gives; NumPy's own fp16 matmul is also very slow).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from bertfuse.ops.bertfuse import bert_attention, dense, dense_fp8, packed_ops, pooler
from bertfuse.ops.bertfuse import embed_layernorm as bert_embed
from bertfuse.ops.contrib import attention, embed_layernorm, gelu, skip_layernorm
from bertfuse.ops.contract import BERTFUSE_DOMAIN, MS_DOMAIN


def _float32_compute(*xs: np.ndarray) -> list[np.ndarray]:
    return [x.astype(np.float32) if x.dtype == np.float16 else x for x in xs]


class MatMul(OpRun):
    op_domain = ""

    def _run(self, a, b):
        return (np.matmul(*_float32_compute(a, b)).astype(a.dtype),)


class Gemm(OpRun):
    op_domain = ""

    def _run(self, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
        a32, b32 = _float32_compute(a, b)
        y = alpha * ((a32.T if transA else a32) @ (b32.T if transB else b32))
        if c is not None:
            y = y + beta * c.astype(np.float32)
        return (y.astype(a.dtype),)


class _Custom(OpRun):
    """A contrib/bertfuse op: no ONNX schema (ai.onnx has an Attention of its own, whose
    attribute defaults must not leak in); attributes absent from the node take _run's
    defaults."""

    op_schema = None


class Attention(_Custom):
    op_domain = MS_DOMAIN

    def _run(self, x, w, bias=None, mask_index=None, past=None, attention_bias=None,
             past_sequence_length=None, num_heads=None, mask_filter_value=-10000.0, scale=None,
             unidirectional=0, qkv_hidden_sizes=None, past_present_share_buffer=0,
             do_rotary=0, rotary_embedding_dim=None):
        if past is not None or attention_bias is not None or unidirectional or do_rotary or \
                qkv_hidden_sizes is not None:
            raise NotImplementedError("Attention: only BERT's bidirectional form is evaluated")
        return (attention.reference(x, w, bias, mask_index, num_heads=num_heads,
                                    mask_filter_value=mask_filter_value, scale=scale),)


class SkipLayerNormalization(_Custom):
    op_domain = MS_DOMAIN

    def _run(self, x, skip, gamma, beta=None, bias=None, epsilon=skip_layernorm.DEFAULT_EPSILON):
        out = skip_layernorm.reference_outputs(x, skip, gamma, beta, bias, epsilon=epsilon)
        return tuple(out)


class EmbedLayerNormalization(_Custom):
    op_domain = MS_DOMAIN

    def _run(self, input_ids, segment_ids, word_embedding, position_embedding,
             segment_embedding=None, gamma=None, beta=None, mask=None, position_ids=None,
             epsilon=embed_layernorm.DEFAULT_EPSILON, mask_index_type=None):
        return tuple(embed_layernorm.reference_outputs(
            input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma,
            beta, mask, position_ids, epsilon=epsilon))


class BiasGelu(_Custom):
    op_domain = MS_DOMAIN

    def _run(self, a, b):
        return (gelu.reference(a, b),)


class FastGelu(_Custom):
    op_domain = MS_DOMAIN

    def _run(self, x, bias=None):
        return (gelu.reference(x, bias, approximate=True),)


class Gelu(_Custom):
    op_domain = MS_DOMAIN

    def _run(self, x):
        return (gelu.reference(x),)


def _yq_outputs(op: OpRun, y: np.ndarray, y64: np.ndarray | None = None,
                yq_scale: float | None = None) -> tuple:
    """A dense or attention op's outputs in slot order, as far as the node names them: Y, then
    Yq (e4m3 of Y with yq_scale) and Y32 where asked for, an empty stand-in where skipped."""
    names = list(op.onnx_node.output)
    out = [y]
    if len(names) > 1:
        if names[1] and yq_scale is None:
            raise ValueError(f"{op.onnx_node.name}: output Yq needs the attribute yq_scale")
        out.append(dense_fp8.e4m3_output(y, yq_scale) if names[1] else np.empty(0, np.uint8))
    if len(names) > 2:
        out.append(y64.astype(np.float32) if names[2] and y64 is not None else np.empty(0, np.float32))
    return tuple(out)


class DenseBias(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, x, w, bias, yq_scale=None):
        return _yq_outputs(self, dense.dense_bias(x, w, bias), yq_scale=yq_scale)


class DenseBiasGelu(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, x, w, bias, approximate=0, yq_scale=None):
        return _yq_outputs(self, dense.dense_bias_gelu(x, w, bias, approximate=approximate),
                           yq_scale=yq_scale)


class DenseBiasSkipLayerNorm(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, x, w, bias, skip, gamma, beta, epsilon=skip_layernorm.DEFAULT_EPSILON,
             yq_scale=None):
        y = dense.dense_bias_skip_layernorm64(x, w, bias, skip, gamma, beta, epsilon=epsilon)
        return _yq_outputs(self, y.astype(x.dtype), y, yq_scale)


class BertAttention(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, qkv, mask=None, num_heads=None, scale=None, yq_scale=None):
        return _yq_outputs(self, bert_attention.reference(qkv, mask, num_heads=num_heads, scale=scale),
                           yq_scale=yq_scale)


class DenseBiasFp8(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, x, wt, bias, w_scale, x_scale=None, fast_accum=0, yq_scale=None):
        y = dense_fp8.reference("DenseBiasFp8", x, wt, bias, w_scale, x_scale=x_scale)
        return _yq_outputs(self, y, yq_scale=yq_scale)


class DenseBiasGeluFp8(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, x, wt, bias, w_scale, approximate=0, x_scale=None, fast_accum=0,
             yq_scale=None):
        y = dense_fp8.reference("DenseBiasGeluFp8", x, wt, bias, w_scale, x_scale=x_scale,
                                approximate=approximate)
        return _yq_outputs(self, y, yq_scale=yq_scale)


class DenseBiasSkipLayerNormFp8(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, x, wt, bias, skip, gamma, beta, w_scale,
             epsilon=skip_layernorm.DEFAULT_EPSILON, x_scale=None, fast_accum=0, yq_scale=None):
        y = dense_fp8.reference64("DenseBiasSkipLayerNormFp8", x, wt, bias, skip, gamma, beta,
                                  w_scale, x_scale=x_scale, epsilon=epsilon)
        return _yq_outputs(self, y.astype(np.float16), y, yq_scale)


class BertPooler(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, x, wt, bias):
        y = pooler.reference64(x, wt, bias)
        if len(self.onnx_node.output) > 1 and self.onnx_node.output[1]:
            return y.astype(x.dtype), y.astype(np.float32)
        return (y.astype(x.dtype),)


class BertEmbedLayerNorm(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, input_ids, segment_ids, word, position, segment=None, gamma=None, beta=None,
             position_ids=None, epsilon=embed_layernorm.DEFAULT_EPSILON):
        return (bert_embed.reference64(input_ids, segment_ids, word, position, segment, gamma,
                                       beta, position_ids, epsilon=epsilon).astype(word.dtype),)


class PackTokens(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, mask, token_bucket):
        return packed_ops.pack_tokens(mask, token_bucket.shape[0])


class PackedBertAttention(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, qkv, token_slot, cumulative_sequence_length, num_heads=None, scale=None):
        return (packed_ops.packed_bert_attention(qkv, token_slot, cumulative_sequence_length,
                                                 num_heads=num_heads, scale=scale),)


class UnpackTokens(_Custom):
    op_domain = BERTFUSE_DOMAIN

    def _run(self, packed, token_slot):
        return (packed_ops.unpack_tokens(packed, token_slot),)


NEW_OPS: list[type[OpRun]] = [MatMul, Gemm, Attention, SkipLayerNormalization,
                              EmbedLayerNormalization, BiasGelu, FastGelu, Gelu, DenseBias,
                              DenseBiasGelu, DenseBiasSkipLayerNorm, BertAttention,
                              DenseBiasFp8, DenseBiasGeluFp8, DenseBiasSkipLayerNormFp8,
                              PackTokens, PackedBertAttention, UnpackTokens, BertPooler,
                              BertEmbedLayerNorm]


def evaluate(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
             outputs: list[str] | None = None) -> dict[str, np.ndarray]:
    """The model's outputs (or the named tensors) on `feeds`; feeds it does not take are
    ignored. Custom nodes this module has no reference for fail as onnx reports them."""
    sess = ReferenceEvaluator(model, new_ops=NEW_OPS)
    names = outputs or list(sess.output_names)
    taken = set(sess.input_names)
    values = sess.run(names, {k: v for k, v in feeds.items() if k in taken})
    return dict(zip(names, values))
