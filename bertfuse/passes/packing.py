"""Packed form: the encoder runs on the real tokens only, [T, H] instead of [B, S, H].

    input_ids, segment_ids ─► EmbedLayerNorm ─► [B,S,H] ─► Reshape[B*S,H] ─► Gather(token_index) ─► [T,H]
        ─► PackedAttention(token_offset, cumulative_sequence_length) / MatMul / SkipLayerNorm / BiasGelu ...
        ─► RestorePadding(token_offset) ─► [B,S,H] sequence_output ─► pooler

Padding costs nothing in the GEMMs any more. The packing itself is decided by the caller
from the mask, so rows may be padded anywhere (holes too): the runtime gives, per request,
`token_index` [T] (flat positions of kept tokens, row by row), `token_offset` [B, S] (those
positions first, then the padded ones) and `cumulative_sequence_length` [B + 1]. Positions
are still the padded columns (EmbedLayerNormalization runs before packing), so a token with a
hole before it keeps its position, as in the padded model. The input_mask input goes away.

PackedAttention and RestorePadding are CUDA-only in ONNX Runtime: packed models run on the
GPU; the CPU can only check their structure.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contract import MS_DOMAIN
from bertfuse.passes.base import PassResult, const, replace_tensor


class PackingPass:
    name = "packing"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        embeds = [n for n in graph.nodes if n.op == "EmbedLayerNormalization"]
        attentions = [n for n in graph.nodes if n.op == "Attention"]
        if len(embeds) != 1 or not attentions:
            result.missed("packing", "needs a fused model (one EmbedLayerNormalization and "
                                     "Attention nodes)")
            return result
        outputs = [t for t in graph.outputs if t.name == "sequence_output"]
        if not outputs:
            result.missed("packing", "no sequence_output to restore the padding on")
            return result
        index = gs.Variable("token_index", dtype=np.int32, shape=["tokens"])
        # token_offset may hold more rows than input_ids (the runtime's filler rows).
        offset = gs.Variable("token_offset", dtype=np.int32, shape=["packed_rows", "seq"])
        cumulative = gs.Variable("cumulative_sequence_length", dtype=np.int32,
                                 shape=["packed_rows_plus_1"])
        gather_tokens(graph, embeds[0], index)
        for att in attentions:
            out = att.outputs[0]
            attrs = {k: v for k, v in att.attrs.items() if k in ("num_heads", "scale",
                                                                 "qkv_hidden_sizes")}
            packed_out = gs.Variable(f"{out.name}_packed", dtype=out.dtype)
            graph.nodes.append(gs.Node("PackedAttention", f"{att.name}_packed", attrs,
                                       inputs=att.inputs[:3] + [offset, cumulative],
                                       outputs=[packed_out], domain=MS_DOMAIN))
            replace_tensor(graph, out, packed_out)
            att.outputs.clear()
            att.inputs.clear()
            result.rewrites += 1
        # Restore where the hidden states end, before any output Cast (fp16 models), so the
        # pooler and the output both read [B, S, H].
        final = outputs[0]
        while final.inputs and final.inputs[0].op == "Cast":
            final = final.inputs[0].inputs[0]
        restored = gs.Variable(f"{final.name}_restored", dtype=final.dtype, shape=None)
        readers = list(final.outputs)
        graph.nodes.append(gs.Node("RestorePadding", "restore_padding", domain=MS_DOMAIN,
                                   inputs=[final, offset], outputs=[restored]))
        for node in readers:
            node.inputs = [restored if t is final else t for t in node.inputs]
        if final is outputs[0]:  # the output keeps its name; the packed tensor is renamed
            graph.outputs = [restored if t is final else t for t in graph.outputs]
            final.name, restored.name = "sequence_output_packed", "sequence_output"
            restored.shape = ["packed_rows", "seq"] + list(outputs[0].shape or [None])[2:]
        final.shape = None
        still_read = {id(t) for n in graph.nodes for t in n.inputs}
        graph.inputs = [i for i in graph.inputs if i.name != "input_mask" or id(i) in still_read] \
            + [index, offset, cumulative]
        result.fused("packing")
        return result


def gather_tokens(graph: gs.Graph, embed: gs.Node, index: gs.Tensor) -> gs.Tensor:
    """Every reader of the embeddings [B, S, H] reads Gather(Reshape [B*S, H], index) [T, H]
    instead (also the device-packed form's, passes/device_packing.py); returns that tensor."""
    embedded = embed.outputs[0]
    hidden = int(embed.inputs[2].values.shape[1])
    flat = gs.Variable("embeddings_flat", dtype=embedded.dtype)
    packed = gs.Variable("embeddings_packed", dtype=embedded.dtype)
    consumers = list(embedded.outputs)
    graph.nodes += [
        gs.Node("Reshape", "pack_flatten", inputs=[
            embedded, const("pack_shape", np.array([-1, hidden], np.int64))], outputs=[flat]),
        gs.Node("Gather", "pack_tokens", {"axis": 0}, inputs=[flat, index], outputs=[packed]),
    ]
    for node in consumers:
        node.inputs = [packed if t is embedded else t for t in node.inputs]
    return packed
