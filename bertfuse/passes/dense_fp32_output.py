"""DenseBiasSkipLayerNorm (and BertPooler) writing the graph's fp32 output itself: the Cast after
it folded in.

    ... ─► DenseBiasSkipLayerNorm ─► y (fp16) ─► Cast(to FLOAT) ─► sequence_output (fp32)
                                      └─► pooler, ...
    ==>  ... ─► DenseBiasSkipLayerNorm ─► y (fp16)  ─► pooler, ...
                                      └─► Y32 = sequence_output (fp32)

The fp16 pass ends every float graph output with a Cast back to fp32; after the last layer's
DenseBiasSkipLayerNorm that Cast is one more kernel (about 3 us at 1280 x 768) that reads what the
LayerNorm just wrote. The LayerNorm writes the fp32 copy beside the fp16 one instead (output
slot 2, Y32), from the value before its rounding to fp16. The FP8 form takes the same output
(passes/fp8_weights.py keeps it); the device-packed form unfolds it again
(passes/device_packing.py), since its hidden states are unpacked before the output. BertPooler's
pooled output takes the same fold (its Y32 is slot 1).

Candidates: every Cast to float32 of a DenseBiasSkipLayerNorm's (or its FP8 form's) or a
BertPooler's Y; each ends folded, or missed when the op already writes Y32.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs
from onnx import TensorProto

from bertfuse.ops.contract import BERTFUSE_DOMAIN
from bertfuse.passes.base import CandidatePass, detach, producer
from bertfuse.passes.match import NotACandidate, expect

# The ops with an fp32 copy of their output Y, and its slot.
Y32_SLOT = {"DenseBiasSkipLayerNorm": 2, "DenseBiasSkipLayerNormFp8": 2, "BertPooler": 1}


class DenseFp32Output(CandidatePass):
    name = "dense_fp32_output"

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        return [n for n in graph.nodes
                if n.op == "Cast" and n.attrs.get("to") == TensorProto.FLOAT and n.inputs]

    def component(self, node: gs.Node) -> str:
        return "kernels_fp32_output"

    def match(self, graph: gs.Graph, node: gs.Node) -> gs.Node:
        """The DenseBiasSkipLayerNorm whose Y the Cast reads."""
        op = producer(node.inputs[0])
        if op is None or op.domain != BERTFUSE_DOMAIN or op.op not in Y32_SLOT or \
                op.outputs[0] is not node.inputs[0]:
            raise NotACandidate
        slot = Y32_SLOT[op.op]
        expect(not (len(op.outputs) > slot and op.outputs[slot].name),
               f"{op.name} already writes a Y32: {node.name} stays")
        return op

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: gs.Node) -> None:
        out, slot = node.outputs[0], Y32_SLOT[found.op]
        detach([node])
        outs = list(found.outputs) + [gs.Variable.empty()] * (slot + 1 - len(found.outputs))
        outs[slot] = out
        found.outputs = outs


def unfold(graph: gs.Graph, y32: gs.Tensor) -> gs.Tensor:
    """The inverse, for a pass that must see the fp16 Y before the output: y32 written again by a
    Cast of Y. Returns Y (y32 itself when no op writes it as its Y32)."""
    op = producer(y32)
    slot = Y32_SLOT.get(op.op) if op is not None else None
    if slot is None or len(op.outputs) <= slot or op.outputs[slot] is not y32:
        return y32
    y = op.outputs[0]
    op.outputs = list(op.outputs[:slot])
    while op.outputs and not op.outputs[-1].name:
        op.outputs.pop()
    graph.nodes.append(gs.Node("Cast", f"{y.name}_to_fp32", {"to": TensorProto.FLOAT},
                               inputs=[y], outputs=[y32]))
    return y
