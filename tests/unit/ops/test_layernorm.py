"""ai.onnx LayerNormalization (opset 17): ORT CPU vs layernorm.reference_outputs."""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.ops.contrib import layernorm
from support.ops_common import FP32_ATOL, B, H, S, assert_close, assert_fp16_within_ulp, run


@pytest.mark.parametrize("epsilon", [1e-12, 1e-5])
@pytest.mark.parametrize("stash_type", [1, 0])
def test_layernorm_fp32(epsilon: float, stash_type: int, rng: np.random.Generator, seed: int) -> None:
    feeds = {"X": (2.0 * rng.standard_normal((B, S, H)) + 0.5).astype(np.float32),
             "Scale": rng.standard_normal(H).astype(np.float32),
             "B": rng.standard_normal(H).astype(np.float32)}
    model = layernorm.make_model((B, S, H), epsilon=epsilon, stash_type=stash_type, with_stats=True)
    got = run(model, feeds)
    ref = layernorm.reference_outputs(**feeds, epsilon=epsilon, stash_type=stash_type)
    for name, g, r in zip(ref._fields, got, ref):
        assert_close(g, r, FP32_ATOL, seed, f"LayerNormalization.{name}")


def test_layernorm_without_bias(rng: np.random.Generator, seed: int) -> None:
    feeds = {"X": rng.standard_normal((B, S, H)).astype(np.float32), "Scale": rng.standard_normal(H).astype(np.float32)}
    (y,) = run(layernorm.make_model((B, S, H), with_bias=False), feeds)
    assert_close(y, layernorm.reference(**feeds, epsilon=1e-12), FP32_ATOL, seed, "LayerNormalization no B")


def fp16_layernorm(rng: np.random.Generator, seed: int) -> None:
    feeds = {"X": rng.standard_normal((B, S, H)).astype(np.float16),
             "Scale": rng.standard_normal(H).astype(np.float16),
             "B": rng.standard_normal(H).astype(np.float16)}
    got = run(layernorm.make_model((B, S, H), np.float16, epsilon=1e-5, with_stats=True), feeds)
    ref = layernorm.reference_outputs(**feeds, epsilon=1e-5)
    assert_fp16_within_ulp(got[0], ref.Y, seed, "LayerNormalization fp16")
    assert got[1].dtype == np.float32 and got[2].dtype == np.float32  # U follows stash_type, not T
