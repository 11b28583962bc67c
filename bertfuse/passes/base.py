"""What every pass shares: its result type, diagnostics, and small graph helpers.

The pass protocol: a pass looks at candidates (the anchors of its pattern: every LayerNorm
for skip_layernorm, every Erf/Tanh for gelu, every Identity for cleanup, ...), tries a match
on each (a `MatchResult`, failed with a reason where a check does not hold) and ends every
candidate in its `PassResult` as fused or missed, with the encoder layer where one is known
(`Layers`). Nothing a pass looks at is skipped silently.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contract import MS_DOMAIN  # noqa: F401  (the one domain constant)


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


class MatchResult:
    """One match attempt (onnxscript's MatchResult): it carries what the match found until a
    check calls `.fail(reason)`; false once failed.

        m = MatchResult()
        if node.op != "Add":
            return m.fail("input is not an Add")
        return m.ok((dense, bias, residual))
    """

    __slots__ = ("reason", "found")

    def __init__(self) -> None:
        self.reason = ""
        self.found: Any = None

    def ok(self, found: Any) -> "MatchResult":
        self.found = found
        return self

    def fail(self, reason: str) -> "MatchResult":
        self.reason, self.found = reason or "no reason given", None
        return self

    def __bool__(self) -> bool:
        return not self.reason

    def __repr__(self) -> str:
        return f"MatchResult(failed: {self.reason})" if self.reason else "MatchResult(ok)"


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

    def record(self, component: str, match: MatchResult, layer: int | None = None) -> bool:
        """Ends a candidate as missed (a failed match, with its reason) or not; returns whether
        it matched. The pass calls `fused` once it has rewritten the match."""
        if not match:
            self.missed(component, match.reason, layer)
        return bool(match)

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
    name: str

    def __call__(self, graph: gs.Graph) -> PassResult: ...


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
