"""tf2onnx handlers for TF ops with known math that tf2onnx 1.17 does not map.

Each handler rewrites one TF op into standard ONNX ops inside tf2onnx's graph. Ops that are
neither mapped by tf2onnx nor here make the export fail with the op and node named.
"""

from __future__ import annotations

from typing import Any, Callable


def _gelu(ctx: Any, node: Any, name: str, args: list) -> None:
    """TF's fused `Gelu` op (tf.nn.gelu may lower to it): x * 0.5 * (1 + erf(x / sqrt(2)))
    or, with approximate=True, the tanh form."""
    import numpy as np

    approximate = bool(node.get_attr_value("approximate", False))
    x = node.input[0]
    dtype = ctx.get_dtype(x)
    np_dtype = np.float16 if dtype == 10 else np.float32

    def const(v: float) -> str:
        return ctx.make_const(ctx.make_node("Const", []).name + "_c",
                              np.array(v, np_dtype)).output[0]

    if approximate:
        cube = ctx.make_node("Mul", [x, ctx.make_node("Mul", [x, x]).output[0]]).output[0]
        inner = ctx.make_node("Add", [x, ctx.make_node("Mul", [cube, const(0.044715)]).output[0]])
        scaled = ctx.make_node("Mul", [inner.output[0], const(float(np.sqrt(2 / np.pi)))])
        core = ctx.make_node("Tanh", [scaled.output[0]]).output[0]
    else:
        core = ctx.make_node("Erf", [ctx.make_node("Mul", [x, const(float(1 / np.sqrt(2)))]).output[0]]).output[0]
    cdf = ctx.make_node("Mul", [ctx.make_node("Add", [core, const(1.0)]).output[0], const(0.5)])
    ctx.remove_node(node.name)
    ctx.make_node("Mul", [x, cdf.output[0]], outputs=node.output, name=node.name)


def custom_op_handlers() -> dict[str, tuple[Callable, list]]:
    return {"Gelu": (_gelu, [])}
