"""com.microsoft EmbedLayerNormalization: ORT CPU vs embed_layernorm.reference, mask_index per EP."""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.ops.contrib import embed_layernorm
from bertfuse.ops.contract import one_node_model
from support.ops_common import FP32_ATOL, B, H, S, assert_close, random_key_mask, run, session

VOCAB, MAXPOS, TYPES = 50, 16, 2


def embed_inputs(rng: np.random.Generator, with_segments: bool = True) -> dict[str, np.ndarray | None]:
    return {
        "input_ids": rng.integers(0, VOCAB, (B, S)).astype(np.int32),
        "segment_ids": rng.integers(0, TYPES, (B, S)).astype(np.int32) if with_segments else None,
        "word_embedding": rng.standard_normal((VOCAB, H)).astype(np.float32),
        "position_embedding": rng.standard_normal((MAXPOS, H)).astype(np.float32),
        "segment_embedding": rng.standard_normal((TYPES, H)).astype(np.float32) if with_segments else None,
        "gamma": (1.0 + 0.5 * rng.standard_normal(H)).astype(np.float32),
        "beta": rng.standard_normal(H).astype(np.float32),
    }


def present(feeds: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {k: v for k, v in feeds.items() if v is not None}


def test_embed_layernorm_all_outputs(rng: np.random.Generator, seed: int) -> None:
    feeds = embed_inputs(rng)
    feeds["mask"] = random_key_mask(rng, B, S)  # row 0 has padding in the middle
    model = embed_layernorm.make_model(B, S, H, VOCAB, MAXPOS, TYPES, with_embedding_sum=True)
    y, mask_index, emb_sum = run(model, present(feeds))
    ref = embed_layernorm.reference_outputs(**feeds)
    assert_close(y, ref.output, FP32_ATOL, seed, "EmbedLayerNormalization.output")
    assert_close(emb_sum, ref.embedding_sum, FP32_ATOL, seed, "EmbedLayerNormalization.embedding_sum")
    assert mask_index.dtype == np.int32 and mask_index.shape == (B,)
    np.testing.assert_array_equal(mask_index, ref.mask_index, err_msg=f"seed={seed}")


def test_embed_layernorm_mask_index_semantics() -> None:
    """CPU counts ones; CUDA finds the first zero. Same only for right-padded 0/1 rows."""
    mask = np.array([[1, 1, 1, 0, 0, 0, 0],   # right padded
                     [1, 0, 1, 1, 0, 1, 1],   # padding in the middle
                     [2, 1, 1, 0, 0, 0, 0],   # non-0/1 value
                     [1, 1, 1, 1, 1, 1, 1]], np.int32)
    b = mask.shape[0]
    ids = np.zeros((b, S), np.int32)
    model = embed_layernorm.make_model(b, S, H, VOCAB, MAXPOS, None, with_mask=True)
    ones = np.ones(H, np.float32)
    word = np.tile(np.arange(H, dtype=np.float32), (VOCAB, 1))  # non-constant rows: LN stays well defined
    feeds = {"input_ids": ids, "word_embedding": word, "position_embedding": np.ones((MAXPOS, H), np.float32),
             "gamma": ones, "beta": ones, "mask": mask}
    _, mask_index = run(model, feeds)
    np.testing.assert_array_equal(mask_index, [3, 5, 2, 7])
    np.testing.assert_array_equal(embed_layernorm.mask_index_from_mask(mask, b, S, "cpu"), [3, 5, 2, 7])
    np.testing.assert_array_equal(embed_layernorm.mask_index_from_mask(mask, b, S, "cuda"), [3, 1, 3, 7])


def test_embed_layernorm_no_segments_no_mask(rng: np.random.Generator, seed: int) -> None:
    feeds = embed_inputs(rng, with_segments=False)
    model = embed_layernorm.make_model(B, S, H, VOCAB, MAXPOS, None, with_mask=False)
    y, mask_index = run(model, present(feeds))
    assert_close(y, embed_layernorm.reference(**feeds), FP32_ATOL, seed, "EmbedLayerNormalization (DistilBERT)")
    np.testing.assert_array_equal(mask_index, np.zeros(B, np.int32))  # zeros, not S


@pytest.mark.parametrize("pos_rows", [1, B], ids=["1xS", "BxS"])
def test_embed_layernorm_position_ids(pos_rows: int, rng: np.random.Generator, seed: int) -> None:
    feeds = embed_inputs(rng)
    feeds["position_ids"] = rng.integers(0, MAXPOS, (pos_rows, S)).astype(np.int32)
    model = embed_layernorm.make_model(
        B, S, H, VOCAB, MAXPOS, TYPES, with_mask=False, position_ids_shape=(pos_rows, S), with_mask_index=False
    )
    (y,) = run(model, present(feeds))
    assert_close(y, embed_layernorm.reference(**feeds), FP32_ATOL, seed, f"position_ids {pos_rows}xS")


def test_embed_layernorm_single_output_needs_mask_index_type_0() -> None:
    f = np.float32
    ins = [("input_ids", np.int32, (B, S)), None, ("word_embedding", f, (VOCAB, H)),
           ("position_embedding", f, (MAXPOS, H)), None, ("gamma", f, (H,)), ("beta", f, (H,))]
    outs = [("output", f, (B, S, H))]
    with pytest.raises(Exception, match="out of range"):
        session(one_node_model("EmbedLayerNormalization", "com.microsoft", ins, outs, {"epsilon": 1e-12}))
    session(one_node_model("EmbedLayerNormalization", "com.microsoft", ins, outs, {"mask_index_type": 0}))


def test_embed_layernorm_ids_must_be_int32(rng: np.random.Generator) -> None:
    f = np.float32
    ins = [("input_ids", np.int64, (B, S)), None, ("word_embedding", f, (VOCAB, H)),
           ("position_embedding", f, (MAXPOS, H)), None, ("gamma", f, (H,)), ("beta", f, (H,))]
    with pytest.raises(Exception, match="int64"):
        session(one_node_model("EmbedLayerNormalization", "com.microsoft", ins, [("output", f, (B, S, H))],
                               {"mask_index_type": 0}))
    feeds = embed_inputs(rng)
    feeds["input_ids"] = feeds["input_ids"].astype(np.int64)
    with pytest.raises(TypeError):
        embed_layernorm.reference(**feeds)
