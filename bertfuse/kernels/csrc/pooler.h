// BERT's pooler in one kernel: the first token of each sequence through a dense layer and tanh.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bertfuse {

constexpr int kPoolerMaxK = 2048;

// y[b, n] = tanh(sum_k x[b, 0, k] * wt[n, k] + bias[n]) for b < B, n < N; x [B, S, K] (only
// position 0 of each row is read), wt [N, K] (the dense weight transposed: each output's
// weights contiguous), fp32 accumulation and tanh, y fp16 and, when y32 is not null, the same
// values in fp32 before their rounding. Needs K % 8 == 0, K <= kPoolerMaxK and 16-byte
// aligned x and wt (cudaErrorInvalidValue otherwise). Tensor cores (mma.sync m16n8k16): one
// block per 8 output columns, its warps splitting K, their weights held in registers across
// the batch's 16-row tiles; wt and bias are read before waiting for the kernel before
// (programmatic dependent launch), so they must not be written by it.
cudaError_t bf_pooler_f16(cudaStream_t stream, const __half* x, const __half* wt, const __half* bias,
                          __half* y, float* y32, int B, int S, int K, int N);

// nullptr when the kernel covers [.., K], else the reason.
const char* pooler_unsupported(int K);

}  // namespace bertfuse
