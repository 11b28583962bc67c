"""com.microsoft GELU family: Gelu, BiasGelu, FastGelu, GemmFastGelu — contracts, reference, model.

Google BERT's ``gelu`` is the tanh approximation (FastGelu); TF2/Keras ``gelu(approximate=False)``
and HF's "gelu" are the exact erf form (Gelu/BiasGelu). Fusing one into the other is a real
numeric change (max |diff| ~5e-4 near |x|~2), so the fusion must preserve which one the source used.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import onnx

from bertfuse.ops.contract import MS_DOMAIN, OpContract, TensorSpec, one_node_model

_T = ("float32", "float16", "float64", "bfloat16")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # 0.7978845608...
_TANH_CUBIC = 0.044715

_BIAS_DOC = "1-D, length = last dim of the input (ORT rejects any other rank/length)"

GELU = OpContract(
    op_type="Gelu",
    domain=MS_DOMAIN,
    since_version=1,
    summary="Y = 0.5 * X * (1 + erf(X / sqrt(2))) — exact GELU, no bias.",
    inputs=(TensorSpec("X", ("...",), _T),),
    outputs=(TensorSpec("Y", ("...",), _T),),
    cpu_kernel_types=("float32",),
    pitfalls=("com.microsoft.Gelu has no bias input; ai.onnx Gelu (opset 20) is a different op with an "
              "'approximate' attribute.",),
)

BIAS_GELU = OpContract(
    op_type="BiasGelu",
    domain=MS_DOMAIN,
    since_version=1,
    summary="C = Gelu(A + B) with exact erf GELU; B broadcast over the last axis.",
    inputs=(TensorSpec("A", ("...", "H"), _T), TensorSpec("B", ("H",), _T, doc=_BIAS_DOC)),
    outputs=(TensorSpec("C", ("...", "H"), _T),),
    cpu_kernel_types=("float32",),
    pitfalls=("B is not optional and must be 1-D [H]; a [1,H] bias fails at run time.",
              "Exact erf GELU: do not use it for Google-BERT checkpoints' tanh gelu (use FastGelu)."),
)

FAST_GELU = OpContract(
    op_type="FastGelu",
    domain=MS_DOMAIN,
    since_version=1,
    summary="Y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), x = X + bias.",
    inputs=(TensorSpec("X", ("...", "H"), _T), TensorSpec("bias", ("H",), _T, optional=True, doc=_BIAS_DOC)),
    outputs=(TensorSpec("Y", ("...", "H"), _T),),
    cpu_kernel_types=("float32",),
    pitfalls=("The schema doc prints rounded constants (0.797885, 0.035677); the kernels use sqrt(2/pi) and "
              "0.044715*sqrt(2/pi) at full precision.",),
)

GEMM_FAST_GELU = OpContract(
    op_type="GemmFastGelu",
    domain=MS_DOMAIN,
    since_version=1,
    summary="Y = FastGelu(X @ W + bias).",
    inputs=(
        TensorSpec("X", ("...", "K"), ("float32", "float16", "bfloat16")),
        TensorSpec("W", ("K", "N"), ("float32", "float16", "bfloat16")),
        TensorSpec("bias", ("N",), ("float32", "float16", "bfloat16"), optional=True),
    ),
    outputs=(TensorSpec("Y", ("...", "N"), ("float32", "float16", "bfloat16")),),
    cpu_kernel_types=(),
    pitfalls=("No CPU kernel (ORT 1.32: NOT_IMPLEMENTED at session creation) and none in the CUDA EP's kernel "
              "table either; the only kernel is the ROCm EP's. bertfuse must emit MatMul + FastGelu(bias) for "
              "CPU/CUDA targets.",),
)

CONTRACTS: dict[str, OpContract] = {c.op_type: c for c in (GELU, BIAS_GELU, FAST_GELU, GEMM_FAST_GELU)}

GeluOp = Literal["Gelu", "BiasGelu", "FastGelu", "GemmFastGelu"]

_erf = np.vectorize(math.erf, otypes=[np.float64])  # libm erf; NumPy has none and arrays here are small


def reference(x: np.ndarray, bias: np.ndarray | None = None, *, approximate: bool = False) -> np.ndarray:
    """GELU(x + bias): exact erf form, or the tanh form when approximate=True (FastGelu)."""
    t = np.asarray(x, np.float64)
    if bias is not None:
        t = t + np.asarray(bias, np.float64)
    if approximate:
        y = 0.5 * t * (1.0 + np.tanh(_SQRT_2_OVER_PI * (t + _TANH_CUBIC * t**3)))
    else:
        y = 0.5 * t * (1.0 + _erf(t / math.sqrt(2.0)))
    return y.astype(x.dtype)


def gemm_fast_gelu_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    xw = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    return reference(xw, None if bias is None else np.asarray(bias, np.float64), approximate=True).astype(x.dtype)


def reference_for(op_type: GeluOp, *args: np.ndarray | None) -> np.ndarray:
    """Reference by op name, args in the op's input order."""
    if op_type == "Gelu":
        return reference(args[0])  # type: ignore[arg-type]
    if op_type == "BiasGelu":
        return reference(args[0], args[1])  # type: ignore[arg-type]
    if op_type == "FastGelu":
        return reference(args[0], args[1] if len(args) > 1 else None, approximate=True)  # type: ignore[arg-type]
    if op_type == "GemmFastGelu":
        return gemm_fast_gelu_reference(args[0], args[1], args[2] if len(args) > 2 else None)  # type: ignore[arg-type]
    raise ValueError(op_type)


def make_model(
    op_type: GeluOp,
    shape: tuple[int | str, ...],
    dtype: type | np.dtype = np.float32,
    *,
    with_bias: bool = True,
    n_out: int | None = None,
) -> onnx.ModelProto:
    """One node of the GELU family. shape is X's shape; n_out is N for GemmFastGelu."""
    h = shape[-1]
    if op_type == "Gelu":
        ins = [("X", dtype, shape)]
        out = ("Y", dtype, shape)
    elif op_type == "BiasGelu":  # bias is mandatory
        ins = [("A", dtype, shape), ("B", dtype, (h,))]
        out = ("C", dtype, shape)
    elif op_type == "FastGelu":
        ins = [("X", dtype, shape), ("bias", dtype, (h,)) if with_bias else None]
        out = ("Y", dtype, shape)
    elif op_type == "GemmFastGelu":
        if n_out is None:
            raise ValueError("GemmFastGelu needs n_out")
        ins = [("X", dtype, shape), ("W", dtype, (h, n_out)), ("bias", dtype, (n_out,)) if with_bias else None]
        out = ("Y", dtype, tuple(shape[:-1]) + (n_out,))
    else:
        raise ValueError(op_type)
    return one_node_model(op_type, MS_DOMAIN, ins, [out])
