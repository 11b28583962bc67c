"""The pass protocol in passes/base.py: MatchResult, PassResult, Layers, graph helpers."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import Layers, MatchResult, PassResult, census, replace_tensor, \
    scalar_value, split_const
from support.builders.onnx_graphs import bert


def test_match_result_fails_with_its_reason():
    m = MatchResult()
    assert m and m.reason == "" and m.found is None
    assert m.ok((1, 2)).found == (1, 2) and m
    failed = MatchResult().fail("input is not an Add")
    assert not failed and failed.reason == "input is not an Add" and failed.found is None
    assert not MatchResult().fail("")  # an empty reason still fails
    assert MatchResult().fail("").reason


def test_pass_result_records_every_candidate():
    result = PassResult()
    assert result.record("gelu", MatchResult().ok("x"), 0)
    result.fused("gelu", 0)
    assert not result.record("gelu", MatchResult().fail("Erf is not part of x*Phi(x)"), 1)
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
