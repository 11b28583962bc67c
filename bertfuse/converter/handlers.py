"""tf2onnx handlers for TF ops with known math that tf2onnx 1.17 does not map.

Each handler rewrites one TF op into standard ONNX ops inside tf2onnx's graph. Ops mapped
neither by tf2onnx nor here make the export fail with the op and node named (export.py).

* Erfc: Keras 3's exact GELU (tf.nn.gelu) is 0.5·x·erfc(-x/√2); ONNX has Erf but no Erfc.
  erfc(z) = 1 - erf(z).
"""

from __future__ import annotations

from typing import Any, Callable


def _erfc(ctx: Any, node: Any, name: str, args: list) -> None:
    import numpy as np
    from onnx import TensorProto
    from tf2onnx import utils

    dtype = ctx.get_dtype(node.output[0])
    np_dtype = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    node.type = "Erf"
    one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1.0, np_dtype))
    ctx.insert_new_node_on_output("Sub", node.output[0], name=utils.make_name(f"{node.name}_erfc"),
                                  inputs=[one.output[0], node.output[0]])


def custom_op_handlers() -> dict[str, tuple[Callable, list]]:
    return {"Erfc": (_erfc, [])}
