"""Packed form on bertfuse's kernels, packed on the device: the bertfuse-kernels encoder
(passes/bertfuse_encoder.py) runs on the real tokens only, and the packing is part of the graph.

    input_mask [B,S] ─► PackTokens(token_bucket [T]) ─► token_index, token_slot, cu [B+1]
    input_ids, segment_ids ─► EmbedLayerNorm ─► [B,S,H] ─► Reshape[B*S,H]
        ─► Gather(token_index) ─► [T,H]
        ─► DenseBias ─► qkv ─► BertAttention(mask)  ==>  PackedBertAttention(token_slot, cu)
        ─► DenseBiasSkipLayerNorm / DenseBiasGelu ... (any leading dims: unchanged)
        ─► UnpackTokens(token_slot) ─► [B,S,H] ─► sequence_output, pooler

Unlike the `--packed` form (passes/packing.py), the host computes nothing per request: it copies
the padded [B, S] inputs as for the padded model and binds a `token_bucket` of the token count T
it picked (only its shape is read, so one CUDA graph per (B, S, T) serves every request of that
bucket). The model keeps `input_mask`: PackTokens reads it on the device. Filler rows (T past
the kept tokens) gather token 0 and come out of PackedBertAttention as zeros; no padded position
reads them back. Every attention must already be a BertAttention (fp16, head size 64 on the
GPU): a layer left on com.microsoft Attention cannot run packed here, and the pass misses.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contract import BERTFUSE_DOMAIN, MS_DOMAIN
from bertfuse.ops.bertfuse.embed_layernorm import EMBEDDING_OPS
from bertfuse.ops.bertfuse.packed_ops import PACK_TOKENS, PACKED_BERT_ATTENTION, UNPACK_TOKENS
from bertfuse.passes.base import Layers, PassResult, cast_int32, replace_tensor
from bertfuse.passes.dense_fp32_output import unfold
from bertfuse.passes.match import MatchFailure, expect, fail
from bertfuse.passes.packing import gather_tokens

DEVICE_PACKED_INPUTS = ("input_ids", "segment_ids", "input_mask", "token_bucket")
COMPONENT = "packing_kernels"


class PackingKernelsPass:
    name = "packing_kernels"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        layers = Layers(graph)
        try:
            _check_packable(graph)
        except MatchFailure as failure:
            result.missed(COMPONENT, failure.reason)
            return result
        embed = next(n for n in graph.nodes if n.op in EMBEDDING_OPS)
        attentions = [n for n in graph.nodes
                      if n.op == "BertAttention" and n.domain == BERTFUSE_DOMAIN]
        final = _hidden_output(graph)
        mask = cast_int32(graph, next(t for t in graph.inputs if t.name == "input_mask"))
        bucket = gs.Variable("token_bucket", dtype=np.int32, shape=["tokens"])
        index = gs.Variable("token_index", dtype=np.int32, shape=["tokens"])
        slot = gs.Variable("token_slot", dtype=np.int32, shape=["batch", "seq"])
        cu = gs.Variable("cumulative_sequence_length", dtype=np.int32, shape=["batch_plus_1"])
        graph.nodes.append(PACK_TOKENS.node("device_pack", [mask, bucket], [index, slot, cu]))
        gather_tokens(graph, embed, index)
        for att in attentions:
            out = att.outputs[0]
            context = gs.Variable(f"{out.name or att.name + '_context'}_packed", dtype=np.float16)
            graph.nodes.append(PACKED_BERT_ATTENTION.node(
                f"{att.name}_packed", [att.inputs[0], slot, cu], [context],
                num_heads=att.attrs["num_heads"], scale=att.attrs.get("scale")))
            if out.name:  # left off where an FP8 GEMM reads only Yq (fp8_handoff)
                replace_tensor(graph, out, context)
            if len(att.outputs) > 1 and att.outputs[1].name:
                # an FP8 GEMM read the e4m3 copy (fp8_handoff): the packed op writes none, so
                # it reads the fp16 context and quantises it itself, with the same scale
                replace_tensor(graph, att.outputs[1], context)
            att.outputs.clear()
            att.inputs.clear()
            result.fused(COMPONENT, layers.of(att))
        _unpack_at_end(graph, final, slot)
        still_read = {id(t) for n in graph.nodes for t in n.inputs}
        graph.inputs = [t for t in graph.inputs
                        if id(t) in still_read or t.name in DEVICE_PACKED_INPUTS] + [bucket]
        return result


def _check_packable(graph: gs.Graph) -> None:
    """Raises MatchFailure with why the graph cannot take the device-packed form."""
    expect(sum(n.op in EMBEDDING_OPS for n in graph.nodes) == 1,
           f"needs one embedding op ({' or '.join(EMBEDDING_OPS)}: a fused model)")
    expect(any(n.op == "BertAttention" and n.domain == BERTFUSE_DOMAIN for n in graph.nodes),
           "needs BertAttention nodes (run the bertfuse_kernels pass first)")
    left = [n.name for n in graph.nodes
            if (n.op == "Attention" and n.domain == MS_DOMAIN) or n.op == "Softmax"]
    if left:  # an unfused or contrib attention reshapes by [B, S]: it cannot run on [T, H]
        fail(f"{len(left)} attention node(s) not on bertfuse kernels ({left[0]}, ...): "
             "every layer must run BertAttention to be packed on the device")
    expect(any(t.name == "input_mask" for t in graph.inputs), "no input_mask input to pack by")
    final = _hidden_output(graph)
    expect(final is not None, "no sequence_output to unpack into")
    if final.dtype is None or np.dtype(final.dtype) != np.float16:
        fail(f"the hidden states are {final.dtype}, UnpackTokens is float16 only")


def _hidden_output(graph: gs.Graph) -> gs.Tensor | None:
    """Where the encoder's hidden states end: sequence_output before any output Cast (the
    pooler of an fp16 model reads the fp16 tensor, not the fp32 output)."""
    final = next((t for t in graph.outputs if t.name == "sequence_output"), None)
    if final is not None:  # the packed hidden states are unpacked first, then cast
        final = unfold(graph, final)
    while final is not None and final.inputs and final.inputs[0].op == "Cast":
        final = final.inputs[0].inputs[0]
    return final


def _unpack_at_end(graph: gs.Graph, final: gs.Tensor, slot: gs.Tensor) -> None:
    """[T, H] back to [B, S, H] for every reader of the hidden states (output, pooler)."""
    restored = gs.Variable(f"{final.name}_unpacked", dtype=final.dtype, shape=None)
    readers = list(final.outputs)
    graph.nodes.append(UNPACK_TOKENS.node("unpack_tokens", [final, slot], [restored]))
    for node in readers:
        node.inputs = [restored if t is final else t for t in node.inputs]
    for i, t in enumerate(graph.outputs):
        if t is final:  # the output keeps its name; the packed tensor is renamed
            restored.shape = list(final.shape or ["batch", "seq", None])
            final.name, restored.name = f"{final.name}_packed", final.name
            graph.outputs[i] = restored
    final.shape = None
