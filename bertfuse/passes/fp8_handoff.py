"""FP8 hand-offs (`--fp8`): the op before an FP8 GEMM writes its e4m3 input, in its epilogue.

    P (DenseBias | DenseBiasGelu | DenseBiasSkipLayerNorm, fp16 or Fp8 form; BertAttention)
      ─► Y (fp16) ─┬─► C (Dense*Fp8, x_scale s): quantises Y itself, one more kernel
                   └─► other readers (the next residual, ...)
    ==>  P {yq_scale = s} ─► Y  ─► other readers
                          └─► Yq (e4m3) ─► C (x_scale s, reads Yq as is)

P's kernel that writes Y last (the LayerNorm, the GELU pass, the attention kernel's store) writes
Yq beside it, the same bytes C's quantise pass would have written (e4m3 of the fp16 value times
the fp32 reciprocal of s), so the model's numbers do not change: one kernel less per hand-off,
and C reads 1 byte per element instead of 2.

A GELU op or attention whose Y nothing reads any more (FFN up: FFN down took its Yq; the
context: the attention-out GEMM took its Yq) leaves Y off: its last kernel then writes only the
e4m3 copy, half the bytes.

Candidates: every FP8 dense op (after fp8_weights); each ends handed off or missed (X not made
by one of those ops: the embedding's output stays quantised in the first QKV GEMM; the
producer's Yq already written with another scale).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from bertfuse.ops.bertfuse.bert_attention import CONTRACT as BERT_ATTENTION
from bertfuse.ops.bertfuse.dense import CONTRACTS as DENSE_CONTRACTS
from bertfuse.ops.bertfuse.dense_fp8 import CONTRACTS as FP8_CONTRACTS
from bertfuse.ops.contract import BERTFUSE_DOMAIN
from bertfuse.passes.base import CandidatePass, Layers, PassResult, producer
from bertfuse.passes.fp8_weights import dense_layer
from bertfuse.passes.match import expect, fail

# every op with an output Yq
PRODUCERS = frozenset(DENSE_CONTRACTS) | frozenset(FP8_CONTRACTS) | {BERT_ATTENTION.op_type}
YQ_SLOT = 1
# the ops whose Y may be left off where only Yq is read (their contracts say so: the GELU ops,
# the attention)
Y_OPTIONAL = frozenset(op for op, c in {**DENSE_CONTRACTS, **FP8_CONTRACTS,
                                        BERT_ATTENTION.op_type: BERT_ATTENTION}.items()
                       if c.outputs[0].optional)


class Fp8Handoff(CandidatePass):
    name = "fp8_handoff"

    def __init__(self, from_fp16_dense: bool = True) -> None:
        # False (FP8 at some places only): an fp16 dense op writes no Yq; its FP8 reader
        # quantises the fp16 Y itself, as the first QKV does the embedding's
        self.producers = PRODUCERS if from_fp16_dense else PRODUCERS - frozenset(DENSE_CONTRACTS)

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        return [n for n in graph.nodes if n.domain == BERTFUSE_DOMAIN and n.op in FP8_CONTRACTS]

    def layer(self, layers: Layers, node: gs.Node) -> int | None:
        return dense_layer(layers, node)

    def match(self, graph: gs.Graph, node: gs.Node) -> tuple[gs.Node, float]:
        """(producer, scale)."""
        x = node.inputs[0]
        scale = node.attrs.get("x_scale")
        expect(isinstance(scale, float) and np.isfinite(scale) and scale > 0,
               f"{node.name} has no usable x_scale ({scale!r})")
        if x.dtype == onnx.TensorProto.FLOAT8E4M3FN:
            fail(f"{node.name} already reads an e4m3 input ({x.name})")
        p = producer(x)
        if p is None:
            fail(f"the input {x.name} of {node.name} is a graph input or constant, not a dense op's Y")
        expect(p.domain == BERTFUSE_DOMAIN and p.op in self.producers,
               f"the input of {node.name} comes from {p.op} {p.name}, which writes no e4m3 copy "
               f"(quantised in {node.name})")
        expect(p.outputs[0] is x, f"{node.name} reads {p.name}'s output {x.name}, not its Y")
        if _yq(p) is not None:
            theirs = p.attrs.get("yq_scale")
            expect(theirs == scale, f"{p.name} writes Yq with yq_scale {theirs}, not {node.name}'s "
                                    f"x_scale {scale}")
        return p, scale

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: tuple[gs.Node, float]) -> None:
        p, scale = found
        y = p.outputs[0]
        yq = _yq(p)
        if yq is None:  # the producer's first FP8 reader: its Yq slot is new
            yq = gs.Variable(f"{y.name}_e4m3", dtype=onnx.TensorProto.FLOAT8E4M3FN, shape=y.shape)
            if len(p.outputs) > YQ_SLOT:
                p.outputs[YQ_SLOT] = yq
            else:
                p.outputs.append(yq)
            p.attrs["yq_scale"] = float(scale)
        node.inputs[0] = yq

    def finish(self, graph: gs.Graph, result: PassResult) -> None:
        outputs = {id(t) for t in graph.outputs}
        for p in graph.nodes:
            if p.domain != BERTFUSE_DOMAIN or p.op not in Y_OPTIONAL or _yq(p) is None:
                continue
            y = p.outputs[0]
            if y.name and not y.outputs and id(y) not in outputs:  # nothing reads Y any more
                p.outputs[0] = gs.Variable.empty()


def _yq(p: gs.Node) -> gs.Tensor | None:
    """The producer's output Yq, where its slot is filled."""
    yq = p.outputs[YQ_SLOT] if len(p.outputs) > YQ_SLOT else None
    return yq if yq is not None and yq.name else None
