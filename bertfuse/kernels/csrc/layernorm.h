// Row-wise LayerNorm over the last axis (fp16 in/out, fp32 statistics), with the
// residual and the Dense bias optionally added first: the second half of
// DenseBiasSkipLayerNorm. y may alias x (in place on the GEMM output).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace bertfuse {

// s = x (+ bias) (+ skip); y = (s - mean(s)) / sqrt(var(s) + eps) * gamma + beta, per row of
// [M, N]. bias/skip/beta may be null. Two-pass statistics in fp32 from registers when
// N % 8 == 0 and N <= 2048 (one warp per row, 16-byte loads), else a block-per-row kernel.
// yq (optional): also write e4m3_satfinite(float(y) * (1 / yq_scale)) there, [M, N] bytes, for
// an FP8 GEMM that consumes y (saves it a quantize pass). y32 (optional): also write the fp32
// value before its rounding to fp16 there, [M, N] floats (a graph's fp32 output without a Cast
// kernel after the op). pdl: launch with programmatic
// dependent launch (see launch.h); only when bias, gamma and beta are not written by the kernel
// just before this one (they are read before waiting for it).
cudaError_t bf_layernorm_f16(cudaStream_t stream, const __half* x, const __half* bias,
                             const __half* skip, const __half* gamma, const __half* beta,
                             float epsilon, __half* y, int M, int N, uint8_t* yq = nullptr,
                             float yq_scale = 1.0f, float* y32 = nullptr, bool pdl = false);

// The same with the row's x given as `splits` fp32 partial sums (a split-K GEMM's, not yet
// reduced: xs[s * split_stride + row * N + col]), added here in fp32. Vector path only: N % 8 == 0,
// N <= 2048, xs 32-byte aligned, split_stride % 8 == 0; else cudaErrorInvalidValue (nothing run).
cudaError_t bf_layernorm_splits_f16(cudaStream_t stream, const float* xs, int splits, size_t split_stride,
                                    const __half* bias, const __half* skip, const __half* gamma,
                                    const __half* beta, float epsilon, __half* y, int M, int N,
                                    float* y32 = nullptr, bool pdl = false);

}  // namespace bertfuse
