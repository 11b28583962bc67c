"""TF's Erfc, which tf2onnx leaves in the graph unmapped, rewritten as 1 - Erf.

ONNX has Erf and no Erfc, so a model holding one passes neither onnx's checker nor ONNX
Runtime's load. TensorFlow's exact GELU (tf.nn.gelu, and so Keras' and tf_keras' `gelu`,
keras-hub's and Model Garden's encoders) computes 0.5·x·erfc(-x/√2); a user's own
`python -m tf2onnx.convert` export keeps that Erfc as an op of the default domain (tf2onnx
logs "Unsupported ops: Counter({'Erfc': N})" and writes the file anyway):

    x ─┬─► Mul(-1/√2) ─► z ─► Erfc ─► Mul(0.5) ─┐              (tf2onnx's export)
       └───────────────────────────────────────► Mul ─► y

    z ─► Erfc ─► e                                             (before)
    z ─► Erf ─► Sub(1, ·) ─► e                                 (after: erfc(z) = 1 - erf(z))

after which the region around the Erf computes x·Φ(x), the exact GELU that passes/gelu.py
fuses like any other. `bertfuse convert` maps TF's Erfc the same way inside tf2onnx
(converter/handlers.py); this is the same rewrite for a graph tf2onnx already wrote, run by
`optimize` when it loads the model, before onnx's checker sees it (so a function on the
ModelProto, not a pass of the plan).

Candidates: every Erfc of the default domain; each is rewritten (there is nothing to match:
1 - erf(z) is erfc(z) for every z).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
_SAME_TYPE = {"Mul", "Div", "Add", "Sub", "Neg", "Abs", "Identity", "Reshape", "Transpose",
              "Squeeze", "Unsqueeze", "Erf", "Erfc", "Relu", "Sqrt", "Pow"}


def erfc_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "Erfc" and n.domain in ("", "ai.onnx")]


def rewrite_erfc(model: onnx.ModelProto) -> int:
    """Every Erfc of the main graph as Sub(1, Erf), in place; the number rewritten."""
    found = erfc_nodes(model)
    if not found:
        return 0
    types = _known_types(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    nodes: list[onnx.NodeProto] = []
    taken = {n.name for n in model.graph.node} | {o for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node not in found:
            nodes.append(node)
            continue
        dtype = _float_type(node.input[0], types, producers)
        base = _fresh(node.name or node.output[0], taken)
        one = helper.make_node("Constant", [], [f"{base}/one"], name=f"{base}/one",
                               value=numpy_helper.from_array(
                                   np.array(1.0, helper.tensor_dtype_to_np_dtype(dtype))))
        erf = helper.make_node("Erf", [node.input[0]], [f"{base}/erf"], name=f"{base}/erf")
        sub = helper.make_node("Sub", [f"{base}/one", f"{base}/erf"], list(node.output),
                               name=node.name or f"{base}/erfc")
        nodes += [one, erf, sub]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return len(found)


def _fresh(base: str, taken: set[str]) -> str:
    name, i = f"{base}/as_erf", 1
    while any(f"{name}/{s}" in taken for s in ("one", "erf", "erfc")):
        name, i = f"{base}/as_erf_{i}", i + 1
    return name


def _known_types(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)
             if v.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in g.initializer})
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            types[n.output[0]] = n.attribute[0].t.data_type
        elif n.op_type == "Cast":
            types[n.output[0]] = next(a.i for a in n.attribute if a.name == "to")
    return types


def _float_type(name: str, types: dict[str, int], producers: dict[str, onnx.NodeProto]) -> int:
    """The float type of `name`, read off the graph upstream through ops that keep their
    input's type (tf2onnx writes no value_info for it); float32 where nothing says."""
    seen, todo = set(), [name]
    while todo and len(seen) < 64:
        t = todo.pop(0)
        if t in seen:
            continue
        seen.add(t)
        if types.get(t) in _FLOATS:
            return types[t]
        node = producers.get(t)
        if node is not None and node.op_type in _SAME_TYPE:
            todo += [i for i in node.input[:2] if i]
    return TensorProto.FLOAT
