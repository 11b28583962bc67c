"""Tied weights: a dense layer whose weight is another initializer transposed reads that one.

    table[V, H] ─► Gather / EmbedLayerNormalization (the word embeddings)
    x[.., H] ─► MatMul(Wᵀ[H, V]) ─► [Add(b[V])] ─► y          (Wᵀ: a folded copy of table)
    ==>
    table[V, H] ─┬─► Gather / EmbedLayerNormalization
                 └──────────────┐
    x ─► Reshape[-1, H] ─► Gemm(·, table, b, transB=1) ─► Reshape[x's dims but the last, V] ─► y

A masked-LM head's decoder multiplies by the word-embedding table itself
(`matmul(h, table, transpose_b=True)`, weights tied); exported, the transpose is folded into a
second initializer, so the table is stored twice (about 94 MB more for BERT-base fp32). Gemm's
transB reads the table as it is: stored once, and no transpose is left to fold again (a
MatMul by Transpose(table) would be folded back into a copy by the next constant folding).
The bias Add after the MatMul becomes Gemm's C. A 2-D x needs no Reshapes. A Gemm (transB=0)
by the copy is rewritten the same way.

The match is by content: the weight equals the other initializer transposed, byte for byte
(dtype, shape, values). Candidates: every MatMul or Gemm whose constant weight is the
transpose of another constant a node reads; each ends rewritten (fused) or missed.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import CandidatePass, const, const_value, replace_tensor
from bertfuse.passes.evaluate import rank_of
from bertfuse.passes.match import expect

_MIN_VALUES = 16  # scalars and shape vectors are not weights


def _key(values: np.ndarray) -> tuple:
    values = np.ascontiguousarray(values)
    return (values.dtype.str, values.shape,
            hashlib.blake2b(values.tobytes(), digest_size=16).digest())


def _weight(node: gs.Node) -> np.ndarray | None:
    """The [K, N] weight of MatMul(x, W) or Gemm(x, W) (transB=0, no transA, alpha 1)."""
    if node.op == "Gemm" and (node.attrs.get("transA", 0) or node.attrs.get("transB", 0) or
                              float(node.attrs.get("alpha", 1.0)) != 1.0 or
                              float(node.attrs.get("beta", 1.0)) != 1.0):
        return None
    if node.op not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return None
    w = const_value(node.inputs[1])
    return w if w is not None and w.ndim == 2 and w.size >= _MIN_VALUES else None


class TiedWeights(CandidatePass):
    name = "tied_weights"

    def prepare(self, graph: gs.Graph) -> None:
        # Every constant a node reads, by content; a weight's transpose is looked up here.
        self._by_content: dict[tuple, gs.Constant] = {}
        for node in graph.nodes:
            for t in node.inputs:
                if isinstance(t, gs.Constant) and t.values.ndim == 2 and \
                        t.values.size >= _MIN_VALUES:
                    self._by_content.setdefault(_key(t.values), t)

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        out = []
        for node in graph.nodes:
            w = _weight(node)
            if w is not None and self._table(node, w) is not None:
                out.append(node)
        return out

    def _table(self, node: gs.Node, w: np.ndarray) -> gs.Constant | None:
        table = self._by_content.get(_key(w.T))
        return table if table is not None and table is not node.inputs[1] else None

    def match(self, graph: gs.Graph, node: gs.Node) -> tuple:
        """(the table, the bias tensor or None, the tensor the rewrite replaces)."""
        w = _weight(node)
        table = self._table(node, w)
        x = node.inputs[0]
        expect(const_value(x) is None, f"{node.name} multiplies two constants")
        y = node.outputs[0]
        if node.op == "Gemm":
            c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
            expect(rank_of(x) == 2, f"{node.name} reads a tensor not known to be 2-D")
            return table, c, y
        bias, out = None, y
        add = y.outputs[0] if len(y.outputs) == 1 else None
        if add is not None and add.op == "Add" and len(add.inputs) == 2:
            other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
            b = const_value(other)
            if b is not None and b.ndim == 1 and b.shape[0] == w.shape[1]:
                bias = other if isinstance(other, gs.Constant) else const(f"{node.name}_b", b)
                out = add.outputs[0]
        return table, bias, out

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: tuple) -> None:
        table, bias, out = found
        x = node.inputs[0]
        k, n = table.values.shape[1], table.values.shape[0]
        flat = rank_of(x) == 2
        x2 = x
        if not flat:
            x2 = gs.Variable(f"{node.name}_tied_in2d", dtype=x.dtype)
            graph.nodes.append(gs.Node("Reshape", f"{node.name}_tied_to2d", inputs=[
                x, const(f"{node.name}_tied_shape2", np.array([-1, k], np.int64))],
                outputs=[x2]))
        y2 = gs.Variable(f"{out.name}_tied", dtype=out.dtype)
        graph.nodes.append(gs.Node("Gemm", f"{node.name}_tied_Gemm", {"transB": 1},
                                   inputs=[x2, table] + ([bias] if bias is not None else []),
                                   outputs=[y2]))
        if not flat:
            dims = gs.Variable(f"{node.name}_tied_dims", dtype=np.int64)
            graph.nodes.append(gs.Node("Shape", f"{node.name}_tied_shape", inputs=[x],
                                       outputs=[dims]))
            lead = gs.Variable(f"{node.name}_tied_lead", dtype=np.int64)
            graph.nodes.append(gs.Node("Slice", f"{node.name}_tied_lead_slice", inputs=[
                dims, const(f"{node.name}_tied_s0", np.array([0], np.int64)),
                const(f"{node.name}_tied_s1", np.array([-1], np.int64))], outputs=[lead]))
            target = gs.Variable(f"{node.name}_tied_target", dtype=np.int64)
            graph.nodes.append(gs.Node("Concat", f"{node.name}_tied_concat", {"axis": 0}, inputs=[
                lead, const(f"{node.name}_tied_n", np.array([n], np.int64))], outputs=[target]))
            y = gs.Variable(f"{out.name}_tied_nd", dtype=out.dtype)
            graph.nodes.append(gs.Node("Reshape", f"{node.name}_tied_back", inputs=[y2, target],
                                       outputs=[y]))
            y2 = y
        replace_tensor(graph, out, y2)
        node.outputs.clear()
