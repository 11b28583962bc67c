"""com.microsoft Attention (BERT self-attention, packed QKV): contract, NumPy reference, one-node model.

The reference is Google BERT's attention_layer written out: per head
softmax(Q K^T * scale + (1 - mask) * mask_filter_value) V, with ORT's mask rule (mask > 0 attends).
"""

from __future__ import annotations

import numpy as np
import onnx

from bertfuse.ops.contract import MS_DOMAIN, AttrSpec, OpContract, TensorSpec, one_node_model

_T = ("float32", "float16", "bfloat16")
BERT_MASK_FILTER_VALUE = -10000.0  # TF BERT: adder = (1.0 - mask) * -10000.0

CONTRACT = OpContract(
    op_type="Attention",
    domain=MS_DOMAIN,
    since_version=1,
    summary="Multi-head self-attention with the Q/K/V projections packed into one weight matrix.",
    inputs=(
        TensorSpec("input", ("B", "S", "H"), _T, doc="hidden states"),
        TensorSpec("weights", ("H", "3H"), _T,
                   doc="[Wq | Wk | Wv] along columns; each block head-major (head n = cols n*D..n*D+D-1)"),
        TensorSpec("bias", ("3H",), _T, optional=True, doc="[bq | bk | bv], same order"),
        TensorSpec("mask_index", ("B", "S"), ("int32",), optional=True,
                   doc="raw key mask [B,S]: >0 attends, 0 pads, any position. Also [B], [2B], [B,S,S] forms"),
        TensorSpec("past", ("2", "B", "N", "P", "D"), _T, optional=True, doc="KV cache; bertfuse never sets it"),
        TensorSpec("attention_bias", ("B|1", "N|1", "S", "S"), _T, optional=True,
                   doc="added to Q K^T; bertfuse never sets it"),
        TensorSpec("past_sequence_length", ("1",), ("int32",), optional=True,
                   doc="only with past_present_share_buffer"),
    ),
    outputs=(
        TensorSpec("output", ("B", "S", "H"), _T, doc="heads merged back: [B,S,N*D]"),
        TensorSpec("present", ("2", "B", "N", "S*", "D"), _T, optional=True, doc="KV cache out; unused by BERT"),
    ),
    attributes=(
        AttrSpec("num_heads", "int", None, "number of heads N; head size D = H / N", required=True),
        AttrSpec("mask_filter_value", "float", -10000.0,
                 "additive value for masked keys (raw and 1-D masks alike); -10000.0 reproduces BERT"),
        AttrSpec("scale", "float", None, "multiplies Q K^T; unset means 1/sqrt(D)"),
        AttrSpec("unidirectional", "int", 0, "1 = causal (GPT-2); BERT needs 0"),
        AttrSpec("qkv_hidden_sizes", "ints", None, "only when V's width differs; bertfuse never sets it"),
        AttrSpec("past_present_share_buffer", "int", 0, "KV-cache decoding; not used"),
        AttrSpec("do_rotary", "int", 0, "rotary embeddings; not used"),
        AttrSpec("rotary_embedding_dim", "int", None, "rotary embeddings; not used"),
    ),
    cpu_kernel_types=("float32",),
    pitfalls=(
        "Packing order is Q, K, V along the columns of weights (and bias). A Q/K swap still produces a "
        "plausible-looking tensor: only a numeric check catches it.",
        "mask_index is int32 only; an int64 mask (common in exported TF/HF graphs) is a type error: Cast it.",
        "A 2-D raw mask [B,S] is a key-padding mask: value > 0 attends, <= 0 gets mask_filter_value added. "
        "Padding may be anywhere in the row.",
        "A 1-D [B] mask holds key lengths and assumes right padding: key j is masked iff j >= len[b]. "
        "It cannot express padding in the middle/left of a row (use [2B] for left padding or the 2-D raw form).",
        "mask_filter_value is additive, not -inf: a fully padded row still softmaxes over all keys "
        "(in float32 the -10000 offset costs ~1e-3 absolute precision there).",
        "TF Dense kernels are [in, out] like ONNX MatMul; PyTorch Linear weights must be transposed first.",
    ),
)


