"""Mask variants of a fused model, for requests whose padding allows faster attention kernels.

ONNX Runtime's Attention reads a raw [B, S] mask correctly wherever the padding is, but with
it the CUDA kernels take the unfused softmax path. Two narrower cases have faster kernels:

* `keylen`: every row is right-padded (ones, then zeros). The mask becomes one key length
  per row, [B] int32 (ReduceSum inside the graph), which the fused/memory-efficient
  attention kernels accept. Exactly equal to the raw form for such rows.
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
    """'nomask' (all ones), 'keylen' (each row ones then zeros), else 'raw'."""
    m = mask != 0
    if m.all():
        return "nomask"
    # Right padding: no row ever goes from 0 back to 1, and every row keeps its first key.
    if m[:, 0].all() and not (m[:, 1:] & ~m[:, :-1]).any():
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
    if mode == "keylen":
        lengths = "input_mask_key_length"
        graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64),
                                                         "input_mask_sum_axes"))
        nodes = [helper.make_node("Cast", [MASK], ["input_mask_i32"], to=onnx.TensorProto.INT32,
                                  name="mask_to_int32"),
                 helper.make_node("ReduceSum", ["input_mask_i32", "input_mask_sum_axes"],
                                  [lengths], keepdims=0, name="mask_key_length")]
        for n in reversed(nodes):
            graph.node.insert(0, n)
    for n in atts:
        if mode == "keylen":
            n.input[3] = lengths
        else:
            del n.input[3:]
    # 'nomask' keeps input_mask as an (unread) input: every variant binds the same buffers.
    return out
