"""The pass protocol in passes/base.py and match.py: MatchFailure, CandidatePass, PassResult,
Layers, graph helpers."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from bertfuse.passes.base import CandidatePass, Layers, PassResult, census, replace_tensor, \
    scalar_factor, scalar_value, split_const
from bertfuse.passes.match import MatchFailure, NotACandidate, expect, fail, prefixed
from support.builders.onnx_graphs import bert


def test_match_failure_carries_its_reason():
    with pytest.raises(MatchFailure) as info:
        fail("input is not an Add")
    assert info.value.reason == "input is not an Add" == str(info.value)
    assert MatchFailure("").reason == "no reason given"  # an empty reason still reads as one
    expect(True, "never raised")
    with pytest.raises(MatchFailure, match="^the sum is read elsewhere$"):
        expect([], "the sum is read elsewhere")
    with pytest.raises(MatchFailure) as info:
        with prefixed("query path: "):
            fail("no head-split Reshape")
    assert info.value.reason == "query path: no head-split Reshape"
    with prefixed("never: "):
        pass  # no failure inside: nothing raised


class _Relus(CandidatePass):
    """Fuses every Relu (into a Sigmoid) unless its name says otherwise."""

    name = "relus"

    def __init__(self, once: bool = False) -> None:
        self.once = once
        self.finished: PassResult | None = None

    def candidates(self, graph):
        for node in list(graph.nodes):
            if node.op == "Relu" and node.outputs:  # read lazily: sees earlier rewrites
                yield node

    def match(self, graph, node):
        if node.name.startswith("skip"):
            raise NotACandidate
        expect(not node.name.startswith("bad"), f"{node.name} is marked bad")
        return node.name.upper()

    def rewrite(self, graph, node, found):
        node.op, node.name = "Sigmoid", found

    def layer(self, layers, node):
        return int(node.name[-1])

    def finish(self, graph, result):
        self.finished = result


def _relus(*names: str) -> gs.Graph:
    x = gs.Variable("x", dtype=np.float32, shape=[2])
    nodes, t = [], x
    for name in names:
        out = gs.Variable(f"{name}_out", dtype=np.float32, shape=[2])
        nodes.append(gs.Node("Relu", name, inputs=[t], outputs=[out]))
        t = out
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[t])


def test_candidate_pass_ends_every_candidate_fused_or_missed():
    graph = _relus("a0", "bad1", "skip2", "b3")
    p = _Relus()
    result = p(graph)
    assert result.rewrites == 2 and p.finished is result
    assert [(d.component, d.fused, d.layer, d.reason) for d in result.diagnostics] == [
        ("relus", True, 0, ""), ("relus", False, 1, "bad1 is marked bad"),
        ("relus", True, 3, "")]  # skip2 is no candidate: nothing recorded
    assert [n.op for n in graph.nodes] == ["Sigmoid", "Relu", "Relu", "Sigmoid"]
    assert [n.name for n in graph.nodes] == ["A0", "bad1", "skip2", "B3"]


def test_candidate_pass_once_stops_after_the_first_rewrite():
    graph = _relus("bad0", "a1", "b2")
    result = _Relus(once=True)(graph)
    assert result.rewrites == 1
    assert [(d.fused, d.layer) for d in result.diagnostics] == [(False, 0), (True, 1)]
    assert [n.op for n in graph.nodes] == ["Relu", "Sigmoid", "Relu"]


def test_pass_result_records_every_candidate():
    result = PassResult()
    result.fused("gelu", 0)
    result.missed("gelu", "Erf is not part of x*Phi(x)", 1)
    assert result.rewrites == 1
    assert [(d.component, d.fused, d.layer) for d in result.diagnostics] == \
        [("gelu", True, 0), ("gelu", False, 1)]
    assert result.missed_reasons("gelu") == ["Erf is not part of x*Phi(x)"]
    assert result.missed_reasons("attention") == []
    assert str(result.diagnostics[1]) == "layer 1 gelu: not fused: Erf is not part of x*Phi(x)"


def test_layers_number_layers_by_their_softmax(rng):
    graph = gs.import_onnx(bert(rng, layers=3))
    layers = Layers(graph)
    softmaxes = [n for n in graph.nodes if n.op == "Softmax"]
    assert [layers.of(n) for n in softmaxes] == [0, 1, 2]
    # the embedding LayerNorm's reductions come before the first layer
    assert layers.of(next(n for n in graph.nodes if n.op == "ReduceMean")) is None
    # the GELU of a layer follows its softmax
    erfs = [n for n in graph.nodes if n.op == "Erf"]
    assert [layers.of(n) for n in erfs] == [0, 1, 2]
    assert layers.of(None) is None
    assert layers.of(gs.Node("Relu")) is None  # added after the count


def test_split_const_and_scalar_value():
    x = gs.Variable("x", dtype=np.float32)
    c = gs.Constant("c", np.full((1, 1), 0.5, np.float32))
    mul = gs.Node("Mul", inputs=[c, x], outputs=[gs.Variable("y")])
    other, value = split_const(mul)
    assert other is x and value.shape == (1, 1)
    assert scalar_value(c) == 0.5
    assert scalar_value(gs.Constant("v", np.array([1.0, 2.0], np.float32))) is None
    assert split_const(gs.Node("Mul", inputs=[x, x], outputs=[gs.Variable("z")])) is None


def test_scalar_factor_reads_mul_and_div_by_a_scalar():
    x = gs.Variable("x", dtype=np.float32)
    c = gs.Constant("c", np.array(4.0, np.float32))

    def node(op, *inputs):
        return gs.Node(op, inputs=list(inputs), outputs=[gs.Variable(f"{op}_out")])

    assert scalar_factor(node("Mul", c, x)) == (x, 4.0)
    assert scalar_factor(node("Div", x, c)) == (x, 0.25)
    assert scalar_factor(node("Div", c, x)) is None  # c / x is not a scaling of x
    assert scalar_factor(node("Add", x, c)) is None


def test_replace_tensor_keeps_the_output_name():
    x = gs.Variable("x", dtype=np.float32, shape=[2])
    y = gs.Variable("y", dtype=np.float32, shape=[2])
    z = gs.Variable("z", dtype=np.float32)
    graph = gs.Graph(nodes=[gs.Node("Relu", inputs=[x], outputs=[y]),
                            gs.Node("Neg", inputs=[x], outputs=[z])], inputs=[x], outputs=[y])
    replace_tensor(graph, y, z)
    assert graph.outputs[0] is z and z.name == "y" and z.shape == [2]
    graph.cleanup()
    assert census(graph) == {"Neg": 1}


def test_cast_int32_picks_a_free_name():
    """An export may already hold `<input>_int32`: the Cast the fusions add must not clash."""
    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs

    from bertfuse.passes.base import cast_int32

    x = gs.Variable("ids", dtype=np.int64, shape=[2, 3])
    taken = gs.Variable("ids_int32", dtype=np.int32, shape=[2, 3])
    graph = gs.Graph(inputs=[x], outputs=[taken], opset=17)
    graph.nodes.append(gs.Node("Cast", "theirs", {"to": 6}, inputs=[x], outputs=[taken]))
    ours = cast_int32(graph, x)
    assert ours.name not in ("ids", "ids_int32") and np.dtype(ours.dtype) == np.int32
    assert cast_int32(graph, taken) is taken  # already int32: no new node
    graph.outputs.append(ours)
    onnx.checker.check_model(gs.export_onnx(graph), full_check=True)


def test_no_pass_imports_another_modules_private_names():
    """What passes share has a public name (base.py, match.py, ...), not another pass's `_x`."""
    import ast
    from pathlib import Path

    import bertfuse.passes

    found = []
    for path in sorted(Path(bertfuse.passes.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and \
                    (node.module or "").startswith("bertfuse.passes."):
                found += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_")]
    assert found == []