def pack_qkv(wq: np.ndarray, wk: np.ndarray, wv: np.ndarray) -> np.ndarray:
    """[H,H] x3 Dense kernels ([in,out]) -> the [H,3H] 'weights' input, in Q,K,V order."""
    return np.concatenate([wq, wk, wv], axis=1)


def pack_qkv_bias(bq: np.ndarray, bk: np.ndarray, bv: np.ndarray) -> np.ndarray:
    return np.concatenate([bq, bk, bv], axis=0)


def additive_mask(
    mask_index: np.ndarray | None,
    batch: int,
    seq: int,
    mask_filter_value: float = BERT_MASK_FILTER_VALUE,
) -> np.ndarray:
    """float64 [B, S(query), S(key)] term added to the scores, for every mask_index form ORT CPU takes."""
    attend = np.ones((batch, seq, seq), dtype=bool)
    if mask_index is not None:
        m = np.asarray(mask_index)
        if m.dtype != np.int32:
            raise TypeError(f"mask_index must be int32, got {m.dtype}")
        keys = np.arange(seq)
        if m.shape == (batch,):  # key lengths, right padding
            attend &= (keys[None, :] < m[:, None])[:, None, :]
        elif m.shape == (2 * batch,):  # exclusive end positions, then inclusive start positions
            end, start = m[:batch], m[batch:]
            attend &= ((keys[None, :] < end[:, None]) & (keys[None, :] >= start[:, None]))[:, None, :]
        elif m.shape == (batch, seq):  # raw key-padding mask
            attend &= (m > 0)[:, None, :]
        elif m.shape == (batch, seq, seq):  # raw per-query mask
            attend &= m > 0
        else:
            raise ValueError(f"unsupported mask_index shape {m.shape} for batch={batch}, seq={seq}")
    return np.where(attend, 0.0, float(mask_filter_value))


def reference(
    input: np.ndarray,
    weights: np.ndarray,
    bias: np.ndarray | None = None,
    mask_index: np.ndarray | None = None,
    *,
    num_heads: int,
    mask_filter_value: float = BERT_MASK_FILTER_VALUE,
    scale: float | None = None,
) -> np.ndarray:
    b, s, h_in = input.shape
    if weights.shape[0] != h_in or weights.shape[1] % 3:
        raise ValueError(f"weights must be [{h_in}, 3H], got {weights.shape}")
    h = weights.shape[1] // 3
    if h % num_heads:
        raise ValueError(f"hidden size {h} is not a multiple of num_heads={num_heads}")
    d = h // num_heads
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)

    qkv = np.asarray(input, np.float64) @ np.asarray(weights, np.float64)
    if bias is not None:
        qkv = qkv + np.asarray(bias, np.float64)
    q, k, v = (qkv[..., i * h:(i + 1) * h].reshape(b, s, num_heads, d).transpose(0, 2, 1, 3) for i in range(3))

    scores = (q @ k.transpose(0, 1, 3, 2)) * scale + additive_mask(mask_index, b, s, mask_filter_value)[:, None]
    scores -= scores.max(axis=-1, keepdims=True)  # stable softmax
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h)  # merge heads back in head-major order
    return out.astype(input.dtype)


def make_model(
    batch: int | str,
    seq: int | str,
    hidden: int,
    num_heads: int,
    dtype: type | np.dtype = np.float32,
    *,
    mask_shape: tuple[int | str, ...] | None = None,
    mask_filter_value: float = BERT_MASK_FILTER_VALUE,
    scale: float | None = None,
    with_bias: bool = True,
) -> onnx.ModelProto:
    """One Attention node; mask_shape=None omits mask_index, else e.g. (B, S) or (B,)."""
    return one_node_model(
        "Attention",
        MS_DOMAIN,
        [
            ("input", dtype, (batch, seq, hidden)),
            ("weights", dtype, (hidden, 3 * hidden)),
            ("bias", dtype, (3 * hidden,)) if with_bias else None,
            ("mask_index", np.int32, mask_shape) if mask_shape is not None else None,
        ],
        [("output", dtype, (batch, seq, hidden))],
        {
            "num_heads": num_heads,
            "mask_filter_value": float(mask_filter_value),
            "scale": None if scale is None else float(scale),
            "unidirectional": 0,
        },
    )
