"""com.microsoft Attention: ORT CPU vs attention.reference, every mask form, packing order."""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.ops.contrib import attention
from support.ops_common import ATTENTION_ATOL, FP32_ATOL, B, H, N, S, assert_close, attention_inputs, \
    max_diff, random_key_mask, run


def test_attention_2d_raw_mask(rng: np.random.Generator, seed: int) -> None:
    feeds = attention_inputs(rng)
    feeds["mask_index"] = random_key_mask(rng, B, S)
    (y,) = run(attention.make_model(B, S, H, N, mask_shape=(B, S)), feeds)
    ref = attention.reference(**feeds, num_heads=N)
    assert_close(y, ref, ATTENTION_ATOL, seed, "Attention 2-D raw mask")


def test_attention_padding_in_middle_of_row(rng: np.random.Generator, seed: int) -> None:
    """[1,1,0,0,1,1,0]: only the raw 2-D form can express it; padded keys must have zero influence."""
    feeds = attention_inputs(rng)
    mask = np.ones((B, S), np.int32)
    mask[0] = [1, 1, 0, 0, 1, 1, 0]
    mask[1] = [0, 1, 1, 1, 0, 1, 1]
    feeds["mask_index"] = mask
    model = attention.make_model(B, S, H, N, mask_shape=(B, S))
    (y,) = run(model, feeds)
    assert_close(y, attention.reference(**feeds, num_heads=N), ATTENTION_ATOL, seed, "middle padding")

    # Rewrite the hidden states at padded positions: outputs at real tokens must not move.
    noisy = dict(feeds)
    noisy["input"] = feeds["input"].copy()
    noisy["input"][mask == 0] = 5.0 * rng.standard_normal((int((mask == 0).sum()), H))
    (y2,) = run(model, noisy)
    real = mask.astype(bool)
    assert max_diff(y2[real], y[real]) <= 1e-6, f"padded keys leak into real tokens (seed={seed})"
    # ... while a mask that ignores the padding does see the change (the check above has teeth).
    assert max_diff(attention.reference(**{**noisy, "mask_index": None}, num_heads=N)[real], y[real]) > 1e-3


def test_attention_1d_lengths_equal_2d_raw_for_right_padding(rng: np.random.Generator, seed: int) -> None:
    feeds = attention_inputs(rng)
    lengths = rng.integers(1, S + 1, B).astype(np.int32)
    lengths[0] = S - 2  # at least one row really padded
    raw = (np.arange(S)[None, :] < lengths[:, None]).astype(np.int32)
    (y1,) = run(attention.make_model(B, S, H, N, mask_shape=(B,)), {**feeds, "mask_index": lengths})
    (y2,) = run(attention.make_model(B, S, H, N, mask_shape=(B, S)), {**feeds, "mask_index": raw})
    assert_close(y1, y2, FP32_ATOL, seed, "1-D lengths vs 2-D raw")
    assert_close(y1, attention.reference(**feeds, mask_index=lengths, num_heads=N), ATTENTION_ATOL, seed, "1-D")


@pytest.mark.parametrize("form", ["none", "left_padding_2B", "raw_3d", "mask_value_2"])
def test_attention_other_mask_forms(form: str, rng: np.random.Generator, seed: int) -> None:
    feeds = attention_inputs(rng)
    mask: np.ndarray | None
    if form == "none":
        mask = None
    elif form == "left_padding_2B":  # exclusive ends, then inclusive starts
        starts = rng.integers(0, S - 1, B)
        mask = np.concatenate([np.full(B, S), starts]).astype(np.int32)
    elif form == "raw_3d":
        mask = rng.integers(0, 2, (B, S, S)).astype(np.int32)
        mask[:, :, 0] = 1
    else:  # ORT's rule is mask > 0, not (1 - mask) * filter
        mask = random_key_mask(rng, B, S) * 2
    model = attention.make_model(B, S, H, N, mask_shape=None if mask is None else mask.shape)
    (y,) = run(model, feeds if mask is None else {**feeds, "mask_index": mask})
    assert_close(y, attention.reference(**feeds, mask_index=mask, num_heads=N), ATTENTION_ATOL, seed, form)


@pytest.mark.parametrize("scale,mask_filter_value", [(None, -10000.0), (0.37, -10000.0), (None, -2.5)])
def test_attention_scale_and_mask_filter_value(
    scale: float | None, mask_filter_value: float, rng: np.random.Generator, seed: int
) -> None:
    feeds = attention_inputs(rng)
    feeds["mask_index"] = random_key_mask(rng, B, S)
    model = attention.make_model(B, S, H, N, mask_shape=(B, S), scale=scale, mask_filter_value=mask_filter_value)
    (y,) = run(model, feeds)
    ref = attention.reference(**feeds, num_heads=N, scale=scale, mask_filter_value=mask_filter_value)
    assert_close(y, ref, ATTENTION_ATOL, seed, f"scale={scale} mask_filter_value={mask_filter_value}")
    if mask_filter_value != -10000.0:  # the attribute is an additive value, honoured as given
        bert = attention.reference(**feeds, num_heads=N, scale=scale)
        assert max_diff(y, bert) > 1e-3


@pytest.mark.parametrize("a,b", [(0, 1), (1, 2), (0, 2)], ids=["Q<->K", "K<->V", "Q<->V"])
def test_attention_packing_swap_is_caught(a: int, b: int, rng: np.random.Generator, seed: int) -> None:
    """Packing Q/K/V in the wrong order still runs; only the reference comparison notices."""
    feeds = attention_inputs(rng)
    feeds["mask_index"] = random_key_mask(rng, B, S)
    w_blocks = np.split(feeds["weights"], 3, axis=1)
    b_blocks = np.split(feeds["bias"], 3)
    for blocks in (w_blocks, b_blocks):
        blocks[a], blocks[b] = blocks[b], blocks[a]
    swapped = {**feeds, "weights": np.concatenate(w_blocks, axis=1), "bias": np.concatenate(b_blocks)}
    (y,) = run(attention.make_model(B, S, H, N, mask_shape=(B, S)), swapped)
    assert_close(y, attention.reference(**swapped, num_heads=N), ATTENTION_ATOL, seed, "swapped vs its reference")
    assert max_diff(y, attention.reference(**feeds, num_heads=N)) > 1e-2, f"swap went unnoticed (seed={seed})"


def test_attention_pack_helpers_keep_qkv_order(rng: np.random.Generator) -> None:
    wq, wk, wv = (rng.standard_normal((H, H)) for _ in range(3))
    w = attention.pack_qkv(wq, wk, wv)
    assert w.shape == (H, 3 * H)
    np.testing.assert_array_equal(w[:, :H], wq)
    np.testing.assert_array_equal(w[:, H:2 * H], wk)
    np.testing.assert_array_equal(w[:, 2 * H:], wv)


def test_attention_rejects_int64_mask(rng: np.random.Generator) -> None:
    with pytest.raises(TypeError):
        attention.reference(**attention_inputs(rng), mask_index=np.ones((B, S), np.int64), num_heads=N)
