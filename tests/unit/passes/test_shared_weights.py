"""SharedWeights: equal weights become one initializer, different ones stay apart."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bertfuse.passes.manager import run_passes
from bertfuse.passes.shared_weights import SharedWeights
from support.passes_common import run


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(run(model, feeds).values())


def _two_matmuls(w0: np.ndarray, w1: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"]),
             helper.make_node("MatMul", ["h", "w1"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        initializer=[numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("same", [True, False])
def test_shared_weights_merge_equal_tensors_only(same):
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((8, 8)).astype(np.float32)
    w1 = w0.copy() if same else w0 + np.float32(1e-3)
    model = _two_matmuls(w0, w1)
    x = {"x": rng.standard_normal((2, 8)).astype(np.float32)}
    merged, _ = run_passes(model, [SharedWeights()])
    assert len(merged.graph.initializer) == (1 if same else 2)
    np.testing.assert_array_equal(_run(merged, x)[0], _run(model, x)[0])
