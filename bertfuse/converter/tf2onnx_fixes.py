"""Two places where tf2onnx 1.17 writes a graph that differs from the TF math, fixed for the
duration of our export only.

* Reshape after Reshape. tf2onnx's reshape optimizer turns a computed shape into a constant
  where it can, writing 0 for "copy this dim of the input" (ONNX Reshape, allowzero 0):
  `Reshape(y, concat(shape(y)[0:2], [heads, d]))` becomes `Reshape(y, [0, 0, heads, d])`.
  Its back-to-back optimizer then merges `Reshape(Reshape(x, s1), s2)` into `Reshape(x, s2)`
  without looking at s2, so each 0 now copies a dim of x instead of y. A Dense layer on
  [B, S, H] (tf.tensordot: [B·S, H] @ W, Reshape back to [B, S, H]) followed by a split into
  heads (bert4keras) becomes Reshape([B·S, H], [0, 0, heads, d]): [B·S, H, heads, d], which
  ONNX Runtime refuses. Wherever a bias Add sits between the two Reshapes nothing merges, so
  a model shows this once a Dense has no bias: use_bias=False, or an all-zero bias (a freshly
  built bert4keras model), which the grappler pass tf2onnx runs first removes. The merge is
  kept whenever it is exact: s2 has no 0, or s1 copies each of those dims from x too.

* Select whose other branch is inf. tf2onnx writes a float Select as
  `cond·x + (1 - cond)·y` (Mul/Add, faster than Where in old ONNX Runtimes), which is NaN
  wherever the branch not taken is ±inf or NaN (0·inf). It keeps Where when a branch is a
  non-finite constant, but only a Const node directly: bert4keras masks attention scores with
  `where(mask, scores, broadcast_to(-inf, shape))`, so every score became NaN. The rewriter
  below sees through the broadcast (and the other ops that only repeat or relabel a value) to
  the constant and marks the Select `handles_nan`, the attribute tf2onnx's own handler reads.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np

from bertfuse.converter.handlers import custom_op_handlers
from bertfuse.optional import optional

# TF ops whose output holds only values of their first input (repeated, reshaped, relabelled)
_REPEATS_INPUT0 = ("BroadcastTo", "Identity", "Reshape", "ExpandDims", "Squeeze", "Tile",
                   "Cast", "StopGradient")
_SELECTS = ("Select", "SelectV2")


def _constant_behind(node: Any) -> np.ndarray | None:
    """The constant whose values `node`'s output repeats (through broadcasts, reshapes,
    Fill's value), or None."""
    for _ in range(32):
        if node is None:
            return None
        if node.is_const():
            return node.get_tensor_value(as_list=False)
        if node.type in _REPEATS_INPUT0 and node.inputs:
            node = node.inputs[0]
        elif node.type == "Fill" and len(node.inputs) == 2:  # Fill(dims, value)
            node = node.inputs[1]
        else:
            return None
    return None


def rewrite_select_nonfinite(g: Any, ops: list) -> list:
    """tf2onnx rewriter: a float Select with a ±inf/NaN constant branch keeps ONNX Where."""
    for node in ops:
        if node.type not in _SELECTS or len(node.inputs) != 3:
            continue
        for branch in node.inputs[1:]:
            value = _constant_behind(branch)
            if value is not None and np.issubdtype(value.dtype, np.floating) and \
                    not np.isfinite(value).all():
                node.set_attr("handles_nan", True)
                break
    return ops


def _merge_moves_copied_dims(first: Any, second: Any) -> bool:
    """Whether Reshape(Reshape(x, s1), s2) -> Reshape(x, s2) would change what a 0 in s2
    copies: s2 is a constant with 0 at a dim where s1 is not a constant 0 (ONNX Reshape's
    allowzero=1 means a real empty dim; nothing is copied then)."""
    shape2 = second.inputs[1] if len(second.inputs) > 1 else None
    if shape2 is None or not shape2.is_const() or second.get_attr_value("allowzero", 0):
        return False
    s2 = np.ravel(shape2.get_tensor_value(as_list=False))
    zeros = np.flatnonzero(s2 == 0)
    if zeros.size == 0:
        return False
    shape1 = first.inputs[1] if len(first.inputs) > 1 else None
    if shape1 is None or not shape1.is_const() or first.get_attr_value("allowzero", 0):
        return True
    s1 = np.ravel(shape1.get_tensor_value(as_list=False))
    return any(i >= s1.size or s1[i] != 0 for i in zeros)


@contextlib.contextmanager
def exact_reshape_merges() -> Iterator[None]:
    """While open, tf2onnx's back-to-back optimizer merges two Reshapes only when the result
    is the same tensor (see the module docstring); restored on exit."""
    b2b = optional("tf2onnx.optimizer", "back_to_back_optimizer",
                   why="tf2onnx exports the TF graph (tf extra)")

    key = ("Reshape",)
    original = b2b._func_map.get(key)
    if original is None:  # another tf2onnx: nothing of ours to guard
        yield
        return

    def merge(g: Any, node: Any, consumers: list) -> list:
        if len(consumers) == 1 and consumers[0].type == "Reshape" and \
                _merge_moves_copied_dims(node, consumers[0]):
            return []
        return original(g, node, consumers)

    b2b._func_map[key] = merge
    try:
        yield
    finally:
        b2b._func_map[key] = original


def from_graph_def(graph_def: Any, input_names: list[str], output_names: list[str],
                   opset: int) -> Any:
    """tf2onnx.convert.from_graph_def with bertfuse's handlers and the two fixes above."""
    tf2onnx = optional("tf2onnx", why="tf2onnx exports the TF graph (tf extra)")

    with exact_reshape_merges():
        model, _ = tf2onnx.convert.from_graph_def(
            graph_def, input_names=input_names, output_names=output_names, opset=opset,
            custom_op_handlers=custom_op_handlers(), custom_rewriter=[rewrite_select_nonfinite])
    return model
