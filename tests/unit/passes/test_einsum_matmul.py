"""EinsumToMatMul on tiny hand-built graphs, run with ORT before and after.

Every equation Keras' EinsumDense / MultiHeadAttention writes in a BERT layer (the ones
tf2onnx leaves as Einsum in Model Garden's AlbertEncoder), each checked numerically against
the Einsum it replaces; equations it cannot lower are left alone with a reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bertfuse.passes.einsum_matmul import EinsumToMatMul
from bertfuse.passes.manager import run_passes
from support.passes_common import run

B, T, N, D, H = 2, 5, 3, 4, 12


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(run(model, feeds).values())


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
