"""Match on math: evaluate candidate subgraphs on probe inputs and check what they compute.

Structural patterns break on every exporter quirk (operand order, Neg vs Sub, Div vs Mul by
a reciprocal, GlobalAveragePool vs ReduceMean). Instead, a fusion finds a candidate region
and an anchor structurally, then evaluates the region on random probes and checks that it
computes the fused op's function. Two evaluators:

* `eval_elementwise`: float64 NumPy over elementwise/reduce ops, exact enough to read the
  affine parameters of a LayerNorm back out of its outputs;
* `eval_with_ort`: any ops, through ONNX Runtime, for mask and shape subgraphs that start at
  the model's inputs.
"""

from __future__ import annotations

from typing import Iterable
from math import erf

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from bertfuse.ops.bertfuse.embed_layernorm import EMBEDDING_OPS
from bertfuse.ops.contract import MS_DOMAIN, MS_OPSET
from bertfuse.passes.base import const_value, producer
from bertfuse.io.ort import make_session

ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Neg", "Sqrt", "Reciprocal", "Pow", "Erf", "Tanh",
               "ReduceMean", "GlobalAveragePool", "Cast", "Identity"}
# Guards some libraries write around a normalisation's divisor, no-ops on its math:
# Max(var + eps, 0) (Keras' sqrt guard) and div_no_nan's Where(Equal(d, 0), 0, x / d).
GUARDS = {"Max", "Min", "Equal", "Where"}


RANK3_PRODUCERS = {"Attention", *EMBEDDING_OPS}
RANK_PRESERVING = {"MatMul", "Add", "Sub", "Mul", "Div", "SkipLayerNormalization",
                   "LayerNormalization", "BiasGelu", "FastGelu", "Gelu", "Relu", "Tanh", "Erf",
                   "Cast", "Sigmoid", "Softmax", "Identity"}


def rank_of(t: gs.Tensor, depth: int = 0) -> int | None:
    """A tensor's rank from shape inference, or from what produced it."""
    if t.shape is not None:
        return len(t.shape)
    node = producer(t)
    if node is None or depth > 50:
        return None
    if node.op in RANK3_PRODUCERS:
        return 3
    if node.op == "Reshape":
        shape = const_value(node.inputs[1])
        return None if shape is None else int(np.size(shape))
    if node.op in RANK_PRESERVING:
        return rank_of(node.inputs[0], depth + 1)
    return None


def bs_input(graph: gs.Graph) -> gs.Variable | None:
    """A [batch, seq] integer model input (ids or mask): the source of B and S."""
    for t in graph.inputs:
        if t.shape is not None and len(t.shape) == 2 and t.dtype is not None and \
                np.dtype(t.dtype).kind in "iub":
            return t
    return None


def closed_region(start: Iterable[gs.Tensor], ops: set[str] = ELEMENTWISE,
                  limit: int = 64) -> list[gs.Node]:
    """Nodes reachable from `start` whose every non-constant input comes from `start` or the
    region itself, restricted to `ops`; in topological order."""
    known = {id(t) for t in start}
    region: list[gs.Node] = []
    frontier = [n for t in start for n in t.outputs]
    seen: set[int] = set()
    changed = True
    while changed and len(region) < limit:
        changed = False
        for node in list(frontier):
            if id(node) in seen or node.op not in ops:
                continue
            if all(id(t) in known or const_value(t) is not None for t in node.inputs):
                seen.add(id(node))
                region.append(node)
                for out in node.outputs:
                    known.add(id(out))
                    frontier.extend(out.outputs)
                changed = True
    return region


def region_outputs(graph: gs.Graph, region: list[gs.Node]) -> list[gs.Tensor]:
    """Tensors made inside the region that something outside it reads (or graph outputs)."""
    inside = {id(n) for n in region}
    outs = []
    graph_outs = {id(t) for t in graph.outputs}
    for node in region:
        for t in node.outputs:
            if id(t) in graph_outs or any(id(c) not in inside for c in t.outputs):
                outs.append(t)
    return outs


