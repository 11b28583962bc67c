// Eight fp16 values in one 16-byte access, unpacked to fp32, a warp's sum, a row's LayerNorm
// over registers, and their e4m3 copy: the building blocks of the row kernels (layernorm.cu,
// embed_layernorm.cu) and of the e4m3 outputs an FP8 GEMM downstream reads (layernorm.cu, the
// bias/GELU pass in dense.cu, attention.cu).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

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

// Eight fp16 values as e4m3_satfinite(value * inv), round to nearest even: the bytes the dense
// ops' quantize pass writes for them (an FP8 GEMM downstream reads them as its X). inv is
// 1 / the copy's scale, rounded to fp32 once, so every producer writes the same bytes.
__device__ __forceinline__ uint2 e4m3x8(const uint4& u, float inv) {
  const __half2* h = reinterpret_cast<const __half2*>(&u);
  uint2 q;
  uint16_t* qq = reinterpret_cast<uint16_t*>(&q);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f = __half22float2(h[j]);
    f.x *= inv;
    f.y *= inv;
    qq[j] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
  }
  return q;
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
