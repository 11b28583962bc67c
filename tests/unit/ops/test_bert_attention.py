"""ai.bertfuse BertAttention (ops/bertfuse/bert_attention.py): the reference against the
com.microsoft Attention reference and ONNX Runtime's own Attention CPU kernel, on the QKV
projection done outside (what DenseBias gives it), for every mask form it takes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bertfuse.ops import BERTFUSE_DOMAIN
from bertfuse.ops.contrib import attention
from bertfuse.ops.bertfuse import bert_attention
from support.ops_common import ATTENTION_ATOL, B, H, N, S, attention_inputs, random_key_mask, run, \
    session


def _qkv64(f: dict[str, np.ndarray]) -> np.ndarray:
    return f["input"].astype(np.float64) @ f["weights"].astype(np.float64) + f["bias"]


def _right_padded(rng, b=B, s=S) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(1, s + 1, b).astype(np.int32)
    return lengths, (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)


def test_contract_and_one_node_model() -> None:
    c = bert_attention.CONTRACT
    assert (c.domain, c.since_version) == (BERTFUSE_DOMAIN, 1)
    assert [t.name for t in c.inputs] == ["qkv", "mask"] and c.input("mask").optional
    assert c.attribute("num_heads").required and c.attribute("scale").default is None
    for mask_shape in (None, ("B", "S"), ("B",)):
        model = bert_attention.make_model("B", "S", H, N, mask_shape=mask_shape, scale=0.5)
        onnx.checker.check_model(model, full_check=True)
        (node,) = model.graph.node
        assert len(node.input) == (1 if mask_shape is None else 2)
        with pytest.raises(Exception, match="ai.bertfuse|NOT_IMPLEMENTED|not a registered"):
            session(model)  # CUDA EP only


@pytest.mark.parametrize("form", ["raw", "keylen", "none"])
def test_equals_attention_reference_on_the_projected_qkv(rng, seed, form) -> None:
    """float64 throughout: the two references agree to rounding, so the op is exactly
    com.microsoft Attention split at its projection."""
    f = attention_inputs(rng)
    lengths, right = _right_padded(rng)
    bf_mask, ms_mask = {"raw": (random_key_mask(rng, B, S),) * 2, "keylen": (lengths, lengths),
                        "none": (None, None)}[form]
    got = bert_attention.reference(_qkv64(f), bf_mask, num_heads=N)
    want = attention.reference(f["input"].astype(np.float64), f["weights"].astype(np.float64),
                               f["bias"].astype(np.float64), ms_mask, num_heads=N)
    assert got.dtype == np.float64
    assert np.abs(got - want).max() < 1e-12, f"seed {seed}"


@pytest.mark.parametrize("scale", [None, 0.3])
def test_matches_ort_attention_kernel(rng, seed, scale) -> None:
    f = attention_inputs(rng)
    mask = random_key_mask(rng, B, S)
    mask[1] = 0  # a row that keeps no key: the -10000 cancels, softmax of the plain scores
    (want,) = run(attention.make_model(B, S, H, N, mask_shape=(B, S), scale=scale),
                  {**f, "mask_index": mask})
    got = bert_attention.reference(_qkv64(f), mask, num_heads=N, scale=scale)
    kept = [0, 2]
    assert np.abs(got[kept] - want[kept]).max() <= ATTENTION_ATOL, f"seed {seed}"
    # float32 scores + -10000 keep ~1e-3 of the scores' precision in the empty row
    assert np.abs(got[1] - want[1]).max() <= 5e-3, f"seed {seed}"
    unmasked = bert_attention.reference(_qkv64(f), None, num_heads=N, scale=scale)
    assert np.abs(got[1] - unmasked[1]).max() < 1e-9
    v = _qkv64(f)[1, :, 2 * H:]  # uniform probabilities would give the mean of V: not that
    assert np.abs(want[1] - v.mean(axis=0)).max() > 1e-2, f"seed {seed}"
    assert np.abs(got[0] - unmasked[0]).max() > 1e-3  # row 0 pads in the middle


def test_key_lengths_equal_the_raw_form_only_for_right_padding(rng, seed) -> None:
    qkv = _qkv64(attention_inputs(rng))
    lengths, right = _right_padded(rng)
    a = bert_attention.reference(qkv, lengths, num_heads=N)
    b = bert_attention.reference(qkv, right, num_heads=N)
    assert np.abs(a - b).max() < 1e-12
    hole = np.ones((B, S), np.int32)
    hole[:, 1:3] = 0
    c = bert_attention.reference(qkv, hole, num_heads=N)
    d = bert_attention.reference(qkv, hole.sum(1).astype(np.int32), num_heads=N)
    assert np.abs(c - d).max() > 1e-3, f"seed {seed}"


def test_fp16_in_fp16_out_and_qk_order_matters(rng, seed) -> None:
    qkv = _qkv64(attention_inputs(rng)).astype(np.float16)
    got = bert_attention.reference(qkv, None, num_heads=N)
    assert got.dtype == np.float16 and got.shape == (B, S, H)
    swapped = np.concatenate([qkv[..., H:2 * H], qkv[..., :H], qkv[..., 2 * H:]], axis=-1)
    other = bert_attention.reference(swapped, None, num_heads=N)
    assert np.abs(other.astype(np.float64) - got).max() > 1e-2, f"seed {seed}"


def test_mask_values_above_one_keep_like_ort(rng) -> None:
    qkv = _qkv64(attention_inputs(rng))
    mask = random_key_mask(rng, B, S)
    np.testing.assert_array_equal(bert_attention.reference(qkv, mask * 2, num_heads=N),
                                  bert_attention.reference(qkv, mask, num_heads=N))


def test_refuses_other_mask_forms(rng) -> None:
    qkv = _qkv64(attention_inputs(rng))
    m = random_key_mask(rng, B, S)
    with pytest.raises(TypeError, match="int32"):
        bert_attention.reference(qkv, m.astype(np.int64), num_heads=N)
    for bad in (np.zeros(2 * B, np.int32), np.zeros(3 * B + 2, np.int32),
                np.ones((B, S, S), np.int32)):
        with pytest.raises(ValueError, match="mask must be"):
            bert_attention.reference(qkv, bad, num_heads=N)
    with pytest.raises(ValueError, match="num_heads"):
        bert_attention.reference(qkv, None, num_heads=5)
