"""Mask variants of a fused model, for requests whose padding allows faster attention kernels.

ONNX Runtime's Attention reads a raw [B, S] mask correctly wherever the padding is, but with
it the CUDA kernels take the unfused softmax path. Two narrower cases have faster kernels:

* `keylen`: every row is right-padded (ones, then zeros). The mask becomes one key length
  per row, [B] int32 (ReduceSum inside the graph), which the fused/memory-efficient
  attention kernels accept. Exactly equal to the raw form for such rows.
* `keyseq`: the same right-padded rows as [3B+2] int32: key lengths, then the padded
  layout's row starts for queries and for keys (0, S, 2S, ..., BS), all computed inside the
  graph. This form (ORT's MASK_1D_KEY_SEQ_LEN_START) is the one that selects the cutlass
  memory-efficient attention kernel.
* `nomask`: no padding at all. Attention gets no mask input.

The runtime checks each request's mask on the host and picks the variant that is provably
equal to the raw form for it.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import helper, numpy_helper

MASK = "input_mask"


def mask_mode(mask: np.ndarray) -> str:
    """'nomask' (all ones), 'keylen' (each row ones then zeros), else 'raw'. For 0/1 masks;
    the runtime refuses other values (after this, in its range check). On the request path:
    three NumPy calls at most."""
    if mask.min() > 0:
        return "nomask"
    # Right padding: every row keeps its first key and never goes from 0 back to 1.
    if mask[:, 0].all() and (mask[:, :-1] >= mask[:, 1:]).all():
        return "keylen"
    return "raw"


def attention_mask_variant(model: onnx.ModelProto, mode: str) -> onnx.ModelProto | None:
    """The model with every Attention reading a key-length mask ('keylen') or none
    ('nomask'); None when the model has no Attention fed by the raw mask input."""
    out = copy.deepcopy(model)
    graph = out.graph
    atts = [n for n in graph.node if n.op_type == "Attention" and len(n.input) > 3 and
            n.input[3]]
    if not atts:
        return None
    if mode in ("keylen", "keyseq"):
        lengths = "input_mask_key_length"
        graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64),
                                                         "input_mask_sum_axes"))
        nodes = [helper.make_node("Cast", [MASK], ["input_mask_i32"], to=onnx.TensorProto.INT32,
                                  name="mask_to_int32"),
                 helper.make_node("ReduceSum", ["input_mask_i32", "input_mask_sum_axes"],
                                  [lengths], keepdims=0, name="mask_key_length")]
        if mode == "keyseq":
            nodes += _row_starts(graph, lengths)
            lengths = "input_mask_key_length_starts"
        for n in reversed(nodes):
            graph.node.insert(0, n)
    for n in atts:
        if mode in ("keylen", "keyseq"):
            n.input[3] = lengths
        else:
            del n.input[3:]
    # 'nomask' keeps input_mask as an (unread) input: every variant binds the same buffers.
    return out


def _row_starts(graph: onnx.GraphProto, lengths: str) -> list[onnx.NodeProto]:
    """[lengths | 0, S, .., BS | 0, S, .., BS] from the mask, on the device (no Shape ops,
    which would run on the CPU and stop CUDA graph capture)."""
    for name, value in (("input_mask_zero", np.array(0, np.int32)),
                        ("input_mask_one", np.array(1, np.int32)),
                        ("input_mask_zero_1d", np.array([0], np.int32)),
                        ("input_mask_cumsum_axis", np.array(0, np.int64))):
        graph.initializer.append(numpy_helper.from_array(value, name))
    return [
        helper.make_node("Mul", ["input_mask_i32", "input_mask_zero"], ["input_mask_zeros"],
                         name="mask_zeros"),
        helper.make_node("Add", ["input_mask_zeros", "input_mask_one"], ["input_mask_ones"],
                         name="mask_ones"),
        helper.make_node("ReduceSum", ["input_mask_ones", "input_mask_sum_axes"],
                         ["input_mask_row_width"], keepdims=0, name="mask_row_width"),
        helper.make_node("CumSum", ["input_mask_row_width", "input_mask_cumsum_axis"],
                         ["input_mask_row_ends"], name="mask_row_ends"),
        helper.make_node("Concat", [lengths, "input_mask_zero_1d", "input_mask_row_ends",
                                    "input_mask_zero_1d", "input_mask_row_ends"],
                         ["input_mask_key_length_starts"], axis=0, name="mask_key_length_starts"),
    ]
