"""ai.bertfuse FP8 dense ops (opt-in, `--fp8`): DenseBiasFp8, DenseBiasGeluFp8,
DenseBiasSkipLayerNormFp8 — contracts, quantisation helpers, NumPy references.

The fp16 dense ops with the weight stored as float8 e4m3 and transposed (cuBLASLt's FP8 GEMMs
take only the "TN" form): Wt [N, K] = e4m3(W^T / w_scale), w_scale = max|W| / 448 (per tensor),
appended as the last input. An fp16 X is quantised inside the op with the attribute x_scale,
calibrated offline (max|X| / 448 over the parity inputs); an e4m3 X arrives quantised, as the
op before wrote it (its output Yq, with yq_scale = this op's x_scale: passes/fp8_handoff.py):

    Xq = e4m3_satfinite(float32(X) * (1 / x_scale))     (X fp16; X e4m3: Xq = X)
    Y  = epilogue(x_scale * w_scale * (Xq @ Wt^T) + bias [+ skip])

The references compute exactly that in float64 from the quantised operands (e4m3 rounding by
ml_dtypes: round to nearest even, saturated at +-448 first, as the kernel's satfinite does).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import ml_dtypes

from bertfuse.ops.bertfuse import dense
from bertfuse.ops.contract import BERTFUSE_DOMAIN, AttrSpec, OpContract, TensorSpec

E4M3_MAX = 448.0
FP8_OF = {"DenseBias": "DenseBiasFp8", "DenseBiasGelu": "DenseBiasGeluFp8",
          "DenseBiasSkipLayerNorm": "DenseBiasSkipLayerNormFp8"}

_X = TensorSpec("X", ("...", "K"), ("float16", "float8e4m3fn"),
                doc="fp16, quantised in the op with x_scale; or e4m3, quantised with x_scale "
                    "upstream (the producer's Yq)")
_WT = TensorSpec("Wt", ("N", "K"), ("float8e4m3fn",),
                 doc="W^T / w_scale in e4m3 (the TRANSPOSE of the fp16 op's W); K % 16 == 0")
_W_SCALE = TensorSpec("w_scale", ("1",), ("float32",), doc="W = Wt^T * w_scale")
_X_SCALE = AttrSpec("x_scale", "float", None,
                    "activation scale, finite > 0: X is quantised as e4m3(X / x_scale) (an "
                    "e4m3 X: the scale it was written with)",
                    required=True)
_FAST_ACCUM = AttrSpec("fast_accum", "int", 1,
                       "1 = Hopper's fast FP8 accumulation (cuBLASLt's FAST_ACCUM: faster, less "
                       "exact), 0 = the accumulator promoted to fp32 as it goes")


def _fp8(base: OpContract) -> OpContract:
    inputs = (_X, _WT) + base.inputs[2:] + (_W_SCALE,)
    return OpContract(
        op_type=FP8_OF[base.op_type], domain=BERTFUSE_DOMAIN, since_version=1,
        summary=base.summary.replace("X @ W", "x_scale * w_scale * (e4m3(X / x_scale) @ Wt^T)"),
        inputs=inputs, outputs=base.outputs,
        attributes=base.attributes + (_X_SCALE, _FAST_ACCUM),
        pitfalls=("Wt is [N, K], the transpose of the fp16 op's W: a square weight transposed "
                  "wrongly still has the right shape.",
                  "x_scale saturates: activations beyond 448 * x_scale are clamped silently; "
                  "calibrate on inputs like the served ones.",
                  "An e4m3 X carries no scale of its own: x_scale must be the yq_scale its "
                  "producer wrote it with.",
                  "Accuracy is FP8's: it is reported against fp32, not held to the fp16 limits."),
    )


DENSE_BIAS_FP8 = _fp8(dense.DENSE_BIAS)
DENSE_BIAS_GELU_FP8 = _fp8(dense.DENSE_BIAS_GELU)
DENSE_BIAS_SKIP_LAYERNORM_FP8 = _fp8(dense.DENSE_BIAS_SKIP_LAYERNORM)
CONTRACTS: dict[str, OpContract] = {c.op_type: c for c in (
    DENSE_BIAS_FP8, DENSE_BIAS_GELU_FP8, DENSE_BIAS_SKIP_LAYERNORM_FP8)}

Fp8Op = Literal["DenseBiasFp8", "DenseBiasGeluFp8", "DenseBiasSkipLayerNormFp8"]


def e4m3_dtype() -> np.dtype:
    """NumPy's float8 e4m3 type (ml_dtypes, which onnx itself uses for FLOAT8E4M3FN)."""
    return np.dtype(ml_dtypes.float8_e4m3fn)


def e4m3(x: np.ndarray) -> np.ndarray:
    """Round to e4m3 (nearest even), saturating at +-448 instead of becoming NaN."""
    return np.clip(np.asarray(x, np.float32), -E4M3_MAX, E4M3_MAX).astype(e4m3_dtype())


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp16 W [K, N] -> (Wt [N, K] e4m3, w_scale float32 [1]) with per-tensor max|W| / 448."""
    amax = float(np.abs(np.asarray(w, np.float32)).max())
    if not np.isfinite(amax) or amax == 0.0:
        raise ValueError(f"weight max |W| is {amax}: no FP8 scale")
    scale = np.float32(amax / E4M3_MAX)
    return e4m3(np.asarray(w, np.float32).T / scale), np.array([scale], np.float32)


def e4m3_output(y: np.ndarray, scale: float) -> np.ndarray:
    """What an op's output Yq holds: e4m3_satfinite(float32(Y) * (1 / scale)), the reciprocal
    rounded to float32 once, as the kernels compute it."""
    inv = np.float32(1.0) / np.float32(scale)
    return e4m3(np.asarray(y, np.float32) * inv)


def x_scale_for(amax: float) -> float:
    """The activation scale for a calibrated max |X|."""
    if not np.isfinite(amax) or amax <= 0.0:
        raise ValueError(f"activation max |X| is {amax}: no FP8 scale")
    return float(np.float32(amax / E4M3_MAX))


def _dequantized(x: np.ndarray, wt: np.ndarray, w_scale: np.ndarray, x_scale: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    if wt.dtype != e4m3_dtype():
        raise TypeError(f"Wt must be float8_e4m3fn, got {wt.dtype}")
    if not (np.isfinite(x_scale) and x_scale > 0):
        raise ValueError(f"x_scale must be finite and > 0, got {x_scale!r}")
    xq = x if x.dtype == e4m3_dtype() else e4m3_output(x, x_scale)
    xq = xq.astype(np.float64) * x_scale
    w = wt.astype(np.float64).T * float(np.asarray(w_scale, np.float32).reshape(-1)[0])
    return xq, w


def reference64(op_type: Fp8Op, *inputs: np.ndarray, x_scale: float, fast_accum: int = 0,
                **attrs) -> np.ndarray:
    """Reference by op name, inputs in slot order (w_scale last); float64, unrounded."""
    x, wt, *rest = inputs
    w_scale = rest.pop()
    xq, w = _dequantized(x, wt, w_scale, x_scale)
    base = {v: k for k, v in FP8_OF.items()}[op_type]
    return dense.reference(base, xq, w, *rest, **attrs)  # float64 operands: float64 out


def reference(op_type: Fp8Op, *inputs: np.ndarray, x_scale: float, fast_accum: int = 0,
              **attrs) -> np.ndarray:
    """Reference by op name, inputs in slot order (w_scale last); output Y in fp16."""
    return reference64(op_type, *inputs, x_scale=x_scale, **attrs).astype(np.float16)
