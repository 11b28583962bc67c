"""FP8 weights (`--fp8`): the bertfuse dense ops' weights in float8 e4m3, per-tensor scales.

    X ─► DenseBias | DenseBiasGelu | DenseBiasSkipLayerNorm (W fp16 [K, N], bias, ...) ─► Y
    ==>  X ─► DenseBiasFp8 | DenseBiasGeluFp8 | DenseBiasSkipLayerNormFp8
               (Wt = e4m3(W^T / w_scale) [N, K], bias, ..., w_scale) {x_scale} ─► Y

w_scale = max|W| / 448 from the weight itself; x_scale = max|X| / 448 from a calibration (the
activations X reach on the parity inputs, measured by running the fp16 model:
pipeline/fp8.py: calibrate), passed in by tensor name. The same quantisation math as the
kernels' contract (ops/bertfuse/dense_fp8.py).

The FP8 form computes GELU in its tanh form (DenseBiasGeluFp8 approximate = 1), whatever the
model's: that is the GELU cuBLASLt's epilogue has, so FFN up's FP8 GEMM can write its e4m3
output itself (passes/fp8_handoff.py) instead of an fp16 tensor and a pass. The two GELUs differ
by at most about 5e-4, against e4m3's relative step of 1/16; the accuracy report against fp32
includes it.

Candidates: every DenseBias, DenseBiasGelu and DenseBiasSkipLayerNorm, or those of the places
asked (`places`, by their place in the layer: PLACES); each ends converted or missed (weight
not a constant, K not a multiple of 16, no calibration for its input, an all-zero weight or
activation), in its encoder layer.

    qkv   DenseBias ─► BertAttention           up    DenseBiasGelu
    out   BertAttention ─► DenseBiasSkipLN     down  DenseBiasGelu ─► DenseBiasSkipLN
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contract import BERTFUSE_DOMAIN
from bertfuse.ops.bertfuse.dense_fp8 import CONTRACTS as FP8_CONTRACTS
from bertfuse.ops.bertfuse.dense_fp8 import FP8_OF, quantize_weight, x_scale_for
from bertfuse.passes.base import CandidatePass, Layers, const, const_value, detach, producer
from bertfuse.passes.match import expect, fail

K_MULTIPLE = 16  # cuBLASLt's FP8 GEMMs need K % 16 == 0
# Hopper's fast FP8 accumulation. Measured on an H200 (benchmarks/runtime/fp8_ab.py, BERT-base
# b32 s128): GPU time 1407.7 -> 1278.9 us, while the error against fp32 stays FP8's (max 0.505
# -> 0.477, mean 0.0525 -> 0.0526, pooled cosine 0.99769 -> 0.99765); e4m3's rounding of the
# operands is the error, not the accumulation.
FAST_ACCUM = 1
GELU_APPROXIMATE = 1  # the tanh GELU, cuBLASLt's epilogue (see above)


PLACES = ("qkv", "out", "up", "down")  # a dense op's place in an encoder layer


def dense_place(node: gs.Node) -> str | None:
    """The dense op's place in its layer (PLACES), by the ops around it; None: none of them
    (a dense op outside the encoder's pattern)."""
    op = node.op.removesuffix("Fp8")
    if op == "DenseBias":
        readers = node.outputs[0].outputs
        return "qkv" if len(readers) == 1 and readers[0].op == "BertAttention" else None
    if op == "DenseBiasGelu":
        return "up"
    if op == "DenseBiasSkipLayerNorm":
        before = producer(node.inputs[0])
        made_by = before.op.removesuffix("Fp8") if before is not None else None
        return {"BertAttention": "out", "DenseBiasGelu": "down"}.get(made_by)
    return None


def dense_layer(layers: Layers, node: gs.Node) -> int | None:
    """A dense op's encoder layer. A layer starts at its BertAttention: the QKV DenseBias (or
    DenseBiasFp8) feeding it belongs to it too."""
    readers = node.outputs[0].outputs
    if node.op in ("DenseBias", FP8_OF["DenseBias"]) and len(readers) == 1 and \
            readers[0].op == "BertAttention":
        return layers.of(readers[0])
    return layers.of(node)


class Fp8Weights(CandidatePass):
    name = "fp8_weights"

    def __init__(self, x_amax: dict[str, float], places: tuple[str, ...] | None = None) -> None:
        self.x_amax = dict(x_amax)
        self.places = places  # None: every dense op

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        return [n for n in graph.nodes if n.domain == BERTFUSE_DOMAIN and n.op in FP8_OF
                and (self.places is None or dense_place(n) in self.places)]

    def layer(self, layers: Layers, node: gs.Node) -> int | None:
        return dense_layer(layers, node)

    def match(self, graph: gs.Graph, node: gs.Node) -> tuple[np.ndarray, np.ndarray, float]:
        """(e4m3 W^T, w_scale, x_scale)."""
        w = const_value(node.inputs[1])
        expect(w is not None and w.ndim == 2 and w.dtype == np.float16,
               f"the weight of {node.name} is not a constant fp16 matrix")
        expect(w.shape[0] % K_MULTIPLE == 0,
               f"{node.name}: K = {w.shape[0]} is not a multiple of {K_MULTIPLE} (cuBLASLt FP8)")
        x = node.inputs[0]
        expect(x.name in self.x_amax, f"no calibration for {x.name}, the input of {node.name}")
        try:
            wt, w_scale = quantize_weight(w)
            x_scale = x_scale_for(float(self.x_amax[x.name]))
        except ValueError as exc:
            fail(f"{node.name}: {exc}")
        return wt, w_scale, x_scale

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: tuple) -> None:
        wt, w_scale, x_scale = found
        prefix = f"{node.name}_fp8"
        ins = [node.inputs[0], const(f"{prefix}_wt", wt), *node.inputs[2:],
               const(f"{prefix}_w_scale", w_scale)]
        attrs = {**node.attrs, "x_scale": x_scale, "fast_accum": FAST_ACCUM}
        if node.op == "DenseBiasGelu":
            attrs["approximate"] = GELU_APPROXIMATE
        outs = list(node.outputs)  # Y and any optional output (Y32) the fp16 op wrote
        detach([node])
        graph.nodes.append(FP8_CONTRACTS[FP8_OF[node.op]].node(f"{prefix}", ins, outs, **attrs))
