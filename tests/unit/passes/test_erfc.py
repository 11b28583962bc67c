"""passes/erfc.py: TF's Erfc, as tf2onnx leaves it (an op ONNX lacks), rewritten as 1 - Erf;
in TF's GELU shape it is then the exact GELU the gelu pass fuses. Graphs in tf2onnx's shape:
fp32, and fp16 where only a Cast upstream says the type (tf2onnx writes no value_info)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bertfuse.passes.erfc import rewrite_erfc
from bertfuse.passes.gelu import GeluFusion, gelu_exact
from support.passes_common import count, fuse, run

ort = pytest.importorskip("onnxruntime")


def _tf_gelu(dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """y = x * 0.5 * erfc(-x/√2), as tf.nn.gelu writes it (x through a Cast for fp16)."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    c = lambda name, v: numpy_helper.from_array(np.array(v, np_type), name)  # noqa: E731
    nodes = [helper.make_node("Cast", ["h"], ["x"], to=dtype),
             helper.make_node("Mul", ["x", "neg_rsqrt2"], ["z"]),
             helper.make_node("Erfc", ["z"], ["e"], name="Gelu/Erfc"),
             helper.make_node("Mul", ["x", "half"], ["hx"]),
             helper.make_node("Mul", ["hx", "e"], ["g"]),
             helper.make_node("Cast", ["g"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(
        nodes, "tf_gelu", [helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])],
        [c("neg_rsqrt2", -1 / math.sqrt(2)), c("half", 0.5)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype, tol", [(TensorProto.FLOAT, 1e-6), (TensorProto.FLOAT16, 4e-3)])
def test_erfc_becomes_erf_and_an_fp32_gelu_fuses(dtype, tol):
    model = _tf_gelu(dtype)
    with pytest.raises(onnx.checker.ValidationError, match="Erfc"):
        onnx.checker.check_model(model)
    assert rewrite_erfc(model) == 1
    onnx.checker.check_model(model, full_check=True)  # the constant has x's type
    assert count(model, "Erfc") == 0 and count(model, "Erf") == 1
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32) * 3
    want = gelu_exact(x.astype(np.float64))
    assert np.abs(run(model, {"h": x})["y"] - want).max() < tol
    if dtype != TensorProto.FLOAT:
        # fp16 constants are GELU's only to fp16's precision, not to gelu.py's 1e-7; exports
        # are fp32 (optimize --precision fp16 halves the graph after the fusions)
        return
    fused, _ = fuse(model, GeluFusion())
    assert count(fused, "Gelu", "com.microsoft") == 1 and count(fused, "Erf") == 0
    assert np.abs(run(fused, {"h": x})["y"] - want).max() < tol


def test_an_erfc_outside_a_gelu_is_erfc_still():
    graph = helper.make_graph(
        [helper.make_node("Erfc", ["x"], ["y"])], "erfc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert rewrite_erfc(model) == 1
    x = np.array([-3, -0.5, 0, 0.5, 3], np.float32)
    np.testing.assert_allclose(run(model, {"x": x})["y"], [math.erfc(v) for v in x], atol=1e-6)
    assert rewrite_erfc(model) == 0
