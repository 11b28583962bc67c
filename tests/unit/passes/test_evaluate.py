"""passes/evaluate.py: the regions and evaluators fusions match on, against ONNX Runtime.

Each evaluator result is compared with ORT CPU (no graph optimisation) running the same
hand-built graph on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto

from bertfuse.passes.evaluate import ancestors, bs_input, closed_region, eval_elementwise, \
    eval_with_ort, rank_of, region_outputs
from support.builders.onnx_graphs import G, layernorm, mask_adder, mask_rows
from support.passes_common import B, H, S, run, vec


def _ln_graph(rng, extra_out: bool = False):
    """x [B,S,H] -> LayerNorm (moments form) -> y, optionally the mean as a second output."""
    g = G("ln")
    x = g.input("x", np.float32, ["B", "S", H])
    layernorm(g, x, vec(rng, H, 0.2, 1.0), vec(rng, H), 1e-3, form="moments")
    g.rename_last("y")
    g.output("y")
    if extra_out:
        g.output(g.nodes[0].output[0])
    return g.model()


def _tensor(graph: gs.Graph, name: str) -> gs.Tensor:
    return graph.tensors()[name]


def test_closed_region_and_eval_elementwise_match_ort(rng, seed):
    model = _ln_graph(rng)
    graph = gs.import_onnx(model)
    x, y = _tensor(graph, "x"), _tensor(graph, "y")
    region = closed_region([x])
    assert len(region) == len(graph.nodes)  # every node is elementwise on x and constants
    assert region_outputs(graph, region) == [y]
    feeds = {"x": rng.standard_normal((B, S, H)).astype(np.float32) * 3 + 1}
    got = eval_elementwise(region, {id(x): feeds["x"].astype(np.float64)})[id(y)]
    want = run(model, feeds)["y"]
    assert got.dtype == np.float64 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5, f"seed {seed}"


def test_region_outputs_include_an_intermediate_read_outside(rng):
    graph = gs.import_onnx(_ln_graph(rng, extra_out=True))
    outs = region_outputs(graph, closed_region([_tensor(graph, "x")]))
    assert [t.name for t in outs] == [graph.nodes[0].outputs[0].name, "y"]


def test_closed_region_stops_at_a_second_variable_input(rng):
    g = G("two")
    x = g.input("x", np.float32, ["N", H])
    z = g.input("z", np.float32, ["N", H])
    a = g.op("Mul", x, 2.0)
    g.op("Add", a, z, out="y")  # reads z: not closed over x
    g.output("y")
    graph = gs.import_onnx(g.model())
    region = closed_region([_tensor(graph, "x")])
    assert [n.op for n in region] == ["Mul"]
    with pytest.raises(KeyError):  # evaluating past the region needs z
        eval_elementwise(graph.nodes, {id(_tensor(graph, "x")): np.ones((2, H))})


def test_eval_with_ort_evaluates_an_inner_tensor_from_the_inputs(rng):
    g = G("mask")
    mask = g.input("input_mask", np.int32, ["B", "S"])
    g.input("hidden", np.float32, ["B", "S", H])  # not needed for the adder
    adder = mask_adder(g, mask, "10000")
    g.op("Identity", adder, out="y")
    g.output("y")
    graph = gs.import_onnx(g.model())
    m = mask_rows(B, S, rng)
    (got,) = eval_with_ort(graph, [_tensor(graph, adder)], {"input_mask": m})
    want = (1.0 - m[:, None, None, :]) * -10000.0
    assert got.shape == (B, 1, 1, S) and np.array_equal(got, want.astype(np.float32))
    nodes, sources = ancestors([_tensor(graph, adder)])
    assert [s.name for s in sources] == ["input_mask"]
    assert "Identity" not in [n.op for n in nodes]
    with pytest.raises(KeyError, match="input_mask"):
        eval_with_ort(graph, [_tensor(graph, adder)], {})


def test_eval_with_ort_cut_feeds_an_inner_tensor(rng):
    g = G("cut")
    x = g.input("x", np.float32, ["N", H])
    a = g.op("Relu", x)
    g.op("Mul", a, 3.0, out="y")
    g.output("y")
    graph = gs.import_onnx(g.model())
    inner = _tensor(graph, a)
    _, sources = ancestors([_tensor(graph, "y")], [inner])
    assert sources == [inner]
    fed = rng.standard_normal((2, H)).astype(np.float32)  # negative values: Relu is cut away
    (got,) = eval_with_ort(graph, [_tensor(graph, "y")], {a: fed}, cut={a: inner})
    assert np.allclose(got, fed * 3.0)


def test_rank_of_and_bs_input():
    g = G("rank")
    ids = g.input("input_ids", np.int32, ["B", "S"])
    x = g.input("x", np.float32, None)
    flat = g.op("Reshape", x, g.ints(-1, H))
    g.op("Relu", g.op("Cast", flat, to=TensorProto.FLOAT), out="y")
    g.output("y")
    g.op("Cast", ids, to=TensorProto.FLOAT, out="ids_f")
    g.output("ids_f")
    graph = gs.import_onnx(g.model())
    assert rank_of(_tensor(graph, "x")) is None  # no shape, no producer
    assert rank_of(_tensor(graph, flat)) == 2  # the constant target shape
    relu_out = _tensor(graph, "y")
    relu_out.shape = None
    assert rank_of(relu_out) == 2  # through rank-preserving Relu and Cast
    assert bs_input(graph) is _tensor(graph, "input_ids")
    graph.inputs = [_tensor(graph, "x")]
    assert bs_input(graph) is None
