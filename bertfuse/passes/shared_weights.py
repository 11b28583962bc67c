"""Shared weights: identical weight tensors become one initializer.

    W_a ─► MatMul (layer 0)             W ─┬─► MatMul (layer 0)
    W_b ─► MatMul (layer 1)     ==>        └─► MatMul (layer 1)
    (W_a, W_b equal in dtype, shape and every byte)

ALBERT runs one encoder layer L times. tf2onnx and the fusions each write their own copy of
what that layer reads (a transposed Gemm weight per use, a packed QKV weight and the
LayerNorm parameters per fused layer), so a model that shares its weights would leave
bertfuse L times its size. Merging by content is exact, and it also catches weights that a
model repeats without meaning to share them.

Candidates: every constant input of 16 values or more; a copy of one seen before ends fused
(merged into it), the rest are the first of their content (nothing to merge, not a miss).
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import Layers, PassResult

# Scalars and shape vectors are folded constants, not weights: leave them.
_MIN_VALUES = 16


class SharedWeights:
    name = "shared_weights"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        layers = Layers(graph)
        first: dict[tuple, gs.Constant] = {}
        for node in graph.nodes:
            for i, t in enumerate(node.inputs):
                if not isinstance(t, gs.Constant) or t.values.size < _MIN_VALUES:
                    continue
                values = np.ascontiguousarray(t.values)
                key = (values.dtype.str, values.shape,
                       hashlib.blake2b(values.tobytes(), digest_size=16).digest())
                kept = first.setdefault(key, t)
                if kept is not t:
                    node.inputs[i] = kept
                    result.fused(self.name, layers.of(node))
        if result.rewrites:
            graph.cleanup()
        return result
