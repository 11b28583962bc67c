"""com.microsoft SkipLayerNormalization: ORT CPU vs skip_layernorm.reference_outputs."""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.ops.contrib import skip_layernorm
from support.ops_common import FP32_ATOL, B, H, S, assert_close, assert_fp16_within_ulp, run


@pytest.mark.parametrize("skip_shape", [(B, S, H), (1, S, H), (S, H)], ids=["BSH", "1SH", "SH"])
@pytest.mark.parametrize("with_beta,with_bias", [(True, True), (True, False), (False, True)])
def test_skip_layernorm_fp32(
    skip_shape: tuple[int, ...], with_beta: bool, with_bias: bool, rng: np.random.Generator, seed: int
) -> None:
    feeds = {
        "input": rng.standard_normal((B, S, H)).astype(np.float32),
        "skip": rng.standard_normal(skip_shape).astype(np.float32),
        "gamma": (1.0 + 0.5 * rng.standard_normal(H)).astype(np.float32),
    }
    if with_beta:
        feeds["beta"] = rng.standard_normal(H).astype(np.float32)
    if with_bias:
        feeds["bias"] = rng.standard_normal(H).astype(np.float32)
    model = skip_layernorm.make_model(
        (B, S, H), skip_shape=skip_shape, with_beta=with_beta, with_bias=with_bias, all_outputs=True
    )
    got = run(model, feeds)
    ref = skip_layernorm.reference_outputs(**feeds)
    for name, g, r in zip(ref._fields, got, ref):
        assert_close(g, r, FP32_ATOL, seed, f"SkipLayerNormalization.{name}")
    assert got[1].shape == (B, S, 1) and got[1].dtype == np.float32


def test_skip_layernorm_main_output_only(rng: np.random.Generator, seed: int) -> None:
    feeds = {k: rng.standard_normal(s).astype(np.float32)
             for k, s in (("input", (B, S, H)), ("skip", (B, S, H)), ("gamma", (H,)), ("beta", (H,)), ("bias", (H,)))}
    (y,) = run(skip_layernorm.make_model((B, S, H)), feeds)
    assert_close(y, skip_layernorm.reference(**feeds), FP32_ATOL, seed, "SkipLayerNormalization")


def fp16_skip_layernorm(rng: np.random.Generator, seed: int) -> None:
    feeds = {k: rng.standard_normal(s).astype(np.float16)
             for k, s in (("input", (B, S, H)), ("skip", (B, S, H)), ("gamma", (H,)), ("beta", (H,)), ("bias", (H,)))}
    got = run(skip_layernorm.make_model((B, S, H), np.float16, epsilon=1e-5, all_outputs=True), feeds)
    ref = skip_layernorm.reference_outputs(**feeds, epsilon=1e-5)
    assert_fp16_within_ulp(got[0], ref.output, seed, "SkipLayerNormalization fp16 output")
    assert_fp16_within_ulp(got[3], ref.input_skip_bias_sum, seed, "SkipLayerNormalization fp16 sum")
    for i, name in ((1, "mean"), (2, "inv_std_var")):
        assert got[i].dtype == np.float32, f"{name} is type U=float32 even for fp16 T"
        assert_close(got[i], ref[i], 1e-4, seed, f"SkipLayerNormalization fp16 {name}")
