"""The com.microsoft GELU family: ORT CPU vs gelu.reference, exact vs tanh, bias rules."""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.ops.contrib import gelu
from bertfuse.ops.contract import one_node_model
from support.ops_common import FP32_ATOL, B, H, S, assert_close, max_diff, run, session


GELU_CASES = [("Gelu", False), ("BiasGelu", True), ("FastGelu", True), ("FastGelu", False)]


@pytest.mark.parametrize("op_type,with_bias", GELU_CASES, ids=["Gelu", "BiasGelu", "FastGelu+bias", "FastGelu"])
def test_gelu_family_fp32(op_type: str, with_bias: bool, rng: np.random.Generator, seed: int) -> None:
    model = gelu.make_model(op_type, (B, S, H), with_bias=with_bias)
    names = [i.name for i in model.graph.input]
    x = (3.0 * rng.standard_normal((B, S, H))).astype(np.float32)  # covers the curved region and tails
    args = [x] + ([rng.standard_normal(H).astype(np.float32)] if with_bias else [])
    (y,) = run(model, dict(zip(names, args)))
    assert_close(y, gelu.reference_for(op_type, *args), FP32_ATOL, seed, op_type)


def test_exact_and_tanh_gelu_are_distinguishable(rng: np.random.Generator, seed: int) -> None:
    """Fusing TF BERT's tanh gelu into BiasGelu (erf) is a numeric change these tests would flag."""
    x = (3.0 * rng.standard_normal((B, S, H))).astype(np.float32)
    bias = rng.standard_normal(H).astype(np.float32)
    (y_erf,) = run(gelu.make_model("BiasGelu", (B, S, H)), {"A": x, "B": bias})
    (y_tanh,) = run(gelu.make_model("FastGelu", (B, S, H)), {"X": x, "bias": bias})
    assert max_diff(y_erf, y_tanh) > 10 * FP32_ATOL, f"seed={seed}"


@pytest.mark.parametrize("op_type,names", [("BiasGelu", ("A", "B")), ("FastGelu", ("X", "bias"))])
def test_gelu_bias_must_be_1d(op_type: str, names: tuple[str, str], rng: np.random.Generator) -> None:
    """A [1,H] bias (what a naive Add-folding produces) is rejected by the kernel, not broadcast."""
    f = np.float32
    model = one_node_model(op_type, "com.microsoft", [(names[0], f, (B, S, H)), (names[1], f, (1, H))],
                           [("Y", f, (B, S, H))])
    feeds = {names[0]: rng.standard_normal((B, S, H)).astype(f), names[1]: rng.standard_normal((1, H)).astype(f)}
    with pytest.raises(Exception, match="expected to have 1 dimensions"):
        run(model, feeds)


def test_gemm_fast_gelu(rng: np.random.Generator, seed: int) -> None:
    model = gelu.make_model("GemmFastGelu", (B * S, H), n_out=4 * H)
    try:
        sess = session(model)
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        if "NOT_IMPLEMENTED" in str(e) or "Could not find an implementation" in str(e):
            pytest.skip("GemmFastGelu has no ONNX Runtime CPU kernel (NOT_IMPLEMENTED); ORT implements it only "
                        "on a GPU EP (ROCm) — emit MatMul + FastGelu(bias) for CPU/CUDA")
        raise
    x = rng.standard_normal((B * S, H)).astype(np.float32)
    w = (rng.standard_normal((H, 4 * H)) / np.sqrt(H)).astype(np.float32)
    bias = rng.standard_normal(4 * H).astype(np.float32)
    (y,) = sess.run(None, {"X": x, "W": w, "bias": bias})
    assert_close(y, gelu.gemm_fast_gelu_reference(x, w, bias), FP32_ATOL, seed, "GemmFastGelu")


def test_gemm_fast_gelu_reference_is_matmul_then_fast_gelu(rng: np.random.Generator) -> None:
    x, w, bias = rng.standard_normal((5, 8)), rng.standard_normal((8, 6)), rng.standard_normal(6)
    np.testing.assert_allclose(gelu.gemm_fast_gelu_reference(x, w, bias),
                               gelu.reference(x @ w, bias, approximate=True), rtol=1e-12)
