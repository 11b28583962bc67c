"""com.microsoft EmbedLayerNormalization: contract, NumPy reference, one-node model.

Fuses BERT's embedding block: LayerNorm(word[ids] + position[pos] + segment[seg]), and optionally
reduces the attention mask to a per-row ``mask_index``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np
import onnx

from bertfuse.ops.contract import MS_DOMAIN, AttrSpec, OpContract, TensorSpec, one_node_model
from bertfuse.ops.contrib.layernorm import layer_norm64

_T = ("float32", "float16")
DEFAULT_EPSILON = 1e-12  # ORT's kDefaultEmbedLayerNormEpsilon

CONTRACT = OpContract(
    op_type="EmbedLayerNormalization",
    domain=MS_DOMAIN,
    since_version=1,
    summary="output = LayerNorm(word_embedding[input_ids] + position_embedding[pos] + segment_embedding[segment_ids]).",
    inputs=(
        TensorSpec("input_ids", ("B", "S"), ("int32",), doc="int32 only; each in [0, V)"),
        TensorSpec("segment_ids", ("B", "S"), ("int32",), optional=True,
                   doc="int32; omit together with segment_embedding (DistilBERT)"),
        TensorSpec("word_embedding", ("V", "H"), _T),
        TensorSpec("position_embedding", ("P", "H"), _T, doc="needs P >= S when position_ids is omitted"),
        TensorSpec("segment_embedding", ("T", "H"), _T, optional=True),
        TensorSpec("gamma", ("H",), _T),
        TensorSpec("beta", ("H",), _T, doc="required (not optional, unlike SkipLayerNormalization)"),
        TensorSpec("mask", ("B", "S"), ("int32",), optional=True, doc="attention mask, only used for mask_index"),
        TensorSpec("position_ids", ("B|1", "S"), ("int32",), optional=True,
                   doc="default: 0..S-1 for every row; [1,S] broadcasts over the batch"),
    ),
    outputs=(
        TensorSpec("output", ("B", "S", "H"), _T),
        TensorSpec("mask_index", ("B",), ("int32",), optional=True,
                   doc="CPU: count of mask==1 per row; CUDA: index of first 0 (S if none); zeros if no mask"),
        TensorSpec("embedding_sum", ("B", "S", "H"), _T, optional=True,
                   doc="word+position(+segment) before LN"),
    ),
    attributes=(
        AttrSpec("epsilon", "float", DEFAULT_EPSILON, "LN epsilon"),
        AttrSpec("mask_index_type", "int", None,
                 "shape/type inference only (unset behaves as 1): 1 = output 1 is a [B] int32 mask_index, "
                 "0 = no mask_index output. The kernel ignores it."),
    ),
    cpu_kernel_types=("float32",),
    pitfalls=(
        "ids, segment_ids, mask and position_ids must be int32; exported graphs often carry int64, so Cast first.",
        "mask_index is NOT the same on every EP: the CPU kernel counts entries equal to 1 (a 2 or a -1 counts as 0), "
        "the CUDA kernel returns the position of the first 0. They agree only for right-padded 0/1 masks.",
        "mask_index is a 1-D key length, so feeding it to Attention assumes right padding; with padding in the "
        "middle of a row, feed the raw [B,S] mask to Attention instead.",
        "Without a mask input, mask_index is all zeros (not S).",
        "Outputs are positional: slot 1 is always mask_index (int32). To get embedding_sum alone, name slot 1 ''.",
        "With a single output, set mask_index_type=0: ORT's shape inference defaults it to 1 and then fails with "
        "'output index 1 is out of range'.",
        "Out-of-range ids fail at run time ('input index out of range'), including S > P without position_ids.",
    ),
)


class EmbedLayerNormOutputs(NamedTuple):
    output: np.ndarray
    mask_index: np.ndarray
    embedding_sum: np.ndarray


MaskIndexSemantics = Literal["cpu", "cuda"]


def mask_index_from_mask(mask: np.ndarray | None, batch: int, seq: int, ep: MaskIndexSemantics = "cpu") -> np.ndarray:
    """What ORT writes to output 1. 'cpu' = ORT CPU kernel (what tests can check), 'cuda' = CUDA kernel."""
    if mask is None:
        return np.zeros((batch,), np.int32)
    m = np.asarray(mask)
    if ep == "cpu":
        return (m == 1).sum(axis=1).astype(np.int32)
    zeros = m == 0
    return np.where(zeros.any(axis=1), zeros.argmax(axis=1), seq).astype(np.int32)


def reference_outputs(
    input_ids: np.ndarray,
    segment_ids: np.ndarray | None,
    word_embedding: np.ndarray,
    position_embedding: np.ndarray,
    segment_embedding: np.ndarray | None,
    gamma: np.ndarray,
    beta: np.ndarray,
    mask: np.ndarray | None = None,
    position_ids: np.ndarray | None = None,
    *,
    epsilon: float = DEFAULT_EPSILON,
    mask_index_ep: MaskIndexSemantics = "cpu",
) -> EmbedLayerNormOutputs:
    int_inputs = {"input_ids": input_ids, "segment_ids": segment_ids, "mask": mask, "position_ids": position_ids}
    for name, ids in int_inputs.items():
        if ids is not None and np.asarray(ids).dtype != np.int32:
            raise TypeError(f"{name} must be int32, got {np.asarray(ids).dtype}")
    if (segment_ids is None) != (segment_embedding is None):
        raise ValueError("segment_ids and segment_embedding go together")
    b, s = input_ids.shape
    pos = np.broadcast_to(np.arange(s, dtype=np.int32) if position_ids is None else position_ids, (b, s))

    def take(table: np.ndarray, idx: np.ndarray, what: str) -> np.ndarray:
        if idx.min() < 0 or idx.max() >= table.shape[0]:
            raise IndexError(f"{what} out of range [0, {table.shape[0]})")  # ORT: 'input index out of range'
        return np.asarray(table, np.float64)[idx]

    e = take(word_embedding, input_ids, "input_ids") + take(position_embedding, pos, "position ids")
    if segment_ids is not None and segment_embedding is not None:
        e = e + take(segment_embedding, segment_ids, "segment_ids")
    y, _, _ = layer_norm64(e, gamma, beta, epsilon)
    t = word_embedding.dtype
    return EmbedLayerNormOutputs(y.astype(t), mask_index_from_mask(mask, b, s, mask_index_ep), e.astype(t))


def reference(
    input_ids: np.ndarray,
    segment_ids: np.ndarray | None,
    word_embedding: np.ndarray,
    position_embedding: np.ndarray,
    segment_embedding: np.ndarray | None,
    gamma: np.ndarray,
    beta: np.ndarray,
    mask: np.ndarray | None = None,
    position_ids: np.ndarray | None = None,
    *,
    epsilon: float = DEFAULT_EPSILON,
) -> np.ndarray:
    return reference_outputs(
        input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma, beta, mask,
        position_ids, epsilon=epsilon,
    ).output


def make_model(
    batch: int | str,
    seq: int | str,
    hidden: int,
    vocab: int,
    max_positions: int,
    type_vocab: int | None = 2,
    dtype: type | np.dtype = np.float32,
    *,
    epsilon: float = DEFAULT_EPSILON,
    with_mask: bool = True,
    position_ids_shape: tuple[int | str, int | str] | None = None,
    with_mask_index: bool = True,
    with_embedding_sum: bool = False,
) -> onnx.ModelProto:
    """One EmbedLayerNormalization node. type_vocab=None omits segment_ids/segment_embedding."""
    seg = type_vocab is not None
    return one_node_model(
        "EmbedLayerNormalization",
        MS_DOMAIN,
        [
            ("input_ids", np.int32, (batch, seq)),
            ("segment_ids", np.int32, (batch, seq)) if seg else None,
            ("word_embedding", dtype, (vocab, hidden)),
            ("position_embedding", dtype, (max_positions, hidden)),
            ("segment_embedding", dtype, (type_vocab, hidden)) if seg else None,
            ("gamma", dtype, (hidden,)),
            ("beta", dtype, (hidden,)),
            ("mask", np.int32, (batch, seq)) if with_mask else None,
            ("position_ids", np.int32, position_ids_shape) if position_ids_shape is not None else None,
        ],
        [
            ("output", dtype, (batch, seq, hidden)),
            ("mask_index", np.int32, (batch,)) if with_mask_index else None,
            ("embedding_sum", dtype, (batch, seq, hidden)) if with_embedding_sum else None,
        ],
        # Always explicit: the unset default (1) breaks shape inference when output 1 is absent.
        {"epsilon": float(epsilon), "mask_index_type": 1 if with_mask_index else 0},
    )
