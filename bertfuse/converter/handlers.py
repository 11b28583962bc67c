"""tf2onnx handlers for TF ops with known math that tf2onnx 1.17 does not map.

Each handler rewrites one TF op into standard ONNX ops inside tf2onnx's graph. Ops mapped
neither by tf2onnx nor here make the export fail with the op and node named (export.py).

* Erfc: Keras 3's exact GELU (tf.nn.gelu) is 0.5·x·erfc(-x/√2); ONNX has Erf but no Erfc.
  erfc(z) = 1 - erf(z).
* BroadcastArgs: the broadcast of two shapes (bert4keras's masking broadcasts the mask and the
  scores to one shape before its Select). shape(zeros(s0) + zeros(s1)), as ONNX's Add
  broadcasts: ConstantOfShape, Add, Shape (int64), Cast back to TF's int type.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from onnx import TensorProto, helper

from bertfuse.optional import optional


def _erfc(ctx: Any, node: Any, name: str, args: list) -> None:
    utils = optional("tf2onnx", "utils", why="tf2onnx exports the TF graph (tf extra)")

    dtype = ctx.get_dtype(node.output[0])
    np_dtype = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    node.type = "Erf"
    one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1.0, np_dtype))
    ctx.insert_new_node_on_output("Sub", node.output[0], name=utils.make_name(f"{node.name}_erfc"),
                                  inputs=[one.output[0], node.output[0]])


def _broadcast_args(ctx: Any, node: Any, name: str, args: list) -> None:
    utils = optional("tf2onnx", "utils", why="tf2onnx exports the TF graph (tf extra)")

    dtype = ctx.get_dtype(node.output[0])
    zero = helper.make_tensor("value", TensorProto.INT32, [1], [0])
    zeros = []
    for i, shape in enumerate(list(node.input)):
        wide = ctx.make_node("Cast", [shape], attr={"to": TensorProto.INT64},
                             name=utils.make_name(f"{node.name}_shape{i}"))
        filled = ctx.make_node("ConstantOfShape", [wide.output[0]], attr={"value": zero},
                               name=utils.make_name(f"{node.name}_zeros{i}"))
        zeros.append(filled.output[0])
    total = ctx.make_node("Add", zeros, name=utils.make_name(f"{node.name}_sum"))
    node.type = "Shape"
    ctx.replace_inputs(node, [total.output[0]])
    ctx.set_dtype(node.output[0], TensorProto.INT64)
    if dtype != TensorProto.INT64:
        ctx.insert_new_node_on_output("Cast", node.output[0], name=utils.make_name(
            f"{node.name}_cast"), to=dtype)
        ctx.set_dtype(node.output[0], TensorProto.INT64)


def custom_op_handlers() -> dict[str, tuple[Callable, list]]:
    return {"Erfc": (_erfc, []), "BroadcastArgs": (_broadcast_args, [])}
