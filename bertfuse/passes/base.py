"""What every pass shares: the candidate loop, its result type, diagnostics, graph helpers.

The pass protocol: a pass looks at candidates (the anchors of its pattern: every LayerNorm
for skip_layernorm, every Erf/Tanh for gelu, every Identity for cleanup, ...), tries a match
on each, which raises `MatchFailure` (match.py) with a reason where a check does not hold, and
ends every candidate in its `PassResult` as fused or missed, with the encoder layer where one
is known (`Layers`). `CandidatePass` runs that loop: a pass says which nodes are its
candidates and how to match and rewrite one. Nothing a pass looks at is skipped silently.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.match import MatchFailure, NotACandidate


@dataclass
class Diagnostic:
    """One finding of a pass about a place in the model ("layer 2 attention: ...")."""

    component: str  # attention | skip_layernorm | gelu | embed_layernorm | layernorm | ...
    fused: bool
    layer: int | None = None
    reason: str = ""

    def __str__(self) -> str:
        where = f"layer {self.layer} " if self.layer is not None else ""
        state = "fused" if self.fused else f"not fused: {self.reason}"
        return f"{where}{self.component}: {state}"


@dataclass
class PassResult:
    """What a pass changed: how many rewrites, and per candidate whether it fused and why not."""

    rewrites: int = 0
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def fused(self, component: str, layer: int | None = None) -> None:
        self.rewrites += 1
        self.diagnostics.append(Diagnostic(component, True, layer))

    def missed(self, component: str, reason: str, layer: int | None = None) -> None:
        self.diagnostics.append(Diagnostic(component, False, layer, reason))

    def missed_reasons(self, component: str | None = None) -> list[str]:
        return [d.reason for d in self.diagnostics
                if not d.fused and (component is None or d.component == component)]


class Layers:
    """The encoder layer of each node, numbered as the encoder table numbers them: every
    attention core (Softmax, or a fused Attention) starts a layer, in topological order.
    Nodes before the first one (the embeddings) have no layer. Taken when a pass starts:
    the manager toposorts the graph after every pass; nodes added later have no layer."""

    def __init__(self, graph: gs.Graph) -> None:
        self._layer: dict[int, int | None] = {}
        layer: int | None = None
        for node in graph.nodes:
            if node.op in ("Softmax", "Attention", "BertAttention"):
                layer = 0 if layer is None else layer + 1
            self._layer[id(node)] = layer

    def of(self, node: gs.Node | None) -> int | None:
        return None if node is None else self._layer.get(id(node))


class Pass(Protocol):
    """What the manager runs: a named callable on a graph. A pass that decides the whole graph
    at once (fp16, hidden_3d, packing) implements this directly; a pass with candidates
    subclasses CandidatePass."""

    name: str

    def __call__(self, graph: gs.Graph) -> PassResult: ...


class CandidatePass:
    """The candidate loop and its bookkeeping: every candidate ends fused (rewritten) or
    missed (the MatchFailure's reason), in its layer.

    A subclass sets `name` and defines:

    * `candidates(graph)`: the anchors, in order; a generator is read as the loop reaches
      each, so it sees the rewrites before it (and can pass over a node one of them detached);
    * `match(graph, node)`: what the rewrite needs; raises MatchFailure with the reason, or
      NotACandidate for a node that turns out not to be one (nothing recorded);
    * `rewrite(graph, node, found)`.

    Hooks, with defaults: `prepare` (graph-wide work before layers are numbered), `component`
    and `layer` (where a diagnostic is recorded), `finish` (after the loop), `once` (stop
    after the first rewrite).
    """

    name: str = ""
    once: bool = False

    def __call__(self, graph: gs.Graph) -> PassResult:
        self.prepare(graph)
        result = PassResult()
        layers = Layers(graph)
        for node in self.candidates(graph):
            component, layer = self.component(node), self.layer(layers, node)
            try:
                found = self.match(graph, node)
            except NotACandidate:
                continue
            except MatchFailure as failure:
                result.missed(component, failure.reason, layer)
                continue
            self.rewrite(graph, node, found)
            result.fused(component, layer)
            if self.once:
                break
        self.finish(graph, result)
        return result

    def candidates(self, graph: gs.Graph) -> Iterable[gs.Node]:
        raise NotImplementedError

    def match(self, graph: gs.Graph, node: gs.Node) -> Any:
        raise NotImplementedError

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: Any) -> None:
        raise NotImplementedError

    def prepare(self, graph: gs.Graph) -> None:
        pass

    def component(self, node: gs.Node) -> str:
        return self.name

    def layer(self, layers: Layers, node: gs.Node) -> int | None:
        return layers.of(node)

    def finish(self, graph: gs.Graph, result: PassResult) -> None:
        pass


def census(graph: gs.Graph) -> Counter:
    """Op histogram keyed by op (contrib ops prefixed with their domain)."""
    return Counter(op_key(n) for n in graph.nodes)


def op_key(node: gs.Node) -> str:
    return f"{node.domain}.{node.op}" if node.domain not in ("", "ai.onnx", None) else node.op


# -- graph helpers ---------------------------------------------------------------------------

def consumers(tensor: gs.Tensor) -> list[gs.Node]:
    return list(tensor.outputs)


def producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if tensor.inputs else None


def reaches_op(t: gs.Tensor, op: str, through: Callable[[gs.Node], gs.Tensor | None],
               nodes: int) -> bool:
    """Whether `t` is made by an `op` node, looking back over at most `nodes` producers;
    `through` gives the tensor a node passes on (None: the walk stops there)."""
    for _ in range(nodes):
        node = producer(t)
        if node is None:
            return False
        if node.op == op:
            return True
        passed = through(node)
        if passed is None:
            return False
        t = passed
    return False


def const_value(tensor: gs.Tensor) -> np.ndarray | None:
    """The value of a Constant tensor or of a Constant node's output, else None."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    node = producer(tensor)
    if node is not None and node.op == "Constant" and "value" in node.attrs:
        return np.asarray(node.attrs["value"].values)
    return None


def scalar_value(tensor: gs.Tensor) -> float | None:
    """The single value of a constant tensor (any shape with one distinct value), else None."""
    value = const_value(tensor)
    if value is None or value.size == 0:
        return None
    flat = value.reshape(-1)
    if not np.all(flat == flat[0]):
        return None
    return float(flat[0])


def split_const(node: gs.Node) -> tuple[gs.Tensor, np.ndarray] | None:
    """For a binary node with exactly one constant operand: (the other operand, the constant)."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    va, vb = const_value(a), const_value(b)
    if vb is not None and va is None:
        return a, vb
    if va is not None and vb is None:
        return b, va
    return None


def scalar_factor(node: gs.Node) -> tuple[gs.Tensor, float] | None:
    """Mul/Div by a scalar constant: (the other operand, the factor it applies)."""
    if node.op not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    vb = scalar_value(b)
    if vb is not None and const_value(a) is None:
        return (a, vb) if node.op == "Mul" else (a, 1.0 / vb)
    va = scalar_value(a)
    if node.op == "Mul" and va is not None and const_value(b) is None:
        return b, va
    return None


def only_consumer(tensor: gs.Tensor, op: str | None = None) -> gs.Node | None:
    outs = tensor.outputs
    if len(outs) != 1 or (op is not None and outs[0].op != op):
        return None
    return outs[0]


def is_graph_output(graph: gs.Graph, tensor: gs.Tensor) -> bool:
    return any(t is tensor for t in graph.outputs)


def detach(nodes: Iterable[gs.Node]) -> None:
    """Disconnects nodes so graph.cleanup() drops them."""
    for node in nodes:
        node.outputs.clear()
        node.inputs.clear()


def replace_tensor(graph: gs.Graph, old: gs.Tensor, new: gs.Tensor) -> None:
    """Makes every consumer of `old` (and the graph outputs) read `new` instead."""
    for node in list(old.outputs):
        for i, t in enumerate(node.inputs):
            if t is old:
                node.inputs[i] = new
    for i, t in enumerate(graph.outputs):
        if t is old:
            # Keep the public name: the graph output is renamed onto the new producer's tensor.
            new.name, old.name = old.name, f"{old.name}__replaced"
            new.shape = new.shape if new.shape is not None else old.shape
            new.dtype = new.dtype if new.dtype is not None else old.dtype
            graph.outputs[i] = new


def const(name: str, value: np.ndarray) -> gs.Constant:
    return gs.Constant(name, np.array(value, order="C"))  # keeps 0-d scalars 0-d


def cast_int32(graph: gs.Graph, t: gs.Tensor) -> gs.Tensor:
    """t as int32 (the contrib ops' index dtype): t itself, or a new Cast under a name no
    tensor of the graph has (an export may already hold `<name>_int32`)."""
    if t.dtype is None or np.dtype(t.dtype) == np.int32:
        return t
    taken = set(graph.tensors())
    name, n = f"{t.name}_int32", 1
    while name in taken:
        name, n = f"{t.name}_int32_{n}", n + 1
    out = gs.Variable(name, dtype=np.int32, shape=t.shape)
    graph.nodes.append(gs.Node("Cast", f"{name}_cast", {"to": 6}, inputs=[t], outputs=[out]))
    return out
