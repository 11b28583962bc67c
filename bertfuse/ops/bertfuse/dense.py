"""ai.bertfuse dense ops (one GEMM with its epilogue): DenseBias, DenseBiasGelu,
DenseBiasSkipLayerNorm — contracts, NumPy references, one-node models.

They replace what ONNX Runtime runs as two kernels, a GEMM and then an elementwise op:

    MatMul(X, W) ─► [Attention's QKV bias]          ==>  DenseBias(X, W, bias)
    MatMul(X, W) ─► BiasGelu(bias) | FastGelu(bias) ==>  DenseBiasGelu(X, W, bias, approximate)
    MatMul(X, W) ─► SkipLayerNormalization(skip, gamma, beta, bias)
                                                    ==>  DenseBiasSkipLayerNorm(X, W, bias, skip, gamma, beta)

W is ONNX MatMul's B ([K, N] row-major, TF Dense's kernel). fp16 tensors, fp32 accumulation;
the references compute in float64 and round once to fp16. CUDA EP only: no CPU kernel.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import onnx

from bertfuse.ops.contrib import gelu
from bertfuse.ops.contract import BERTFUSE_DOMAIN, AttrSpec, OpContract, TensorSpec, one_node_model
from bertfuse.ops.contrib.layernorm import layer_norm64
from bertfuse.ops.contrib.skip_layernorm import DEFAULT_EPSILON

_T = ("float16",)
_X = TensorSpec("X", ("...", "K"), _T, doc="M = product of the leading dims")
_W = TensorSpec("W", ("K", "N"), _T, doc="ONNX MatMul's B, row-major (TF Dense kernel)")
_BIAS = TensorSpec("bias", ("N",), _T, doc="added in the GEMM epilogue")
_YQ = TensorSpec("Yq", ("...", "N"), ("float8e4m3fn",), optional=True,
                 doc="e4m3_satfinite(Y * (1 / yq_scale)), for an FP8 op downstream; needs yq_scale")
_YQ_SCALE = AttrSpec("yq_scale", "float", None,
                     "the scale of output Yq (finite, > 0; required when Yq is requested)")
_PITFALL_W = ("W is [K, N] like ONNX MatMul's B and TF's Dense kernel; PyTorch Linear weights "
              "([N, K]) must be transposed first.")

DENSE_BIAS = OpContract(
    op_type="DenseBias",
    domain=BERTFUSE_DOMAIN,
    since_version=1,
    summary="Y = X @ W + bias (the QKV projection ahead of BertAttention).",
    inputs=(_X, _W, _BIAS),
    outputs=(TensorSpec("Y", ("...", "N"), _T, doc="X's leading dims kept"), _YQ),
    attributes=(_YQ_SCALE,),
    pitfalls=(_PITFALL_W,),
)

DENSE_BIAS_GELU = OpContract(
    op_type="DenseBiasGelu",
    domain=BERTFUSE_DOMAIN,
    since_version=1,
    summary="Y = gelu(X @ W + bias), exact erf GELU or its tanh approximation.",
    inputs=(_X, _W, _BIAS),
    outputs=(TensorSpec("Y", ("...", "N"), _T, optional=True,
                        doc="may be left off where Yq is asked for (an FP8 GEMM reads Yq and "
                            "nothing reads Y): the op then keeps Y in scratch"), _YQ),
    attributes=(AttrSpec("approximate", "int", 0,
                         "0 = exact erf GELU (BiasGelu), 1 = tanh approximation (FastGelu)"),
                _YQ_SCALE),
    pitfalls=(_PITFALL_W,
              "approximate picks the GELU: 0 erf (HF 'gelu', Keras), 1 tanh (Google BERT's "
              "modeling.py, HF 'gelu_new'); they differ by up to ~5e-4, so the wrong one drifts."),
)

DENSE_BIAS_SKIP_LAYERNORM = OpContract(
    op_type="DenseBiasSkipLayerNorm",
    domain=BERTFUSE_DOMAIN,
    since_version=1,
    summary="Y = LayerNorm(X @ W + bias + skip) * gamma + beta over N (fp32 statistics).",
    inputs=(_X, _W, _BIAS,
            TensorSpec("skip", ("...", "N"), _T, doc="the residual; same shape as Y (no broadcast)"),
            TensorSpec("gamma", ("N",), _T),
            TensorSpec("beta", ("N",), _T)),
    outputs=(TensorSpec("Y", ("...", "N"), _T), _YQ,
             TensorSpec("Y32", ("...", "N"), ("float32",), optional=True,
                        doc="Y in fp32, before its rounding to fp16: a graph's fp32 output "
                            "with no Cast kernel after the op")),
    attributes=(AttrSpec("epsilon", "float", DEFAULT_EPSILON, "added to the biased variance"),
                _YQ_SCALE),
    pitfalls=(_PITFALL_W,
              "skip must have Y's shape: SkipLayerNormalization's broadcast skip ([1,S,H], "
              "[S,H]) is not taken.",
              "beta is required (zeros where the source has none); epsilon defaults to 1e-12 "
              "like SkipLayerNormalization, not LayerNormalization's 1e-5."),
)

CONTRACTS: dict[str, OpContract] = {c.op_type: c for c in (DENSE_BIAS, DENSE_BIAS_GELU,
                                                             DENSE_BIAS_SKIP_LAYERNORM)}

DenseOp = Literal["DenseBias", "DenseBiasGelu", "DenseBiasSkipLayerNorm"]


def _affine64(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    _check_dense(x, w, bias)
    flat = np.asarray(x, np.float64).reshape(-1, x.shape[-1])  # one GEMM, not one per row of B
    y = flat @ np.asarray(w, np.float64) + np.asarray(bias, np.float64)
    return y.reshape(tuple(x.shape[:-1]) + (w.shape[1],))


def _check_dense(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> None:
    if w.ndim != 2 or x.shape[-1] != w.shape[0] or bias.shape != (w.shape[1],):
        raise ValueError(f"X {list(x.shape)}, W {list(w.shape)}, bias {list(bias.shape)}: "
                         f"expected X [.., K], W [K, N], bias [N]")


def dense_bias(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return _affine64(x, w, bias).astype(x.dtype)


def dense_bias_gelu(x: np.ndarray, w: np.ndarray, bias: np.ndarray, *,
                    approximate: int = 0) -> np.ndarray:
    if approximate not in (0, 1):
        raise ValueError(f"approximate must be 0 or 1, got {approximate!r}")
    return gelu.reference(_affine64(x, w, bias), approximate=bool(approximate)).astype(x.dtype)


def dense_bias_skip_layernorm64(x: np.ndarray, w: np.ndarray, bias: np.ndarray,
                                skip: np.ndarray, gamma: np.ndarray, beta: np.ndarray, *,
                                epsilon: float = DEFAULT_EPSILON) -> np.ndarray:
    """Y in float64, unrounded: Y is it rounded to X's dtype, Y32 to float32."""
    s = _affine64(x, w, bias)
    if skip.shape != s.shape:
        raise ValueError(f"skip {list(skip.shape)} must have Y's shape {list(s.shape)}")
    y, _, _ = layer_norm64(s + np.asarray(skip, np.float64), gamma, beta, epsilon)
    return y


