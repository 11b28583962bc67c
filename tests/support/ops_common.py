"""What the custom-op tests share: ORT CPU sessions on one-node models, comparisons, inputs.

Every test draws fresh random inputs. The seed comes from Python's ``random`` (which
pytest-randomly reseeds per test when installed) and is printed in every failure message;
set BERTFUSE_TEST_SEED=<n> to replay one.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

FP32_ATOL = 1e-5
ATTENTION_ATOL = 1e-4
B, S, H, N = 3, 7, 32, 4


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    # No fusions/constant folding: the node under test must be the kernel that runs.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return session(model).run(None, feeds)


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def assert_close(actual: np.ndarray, expected: np.ndarray, atol: float, seed: int, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    d = max_diff(actual, expected)
    assert d <= atol, f"{what}: max|diff| {d:.3g} > {atol:g} (replay: BERTFUSE_TEST_SEED={seed})"


def assert_fp16_within_ulp(actual: np.ndarray, expected: np.ndarray, seed: int, what: str, ulps: int = 1) -> None:
    """fp16 check: ORT's result within `ulps` fp16 ulps of the float64 reference rounded to fp16.

    Plus a 2**-18 absolute floor: near 0, float32 cancellation inside the kernel (x_hat*gamma + beta)
    is a few subnormal fp16 ulps.
    """
    assert actual.dtype == np.float16 and expected.dtype == np.float16, what
    tol = ulps * np.spacing(np.abs(expected)).astype(np.float64) + 2.0**-18
    excess = np.abs(actual.astype(np.float64) - expected.astype(np.float64)) - tol
    assert excess.max() <= 0, (
        f"{what}: {int((excess > 0).sum())} values off by > {ulps} fp16 ulp "
        f"(max|diff| {max_diff(actual, expected):.3g}; replay: BERTFUSE_TEST_SEED={seed})"
    )


def random_key_mask(rng: np.random.Generator, b: int, s: int) -> np.ndarray:
    """0/1 int32 [B,S] with padding anywhere; row 0 pads in the middle; every row attends somewhere."""
    m = (rng.random((b, s)) < 0.7).astype(np.int32)
    m[np.arange(b), rng.integers(0, s, b)] = 1
    m[0] = 1
    m[0, s // 3: s // 3 + 2] = 0  # padding in the middle of a row
    return m


def ort_cpu_float_types(op_type: str, domain: str, opset: int) -> set[str]:
    """Float types of the native CPU kernels ORT registers for (domain, op_type) at opset."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    if not hasattr(C, "get_all_opkernel_def"):
        pytest.skip("this onnxruntime build does not expose its kernel registry")
    names = {"tensor(float)": "float32", "tensor(float16)": "float16",
             "tensor(double)": "float64", "tensor(bfloat16)": "bfloat16"}
    found: set[str] = set()
    for k in C.get_all_opkernel_def():
        lo, hi = k.version_range
        if (k.op_name, k.domain or "", k.provider) == (op_type, domain, "CPUExecutionProvider") and lo <= opset <= hi:
            found |= {names[t] for t in k.type_constraints.get("T", []) if t in names}
    return found


def attention_inputs(rng: np.random.Generator, b: int = B, s: int = S, h: int = H) -> dict[str, np.ndarray]:
    # 2/sqrt(H) weight scale gives O(1..3) logits: peaky softmax, so mask/packing errors show.
    return {
        "input": rng.standard_normal((b, s, h)).astype(np.float32),
        "weights": (rng.standard_normal((h, 3 * h)) * (2.0 / np.sqrt(h))).astype(np.float32),
        "bias": (0.1 * rng.standard_normal(3 * h)).astype(np.float32),
    }
