// The elementwise kernels after a GEMM: bias + activation (erf or tanh GELU) and the e4m3
// quantize, fp16 in with fp32 math. Launchers: they return CUDA's own cudaError_t (status.h).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace bertfuse {

// kGeluErf: the erf GELU with erf from Abramowitz & Stegun 7.1.28 (branch-free, one
// reciprocal; |erf error| <= 2e-6 in fp32, far below fp16's resolution). kGeluErfLib: the same
// with CUDA's erff (slower: its two ranges diverge inside a warp), kept to measure against.
enum class Act : int { kNone = 0, kGeluErf = 1, kGeluTanh = 2, kGeluErfLib = 3 };

// y = act(x (+ bias)) over [M,N], fp32 math; y may be x (in place on the GEMM output). The
// erf GELU that cuBLASLt has no epilogue for; the bias and tanh GELU only where cuBLASLt
// offers no algorithm with them. bias may be null. yq (optional): also e4m3(y / yq_scale),
// the FP8 input of a GEMM downstream; y may then be null (fp8 output only).
cudaError_t bf_bias_act_f16(cudaStream_t stream, const __half* x, __half* y, const __half* bias,
                            int M, int N, Act act, uint8_t* yq = nullptr, float yq_scale = 1.0f);

// q[i] = e4m3(x[i] / scale), saturating to +-448 (round to nearest even), n elements.
cudaError_t bf_quantize_e4m3(cudaStream_t stream, const __half* x, float scale, uint8_t* q,
                             size_t n);

}  // namespace bertfuse
