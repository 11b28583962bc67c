"""BertPooler: BERT's pooler (first token, dense layer, tanh) as one ai.bertfuse op.

    X [B,S,H] ─► Gather(axis 1, index 0) ─► Gemm(W, bias) ─► Tanh ─► y [B,N]
    ==>  X ─► BertPooler(Wt = W^T, bias) ─► y

Five ORT kernels after the encoder (Gather, bias broadcast, GEMM, Tanh, Cast) become one
(ops/bertfuse/pooler.py). The Gather and Gemm are what
the fusion plan makes of the pooler (passes/dense_gemm.py: first-token Slice+Squeeze ->
Gather, MatMul + Add -> Gemm); Gemm's transB=1 weight is already Wt. fp16 only, like the other
bertfuse ops; the output Cast to fp32 folds in afterwards (passes/dense_fp32_output.py).

Candidates: every Tanh of a Gemm of a first-token Gather; each ends converted, or missed when
the Gemm scales or transposes its input, the weight or bias is not an fp16 constant, the hidden
size is past the kernel's (multiple of 8, at most 2048), or an intermediate is read elsewhere.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.bertfuse.pooler import CONTRACT as BERT_POOLER
from bertfuse.ops.bertfuse.pooler import MAX_HIDDEN
from bertfuse.passes.base import CandidatePass, const, const_value, detach, is_graph_output, \
    producer
from bertfuse.passes.evaluate import rank_of
from bertfuse.passes.match import NotACandidate, expect

COMPONENT = "kernels_pooler"


class BertPoolerFusion(CandidatePass):
    name = "bert_pooler"

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        return [n for n in graph.nodes if n.op == "Tanh"]

    def component(self, node: gs.Node) -> str:
        return COMPONENT

    def match(self, graph: gs.Graph, node: gs.Node) -> tuple:
        """(X, Wt, bias, the Gemm, the Gather)."""
        gemm = producer(node.inputs[0])
        gather = producer(gemm.inputs[0]) if gemm is not None and gemm.op == "Gemm" else None
        if gather is None or gather.op != "Gather" or not _first_token(gather):
            raise NotACandidate  # some other tanh: not a pooler
        for t, what in ((gather.outputs[0], gather.name), (gemm.outputs[0], gemm.name)):
            expect(len(t.outputs) == 1 and not is_graph_output(graph, t),
                   f"the output of {what} is also read elsewhere")
        attrs = {k: gemm.attrs.get(k, d) for k, d in
                 (("alpha", 1.0), ("beta", 1.0), ("transA", 0), ("transB", 0))}
        expect(attrs["alpha"] == 1.0 and attrs["beta"] == 1.0 and attrs["transA"] == 0,
               f"{gemm.name} scales or transposes its input ({attrs})")
        w = const_value(gemm.inputs[1])
        expect(w is not None and w.ndim == 2 and w.dtype == np.float16,
               f"the weight of {gemm.name} is not a constant fp16 matrix")
        wt = w if attrs["transB"] else w.T
        n, k = wt.shape
        expect(k % 8 == 0 and k <= MAX_HIDDEN,
               f"{gemm.name}: hidden size {k} is not a multiple of 8 up to {MAX_HIDDEN}")
        bias = const_value(gemm.inputs[2]) if len(gemm.inputs) > 2 and gemm.inputs[2].name else \
            np.zeros(n, np.float16)
        expect(bias is not None and bias.dtype == np.float16 and np.size(bias) == n and
               bias.ndim <= 1, f"the bias of {gemm.name} is not a constant fp16 [{n}]")
        x = gather.inputs[0]
        expect(rank_of(x) in (3, None) and (x.dtype is None or np.dtype(x.dtype) == np.float16),
               f"{gather.name} does not read fp16 [B, S, H] hidden states")
        return x, np.ascontiguousarray(wt), np.asarray(bias).reshape(n), gemm, gather

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: tuple) -> None:
        x, wt, bias, gemm, gather = found
        y = node.outputs[0]
        detach([node, gemm, gather])
        graph.nodes.append(BERT_POOLER.node(
            f"{gemm.name}_BertPooler",
            [x, const(f"{gemm.name}_wt", wt), const(f"{gemm.name}_pooler_bias", bias)], [y]))


def _first_token(gather: gs.Node) -> bool:
    index = const_value(gather.inputs[1]) if len(gather.inputs) > 1 else None
    return gather.attrs.get("axis", 0) == 1 and index is not None and np.ndim(index) == 0 \
        and int(index) == 0
