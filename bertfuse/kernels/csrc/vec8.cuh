// Eight fp16 values in one 16-byte access, unpacked to fp32, a warp's sum, and a row's
// LayerNorm over registers: the building blocks of the row kernels (layernorm.cu,
// embed_layernorm.cu).
#pragma once

#include <cuda_fp16.h>

namespace bertfuse {

__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 t = __half22float2(h[j]);
    f[2 * j] = t.x;
    f[2 * j + 1] = t.y;
  }
}

// p 16-byte aligned.
__device__ __forceinline__ void load8(const __half* p, float (&f)[8]) {
  unpack8(*reinterpret_cast<const uint4*>(p), f);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Adds eight fp16 values at p (16-byte aligned) to f.
__device__ __forceinline__ void add8(const __half* p, float (&f)[8]) {
  float t[8];
  load8(p, t);
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] += t[j];
}

__device__ __forceinline__ uint4 pack8(const float (&r)[8]) {
  uint4 out;
  __half2* o = reinterpret_cast<__half2*>(&out);
#pragma unroll
  for (int j = 0; j < 4; ++j) o[j] = __floats2half2_rn(r[2 * j], r[2 * j + 1]);
  return out;
}

// A row of n values held across a warp as v[VPT][8] (lane l: the 8-element chunks l, l+32, ...;
// chunks at or past n are not read): its mean and 1 / sqrt(variance + eps), the variance an
// exact second pass over the registers.
template <int VPT>
__device__ __forceinline__ void warp_row_stats(const float (&v)[VPT][8], int lane, int n, float eps,
                                               float* mean, float* rstd) {
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if ((lane + 32 * i) * 8 < n) {
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += v[i][j];
    }
  }
  const float m = warp_sum(sum) / n;
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if ((lane + 32 * i) * 8 < n) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = v[i][j] - m;
        sq += d * d;
      }
    }
  }
  *mean = m;
  *rstd = rsqrtf(warp_sum(sq) / n + eps);
}

// r = (v - mean) * rstd * gamma + beta for one chunk, gamma and beta as loaded (8 fp16 each).
__device__ __forceinline__ void ln_chunk(const float (&v)[8], float mean, float rstd, const uint4& gamma,
                                         const uint4& beta, float (&r)[8]) {
  float g[8], b[8];
  unpack8(gamma, g);
  unpack8(beta, b);
#pragma unroll
  for (int j = 0; j < 8; ++j) r[j] = (v[j] - mean) * rstd * g[j] + b[j];
}

}  // namespace bertfuse
