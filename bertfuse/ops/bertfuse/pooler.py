"""ai.bertfuse BertPooler: BERT's pooler (the first token through a dense layer and tanh) in one
op — contract, NumPy reference, one-node model.

It replaces what ONNX Runtime runs as five kernels after the encoder (Gather, the bias
broadcast, the GEMM, Tanh, the Cast):

    X [B,S,H] ─► Gather(axis 1, index 0) ─► Gemm(W, bias) ─► Tanh ─► [Cast to float32]
    ==>  X ─► BertPooler(Wt, bias) ─► Y [B,N] fp16 (and Y32, the fp32 output, for the Cast)

Wt is the dense weight transposed ([N, K], each output's weights contiguous), as the FP8 dense
ops store theirs. fp16 tensors, fp32 accumulation and tanh; the reference computes in float64.
CUDA EP only: no CPU kernel.
"""

from __future__ import annotations

import numpy as np
import onnx

from bertfuse.ops.contract import BERTFUSE_DOMAIN, OpContract, TensorSpec, one_node_model

MAX_HIDDEN = 2048  # csrc/pooler.h kPoolerMaxK: a block's four warps hold its weights in registers

CONTRACT = OpContract(
    op_type="BertPooler",
    domain=BERTFUSE_DOMAIN,
    since_version=1,
    summary="Y = tanh(X[:, 0, :] @ Wt^T + bias): BERT's pooler on the first token of each row.",
    inputs=(TensorSpec("X", ("B", "S", "K"), ("float16",),
                       doc="the encoder's output; only position 0 of each row is read; "
                           "K % 8 == 0, K <= 2048"),
            TensorSpec("Wt", ("N", "K"), ("float16",),
                       doc="the dense weight TRANSPOSED (ONNX MatMul's B is [K, N])"),
            TensorSpec("bias", ("N",), ("float16",))),
    outputs=(TensorSpec("Y", ("B", "N"), ("float16",)),
             TensorSpec("Y32", ("B", "N"), ("float32",), optional=True,
                        doc="Y in fp32, before its rounding to fp16: a graph's fp32 output "
                            "with no Cast kernel after the op")),
    pitfalls=("Wt is [N, K], the transpose of a Dense kernel or MatMul's B: a square weight "
              "stored the other way still has the right shape; only a numeric check catches it.",
              "Only position 0 is pooled: a model that pools another token, or a mean, is not "
              "this op."),
)

CONTRACTS: dict[str, OpContract] = {CONTRACT.op_type: CONTRACT}


def reference64(x: np.ndarray, wt: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """tanh(x[:, 0] @ wt.T + bias) in float64, unrounded."""
    if x.ndim != 3 or wt.ndim != 2 or wt.shape[1] != x.shape[2] or bias.shape != (wt.shape[0],):
        raise ValueError(f"X {list(x.shape)}, Wt {list(wt.shape)}, bias {list(bias.shape)}: "
                         f"expected X [B, S, K], Wt [N, K], bias [N]")
    first = np.asarray(x[:, 0, :], np.float64)
    return np.tanh(first @ np.asarray(wt, np.float64).T + np.asarray(bias, np.float64))


def reference(x: np.ndarray, wt: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return reference64(x, wt, bias).astype(x.dtype)


def make_model(batch: int | str, seq: int | str, hidden: int, n_out: int, *,
               y32: bool = False) -> onnx.ModelProto:
    """One BertPooler node; graph inputs X, Wt, bias; outputs Y (and Y32)."""
    outs = [("Y", np.float16, (batch, n_out))] + \
        ([("Y32", np.float32, (batch, n_out))] if y32 else [])
    return one_node_model(
        "BertPooler", BERTFUSE_DOMAIN,
        [("X", np.float16, (batch, seq, hidden)), ("Wt", np.float16, (n_out, hidden)),
         ("bias", np.float16, (n_out,))],
        outs)
