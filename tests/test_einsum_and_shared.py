"""EinsumToMatMul and SharedWeights on tiny hand-built graphs, run with ORT before and after.

Einsum: every equation Keras' EinsumDense / MultiHeadAttention writes in a BERT layer (the
ones tf2onnx leaves as Einsum in Model Garden's AlbertEncoder), each checked numerically
against the Einsum it replaces; equations it cannot lower are left alone with a reason.
SharedWeights: equal weights become one initializer, different ones stay apart.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")

from bertfuse.passes.einsum_matmul import EinsumToMatMul  # noqa: E402
from bertfuse.passes.manager import run_passes  # noqa: E402
from bertfuse.passes.shared_weights import SharedWeights  # noqa: E402

B, T, N, D, H = 2, 5, 3, 4, 12


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _einsum_model(equation: str, a_shape, b_shape, b_const: np.ndarray | None):
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
    inits = []
    if b_const is None:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape))
    else:
        inits.append(numpy_helper.from_array(b_const, "b"))
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation, name="e")
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES = [  # (equation, A shape, B shape, B constant?)
    ("abc,cde->abde", [B, T, H], [H, N, D], True),          # Q/K/V projection
    ("abcd,cde->abe", [B, T, N, D], [N, D, H], True),       # attention output projection
    ("aecd,abcd->acbe", [B, T, N, D], [B, T, N, D], False),  # scores (K, Q)
    ("acbe,aecd->abcd", [B, N, T, T], [B, T, N, D], False),  # context (P, V)
    ("...x,xy->...y", [B, T, D], [D, H], True),             # embedding projection
    ("abc,cd->abd", [B, T, H], [H, D], True),               # plain dense
]


@pytest.mark.parametrize("equation,a_shape,b_shape,b_is_const", CASES)
def test_einsum_lowered_exactly(equation, a_shape, b_shape, b_is_const):
    rng = np.random.default_rng(0)
    b_val = rng.standard_normal(b_shape).astype(np.float32)
    model = _einsum_model(equation, a_shape, b_shape, b_val if b_is_const else None)
    feeds = {"a": rng.standard_normal(a_shape).astype(np.float32)}
    if not b_is_const:
        feeds["b"] = b_val
    (before,) = _run(model, feeds)
    lowered, report = run_passes(model, [EinsumToMatMul()])
    ops = [n.op_type for n in lowered.graph.node]
    assert "Einsum" not in ops and "MatMul" in ops, (equation, ops, report.diagnostics)
    (after,) = _run(lowered, feeds)
    assert after.shape == before.shape
    np.testing.assert_allclose(after, before, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("equation,a_shape,b_shape", [
    ("ab,ab->a", [B, T], [B, T]),       # no free index on the right: a reduction, not a product
    ("aab,bc->ac", [T, T, H], [H, D]),  # a diagonal
])
def test_einsum_left_alone_with_a_reason(equation, a_shape, b_shape):
    model = _einsum_model(equation, a_shape, b_shape, None)
    lowered, report = run_passes(model, [EinsumToMatMul()])
    assert [n.op_type for n in lowered.graph.node] == ["Einsum"]
    reasons = [d.reason for d in report.diagnostics if not d.fused]
    assert reasons and equation in reasons[0]


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
