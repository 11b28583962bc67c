"""FP8 weights (`--fp8`): the bertfuse dense ops' weights in float8 e4m3, per-tensor scales.

    X ─► DenseBias | DenseBiasGelu | DenseBiasSkipLayerNorm (W fp16 [K, N], bias, ...) ─► Y
    ==>  X ─► DenseBiasFp8 | DenseBiasGeluFp8 | DenseBiasSkipLayerNormFp8
               (Wt = e4m3(W^T / w_scale) [N, K], bias, ..., w_scale) {x_scale} ─► Y

w_scale = max|W| / 448 from the weight itself; x_scale = max|X| / 448 from a calibration (the
activations X reach on the parity inputs, measured by running the fp16 model:
kernels_form.calibrate), passed in by tensor name. The same quantisation math as the
kernels' contract (custom_ops/dense_fp8.py).

Candidates: every DenseBias, DenseBiasGelu and DenseBiasSkipLayerNorm; each ends converted or
missed (weight not a constant, K not a multiple of 16, no calibration for its input, an
all-zero weight or activation), in its encoder layer.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contract import BERTFUSE_DOMAIN
from bertfuse.ops.bertfuse.dense_fp8 import CONTRACTS as FP8_CONTRACTS
from bertfuse.ops.bertfuse.dense_fp8 import FP8_OF, quantize_weight, x_scale_for
from bertfuse.passes.base import Layers, MatchResult, PassResult, const, const_value, detach

K_MULTIPLE = 16  # cuBLASLt's FP8 GEMMs need K % 16 == 0


class Fp8Weights:
    name = "fp8_weights"

    def __init__(self, x_amax: dict[str, float]) -> None:
        self.x_amax = dict(x_amax)

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        layers = Layers(graph)
        for node in [n for n in graph.nodes if n.domain == BERTFUSE_DOMAIN and n.op in FP8_OF]:
            layer = _layer(layers, node)
            match = self._match(node)
            if not result.record(self.name, match, layer):
                continue
            wt, w_scale, x_scale = match.found
            prefix = f"{node.name}_fp8"
            ins = [node.inputs[0], const(f"{prefix}_wt", wt), *node.inputs[2:],
                   const(f"{prefix}_w_scale", w_scale)]
            attrs = {**node.attrs, "x_scale": x_scale, "fast_accum": 0}
            out = node.outputs[0]
            detach([node])
            graph.nodes.append(FP8_CONTRACTS[FP8_OF[node.op]].node(f"{prefix}", ins, [out], **attrs))
            result.fused(self.name, layer)
        return result

    def _match(self, node: gs.Node) -> MatchResult:
        m = MatchResult()
        w = const_value(node.inputs[1])
        if w is None or w.ndim != 2 or w.dtype != np.float16:
            return m.fail(f"the weight of {node.name} is not a constant fp16 matrix")
        if w.shape[0] % K_MULTIPLE:
            return m.fail(f"{node.name}: K = {w.shape[0]} is not a multiple of {K_MULTIPLE} "
                          f"(cuBLASLt FP8)")
        x = node.inputs[0]
        if x.name not in self.x_amax:
            return m.fail(f"no calibration for {x.name}, the input of {node.name}")
        try:
            wt, w_scale = quantize_weight(w)
            x_scale = x_scale_for(float(self.x_amax[x.name]))
        except ValueError as exc:
            return m.fail(f"{node.name}: {exc}")
        return m.ok((wt, w_scale, x_scale))


def _layer(layers: Layers, node: gs.Node) -> int | None:
    """A layer starts at its BertAttention: the QKV DenseBias feeding it belongs to it too."""
    readers = node.outputs[0].outputs
    if node.op == "DenseBias" and len(readers) == 1 and readers[0].op == "BertAttention":
        return layers.of(readers[0])
    return layers.of(node)