def eval_elementwise(region: list[gs.Node], feeds: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Evaluates a region in float64; feeds and result are keyed by id(tensor)."""
    env = dict(feeds)

    def val(t: gs.Tensor) -> np.ndarray:
        if id(t) in env:
            return env[id(t)]
        c = const_value(t)
        if c is None:
            raise KeyError(t.name)
        return c.astype(np.float64) if c.dtype.kind == "f" else c

    for node in region:
        ins = [val(t) for t in node.inputs]
        op = node.op
        if op == "Add":
            r = ins[0] + ins[1]
        elif op == "Sub":
            r = ins[0] - ins[1]
        elif op == "Mul":
            r = ins[0] * ins[1]
        elif op == "Div":
            r = ins[0] / ins[1]
        elif op == "Neg":
            r = -ins[0]
        elif op == "Sqrt":
            r = np.sqrt(ins[0])
        elif op == "Reciprocal":
            r = 1.0 / ins[0]
        elif op == "Pow":
            r = np.power(ins[0], ins[1])
        elif op == "Erf":
            r = np.vectorize(erf)(ins[0])
        elif op == "Tanh":
            r = np.tanh(ins[0])
        elif op in ("Cast", "Identity"):
            r = ins[0]
        elif op in ("Max", "Min"):
            r = (np.maximum if op == "Max" else np.minimum).reduce(np.broadcast_arrays(*ins))
        elif op == "Equal":
            r = ins[0] == ins[1]
        elif op == "Where":
            r = np.where(ins[0].astype(bool), ins[1], ins[2])
        elif op == "GlobalAveragePool":
            r = ins[0].mean(axis=tuple(range(2, ins[0].ndim)), keepdims=True)
        elif op == "ReduceMean":
            axes = node.attrs.get("axes")
            if axes is None and len(ins) > 1:
                axes = ins[1]
            keep = bool(node.attrs.get("keepdims", 1))
            r = ins[0].mean(axis=None if axes is None else tuple(int(a) for a in np.ravel(axes)),
                            keepdims=keep)
        else:
            raise KeyError(op)
        r = np.asarray(r)
        env[id(node.outputs[0])] = r if r.dtype == bool else r.astype(np.float64)
    return env


def ancestors(tensors: Iterable[gs.Tensor], cut: Iterable[gs.Tensor] = ()
              ) -> tuple[list[gs.Node], list[gs.Variable]]:
    """All nodes feeding `tensors` (topological order) and the sources they start from: graph
    inputs, and the `cut` tensors, which are treated as inputs."""
    nodes: dict[int, gs.Node] = {}
    sources: dict[int, gs.Variable] = {}
    cut_ids = {id(t) for t in cut}
    stack = list(tensors)
    while stack:
        t = stack.pop()
        if not t.name and not t.inputs:  # an absent optional input ("")
            continue
        if id(t) in cut_ids:
            sources[id(t)] = t
            continue
        if not t.inputs:
            if isinstance(t, gs.Variable):
                sources[id(t)] = t
            continue
        node = t.inputs[0]
        if id(node) in nodes:
            continue
        nodes[id(node)] = node
        stack.extend(node.inputs)
    order = _topo(list(nodes.values()))
    return order, list(sources.values())


def _topo(nodes: list[gs.Node]) -> list[gs.Node]:
    ids = {id(n) for n in nodes}
    done: set[int] = set()
    out: list[gs.Node] = []

    def visit(n: gs.Node) -> None:
        if id(n) in done:
            return
        done.add(id(n))
        for t in n.inputs:
            if t.inputs and id(t.inputs[0]) in ids:
                visit(t.inputs[0])
        out.append(n)

    for n in nodes:
        visit(n)
    return out


def eval_with_ort(graph: gs.Graph, outputs: list[gs.Tensor],
                  feeds: dict[str, np.ndarray],
                  cut: dict[str, gs.Tensor] | None = None) -> list[np.ndarray]:
    """Evaluates `outputs` from the graph inputs with ONNX Runtime (CPU, no optimisation).
    `cut` names inner tensors to feed directly (their producers are not evaluated)."""
    nodes, sources = ancestors(outputs, (cut or {}).values())
    missing = [s.name for s in sources if s.name not in feeds]
    if missing:
        raise KeyError(f"needs {', '.join(missing)}")
    sub = gs.Graph(nodes=[_copy(n) for n in nodes], opset=graph.opset)
    tensor_map: dict[int, gs.Tensor] = {}
    for orig, copy in zip(nodes, sub.nodes):
        copy.inputs = [_mapped(t, tensor_map) for t in orig.inputs]
        copy.outputs = [_mapped(t, tensor_map) for t in orig.outputs]
    sub.inputs = [tensor_map[id(s)] for s in sources]
    for s in sub.inputs:
        s.dtype, s.shape = np.asarray(feeds[s.name]).dtype, list(np.shape(feeds[s.name]))
    sub.outputs = [tensor_map[id(t)] for t in outputs]
    for o in sub.outputs:
        o.dtype = o.dtype or np.float32
    model = gs.export_onnx(sub, do_type_check=False)
    model.ir_version = min(model.ir_version, 10)
    del model.opset_import[:]
    model.opset_import.extend([onnx.helper.make_opsetid("", graph.opset),
                               onnx.helper.make_opsetid(MS_DOMAIN, MS_OPSET)])
    sess = make_session(model, optimize=False, log_severity=4, register_kernels=False)
    return sess.run([o.name for o in sub.outputs], {s.name: feeds[s.name] for s in sub.inputs})


def _copy(node: gs.Node) -> gs.Node:
    return gs.Node(node.op, node.name, dict(node.attrs), domain=node.domain)


def _mapped(t: gs.Tensor, tensor_map: dict[int, gs.Tensor]) -> gs.Tensor:
    if id(t) not in tensor_map:
        if isinstance(t, gs.Constant):
            tensor_map[id(t)] = t
        else:
            tensor_map[id(t)] = gs.Variable(t.name, dtype=t.dtype, shape=None)
    return tensor_map[id(t)]
