"""com.microsoft PackedAttention and RestorePadding (the `--packed` form): contracts, NumPy
references.

Both have CUDA kernels only: ORT's CPU EP cannot run them, so the references are what CI
checks bertfuse's packing arithmetic against (tests/unit/passes/test_packing.py), and the GPU benchmark
checks ORT's kernels against the padded model.
"""

from __future__ import annotations

import numpy as np

from bertfuse.ops.contrib import attention
from bertfuse.ops.contract import MS_DOMAIN, AttrSpec, OpContract, TensorSpec

_T = ("float32", "float16")

CONTRACT = OpContract(
    op_type="PackedAttention",
    domain=MS_DOMAIN,
    since_version=1,
    summary="Self-attention over packed tokens: each sequence is a run of rows of `input`.",
    inputs=(
        TensorSpec("input", ("T", "H"), _T, doc="the real tokens of every row, row after row"),
        TensorSpec("weights", ("H", "3H"), _T, doc="[Wq | Wk | Wv], as Attention"),
        TensorSpec("bias", ("3H",), _T, doc="[bq | bk | bv]; required here"),
        TensorSpec("token_offset", ("B", "S"), ("int32",),
                   doc="flat position (b*S+s) of packed token i at entry i < T, then the padded positions"),
        TensorSpec("cumulative_sequence_length", ("B+1",), ("int32",),
                   doc="sequence b is rows cum[b]..cum[b+1]-1 of input; cum[B] = T"),
        TensorSpec("attention_bias", ("B", "N", "S", "S"), _T, optional=True, doc="bertfuse never sets it"),
    ),
    outputs=(TensorSpec("output", ("T", "H"), _T, doc="context, packed like input"),),
    attributes=(
        AttrSpec("num_heads", "int", None, "number of heads N", required=True),
        AttrSpec("scale", "float", None, "multiplies Q K^T; unset means 1/sqrt(D)"),
        AttrSpec("qkv_hidden_sizes", "ints", None, "only when V's width differs; not used"),
    ),
    cpu_kernel_types=(),
    pitfalls=(
        "No mask input: a token attends to every token of its own sequence, nothing else.",
        "Every row of input is computed by the projections; rows past cum[B] are not attended "
        "and their output is not written. bertfuse's runtime pads T with filler sequences so "
        "that no row is left unwritten.",
        "B and S come from token_offset, not from the model's input_ids: they may differ.",
    ),
)

RESTORE_PADDING = OpContract(
    op_type="RestorePadding",
    domain=MS_DOMAIN,
    since_version=1,
    summary="Scatters packed tokens back to [B, S, H]; positions no token maps to become zeros.",
    inputs=(
        TensorSpec("input", ("T", "H"), _T, doc="packed hidden states"),
        TensorSpec("token_offset", ("B", "S"), ("int32",), doc="as PackedAttention"),
    ),
    outputs=(TensorSpec("output", ("B", "S", "H"), _T, doc="zeros where entry >= T of token_offset points"),),
    cpu_kernel_types=(),
    pitfalls=("Padded positions come back as zeros, not as the padded model's values there.",),
)

CONTRACTS = {c.op_type: c for c in (CONTRACT, RESTORE_PADDING)}


def reference(input: np.ndarray, weights: np.ndarray, bias: np.ndarray,
              cumulative_sequence_length: np.ndarray, *, num_heads: int,
              scale: float | None = None) -> np.ndarray:
    """Attention within each sequence of packed rows (rows past cum[-1] come back as zeros)."""
    out = np.zeros((input.shape[0], weights.shape[1] // 3), input.dtype)
    cum = np.asarray(cumulative_sequence_length)
    for start, end in zip(cum[:-1], cum[1:]):
        if end > start:
            out[start:end] = attention.reference(input[None, start:end], weights, bias,
                                                 num_heads=num_heads, scale=scale)[0]
    return out


def restore_padding(input: np.ndarray, token_offset: np.ndarray) -> np.ndarray:
    rows, seq = token_offset.shape
    out = np.zeros((rows * seq, input.shape[1]), input.dtype)
    flat = np.asarray(token_offset).reshape(-1)
    tokens = input.shape[0]
    out[flat[:tokens]] = input
    return out.reshape(rows, seq, input.shape[1])
