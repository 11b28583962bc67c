"""com.microsoft SkipLayerNormalization: contract, NumPy reference, one-node model.

bertfuse emits it for every BERT residual block: LayerNorm(dense_out + bias + residual).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx

from bertfuse.ops.contract import MS_DOMAIN, AttrSpec, OpContract, TensorSpec, one_node_model
from bertfuse.ops.contrib.layernorm import layer_norm64

_T = ("float32", "float16", "bfloat16")
DEFAULT_EPSILON = 1e-12  # ORT's kDefaultSkipLayerNormEpsilon (decoded from the schema default)

CONTRACT = OpContract(
    op_type="SkipLayerNormalization",
    domain=MS_DOMAIN,
    since_version=1,
    summary="output = LayerNorm(input + skip + bias) * gamma + beta over the last axis.",
    inputs=(
        TensorSpec("input", ("B", "S", "H"), _T, doc="3-D"),
        TensorSpec("skip", ("B", "S", "H"), _T, doc="or [1,S,H] or [S,H] (broadcast over batch)"),
        TensorSpec("gamma", ("H",), _T),
        TensorSpec("beta", ("H",), _T, optional=True),
        TensorSpec("bias", ("H",), _T, optional=True, doc="added BEFORE normalisation (the Dense bias)"),
    ),
    outputs=(
        TensorSpec("output", ("B", "S", "H"), _T),
        TensorSpec("mean", ("B", "S", "1"), ("float32",), optional=True, doc="type U=float32 even for fp16 T"),
        TensorSpec("inv_std_var", ("B", "S", "1"), ("float32",), optional=True, doc="1/sqrt(var+eps), float32"),
        TensorSpec("input_skip_bias_sum", ("B", "S", "H"), _T, optional=True,
                   doc="input+skip+bias, pre-LN; lets the next residual reuse it"),
    ),
    attributes=(AttrSpec("epsilon", "float", DEFAULT_EPSILON, "added to the biased variance"),),
    cpu_kernel_types=("float32", "float16", "float64", "bfloat16"),
    pitfalls=(
        "Outputs are positional: to get input_skip_bias_sum without mean/inv_std_var, name slots 1-2 ''.",
        "bias is added before LN (it is the preceding Dense bias), beta after: swapping them is not an error, "
        "just wrong numbers.",
        "Default epsilon is 1e-12 (same as Google BERT), unlike ai.onnx LayerNormalization's 1e-5.",
        "mean/inv_std_var are float32 with shape [B,S,1] even when T is float16.",
    ),
)


class SkipLayerNormOutputs(NamedTuple):
    output: np.ndarray
    mean: np.ndarray
    inv_std_var: np.ndarray
    input_skip_bias_sum: np.ndarray


def reference_outputs(
    input: np.ndarray,
    skip: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    epsilon: float = DEFAULT_EPSILON,
) -> SkipLayerNormOutputs:
    # float64 sum, rounded once to T: matches ORT, which accumulates fp16 in float32.
    s = np.asarray(input, np.float64) + np.asarray(skip, np.float64)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    y, mean, inv_std = layer_norm64(s, gamma, beta, epsilon)
    t = input.dtype
    return SkipLayerNormOutputs(y.astype(t), mean.astype(np.float32), inv_std.astype(np.float32), s.astype(t))


def reference(
    input: np.ndarray,
    skip: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    epsilon: float = DEFAULT_EPSILON,
) -> np.ndarray:
    return reference_outputs(input, skip, gamma, beta, bias, epsilon=epsilon).output


def make_model(
    shape: tuple[int | str, int | str, int],
    dtype: type | np.dtype = np.float32,
    *,
    skip_shape: tuple[int | str, ...] | None = None,
    epsilon: float = DEFAULT_EPSILON,
    with_beta: bool = True,
    with_bias: bool = True,
    all_outputs: bool = False,
) -> onnx.ModelProto:
    """One SkipLayerNormalization node; all_outputs=True also exposes mean/inv_std_var/sum."""
    h = shape[-1]
    stat_shape = tuple(shape[:-1]) + (1,)
    return one_node_model(
        "SkipLayerNormalization",
        MS_DOMAIN,
        [
            ("input", dtype, shape),
            ("skip", dtype, skip_shape or shape),
            ("gamma", dtype, (h,)),
            ("beta", dtype, (h,)) if with_beta else None,
            ("bias", dtype, (h,)) if with_bias else None,
        ],
        [
            ("output", dtype, shape),
            ("mean", np.float32, stat_shape) if all_outputs else None,
            ("inv_std_var", np.float32, stat_shape) if all_outputs else None,
            ("input_skip_bias_sum", dtype, shape) if all_outputs else None,
        ],
        {"epsilon": float(epsilon)},
    )
