"""ai.bertfuse BertAttention: BERT self-attention on a packed QKV tensor — contract, NumPy
reference, one-node model.

    X ─► DenseBias(W_qkv, b_qkv) ─► qkv [B,S,3H] ─► BertAttention(mask) ─► context [B,S,H]

is ONNX Runtime's com.microsoft Attention(X, W_qkv, b_qkv, mask) split at the projection:
the QKV bias is added by DenseBias's epilogue, so BertAttention adds none. The mask comes in
the two forms bertfuse's graphs and runtime use: raw [B, S] (padding anywhere) and key
lengths [B] (right padding), with ORT's additive -10000.0 for masked keys.
"""

from __future__ import annotations

import numpy as np
import onnx

from bertfuse.ops.contract import (BERTFUSE_DOMAIN, FP8_IR_VERSION, AttrSpec, OpContract, TensorSpec,
                                   one_node_model)

MASK_FILTER_VALUE = -10000.0  # fixed: ORT Attention's default and TF BERT's adder
# The largest head size the CUDA op runs (its general path), and the head sizes its tensor-core
# kernels cover (attention.cu: 64 up to S 128; attention_tiled.cu: 32, 64, 128 up to S 1024).
MAX_HEAD_SIZE = 256
TENSOR_CORE_HEAD_SIZES = (32, 64, 128)

CONTRACT = OpContract(
    op_type="BertAttention",
    domain=BERTFUSE_DOMAIN,
    since_version=1,
    summary="softmax(Q K^T * scale + mask) V per head, from one packed [B,S,3H] QKV tensor.",
    inputs=(
        TensorSpec("qkv", ("B", "S", "3H"), ("float16",),
                   doc="columns [0,H) Q, [H,2H) K, [2H,3H) V; head n = cols n*D..n*D+D-1 of each; "
                       "bias already added"),
        TensorSpec("mask", ("B", "S"), ("int32",), optional=True,
                   doc="raw [B,S] (>0 keeps key j, padding anywhere) or key lengths [B] "
                       "(keeps j < len[b]); absent: no mask"),
    ),
    outputs=(TensorSpec("context", ("B", "S", "H"), ("float16",), optional=True,
                        doc="heads merged: [B,S,N*D]; may be left off where Yq is asked for (an "
                            "FP8 model reads only Yq)"),
             TensorSpec("Yq", ("B", "S", "H"), ("float8e4m3fn",), optional=True,
                        doc="e4m3_satfinite(context * (1 / yq_scale)), for the FP8 attention-out "
                            "GEMM; needs yq_scale")),
    attributes=(
        AttrSpec("num_heads", "int", None, "number of heads N; head size D = H / N", required=True),
        AttrSpec("scale", "float", None, "multiplies Q K^T; unset or 0 means 1/sqrt(D)"),
        AttrSpec("yq_scale", "float", None,
                 "the scale of output Yq (finite, > 0; required when Yq is requested)"),
    ),
    pitfalls=(
        "Q, K, V order along the columns (as com.microsoft Attention's packed weights): a Q/K swap "
        "gives plausible numbers, only a numeric check catches it.",
        "The mask's form is read from its rank: rank 2 is the raw [B,S] mask, rank 1 key lengths "
        "[B]. ORT Attention's other 1-D forms ([2B] left padding, [3B+2] key/sequence starts) are "
        "not taken.",
        "Masked keys get -10000.0 added (not -inf): a row whose mask keeps no key softmaxes "
        "over the unmasked scores, as TF BERT and ORT's Attention do.",
        "The mask is int32; raw values > 0 keep a key (a 2 keeps like a 1, as in ORT).",
    ),
)

CONTRACTS: dict[str, OpContract] = {CONTRACT.op_type: CONTRACT}


def key_mask(mask: np.ndarray | None, batch: int, seq: int) -> np.ndarray:
    """bool [B, S(keys)]: whether key j is attended in row b, for each mask form."""
    if mask is None:
        return np.ones((batch, seq), bool)
    m = np.asarray(mask)
    if m.dtype != np.int32:
        raise TypeError(f"mask must be int32, got {m.dtype}")
    if m.shape == (batch, seq):
        return m > 0
    if m.shape == (batch,):
        return np.arange(seq)[None, :] < m[:, None]
    raise ValueError(f"mask must be [B, S] = [{batch}, {seq}] or [B] = [{batch}], got {list(m.shape)}")


def reference(qkv: np.ndarray, mask: np.ndarray | None = None, *, num_heads: int,
              scale: float | None = None) -> np.ndarray:
    b, s, h3 = qkv.shape
    if h3 % 3 or (h3 // 3) % num_heads:
        raise ValueError(f"qkv width {h3} is not 3 * num_heads({num_heads}) * D")
    h = h3 // 3
    d = h // num_heads
    scale = 1.0 / np.sqrt(d) if not scale else float(scale)
    t = np.asarray(qkv, np.float64).reshape(b, s, 3, num_heads, d)
    q, k, v = t[:, :, 0], t[:, :, 1], t[:, :, 2]  # [B, S, N, D]
    scores = np.einsum("bind,bjnd->bnij", q, k) * scale
    scores += np.where(key_mask(mask, b, s), 0.0, MASK_FILTER_VALUE)[:, None, None, :]
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.einsum("bnij,bjnd->bind", probs, v).reshape(b, s, h).astype(qkv.dtype)


def make_model(batch: int | str, seq: int | str, hidden: int, num_heads: int,
               dtype: type | np.dtype = np.float16, *,
               mask_shape: tuple[int | str, ...] | None = None,
               scale: float | None = None, context: bool = True,
               yq_scale: float | None = None) -> onnx.ModelProto:
    """One BertAttention node; mask_shape None omits the mask, else (B, S) or (B,). yq_scale
    adds the output Yq; context=False leaves the context off (Yq alone)."""
    if not context and yq_scale is None:
        raise ValueError("context=False needs yq_scale: the node must write some output")
    shape = (batch, seq, hidden)
    model = one_node_model(
        "BertAttention",
        BERTFUSE_DOMAIN,
        [("qkv", dtype, (batch, seq, 3 * hidden)),
         ("mask", np.int32, mask_shape) if mask_shape is not None else None],
        [("context", dtype, shape) if context else None,
         ("Yq", onnx.TensorProto.FLOAT8E4M3FN, shape) if yq_scale is not None else None],
        {"num_heads": num_heads, "scale": None if scale is None else float(scale),
         "yq_scale": None if yq_scale is None else float(yq_scale)},
    )
    if yq_scale is not None:
        model.ir_version = max(model.ir_version, FP8_IR_VERSION)
    return model
