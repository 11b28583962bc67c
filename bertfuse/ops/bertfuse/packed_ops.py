"""ai.bertfuse PackTokens, PackedBertAttention, UnpackTokens: the packed (variable-length) path on
bertfuse's own kernels, with packing done on the device — contracts, float64/NumPy references,
one-node models.

    input_mask [B,S] ─► PackTokens(token_bucket [T]) ─► token_index [T], token_slot [B,S],
                                                        cu [B+1]
    [B*S,H] embeddings ─► Gather(token_index) ─► [T,H] ─► DenseBias ─► qkv [T,3H]
        ─► PackedBertAttention(token_slot, cu) ─► [T,H] ...
        ─► UnpackTokens(token_slot) ─► [B,S,H]

The host copies the padded request and picks a token bucket T (>= the kept tokens); the prefix
sum that orders the kept tokens runs on the device, in one kernel. Filler: packed rows cu[B]..T-1
belong to no sequence; they gather token 0, PackedBertAttention writes zeros there, and no
padded position points at them. So every row any kernel touches is finite and written, and one
CUDA graph per (B, S, T) replays any request of that bucket.
"""

from __future__ import annotations

import numpy as np
import onnx

from bertfuse.ops.bertfuse.bert_attention import reference as _padded_attention
from bertfuse.ops.contract import BERTFUSE_DOMAIN, AttrSpec, OpContract, TensorSpec, one_node_model

MAX_SEQ = 128  # PackedBertAttention: longest sequence (S, token_slot's second dim)
HEAD_SIZE = 64

PACK_TOKENS = OpContract(
    op_type="PackTokens",
    domain=BERTFUSE_DOMAIN,
    since_version=1,
    summary="The packed layout of a padded [B,S] mask: kept tokens row by row, on the device.",
    inputs=(
        TensorSpec("mask", ("B", "S"), ("int32",),
                   doc="padded request mask: a position is kept iff != 0"),
        TensorSpec("token_bucket", ("T",), ("int32",),
                   doc="only its length is read: the packed token count T (the bucket)"),
    ),
    outputs=(
        TensorSpec("token_index", ("T",), ("int32",),
                   doc="flat position b*S+s of packed row i (row by row); 0 for filler rows "
                       "i >= cu[B]"),
        TensorSpec("token_slot", ("B", "S"), ("int32",),
                   doc="packed row of position (b,s); -1 where not kept"),
        TensorSpec("cumulative_sequence_length", ("B+1",), ("int32",),
                   doc="sequence b is packed rows cu[b]..cu[b+1]-1; cu[B] = kept tokens "
                       "(at most T)"),
    ),
    pitfalls=(
        "T comes from token_bucket's shape, never from device values: ORT needs output shapes on "
        "the host, and reading the mask's count would need a synchronisation (no CUDA graph).",
        "A mask keeping more than T tokens is cut at T in row order: the cut tokens get slot -1 "
        "(unpacked as zeros) and cu is clamped to T. The runtime picks T >= kept tokens.",
        "Kept means != 0 (the packed layout's rule), where BertAttention's raw mask keeps > 0.",
    ),
)

PACKED_BERT_ATTENTION = OpContract(
    op_type="PackedBertAttention",
    domain=BERTFUSE_DOMAIN,
    since_version=1,
    summary="softmax(Q K^T * scale) V per head within each packed sequence, from one [T,3H] qkv.",
    inputs=(
        TensorSpec("qkv", ("T", "3H"), ("float16",),
                   doc="packed rows; columns as BertAttention's qkv; bias already added"),
        TensorSpec("token_slot", ("R", "S"), ("int32",),
                   doc="only its shape is read: R sequences, none longer than S (<= 128); "
                       "PackTokens' token_slot or the packed layout's token_offset"),
        TensorSpec("cumulative_sequence_length", ("R+1",), ("int32",),
                   doc="sequence r is rows cu[r]..cu[r+1]-1 (non-decreasing, within [0, T])"),
    ),
    outputs=(TensorSpec("context", ("T", "H"), ("float16",),
                        doc="packed like qkv; rows outside every sequence (filler) are zeros"),),
    attributes=(
        AttrSpec("num_heads", "int", None, "number of heads N; head size D = H / N = 64",
                 required=True),
        AttrSpec("scale", "float", None, "multiplies Q K^T; unset or 0 means 1/sqrt(D)"),
    ),
    pitfalls=(
        "No mask: a token attends to every token of its own sequence and nothing else; empty "
        "sequences are allowed (the padded request's rows past its batch).",
        "Equals BertAttention on the padded layout with key lengths at every kept query, "
        "exactly in fp32 softmax terms: -10000 masked keys give exp() == 0 there too.",
        "Device values are clamped for memory safety only: a sequence longer than S has just its "
        "first S rows attended, the rest zeroed. PackTokens never produces one.",
    ),
)

