"""io/onnx_in.py: what is checked of a user's ONNX model before anything uses it, on the
graphs that are valid but unusual (subgraphs reading outer names, nodes out of order) as
well as the broken ones. The commands' refusals are in tests/hostile/test_stranger_onnx.py."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bertfuse.errors import BertfuseError
from bertfuse.io.onnx_in import check_graph, check_stranger


def _vi(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])


def _if_model(branch_reads: str) -> onnx.ModelProto:
    """y = If(cond) { then: Relu(branch_reads) } { else: Neg(x) }; `x` and `h` live outside."""
    then = helper.make_graph([helper.make_node("Relu", [branch_reads], ["t"])], "then", [],
                             [_vi("t")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e")])
    nodes = [helper.make_node("Abs", ["x"], ["h"], name="abs"),
             helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then,
                              else_branch=other)]
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    return helper.make_model(helper.make_graph(nodes, "g", [_vi("x"), cond], [_vi("y")]),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_a_subgraph_may_read_outer_names(tmp_path):
    path = tmp_path / "if.onnx"
    onnx.save(_if_model("h"), path)
    assert check_stranger(onnx.load(path), path) == []
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.array([-1, 2], np.float32), "cond": np.array(True)})[0]
    assert out.tolist() == [1, 2]  # ONNX Runtime agrees the model is sound


def test_a_subgraph_reading_nothing_names_its_node(tmp_path):
    path = tmp_path / "if.onnx"
    onnx.save(_if_model("ghost"), path)
    with pytest.raises(BertfuseError, match=r"node 'branch' \(If\) reads 'ghost'"):
        check_stranger(onnx.load(path), path)


def test_nodes_out_of_order_are_a_graph(tmp_path):
    """Acyclic but listed backwards: ONNX Runtime sorts it, so the loader takes it."""
    nodes = [helper.make_node("Neg", ["a"], ["y"], name="second"),
             helper.make_node("Relu", ["x"], ["a"], name="first")]
    graph = helper.make_graph(nodes, "g", [_vi("x")], [_vi("y")])
    check_graph(graph, "m.onnx")
    graph.node[0].input[0] = "y"  # Neg reads its own output now
    with pytest.raises(BertfuseError, match=r"cycle through node 'second' \(Neg\)"):
        check_graph(graph, "m.onnx")


def test_a_graph_output_made_by_nothing(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="r")], "g",
                              [_vi("x")], [_vi("y")])
    with pytest.raises(BertfuseError, match="graph output 'y' is made by no node"):
        check_graph(graph, "m.onnx")


def test_a_constant_with_external_data_outside(tmp_path):
    """Tensors in node attributes are data too: a Constant's value is checked like an
    initializer."""
    (tmp_path / "secret.bin").write_bytes(np.ones(2, np.float32).tobytes())
    (tmp_path / "m").mkdir()
    os.symlink("../secret.bin", tmp_path / "m" / "c.bin")
    value = numpy_helper.from_array(np.zeros(2, np.float32), "c")
    value.ClearField("raw_data")
    value.data_location = TensorProto.EXTERNAL
    value.external_data.add(key="location", value="c.bin")
    nodes = [helper.make_node("Constant", [], ["c"], name="const", value=value),
             helper.make_node("Add", ["x", "c"], ["y"], name="add")]
    path = tmp_path / "m" / "model.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [_vi("x")], [_vi("y")]),
                                opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(BertfuseError, match="node 'const' attribute 'value' has its external "
                                            "data at 'c.bin', which leads outside"):
        check_stranger(onnx.load(path, load_external_data=False), path)
    os.remove(tmp_path / "m" / "c.bin")
    os.rename(tmp_path / "secret.bin", tmp_path / "m" / "c.bin")  # now beside it: fine
    assert check_stranger(onnx.load(path, load_external_data=False), path) == ["c.bin"]
