"""ai.bertfuse FP8 dense ops (ops/bertfuse/dense_fp8.py): the e4m3 quantisation against ONNX
Runtime's own float8 QuantizeLinear (round to nearest even, saturate), and the references
against ORT's CPU kernels on the dequantised operands (DequantizeLinear, MatMul, then the
contrib epilogue op)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from bertfuse.ops import BERTFUSE_CONTRACTS, BERTFUSE_DOMAIN
from bertfuse.ops.bertfuse import dense_fp8
from support.ops_common import assert_fp16_within_ulp, run

K, N = 32, 24


def _ort_quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """ORT's QuantizeLinear to float8e4m3fn (saturate=1), as float32 values."""
    zp = numpy_helper.from_array(np.zeros((), dense_fp8.e4m3_dtype()), "zp")
    sc = numpy_helper.from_array(np.array(scale, np.float32), "sc")
    nodes = [helper.make_node("QuantizeLinear", ["x", "sc", "zp"], ["q"], saturate=1),
             helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
                              [sc, zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    (y,) = run(model, {"x": np.asarray(x, np.float32)})
    return y


def test_contracts_follow_the_fp16_ops_with_wt_and_w_scale() -> None:
    for base, fp8 in dense_fp8.FP8_OF.items():
        c, b = BERTFUSE_CONTRACTS[fp8], BERTFUSE_CONTRACTS[base]
        assert c.domain == BERTFUSE_DOMAIN
        names = [t.name for t in c.inputs]
        assert names == ["X", "Wt"] + [t.name for t in b.inputs[2:]] + ["w_scale"]
        assert c.input("Wt").shape == ("N", "K") and c.input("Wt").dtypes == ("float8e4m3fn",)
        assert c.attribute("x_scale").required and c.attribute("fast_accum").default == 1  # the kernel's default
        assert {a.name for a in b.attributes} <= {a.name for a in c.attributes}


def test_e4m3_rounding_and_saturation_equal_ort_quantize_linear(rng, seed) -> None:
    x = np.concatenate([rng.standard_normal(4000) * 100, [448.0, 449.0, 500.0, -1e4, 0.0,
                                                          2.0 ** -9, 2.0 ** -10, 464.0]])
    x = x.astype(np.float32)
    got = dense_fp8.e4m3(x).astype(np.float32)
    np.testing.assert_array_equal(got, _ort_quantize(x, 1.0), err_msg=f"seed {seed}")
    assert np.isfinite(got).all() and np.abs(got).max() == 448.0


def test_weight_quantization(rng, seed) -> None:
    w = (rng.standard_normal((K, N)) * 0.05).astype(np.float16)
    wt, w_scale = dense_fp8.quantize_weight(w)
    assert wt.shape == (N, K) and wt.dtype == dense_fp8.e4m3_dtype()
    assert w_scale.dtype == np.float32 and w_scale.shape == (1,)
    back = wt.astype(np.float64).T * w_scale[0]
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 above the subnormal range
    err = np.abs(back - w)
    assert (err <= np.abs(w.astype(np.float64)) / 16 + 2.0 ** -9 * w_scale[0]).all(), seed
    assert np.abs(wt.astype(np.float32)).max() == 448.0  # the largest weight maps to 448
    with pytest.raises(ValueError):
        dense_fp8.quantize_weight(np.zeros((K, N), np.float16))
    with pytest.raises(ValueError):
        dense_fp8.x_scale_for(0.0)


@pytest.mark.parametrize("op", sorted(dense_fp8.FP8_OF.values()))
def test_reference_matches_ort_on_the_dequantized_operands(rng, seed, op) -> None:
    x = (rng.standard_normal((3, 5, K)) * 2).astype(np.float16)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float16)
    bias = (0.3 * rng.standard_normal(N)).astype(np.float16)
    skip = rng.standard_normal((3, 5, N)).astype(np.float16)
    gamma = (1 + 0.1 * rng.standard_normal(N)).astype(np.float16)
    beta = (0.2 * rng.standard_normal(N)).astype(np.float16)
    wt, w_scale = dense_fp8.quantize_weight(w)
    x_scale = dense_fp8.x_scale_for(float(np.abs(x).max()) * 0.5)  # some activations saturate
    extra = (skip, gamma, beta) if "SkipLayerNorm" in op else ()
    attrs = {"approximate": 1} if "Gelu" in op else {"epsilon": 1e-5} if extra else {}
    got = dense_fp8.reference(op, x, wt, bias, *extra, w_scale, x_scale=x_scale, **attrs)
    assert got.dtype == np.float16 and got.shape == (3, 5, N)
    # ORT: quantise X, dequantise both, MatMul, the contrib epilogue, all float32
    xq = _ort_quantize(x.astype(np.float32) / np.float32(x_scale), 1.0) * x_scale
    wq = wt.astype(np.float32).T * w_scale[0]
    from unit.ops.test_dense import _ort_two_kernels

    feeds = {"X": xq.astype(np.float32), "W": wq, "bias": bias, "skip": skip, "gamma": gamma,
             "beta": beta}
    if op == "DenseBiasFp8":
        want = xq.astype(np.float64) @ wq.astype(np.float64) + bias
    else:
        contrib = {"DenseBiasGeluFp8": "FastGelu",
                   "DenseBiasSkipLayerNormFp8": "SkipLayerNormalization"}[op]
        want = _ort_two_kernels(contrib, feeds, **({"epsilon": 1e-5} if extra else {}))
    assert_fp16_within_ulp(got, np.asarray(want).astype(np.float16), seed, op)


def test_reference_refuses_a_bad_scale_or_an_fp16_weight(rng) -> None:
    x = rng.standard_normal((2, K)).astype(np.float16)
    wt, ws = dense_fp8.quantize_weight(rng.standard_normal((K, N)).astype(np.float16))
    b = np.zeros(N, np.float16)
    with pytest.raises(ValueError, match="x_scale"):
        dense_fp8.reference("DenseBiasFp8", x, wt, b, ws, x_scale=float("nan"))
    with pytest.raises(TypeError, match="float8"):
        dense_fp8.reference("DenseBiasFp8", x, wt.astype(np.float16), b, ws, x_scale=1.0)


def test_node_builder_needs_x_scale() -> None:
    import onnx_graphsurgeon as gs

    t = [gs.Variable(n, dtype=np.float16) for n in ("x", "wt", "b", "ws", "y")]
    with pytest.raises(ValueError, match="x_scale"):
        dense_fp8.DENSE_BIAS_FP8.node("n", t[:4], t[4:])
    node = dense_fp8.DENSE_BIAS_FP8.node("n", t[:4], t[4:], x_scale=0.01)
    assert node.attrs == {"x_scale": 0.01}  # fast_accum left at its default