UNPACK_TOKENS = OpContract(
    op_type="UnpackTokens",
    domain=BERTFUSE_DOMAIN,
    since_version=1,
    summary="Gathers packed rows back to [B,S,H]; zeros where token_slot is -1 (padding).",
    inputs=(
        TensorSpec("packed", ("T", "H"), ("float16",), doc="packed hidden states"),
        TensorSpec("token_slot", ("B", "S"), ("int32",), doc="as PackTokens: packed row or -1"),
    ),
    outputs=(TensorSpec("output", ("B", "S", "H"), ("float16",),
                        doc="zeros where the slot is outside [0, T)"),),
    pitfalls=("Padded positions come back as zeros, not as the padded model's values there "
              "(as com.microsoft RestorePadding).",),
)

CONTRACTS: dict[str, OpContract] = {
    c.op_type: c for c in (PACK_TOKENS, PACKED_BERT_ATTENTION, UNPACK_TOKENS)}


def pack_tokens(mask: np.ndarray, tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token_index [T], token_slot [B,S], cumulative_sequence_length [B+1]) of `mask`."""
    m = np.asarray(mask)
    if m.ndim != 2 or m.dtype != np.int32:
        raise ValueError(f"mask must be int32 [B, S], got {m.dtype} {list(m.shape)}")
    if tokens < 1:
        raise ValueError(f"token count must be >= 1, got {tokens}")
    keep = (m != 0).reshape(-1)
    rank = np.cumsum(keep) - keep  # kept tokens before each position
    kept = keep & (rank < tokens)
    slot = np.where(kept, rank, -1).astype(np.int32).reshape(m.shape)
    index = np.zeros(tokens, np.int32)
    positions = np.flatnonzero(kept)
    index[:positions.size] = positions
    cu = np.zeros(m.shape[0] + 1, np.int32)
    cu[1:] = np.minimum(np.cumsum(keep.reshape(m.shape).sum(axis=1)), tokens)
    return index, slot, cu


def _bounds(cu: np.ndarray, tokens: int) -> list[tuple[int, int]]:
    c = np.asarray(cu, np.int64)
    if c.ndim != 1 or c.size < 2 or np.any(np.diff(c) < 0) or c[0] < 0 or c[-1] > tokens:
        raise ValueError(f"cumulative_sequence_length must be non-decreasing within "
                         f"[0, {tokens}], got {c.tolist()}")
    return list(zip(c[:-1].tolist(), c[1:].tolist()))


def packed_bert_attention(qkv: np.ndarray, token_slot: np.ndarray,
                          cumulative_sequence_length: np.ndarray, *, num_heads: int,
                          scale: float | None = None) -> np.ndarray:
    """Attention within each sequence (float64 inside); rows outside every sequence are zeros."""
    t, h3 = qkv.shape
    seq = np.asarray(token_slot).shape[1]
    out = np.zeros((t, h3 // 3), qkv.dtype)
    for start, end in _bounds(cumulative_sequence_length, t):
        if end - start > seq:
            raise ValueError(f"sequence rows {start}..{end - 1} are longer than S = {seq}")
        if end > start:
            out[start:end] = _padded_attention(qkv[None, start:end], num_heads=num_heads,
                                               scale=scale)[0]
    return out


def unpack_tokens(packed: np.ndarray, token_slot: np.ndarray) -> np.ndarray:
    slot = np.asarray(token_slot)
    valid = (slot >= 0) & (slot < packed.shape[0])
    out = np.zeros(slot.shape + packed.shape[1:], packed.dtype)
    out[valid] = packed[slot[valid]]
    return out


def make_model(op_type: str, *, batch: int | str = "B", seq: int | str = "S",
               tokens: int | str = "T", hidden: int = 768, num_heads: int = 12,
               scale: float | None = None) -> onnx.ModelProto:
    """One PackTokens, PackedBertAttention or UnpackTokens node with symbolic or fixed dims."""
    i32, f16 = np.int32, np.float16
    if op_type == "PackTokens":
        return one_node_model(op_type, BERTFUSE_DOMAIN,
                              [("mask", i32, (batch, seq)), ("token_bucket", i32, (tokens,))],
                              [("token_index", i32, (tokens,)), ("token_slot", i32, (batch, seq)),
                               ("cumulative_sequence_length", i32, (_plus1(batch),))])
    slot = ("token_slot", i32, (batch, seq))
    if op_type == "PackedBertAttention":
        return one_node_model(op_type, BERTFUSE_DOMAIN,
                              [("qkv", f16, (tokens, 3 * hidden)), slot,
                               ("cumulative_sequence_length", i32, (_plus1(batch),))],
                              [("context", f16, (tokens, hidden))],
                              {"num_heads": num_heads,
                               "scale": None if scale is None else float(scale)})
    if op_type == "UnpackTokens":
        return one_node_model(op_type, BERTFUSE_DOMAIN, [("packed", f16, (tokens, hidden)), slot],
                              [("output", f16, (batch, seq, hidden))])
    raise ValueError(f"no packed op {op_type!r} (one of {', '.join(CONTRACTS)})")


def _plus1(dim: int | str) -> int | str:
    return dim + 1 if isinstance(dim, int) else f"{dim}+1"
