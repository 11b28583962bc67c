"""ai.bertfuse BertEmbedLayerNorm: BERT's embedding block (three lookups, their sum, LayerNorm)
in one op — contract, NumPy reference.

It replaces ONNX Runtime's com.microsoft EmbedLayerNormalization in the lowered model where
nothing reads that op's mask_index or embedding_sum: the same input slots without the mask,
one output.

    input_ids, segment_ids, position_ids ─► word[ids] + position[pos] + segment[segs] ─► LN ─► Y

fp16 tables, fp32 sum and statistics; the reference computes in float64. CUDA EP only: no CPU
kernel.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from bertfuse.ops.contract import BERTFUSE_DOMAIN, AttrSpec, OpContract, TensorSpec, one_node_model
from bertfuse.ops.contrib import embed_layernorm as contrib

# The ops that hold a model's embedding tables, their slots alike: 0 ids, 1 segment ids, 2 word,
# 3 position, 4 segment table, 5 gamma, 6 beta (model facts, skeleton refills, packing read them).
EMBEDDING_OPS = ("EmbedLayerNormalization", "BertEmbedLayerNorm")
MAX_HIDDEN = 2048  # csrc/embed_layernorm.h kEmbedMaxHidden: one warp's registers hold a token

CONTRACT = OpContract(
    op_type="BertEmbedLayerNorm",
    domain=BERTFUSE_DOMAIN,
    since_version=1,
    summary="Y = LayerNorm(word[input_ids] + position[pos] + segment[segment_ids]) * gamma + beta.",
    # EmbedLayerNormalization's slots less the mask, the tables fp16 only
    inputs=tuple(dataclasses.replace(t, dtypes=("float16",)) if "float16" in t.dtypes else t
                 for t in contrib.CONTRACT.inputs if t.name != "mask"),
    outputs=(TensorSpec("Y", ("B", "S", "H"), ("float16",)),),
    attributes=(AttrSpec("epsilon", "float", contrib.DEFAULT_EPSILON, "LN epsilon"),),
    pitfalls=(
        "Slot 7 is position_ids, not the mask: EmbedLayerNormalization's slot 7 (mask) is dropped.",
        "An index outside its table writes NaN to that token's row instead of failing the run "
        "(the kernel cannot raise; bertfuse's runtime refuses such requests before the GPU).",
    ),
)

CONTRACTS: dict[str, OpContract] = {CONTRACT.op_type: CONTRACT}


def reference64(input_ids: np.ndarray, segment_ids: np.ndarray | None, word: np.ndarray,
                position: np.ndarray, segment: np.ndarray | None, gamma: np.ndarray,
                beta: np.ndarray, position_ids: np.ndarray | None = None, *,
                epsilon: float = contrib.DEFAULT_EPSILON) -> np.ndarray:
    """The op's Y in float64, unrounded (index errors as the contrib reference raises them)."""
    as64 = [None if t is None else np.asarray(t, np.float64)
            for t in (word, position, segment, gamma, beta)]
    return contrib.reference(input_ids, segment_ids, *as64[:3], *as64[3:], None, position_ids,
                             epsilon=epsilon)


def make_model(batch: int, seq: int, hidden: int, vocab: int, positions: int,
               types: int | None = 2, position_ids_rows: int | None = None, *,
               epsilon: float = contrib.DEFAULT_EPSILON) -> onnx.ModelProto:
    """One BertEmbedLayerNorm node, every slot a graph input; types=None omits the segment
    slots, position_ids_rows (1 or batch) adds position_ids."""
    seg = types is not None
    return one_node_model(
        CONTRACT.op_type, BERTFUSE_DOMAIN,
        [("input_ids", np.int32, (batch, seq)),
         ("segment_ids", np.int32, (batch, seq)) if seg else None,
         ("word_embedding", np.float16, (vocab, hidden)),
         ("position_embedding", np.float16, (positions, hidden)),
         ("segment_embedding", np.float16, (types, hidden)) if seg else None,
         ("gamma", np.float16, (hidden,)), ("beta", np.float16, (hidden,)),
         ("position_ids", np.int32, (position_ids_rows, seq)) if position_ids_rows else None],
        [("Y", np.float16, (batch, seq, hidden))], {"epsilon": float(epsilon)})
