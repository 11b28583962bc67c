"""Softmax from a hand-written exp / sum (keras-bert's scaled dot product, Keras 2 layers).

    x ─┬─► ReduceMax|GlobalMaxPool (keepdims) ─► m ─┐
       └───────────────────────────────► Sub(x, m) ─► Exp ─► e ─┬─► ReduceSum(-1, keep) ─► s
                                                                └─► Div(e, s) | Mul(e, 1/s) ─► y
    ==>  Softmax(x, axis=-1) ─► y

and the same without the max subtraction (Exp(x) / sum). Subtracting a max that is constant
along the last axis only keeps exp from overflowing: softmax(x - m) = softmax(x) whenever m
does not vary along that axis, and ONNX Softmax is itself computed stably, so both forms are
the same function. The sum must be over the last axis only, kept as [..., 1]; the
exponentials and their sum must be read by nothing else (a Softmax would not produce them).

Candidates: every Exp whose output a ReduceSum reads; each ends fused or missed, in its
encoder layer (an Exp read by no ReduceSum is not a softmax and is not looked at).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import CandidatePass, const_value, detach, is_graph_output, \
    producer, replace_tensor
from bertfuse.passes.evaluate import rank_of
from bertfuse.passes.match import expect

MAX_REDUCE = ("ReduceMax", "GlobalMaxPool")


class SoftmaxFromExp(CandidatePass):
    name = "softmax"

    def candidates(self, graph: gs.Graph) -> Iterator[gs.Node]:
        for node in list(graph.nodes):
            if node.op == "Exp" and node.outputs and \
                    any(c.op == "ReduceSum" for c in node.outputs[0].outputs):
                yield node

    def match(self, graph: gs.Graph, exp: gs.Node) -> tuple:
        """(x, y, nodes to drop) of the softmax the Exp starts."""
        return match_softmax(graph, exp)

    def rewrite(self, graph: gs.Graph, exp: gs.Node, found: tuple) -> None:
        x, y, region = found
        out = gs.Variable(f"{y.name}_softmax", dtype=y.dtype, shape=y.shape)
        graph.nodes.append(gs.Node("Softmax", f"{exp.name}_Softmax", {"axis": -1},
                                   inputs=[x], outputs=[out]))
        replace_tensor(graph, y, out)
        detach(region)


def match_softmax(graph: gs.Graph, exp: gs.Node) -> tuple:
    """(x, y, region): y = Softmax(x) over the last axis; raises MatchFailure."""
    e = exp.outputs[0]
    expect(not is_graph_output(graph, e), f"the exponentials {e.name} are a graph output")
    sums = [c for c in e.outputs if c.op == "ReduceSum"]
    expect(len(sums) == 1, f"{exp.name}'s output is summed {len(sums)} times")
    total = sums[0]
    rank = rank_of(e) or rank_of(exp.inputs[0])
    expect(_last_axis_only(total, rank), f"{total.name} does not sum over the last axis only "
                                         "(keeping it)")
    s = total.outputs[0]
    expect(not is_graph_output(graph, s) and len(s.outputs) == 1,
           f"the sum of exponentials {s.name} is read outside the softmax")
    div, recip = s.outputs[0], None
    if div.op == "Reciprocal":  # e * (1 / s)
        recip = div
        expect(len(recip.outputs[0].outputs) == 1 and
               not is_graph_output(graph, recip.outputs[0]),
               f"1 / sum {recip.outputs[0].name} is read outside the softmax")
        div = recip.outputs[0].outputs[0]
        expect(div.op == "Mul" and any(t is e for t in div.inputs),
               f"1 / sum is read by {div.op}, not e * (1/s)")
    else:
        expect(div.op == "Div" and div.inputs[0] is e and div.inputs[1] is s,
               f"the sum {s.name} is read by {div.op} {div.name}, not exp / sum")
    readers = {id(c) for c in e.outputs}
    expect(readers == {id(total), id(div)},
           f"the exponentials {e.name} are read outside the softmax")
    region = [exp, total] + ([recip] if recip is not None else []) + [div]
    x = exp.inputs[0]
    sub = producer(x)
    if sub is not None and sub.op == "Sub" and len(x.outputs) == 1 and \
            not is_graph_output(graph, x):
        m = producer(sub.inputs[1])
        if m is not None and m.op in MAX_REDUCE and m.inputs[0] is sub.inputs[0]:
            expect(_keeps_last_axis_one(m, rank),
                   f"the max {m.name} is not taken over the last axis (kept): exp(x - max) "
                   "would not be a softmax of x")
            x = sub.inputs[0]
            region.insert(0, sub)  # the max reduce goes with cleanup if nothing else reads it
    return x, div.outputs[0], region


def _axes(node: gs.Node) -> list[int] | None:
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1].name:
        value = const_value(node.inputs[1])
        if value is None:
            return None
        axes = value
    return None if axes is None else [int(a) for a in np.ravel(axes)]


def _last_axis_only(node: gs.Node, rank: int | None) -> bool:
    """A ReduceSum over exactly the last axis, keepdims."""
    if not node.attrs.get("keepdims", 1):
        return False
    axes = _axes(node)
    if not axes or len(axes) != 1:
        return False  # absent axes: every axis (or a no-op), neither a softmax's sum
    return axes[0] == -1 or (rank is not None and axes[0] == rank - 1)


def _keeps_last_axis_one(node: gs.Node, rank: int | None) -> bool:
    """A max whose result is constant along the last axis: GlobalMaxPool (axes 2.., kept)
    or a keepdims ReduceMax whose axes include the last."""
    if node.op == "GlobalMaxPool":
        return rank is None or rank >= 3
    if not node.attrs.get("keepdims", 1):
        return False
    axes = _axes(node)
    if axes is None:  # every axis, kept, unless the empty axes mean "no reduction"
        return not node.attrs.get("noop_with_empty_axes", 0) and \
            (len(node.inputs) < 2 or not node.inputs[1].name)
    return -1 in axes or (rank is not None and rank - 1 in axes)