def dense_bias_skip_layernorm(x: np.ndarray, w: np.ndarray, bias: np.ndarray, skip: np.ndarray,
                              gamma: np.ndarray, beta: np.ndarray, *,
                              epsilon: float = DEFAULT_EPSILON) -> np.ndarray:
    return dense_bias_skip_layernorm64(x, w, bias, skip, gamma, beta,
                                       epsilon=epsilon).astype(x.dtype)


def reference(op_type: DenseOp, *inputs: np.ndarray, **attrs) -> np.ndarray:
    """Reference by op name, inputs in the op's slot order."""
    fn = {"DenseBias": dense_bias, "DenseBiasGelu": dense_bias_gelu,
          "DenseBiasSkipLayerNorm": dense_bias_skip_layernorm}[op_type]
    return fn(*inputs, **attrs)


def make_model(op_type: DenseOp, x_shape: tuple[int | str, ...], n_out: int,
               dtype: type | np.dtype = np.float16, *, approximate: int | None = None,
               epsilon: float | None = None, y32: bool = False) -> onnx.ModelProto:
    """One node; graph inputs carry the slot names (X, W, bias[, skip, gamma, beta]); y32
    (DenseBiasSkipLayerNorm) adds output Y32 beside Y."""
    if y32 and op_type != "DenseBiasSkipLayerNorm":
        raise ValueError(f"{op_type} has no output Y32")
    k = x_shape[-1]
    y_shape = tuple(x_shape[:-1]) + (n_out,)
    ins = [("X", dtype, x_shape), ("W", dtype, (k, n_out)), ("bias", dtype, (n_out,))]
    attrs: dict = {}
    if op_type == "DenseBiasGelu":
        attrs["approximate"] = approximate
    elif op_type == "DenseBiasSkipLayerNorm":
        ins += [("skip", dtype, y_shape), ("gamma", dtype, (n_out,)), ("beta", dtype, (n_out,))]
        attrs["epsilon"] = None if epsilon is None else float(epsilon)
    elif op_type != "DenseBias":
        raise ValueError(op_type)
    outs = [("Y", dtype, y_shape)] + ([None, ("Y32", np.float32, y_shape)] if y32 else [])
    return one_node_model(op_type, BERTFUSE_DOMAIN, ins, outs, attrs)
