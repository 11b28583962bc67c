"""ai.onnx LayerNormalization (opset 17): contract, NumPy reference, one-node model.

bertfuse leaves a LayerNormalization wherever no Skip/Embed fusion applies (e.g. the embedding
LN when EmbedLayerNormalization is not used). The helper ``layer_norm64`` is shared by the
Skip/Embed references so all three normalise identically.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx

from bertfuse.ops.contract import ONNX_DOMAIN, AttrSpec, OpContract, TensorSpec, one_node_model

_FLOATS = ("float32", "float16", "bfloat16", "float64")

CONTRACT = OpContract(
    op_type="LayerNormalization",
    domain=ONNX_DOMAIN,
    since_version=17,
    summary="Y = (X - mean) / sqrt(var + epsilon) * Scale + B, statistics over axes [axis, rank).",
    inputs=(
        TensorSpec("X", ("B", "S", "H"), _FLOATS, doc="any rank; BERT uses [B,S,H]"),
        TensorSpec("Scale", ("H",), _FLOATS, doc="gamma; broadcast over the normalised axes"),
        TensorSpec("B", ("H",), _FLOATS, optional=True, doc="beta"),
    ),
    outputs=(
        TensorSpec("Y", ("B", "S", "H"), _FLOATS),
        TensorSpec("Mean", ("B", "S", "1"), ("float32",), optional=True, doc="type U = stash_type"),
        TensorSpec("InvStdDev", ("B", "S", "1"), ("float32",), optional=True, doc="1/sqrt(var+eps), type U"),
    ),
    attributes=(
        AttrSpec("axis", "int", -1, "first normalised axis; BERT: -1 (hidden)"),
        AttrSpec("epsilon", "float", 1e-5, "added to the biased variance; TF BERT uses 1e-12"),
        AttrSpec("stash_type", "int", 1, "precision of mean/var: 1 = float32 (TensorProto.FLOAT)"),
    ),
    cpu_kernel_types=("float32", "float16", "float64", "bfloat16"),
    pitfalls=(
        "Default epsilon is 1e-5, but Google BERT uses 1e-12: always set it explicitly.",
        "Variance is the biased (population) variance, as in TF's tf.nn.moments.",
        "Mean/InvStdDev keep the normalised axes as size-1 dims and have type U (float32 with stash_type=1).",
    ),
)


class LayerNormOutputs(NamedTuple):
    Y: np.ndarray
    Mean: np.ndarray
    InvStdDev: np.ndarray


def layer_norm64(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, epsilon: float, axis: int = -1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 LN over axes [axis, rank); returns (y, mean, inv_std) with keepdims stats."""
    x64 = np.asarray(x, dtype=np.float64)
    axis = axis % x64.ndim
    axes = tuple(range(axis, x64.ndim))
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)  # biased, like TF moments
    inv_std = 1.0 / np.sqrt(var + float(epsilon))
    y = (x64 - mean) * inv_std * np.asarray(gamma, dtype=np.float64)
    if beta is not None:
        y = y + np.asarray(beta, dtype=np.float64)
    return y, mean, inv_std


def reference_outputs(
    X: np.ndarray,
    Scale: np.ndarray,
    B: np.ndarray | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> LayerNormOutputs:
    # stash_type only picks the kernel's accumulation precision; float64 covers either value.
    del stash_type
    y, mean, inv_std = layer_norm64(X, Scale, B, epsilon, axis)
    return LayerNormOutputs(y.astype(X.dtype), mean.astype(np.float32), inv_std.astype(np.float32))


def reference(
    X: np.ndarray,
    Scale: np.ndarray,
    B: np.ndarray | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> np.ndarray:
    return reference_outputs(X, Scale, B, axis=axis, epsilon=epsilon, stash_type=stash_type).Y


def make_model(
    shape: tuple[int | str, ...],
    dtype: type | np.dtype = np.float32,
    *,
    epsilon: float = 1e-12,
    axis: int = -1,
    stash_type: int = 1,
    with_bias: bool = True,
    with_stats: bool = False,
) -> onnx.ModelProto:
    """One LayerNormalization node; input names are the contract's (X, Scale, B)."""
    norm_shape = tuple(shape[axis % len(shape):])
    stat_shape = tuple(shape[: axis % len(shape)]) + (1,) * len(norm_shape)
    return one_node_model(
        "LayerNormalization",
        ONNX_DOMAIN,
        [("X", dtype, shape), ("Scale", dtype, norm_shape), ("B", dtype, norm_shape) if with_bias else None],
        [
            ("Y", dtype, shape),
            ("Mean", np.float32, stat_shape) if with_stats else None,
            ("InvStdDev", np.float32, stat_shape) if with_stats else None,
        ],
        {"axis": axis, "epsilon": float(epsilon), "stash_type": stash_type},
    )
