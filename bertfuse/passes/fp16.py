"""FP16: weights and activations in half precision; int32 ids in, fp32 outputs out.

    input_ids (int32) ─► EmbedLayerNorm(fp16 tables) ─► Attention(fp16) ─► ... ─► Cast(fp32) ─► output

Every float initializer and Constant becomes fp16, Casts to float inside the graph cast to
fp16 instead, and each float graph output gets one Cast back to fp32 at the very end, so no
Cast sits between fused ops. Constants are clamped to fp16's finite range (a -1e9 or
float32-min mask constant would otherwise become -inf and turn a fully padded row into NaN).
Attention's mask_filter_value is already at most -10000 in magnitude (attention.py).

Candidates: every float32 initializer; each ends converted (fused), or missed when values
beyond fp16's range had to be clamped (the conversion is then not exact; a mask constant's
clamp is harmless). Constant attributes, Casts and outputs follow without being itemised.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from bertfuse.passes.base import Layers, PassResult

FP16_MAX = float(np.finfo(np.float16).max)


def _half(values: np.ndarray) -> np.ndarray:
    # np.asarray: a 0-d array through np.clip comes back a NumPy scalar, which gs.Constant
    # rejects when the graph is copied (fold_constants then silently does nothing)
    return np.asarray(np.clip(values, -FP16_MAX, FP16_MAX).astype(np.float16))


class Fp16Pass:
    name = "fp16"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        layers = Layers(graph)
        tensors = graph.tensors()
        for t in tensors.values():
            if isinstance(t, gs.Constant) and t.values.dtype == np.float32:
                values = np.asarray(t.values)
                clamped = int(np.count_nonzero(np.abs(values) > FP16_MAX))
                t.values = _half(values)
                layer = layers.of(t.outputs[0]) if t.outputs else None
                if clamped:
                    result.missed(self.name, f"{t.name}: {clamped} values beyond fp16's range "
                                             f"clamped to +-{FP16_MAX:g}", layer)
                    result.rewrites += 1
                else:
                    result.fused(self.name, layer)
            elif isinstance(t, gs.Variable) and t.dtype is not None and \
                    np.dtype(t.dtype) == np.float32:
                t.dtype = np.float16
        for node in graph.nodes:
            # Every float32 tensor attribute (Constant's and ConstantOfShape's 'value', ...).
            for key, value in list(node.attrs.items()):
                if isinstance(value, gs.Constant) and \
                        np.asarray(value.values).dtype == np.float32:
                    node.attrs[key] = gs.Constant(value.name, _half(np.asarray(value.values)))
            if node.op == "Constant" and "value_float" in node.attrs:
                node.attrs["value"] = gs.Constant(
                    f"{node.name}_value", _half(np.array(node.attrs.pop("value_float"), np.float32)))
            if node.op == "Constant" and "value_floats" in node.attrs:
                node.attrs["value"] = gs.Constant(f"{node.name}_value", _half(
                    np.array(node.attrs.pop("value_floats"), np.float32).reshape(-1)))
            if node.op == "ConstantOfShape" and "value" not in node.attrs:
                # the default value is a float32 zero
                node.attrs["value"] = gs.Constant(f"{node.name}_value", np.zeros([1], np.float16))
            if node.op == "Cast" and node.attrs.get("to") == TensorProto.FLOAT:
                node.attrs["to"] = TensorProto.FLOAT16
        for i, out in enumerate(list(graph.outputs)):
            if out.dtype is None or np.dtype(out.dtype) != np.float16:
                continue
            half = gs.Variable(f"{out.name}_fp16", dtype=np.float16, shape=out.shape)
            for node in list(out.inputs):
                node.outputs = [half if o is out else o for o in node.outputs]
            for node in list(out.outputs):
                node.inputs = [half if x is out else x for x in node.inputs]
            out.dtype = np.float32
            graph.nodes.append(gs.Node("Cast", f"{out.name}_to_fp32", {"to": TensorProto.FLOAT},
                                       inputs=[half], outputs=[out]))
        return result
