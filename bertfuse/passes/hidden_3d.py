"""3-D hidden states: drop the [B,S,H] -> [B*S,H] -> [B,S,H] Reshape round trips.

Google's modeling.py (and tf2onnx after it) keeps hidden states 2-D [B*S, H] between layers;
Attention, EmbedLayerNormalization and SkipLayerNormalization want [B, S, H]. After the
fusions the encoder is a chain of row-wise ops between flattening and unflattening Reshapes:

    [B,S,H] ─► Reshape[-1,H] ─► MatMul / Add(bias) / SkipLayerNorm / BiasGelu ... ─► Reshape[B|-1,S,H'] ─►

Every row-wise op computes the same on [B,S,H] as on [B*S,H], so when every path from the
flattening Reshapes reaches only row-wise ops and Reshapes back to [B,S,·] (checked by
evaluating their target shapes on probe inputs), all of those Reshapes are removed.

Candidates: the flattening Reshapes, decided together: all are removed (each reported fused,
with the Reshapes back) or none, with one reason for the whole encoder.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import Layers, PassResult, const_value, is_graph_output, replace_tensor
from bertfuse.passes.evaluate import eval_with_ort, rank_of
from bertfuse.passes.match import MatchFailure, expect, fail
from bertfuse.io.inputs import PROBE_BATCH, PROBE_SEQ, probe_feeds

ROWWISE = {"MatMul", "Add", "Sub", "Mul", "Div", "SkipLayerNormalization",
           "LayerNormalization", "BiasGelu", "FastGelu", "Gelu", "Relu", "Tanh", "Erf", "Cast",
           "Sigmoid"}


class Hidden3DPass:
    name = "hidden_3d"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        layers = Layers(graph)
        flattens = [n for n in graph.nodes if _is_flatten(n)]
        if not flattens:
            return result
        try:  # the whole encoder at once: every Reshape goes, or none, with one reason
            for f in flattens:
                expect(not is_graph_output(graph, f.outputs[0]),
                       f"2-D tensor {f.outputs[0].name} is a model output")
            region, terminals = _region(graph, flattens)
            unflattened = _check_terminals(graph, terminals)
        except MatchFailure as failure:
            result.missed("hidden_3d", failure.reason)
            return result
        for node in region:
            for t in node.outputs:
                t.shape = None  # the 2-D shapes recorded by shape inference no longer hold
        for f in flattens:
            replace_tensor(graph, f.outputs[0], f.inputs[0])
            result.fused(self.name, layers.of(f))
        for term, out in zip(terminals, unflattened):
            replace_tensor(graph, out, term.inputs[0])
            result.fused(self.name, layers.of(term))
        return result


def _is_flatten(node: gs.Node) -> bool:
    if node.op != "Reshape":
        return False
    shape = const_value(node.inputs[1])
    return shape is not None and shape.size == 2 and int(shape[0]) == -1 and \
        rank_of(node.inputs[0]) == 3


def _region(graph: gs.Graph, flattens: list[gs.Node]) -> tuple[list[gs.Node], list[gs.Node]]:
    """The row-wise nodes the flattened hidden states reach, and the Reshapes back (terminals);
    raises MatchFailure."""
    known = {id(f.outputs[0]) for f in flattens}
    graph_outputs = {id(t) for t in graph.outputs}
    region: list[gs.Node] = []
    terminals: list[gs.Node] = []
    seen: set[int] = set()
    stack = [c for f in flattens for c in f.outputs[0].outputs]
    pending: list[gs.Node] = []
    while stack or pending:
        if not stack:
            # Nodes waiting for another region input (SkipLN's residual): retry once more.
            ready = [n for n in pending if _inputs_ready(n, known)]
            if not ready:
                n = pending[0]
                fail(f"{n.op} {n.name} mixes 2-D hidden states with other tensors")
            pending = [n for n in pending if n not in ready]
            stack.extend(ready)
            continue
        node = stack.pop()
        if id(node) in seen:
            continue
        if node.op == "Reshape":
            shape_is_var = const_value(node.inputs[1]) is None
            if shape_is_var or int(np.size(const_value(node.inputs[1]))) >= 3:
                seen.add(id(node))
                terminals.append(node)
                continue
            fail(f"Reshape {node.name} of 2-D hidden states is not back to [B,S,H]")
        if node.op not in ROWWISE:
            fail(f"{node.op} {node.name} reads 2-D hidden states")
        if node.op == "MatMul":
            w = const_value(node.inputs[1])
            if w is None or w.ndim != 2 or id(node.inputs[0]) not in known:
                fail(f"MatMul {node.name} is not a dense layer on hidden states")
        if node.op == "LayerNormalization" and node.attrs.get("axis", -1) != -1:
            fail(f"LayerNormalization {node.name} is not over the last axis")
        if not _inputs_ready(node, known):
            if node not in pending:
                pending.append(node)
            continue
        for t in node.inputs[:1] if node.op == "MatMul" else node.inputs:
            value = const_value(t)
            if value is not None and value.ndim > 1:
                fail(f"{node.op} {node.name} has a {value.ndim}-D constant operand")
        seen.add(id(node))
        region.append(node)
        for t in node.outputs:
            if id(t) in graph_outputs:
                fail(f"2-D tensor {t.name} is a model output")
            known.add(id(t))
            stack.extend(t.outputs)
    return region, terminals


def _inputs_ready(node: gs.Node, known: set[int]) -> bool:
    return all(id(t) in known or const_value(t) is not None or t.name == ""
               for t in node.inputs)


def _check_terminals(graph: gs.Graph, terminals: list[gs.Node]) -> list[gs.Tensor]:
    """Each unflatten must give [B, S, H] (Keras' einsum: [B, S, H, 1, ..] then a Squeeze of
    the trailing ones). Per terminal the tensor that becomes 3-D; raises MatchFailure."""
    pending = [t.inputs[1] for t in terminals if const_value(t.inputs[1]) is None]
    feeds = probe_feeds(graph)
    # S is the inputs' own where it is fixed (bert-for-tf2's [batch, 16]), else the probe's
    seq = next((np.shape(f)[1] for f in feeds.values() if np.ndim(f) == 2), PROBE_SEQ)
    try:
        evaluated = iter(eval_with_ort(graph, pending, feeds) if pending else [])
    except Exception as exc:
        fail(f"cannot evaluate the unflatten shapes ({type(exc).__name__})")
    outs = []
    for term in terminals:
        value = const_value(term.inputs[1])
        v = [int(x) for x in np.ravel(value if value is not None else next(evaluated))]
        # B and S, B and -1, or -1 and S (a head's [-1, S, vocab]: B*S rows make B).
        if v[:2] not in ([PROBE_BATCH, seq], [PROBE_BATCH, -1], [-1, seq]) or len(v) < 3:
            fail(f"an unflatten Reshape targets {v}, not [B, S, H]")
        if len(v) == 3:
            outs.append(term.outputs[0])
            continue
        squeeze = term.outputs[0].outputs[0] if len(term.outputs[0].outputs) == 1 else None
        axes = None
        if squeeze is not None and squeeze.op == "Squeeze":
            axes = squeeze.attrs.get("axes")
            if axes is None and len(squeeze.inputs) > 1:
                axes = const_value(squeeze.inputs[1])
        trailing = list(range(3, len(v)))
        if any(d != 1 for d in v[3:]) or axes is None or \
                sorted(int(a) % len(v) for a in np.ravel(axes)) != trailing:
            fail(f"an unflatten Reshape targets {v}, not [B, S, H]")
        outs.append(squeeze.outputs[0])
    return outs
