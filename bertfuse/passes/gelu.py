"""GELU, exact or tanh-approximated, with the preceding bias folded: BiasGelu / FastGelu.

Exact (modeling.py's original, HF, Keras via erfc rewritten to erf), any operand order:

    h ─► Add(bias) ─► x ─┬─► Mul(1/√2)|Div(√2) ─► Erf ─► Add(1) ─► Mul(0.5) ─┐
                         └───────────────────────────────────────────────► Mul ─► y

Tanh approximation (modeling.py's current form, Keras approximate=True):

    x ─┬─► Pow(3)|Mul(x·x·x) ─► Mul(0.044715) ─► Add(x) ─► Mul(√(2/π)) ─► Tanh ─► Add(1) ─► Mul(0.5) ─┐
       └────────────────────────────────────────────────────────────────────────────────────────► Mul ─► y

Structure only finds the candidate: the closed elementwise region around an Erf/Tanh whose
one external input is x. The region is then evaluated on probes in float64 and must equal
x·Φ(x) (→ BiasGelu, or Gelu without a bias) or the tanh form (→ FastGelu) to 1e-7.

Candidates: every Erf, and every Tanh that computes GELU or has GELU's 0.044715 upstream (a
pooler's Tanh is not one); each ends fused or missed, in its encoder layer.
"""

from __future__ import annotations

from math import erf
from typing import Iterator

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contrib.gelu import CONTRACTS as GELU_CONTRACTS
from bertfuse.passes.base import (CandidatePass, const_value, detach, is_graph_output, producer,
                                  replace_tensor)
from bertfuse.passes.evaluate import closed_region, eval_elementwise, region_outputs
from bertfuse.passes.match import NotACandidate, fail

_erf = np.vectorize(erf)


def gelu_exact(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


class GeluFusion(CandidatePass):
    name = "gelu"

    def candidates(self, graph: gs.Graph) -> Iterator[gs.Node]:
        for anchor in [n for n in graph.nodes if n.op in ("Erf", "Tanh")]:
            if anchor.outputs and anchor.inputs:  # else inside a region an earlier match fused
                yield anchor

    def match(self, graph: gs.Graph, anchor: gs.Node) -> tuple:
        """(x, y, region, 'exact' | 'tanh')."""
        # x is a tensor upstream of the Erf/Tanh that both its branch and the final Mul
        # read. Try the anchor's elementwise ancestors, nearest first, as x.
        for t in _upstream(anchor, steps=8):
            region = closed_region([t])
            if anchor not in region:
                continue
            outs = region_outputs(graph, region)
            if len(outs) == 1:
                kind = _classify(region, t, outs[0])
                if kind:
                    return t, outs[0], region, kind
        if anchor.op == "Tanh" and not _near_cubic(anchor):
            raise NotACandidate  # a Tanh activation (the pooler's), not a GELU candidate
        fail(f"{anchor.op} is not part of x·Φ(x) (no region computes GELU)")

    def rewrite(self, graph: gs.Graph, anchor: gs.Node, found: tuple) -> None:
        x, y, region, kind = found
        bias = None
        src = x
        adder = producer(x)
        if adder is not None and adder.op == "Add" and \
                len(x.outputs) == len(region_consumers(x, region)) and \
                not is_graph_output(graph, x):
            consts = [(i, const_value(t)) for i, t in enumerate(adder.inputs)]
            c = [(i, v) for i, v in consts if v is not None and v.ndim == 1]
            if len(c) == 1 and len(adder.inputs) == 2 and \
                    c[0][1].shape[0] == _last_dim(x, adder.inputs[1 - c[0][0]]):
                bias = adder.inputs[c[0][0]]
                src = adder.inputs[1 - c[0][0]]
        out = gs.Variable(f"{y.name}_gelu", dtype=y.dtype, shape=y.shape)
        if kind == "exact":
            op, inputs = ("BiasGelu", [src, bias]) if bias is not None else ("Gelu", [x])
        else:
            op, inputs = "FastGelu", ([src, bias] if bias is not None else [x])
        graph.nodes.append(GELU_CONTRACTS[op].node(f"{y.name}_{op}", inputs, [out]))
        replace_tensor(graph, y, out)
        detach(region)
        if bias is not None and adder is not None and not x.outputs:
            detach([adder])


def _last_dim(x: gs.Tensor, src: gs.Tensor) -> int | None:
    """The last dim of the bias-free operand src (x = src + bias), which BiasGelu/FastGelu's
    bias must match: src's recorded shape, else the columns of the constant W in src = h @ W,
    else x's recorded shape."""
    if src.shape and isinstance(src.shape[-1], int) and src.shape[-1] > 0:
        return int(src.shape[-1])
    node = producer(src)
    if node is not None and node.op == "MatMul" and len(node.inputs) == 2:
        w = const_value(node.inputs[1])
        if w is not None and w.ndim >= 2:
            return int(w.shape[-1])
    if x.shape and isinstance(x.shape[-1], int) and x.shape[-1] > 0:
        return int(x.shape[-1])
    return None


def _upstream(anchor: gs.Node, steps: int) -> list[gs.Tensor]:
    """Variable tensors feeding the anchor through elementwise ops, breadth first."""
    order: list[gs.Tensor] = []
    seen: set[int] = set()
    frontier = [anchor.inputs[0]]
    for _ in range(steps):
        nxt = []
        for t in frontier:
            if id(t) in seen or const_value(t) is not None:
                continue
            seen.add(id(t))
            order.append(t)
            node = producer(t)
            if node is not None and node.op in ("Mul", "Div", "Add", "Sub", "Pow", "Neg", "Cast"):
                nxt.extend(node.inputs)
        frontier = nxt
    return order


def _near_cubic(anchor: gs.Node) -> bool:
    """A Tanh whose input path holds GELU's 0.044715 (for diagnostics; pooler Tanh has none)."""
    for t in _upstream(anchor, steps=4):
        node = producer(t)
        for i in (node.inputs if node is not None else []):
            v = const_value(i)
            if v is not None and v.size == 1 and abs(float(v.ravel()[0]) - 0.044715) < 1e-6:
                return True
    return False


def region_consumers(x: gs.Tensor, region: list[gs.Node]) -> list[gs.Node]:
    inside = {id(n) for n in region}
    return [c for c in x.outputs if id(c) in inside]


def _classify(region: list[gs.Node], x: gs.Tensor, y: gs.Tensor) -> str | None:
    probe = np.linspace(-6.0, 6.0, 97).reshape(1, 97)
    try:
        got = eval_elementwise(region, {id(x): probe})[id(y)]
    except (KeyError, ValueError):
        return None
    if got.shape != probe.shape:
        return None
    if np.abs(got - gelu_exact(probe)).max() < 1e-7:
        return "exact"
    if np.abs(got - gelu_tanh(probe)).max() < 1e-7:
        return "tanh"
    return None
