"""BertEmbedLayerNorm: the fused embedding block on bertfuse's own kernel.

    input_ids ──────┐
    segment_ids ────┤
    word, position, ├─► EmbedLayerNormalization ─► output [B,S,H]
    segment tables, │      (mask ─►)               mask_index  (read by nothing)
    gamma, beta ────┤                              embedding_sum (read by nothing)
    position_ids ───┘
    ==>  the same inputs less the mask ─► BertEmbedLayerNorm(epsilon) ─► output

ONNX Runtime's fp16 EmbedLayerNormalization kernel takes 8.3 us at shenma b20 s64 on the H200
for 5.9 MB of table rows; bertfuse's (csrc/embed_layernorm.cu: a warp per token, the rows read
once in 16-byte loads, fp32 statistics from registers) replaces it in the lowered model
(ops/bertfuse/embed_layernorm.py). The mask_index and embedding_sum outputs have no kernel
here: where anything reads them the contrib op stays.

Candidates: every EmbedLayerNormalization (one per fused model, passes/embed_layernorm.py);
each ends converted, or missed when its mask_index or embedding_sum is read, the tables are not
fp16, or the hidden size is past the kernel's (multiple of 8, at most 2048).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.bertfuse.embed_layernorm import CONTRACT as BERT_EMBED_LN
from bertfuse.ops.bertfuse.embed_layernorm import MAX_HIDDEN
from bertfuse.ops.contract import MS_DOMAIN
from bertfuse.ops.contrib.embed_layernorm import CONTRACT as EMBED_LN
from bertfuse.ops.contrib.embed_layernorm import DEFAULT_EPSILON
from bertfuse.passes.base import CandidatePass, detach, is_graph_output
from bertfuse.passes.match import expect

COMPONENT = "kernels_embed_layernorm"
_SLOT = {t.name: i for i, t in enumerate(EMBED_LN.inputs)}  # EmbedLayerNormalization's slots
_TABLES = ("word_embedding", "position_embedding", "segment_embedding")


class BertEmbedLayerNormFusion(CandidatePass):
    name = "bert_embed_layernorm"

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        return [n for n in graph.nodes
                if n.op == "EmbedLayerNormalization" and n.domain == MS_DOMAIN]

    def component(self, node: gs.Node) -> str:
        return COMPONENT

    def match(self, graph: gs.Graph, node: gs.Node) -> list:
        """The op's inputs, slot by slot."""
        for slot, what in ((1, "mask_index"), (2, "embedding_sum")):
            if len(node.outputs) > slot and node.outputs[slot].name:
                t = node.outputs[slot]
                expect(not t.outputs and not is_graph_output(graph, t),
                       f"the {what} output of {node.name} is read (no bertfuse kernel writes it)")
        ins = list(node.inputs) + [None] * (len(_SLOT) - len(node.inputs))
        ins = [t if t is not None and t.name else None for t in ins]
        for t in (ins[_SLOT[name]] for name in _TABLES):
            if t is not None:
                expect(t.dtype is not None and np.dtype(t.dtype) == np.float16,
                       f"{node.name}: the embedding table {t.name} is not fp16")
        shape = ins[_SLOT["word_embedding"]].shape
        hidden = shape[1] if shape is not None and len(shape) == 2 else None
        expect(isinstance(hidden, int) and hidden % 8 == 0 and hidden <= MAX_HIDDEN,
               f"{node.name}: hidden size {hidden} is not a multiple of 8 up to {MAX_HIDDEN}")
        return [ins[_SLOT[t.name]] for t in BERT_EMBED_LN.inputs]  # the mask is dropped

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: list) -> None:
        out = node.outputs[0]
        eps = float(node.attrs.get("epsilon", DEFAULT_EPSILON))
        detach([node])
        graph.nodes.append(BERT_EMBED_LN.node(f"{node.name}_bertfuse", found, [out], epsilon=eps))
