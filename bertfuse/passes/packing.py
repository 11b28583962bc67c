"""Packed form: the encoder runs on the real tokens only, [T, H] instead of [B, S, H].

    input_ids, segment_ids ─► EmbedLayerNorm ─► [B,S,H] ─► Reshape[B*S,H] ─► Gather(token_index) ─► [T,H]
        ─► PackedAttention(token_offset, cumulative_sequence_length) / MatMul / SkipLayerNorm / BiasGelu ...
        ─► RestorePadding(token_offset) ─► [B,S,H] sequence_output ─► pooler

Padding costs nothing in the GEMMs any more. The packing itself is decided by the caller
from the mask, so rows may be padded anywhere (holes too): the runtime gives, per request,
`token_index` [T] (flat positions of kept tokens, row by row), `token_offset` [B, S] (those
positions first, then the padded ones) and `cumulative_sequence_length` [B + 1]. Positions
are still the padded columns (EmbedLayerNormalization runs before packing), so a token with a
hole before it keeps its position, as in the padded model. The input_mask input goes away.

PackedAttention and RestorePadding are CUDA-only in ONNX Runtime: packed models run on the
GPU; the CPU can only check their structure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import MS_DOMAIN, PassResult, const, replace_tensor

PACKED_INPUTS = ("token_index", "token_offset", "cumulative_sequence_length")


class PackingPass:
    name = "packing"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        embeds = [n for n in graph.nodes if n.op == "EmbedLayerNormalization"]
        attentions = [n for n in graph.nodes if n.op == "Attention"]
        if len(embeds) != 1 or not attentions:
            result.missed("packing", "needs a fused model (one EmbedLayerNormalization and "
                                     "Attention nodes)")
            return result
        outputs = [t for t in graph.outputs if t.name == "sequence_output"]
        if not outputs:
            result.missed("packing", "no sequence_output to restore the padding on")
            return result
        index = gs.Variable("token_index", dtype=np.int32, shape=["tokens"])
        # token_offset may hold more rows than input_ids (the runtime's filler rows).
        offset = gs.Variable("token_offset", dtype=np.int32, shape=["packed_rows", "seq"])
        cumulative = gs.Variable("cumulative_sequence_length", dtype=np.int32,
                                 shape=["packed_rows_plus_1"])
        embedded = embeds[0].outputs[0]
        hidden = int(embeds[0].inputs[2].values.shape[1])
        flat = gs.Variable("embeddings_flat", dtype=embedded.dtype)
        packed = gs.Variable("embeddings_packed", dtype=embedded.dtype)
        consumers = list(embedded.outputs)
        graph.nodes += [
            gs.Node("Reshape", "pack_flatten", inputs=[
                embedded, const("pack_shape", np.array([-1, hidden], np.int64))], outputs=[flat]),
            gs.Node("Gather", "pack_tokens", {"axis": 0}, inputs=[flat, index], outputs=[packed]),
        ]
        for node in consumers:
            node.inputs = [packed if t is embedded else t for t in node.inputs]
        for att in attentions:
            out = att.outputs[0]
            attrs = {k: v for k, v in att.attrs.items() if k in ("num_heads", "scale",
                                                                 "qkv_hidden_sizes")}
            packed_out = gs.Variable(f"{out.name}_packed", dtype=out.dtype)
            graph.nodes.append(gs.Node("PackedAttention", f"{att.name}_packed", attrs,
                                       inputs=att.inputs[:3] + [offset, cumulative],
                                       outputs=[packed_out], domain=MS_DOMAIN))
            replace_tensor(graph, out, packed_out)
            att.outputs.clear()
            att.inputs.clear()
            result.rewrites += 1
        # Restore where the hidden states end, before any output Cast (fp16 models), so the
        # pooler and the output both read [B, S, H].
        final = outputs[0]
        while final.inputs and final.inputs[0].op == "Cast":
            final = final.inputs[0].inputs[0]
        restored = gs.Variable(f"{final.name}_restored", dtype=final.dtype, shape=None)
        readers = list(final.outputs)
        graph.nodes.append(gs.Node("RestorePadding", "restore_padding", domain=MS_DOMAIN,
                                   inputs=[final, offset], outputs=[restored]))
        for node in readers:
            node.inputs = [restored if t is final else t for t in node.inputs]
        if final is outputs[0]:  # the output keeps its name; the packed tensor is renamed
            graph.outputs = [restored if t is final else t for t in graph.outputs]
            final.name, restored.name = "sequence_output_packed", "sequence_output"
            restored.shape = ["packed_rows", "seq"] + list(outputs[0].shape or [None])[2:]
        final.shape = None
        still_read = {id(t) for n in graph.nodes for t in n.inputs}
        graph.inputs = [i for i in graph.inputs if i.name != "input_mask" or id(i) in still_read] \
            + [index, offset, cumulative]
        result.fused("packing")
        return result



@dataclass(frozen=True)
class PackedShape:
    """One fixed shape of the packed model, so a CUDA graph can be captured for it.

    input_ids/segment_ids are [batch, seq]; the encoder runs on `tokens` rows; token_offset is
    [rows, seq] with rows = batch + filler rows. A request with t real tokens is padded up to
    `tokens` with filler tokens that form sequences of their own (the rows past the request's
    batch), so every token the kernels touch belongs to some sequence and no row is empty.
    """

    batch: int
    seq: int
    tokens: int
    rows: int


def packed_shapes(batch: int, seq: int, steps: int = 8) -> list[PackedShape]:
    """The token buckets of one [batch, seq] bucket: `steps` equal steps up to batch x seq."""
    step = -(-batch * seq // steps)
    extra_rows = -(-step // seq) + 1
    while extra_rows * (seq - 1) < step:  # filler rows must hold a step's worth of tokens
        extra_rows += 1
    return [PackedShape(batch, seq, k * step + extra_rows, batch + extra_rows)
            for k in range(1, steps + 1)]


def choose_shape(shapes: list[PackedShape], batch: int, tokens: int) -> PackedShape:
    """The smallest shape that holds `tokens` real tokens of `batch` rows plus a filler token
    for each remaining row."""
    for shape in shapes:
        if shape.tokens >= tokens + shape.rows - batch:
            return shape
    raise ValueError(f"{tokens} tokens do not fit {shapes[-1]}")


def pack_into(mask: np.ndarray, shape: PackedShape,
              out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """token_index / token_offset / cumulative_sequence_length of `mask` ([b, s] 0/1, b and s
    within the shape), padded to `shape` with filler sequences; written into `out`'s arrays
    when given (the runtime's staging buffer). It is on the request path: few NumPy calls."""
    b, s = mask.shape
    keep = np.zeros((shape.rows, shape.seq), bool)
    np.not_equal(mask, 0, out=keep[:b, :s])
    lengths = np.add.reduce(keep, axis=1, dtype=np.int64)
    real = int(lengths.sum())
    filler_rows = shape.rows - b
    extra = shape.tokens - real
    if not filler_rows <= extra <= filler_rows * shape.seq:
        raise ValueError(f"{real} tokens in {b} rows do not pack into {shape}")
    each, rest = divmod(extra, filler_rows)
    lengths[b:] = each
    lengths[b:b + rest] += 1
    keep[b:] = np.arange(shape.seq) < lengths[b:, None]
    flat = keep.reshape(-1)
    kept = flat.nonzero()[0]  # row by row: the order the kernels expect
    if out is None:
        out = {"token_index": np.empty(shape.tokens, np.int32),
               "token_offset": np.empty((shape.rows, shape.seq), np.int32),
               "cumulative_sequence_length": np.empty(shape.rows + 1, np.int32)}
    offset = out["token_offset"].reshape(-1)
    offset[:shape.tokens] = kept
    offset[shape.tokens:] = (~flat).nonzero()[0]
    index = out["token_index"]
    index[:] = kept
    index[np.searchsorted(kept, shape.batch * shape.seq):] = 0  # filler past input_ids: token 0
    cumulative = out["cumulative_sequence_length"]
    cumulative[0] = 0
    np.cumsum(lengths, out=cumulative[1:])
    return out

