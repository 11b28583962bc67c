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
equal to the raw form for it (`VariantPolicy`), and every bucket checks each variant against
the raw mask on a probe request when it is made (`check_variants`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from bertfuse.io.inputs import variant_probe

MASK = "input_mask"
# right_padded='auto': [3B+2] below this bucket length, [B] from it.
AUTO_KEYLEN_MIN_SEQ = 128
# A variant differing from the raw mask by more than this on a probe misreads the mask:
# genuine differences are kernel rounding (fp16 about 1e-2), a misread mask is O(1).
VARIANT_TOLERANCE = 5e-2


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


@dataclass(frozen=True)
class VariantPolicy:
    """Which session (mask variant) serves a request. Rows that are right-padded (or full)
    can use a narrower mask form with faster attention kernels, each provably equal to the
    raw mask for them: 'keylen' ([B]: cuDNN flash attention), 'keyseq' ([3B+2]: cutlass
    memory-efficient attention). Measured on the H200 (docs/journal/gpu.md): keyseq is
    fastest below seq 128 (243 -> 229 us GPU at 3 layers b20 s64), cuDNN's keylen from 128
    on, so 'auto' splits there. min_seq keeps the raw mask below a bucket length. [3B+2]
    selects cutlass attention in fp16 only; fp32 would take the unfused path. A model whose
    attention is all bertfuse's BertAttention (own_attention) keeps the raw mask at every
    length under 'auto': its kernel reads the raw mask at no cost, and the key-length form only
    adds its ReduceSum (measured on the H200 at shenma-3l b20 s64: GPU 182.6 against 184.2 us,
    p50 8-22 us lower in three runs; at base b1 s128: GPU 389.8 against 393.7 us, 99 kernels
    against 100; docs/journal/kernels.md)."""

    right_padded: str  # 'auto', 'keylen' or 'keyseq'
    min_seq: int
    fp16: bool
    own_attention: bool = False

    def mode_for(self, kind: str, bucket_seq: int) -> str:
        """The session for a request whose mask is of `kind` (mask_mode) in a bucket."""
        if kind == "raw" or bucket_seq < self.min_seq:
            return "raw"
        if self.right_padded == "auto":
            if self.own_attention:
                return "raw"
            if bucket_seq < AUTO_KEYLEN_MIN_SEQ:  # right-padded and full rows alike
                return "keyseq" if self.fp16 else "raw"
            return kind
        return self.right_padded if kind == "keylen" else kind

    def modes_used(self, seq_buckets: Sequence[int]) -> list[str]:
        """The variant sessions some bucket can use (sorted; 'raw' is always there)."""
        used = {self.mode_for(kind, s) for kind in ("keylen", "nomask")
                for s in seq_buckets if s >= self.min_seq}
        return sorted(used - {"raw"})

    @staticmethod
    def request_kind(mask: object, bucket: tuple[int, int], request: tuple[int, int],
                     form: str | None = None) -> str:
        """mask_mode of a request's mask in a bucket: None is 'nomask', a device mask 'raw';
        `form`: that mask_mode, where the caller has it already (runtime/staging.py)."""
        kind = "nomask" if mask is None else form if form is not None else \
            mask_mode(mask) if isinstance(mask, np.ndarray) else "raw"
        if kind == "nomask" and bucket != request:
            kind = "keylen"  # bucket padding adds padded keys to every row: right padding
        return kind


def check_variants(modes: Sequence[str], batch: int, seq: int, inputs: Sequence[str],
                   vocab: int | None,
                   run: Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]]
                   ) -> dict[str, str]:
    """Every mask variant must match the raw mask on a probe request in a [batch, seq]
    bucket (right-padded; all ones for 'nomask'). ORT picks attention kernels per shape,
    precision and GPU, and a kernel that misreads the narrower mask form (seen on the H200:
    [3B+2] with fp32 CUDA) must never serve requests. `run(mode, arrays)` runs the bucket
    with one variant and returns its outputs; returns {mode: why} for the variants to turn
    off in that bucket."""
    ids, lengths = variant_probe(batch, seq, vocab)
    bad = {}
    for mode in modes:
        keep = np.arange(seq)[None, :] < (np.full((batch, 1), seq) if mode == "nomask"
                                          else lengths[:, None])
        arrays = {"input_ids": ids, "input_mask": keep.astype(np.int32),
                  "segment_ids": np.zeros((batch, seq), np.int32)}
        arrays = {k: v for k, v in arrays.items() if k in inputs}
        got = {run_mode: run(run_mode, arrays) for run_mode in ("raw", mode)}
        worst = 0.0
        for name, want in got["raw"].items():
            diff = np.abs(got[mode][name] - want)
            worst = max(worst, float((diff[keep] if diff.ndim == 3 else diff).max()))
        if not worst <= VARIANT_TOLERANCE:  # NaN too
            bad[mode] = f"max |diff| {worst:.3g} vs the raw mask"
    return bad


# The mask's input slot of each attention op: ORT's Attention, bertfuse's BertAttention.
# BertAttention reads raw [B, S] or key lengths [B]: 'keyseq' gives it the key lengths.
MASK_SLOT = {("com.microsoft", "Attention"): 3, ("ai.bertfuse", "BertAttention"): 1}


def has_own_attention(model: onnx.ModelProto) -> bool:
    """Whether every attention op that reads the mask is bertfuse's BertAttention."""
    ops = {(n.domain, n.op_type) for n in model.graph.node if (n.domain, n.op_type) in MASK_SLOT}
    return bool(ops) and all(op != "Attention" for _, op in ops)


def attention_mask_variant(model: onnx.ModelProto, mode: str) -> onnx.ModelProto | None:
    """The model with every Attention (or BertAttention) reading a key-length mask
    ('keylen', and 'keyseq' for BertAttention), key lengths and row starts ('keyseq') or
    none ('nomask'); None when the model has no attention op fed by a mask."""
    out = copy.deepcopy(model)
    graph = out.graph
    atts = [n for n in graph.node if (n.domain, n.op_type) in MASK_SLOT and
            len(n.input) > MASK_SLOT[n.domain, n.op_type] and
            n.input[MASK_SLOT[n.domain, n.op_type]]]
    if not atts:
        return None
    key_lengths = "input_mask_key_length"
    if mode in ("keylen", "keyseq"):
        lengths = key_lengths
        graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64),
                                                         "input_mask_sum_axes"))
        nodes = [helper.make_node("Cast", [MASK], ["input_mask_i32"], to=onnx.TensorProto.INT32,
                                  name="mask_to_int32"),
                 helper.make_node("ReduceSum", ["input_mask_i32", "input_mask_sum_axes"],
                                  [lengths], keepdims=0, name="mask_key_length")]
        if mode == "keyseq" and any(n.op_type == "Attention" for n in atts):
            nodes += _row_starts(graph, lengths)
            lengths = "input_mask_key_length_starts"
        for n in reversed(nodes):
            graph.node.insert(0, n)
    for n in atts:
        slot = MASK_SLOT[n.domain, n.op_type]
        if mode in ("keylen", "keyseq"):
            n.input[slot] = lengths if n.op_type == "Attention" else key_lengths
        else:
            del n.input[slot:]
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
