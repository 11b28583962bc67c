// Residual + bias + LayerNorm, fp32 statistics, fp16 in/out (see layernorm.h).
#include "layernorm.h"

#include "launch.h"
#include "vec8.cuh"

#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>

namespace bertfuse {
namespace {

struct LnParams {
  const __half *x, *bias, *skip, *gamma, *beta;
  __half* y;
  uint8_t* yq;      // optional e4m3 copy of y: e4m3(y * yq_inv)
  float yq_inv;     // 1 / yq_scale, rounded to fp32 once (a multiply, not a divide, per element)
  float* y32;       // optional fp32 copy of y, before the fp16 rounding
  float eps;
  int M, N;
  // Split-K partial sums in place of x (fp32 [splits][M][N], `split_stride` floats apart):
  // x is then their sum (ln_warp_kernel with SPLIT only).
  const float* xs = nullptr;
  int splits = 0;
  size_t split_stride = 0;
};

// v[0..7] += the 8 floats at p (32-byte aligned: two 16-byte loads).
__device__ __forceinline__ void add8f(const float* p, float* v) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] += a.x, v[1] += a.y, v[2] += a.z, v[3] += a.w, v[4] += b.x, v[5] += b.y, v[6] += b.z, v[7] += b.w;
}

// One warp per row; lane l holds 8-element chunks l, l+32, ... (VPT of them) in registers,
// so the row is read once and the variance is an exact second pass over registers. The
// weights (bias, gamma, beta) are fetched first, so their latency overlaps the row's (and,
// under PDL, the previous kernel's tail).
// No __restrict__: y may alias x (each element is read and written by the same lane).
template <int VPT, bool SPLIT>
__device__ __forceinline__ void ln_warp_rows(const LnParams& p) {
  const __half *x = p.x, *bias = p.bias, *skip = p.skip, *gamma = p.gamma, *beta = p.beta;
  __half* y = p.y;
  const int M = p.M, N = p.N;
  const float eps = p.eps;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 wg[VPT], wb[VPT], wbias[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = (lane + 32 * i) * 8;
    const bool in = c < N;
    wg[i] = in ? *reinterpret_cast<const uint4*>(gamma + c) : zero;
    wb[i] = in && beta ? *reinterpret_cast<const uint4*>(beta + c) : zero;
    wbias[i] = in && bias ? *reinterpret_cast<const uint4*>(bias + c) : zero;
  }
  wait_for_producer();
  if (row >= M) return;
  const size_t base = static_cast<size_t>(row) * N;
  float v[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = (lane + 32 * i) * 8;
    if (c < N) {
      if (SPLIT) {  // the split-K GEMM's partial sums, added in fp32 (the reduction cuBLASLt skips)
#pragma unroll
        for (int j = 0; j < 8; ++j) v[i][j] = 0.0f;
        for (int s = 0; s < p.splits; ++s) add8f(p.xs + s * p.split_stride + base + c, v[i]);
      } else {
        load8(x + base + c, v[i]);
      }
      float t[8];
      unpack8(wbias[i], t);  // zeros without a bias
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i][j] += t[j];
      if (skip) add8(skip + base + c, v[i]);
    }
  }
  float mean, rstd;
  warp_row_stats<VPT>(v, lane, N, eps, &mean, &rstd);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = (lane + 32 * i) * 8;
    if (c < N) {
      float r[8];
      ln_chunk(v[i], mean, rstd, wg[i], wb[i], r);  // beta zeros without a beta
      const uint4 out = pack8(r);
      *reinterpret_cast<uint4*>(y + base + c) = out;
      if (p.y32) {  // the graph's fp32 output, written here instead of by a Cast after the op
        float4* o32 = reinterpret_cast<float4*>(p.y32 + base + c);
        o32[0] = make_float4(r[0], r[1], r[2], r[3]);
        o32[1] = make_float4(r[4], r[5], r[6], r[7]);
      }
      if (p.yq) {  // the e4m3 copy of the fp16 result, for an FP8 GEMM downstream
        *reinterpret_cast<uint2*>(p.yq + base + c) = e4m3x8(out, p.yq_inv);
      }
    }
  }
}

template <int VPT, bool SPLIT>
__global__ void ln_warp_kernel(LnParams p) {
  ln_warp_rows<VPT, SPLIT>(p);
}

// The same with the registers capped so that 8 CTAs of 4 warps fit an SM (see launch_warp).
template <int VPT>
__global__ void __launch_bounds__(128, 8) ln_warp_kernel_capped(LnParams p) {
  ln_warp_rows<VPT, false>(p);
}

template <int THREADS>
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < THREADS / 32 ? red[lane] : 0.f;
  t = warp_sum(t);
  __syncthreads();  // red is reused by the next reduction
  return t;
}

__device__ __forceinline__ float row_value(const __half* x, const __half* bias,
                                           const __half* skip, size_t base, int c) {
  float s = __half2float(x[base + c]);
  if (bias) s += __half2float(bias[c]);
  if (skip) s += __half2float(skip[base + c]);
  return s;
}

// Any N, any alignment: one block per row, three passes over global memory (L1/L2 hits).
template <int THREADS>
__global__ void ln_block_kernel(LnParams p) {
  const __half *x = p.x, *bias = p.bias, *skip = p.skip, *gamma = p.gamma, *beta = p.beta;
  __half* y = p.y;
  const int N = p.N;
  const float eps = p.eps;
  __shared__ float red[THREADS / 32];
  wait_for_producer();
  const size_t base = static_cast<size_t>(blockIdx.x) * N;
  float sum = 0.f;
  for (int c = threadIdx.x; c < N; c += THREADS) sum += row_value(x, bias, skip, base, c);
  const float mean = block_sum<THREADS>(sum, red) / N;
  float sq = 0.f;
  for (int c = threadIdx.x; c < N; c += THREADS) {
    const float d = row_value(x, bias, skip, base, c) - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(block_sum<THREADS>(sq, red) / N + eps);
  for (int c = threadIdx.x; c < N; c += THREADS) {
    const float s = row_value(x, bias, skip, base, c);
    const float b = beta ? __half2float(beta[c]) : 0.f;
    const float r = (s - mean) * rstd * __half2float(gamma[c]) + b;
    const __half h = __float2half_rn(r);
    y[base + c] = h;
    if (p.y32) p.y32[base + c] = r;
    if (p.yq) p.yq[base + c] = __nv_cvt_float_to_fp8(__half2float(h) * p.yq_inv, __NV_SATFINITE, __NV_E4M3);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// One row per warp, 4 warps a CTA. Where those CTAs are more than the GPU holds at once, the
// registers are capped for 8 CTAs an SM (64 a thread; no spills for rows of up to 768 elements):
// all of them then run in one wave. Measured on an H100 (benchmarks/kernels/ln_probe.py, N = 768):
// M = 4096 takes 1,024 CTAs, 924 resident uncapped; capped, 6.19 -> 5.39 us with the rows in L2,
// 10.2 -> 8.93 us from DRAM; M <= 1280 unchanged. BERTFUSE_LN_CAP (launch.h) forces either form.
template <int VPT, bool SPLIT = false>
cudaError_t launch_warp(cudaStream_t stream, bool pdl, const LnParams& p) {
  constexpr int kWarps = 4;
  const int blocks = (p.M + kWarps - 1) / kWarps;
  if constexpr (VPT <= 3 && !SPLIT) {
    static std::atomic<int> slots_cache[kMaxDevices];
    const int mode = LnCapFlag().load(std::memory_order_relaxed);
    const int slots = mode == 0 ? resident_ctas_of(slots_cache, ln_warp_kernel<VPT, false>, kWarps * 32) : 0;
    if (mode == 2 || (mode == 0 && slots > 0 && blocks > slots))
      return LaunchAfterGemm(ln_warp_kernel_capped<VPT>, dim3(blocks), dim3(kWarps * 32), stream, pdl, p);
  }
  return LaunchAfterGemm(ln_warp_kernel<VPT, SPLIT>, dim3(blocks), dim3(kWarps * 32), stream, pdl, p);
}

}  // namespace

cudaError_t bf_layernorm_f16(cudaStream_t stream, const __half* x, const __half* bias,
                             const __half* skip, const __half* gamma, const __half* beta,
                             float epsilon, __half* y, int M, int N, uint8_t* yq, float yq_scale,
                             float* y32, bool pdl) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  const LnParams p{x, bias, skip, gamma, beta, y, yq, 1.0f / yq_scale, y32, epsilon, M, N};
  const bool vec = N % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) &&
                   (!bias || aligned16(bias)) && (!skip || aligned16(skip)) &&
                   (!beta || aligned16(beta)) && (!yq || (reinterpret_cast<uintptr_t>(yq) & 7u) == 0) && (!y32 || aligned16(y32));
  if (vec) {
    switch ((N / 8 + 31) / 32) {  // 8-element chunks per lane
      case 1: return launch_warp<1>(stream, pdl, p);
      case 2: return launch_warp<2>(stream, pdl, p);
      case 3: return launch_warp<3>(stream, pdl, p);
      case 4: return launch_warp<4>(stream, pdl, p);
      case 5:
      case 6: return launch_warp<6>(stream, pdl, p);
      case 7:
      case 8: return launch_warp<8>(stream, pdl, p);
      default: break;  // N > 2048: block kernel (the row no longer fits in registers)
    }
  }
  constexpr int kThreads = 256;
  return LaunchAfterGemm(ln_block_kernel<kThreads>, dim3(M), dim3(kThreads), stream, pdl, p);
}

cudaError_t bf_layernorm_splits_f16(cudaStream_t stream, const float* xs, int splits, size_t split_stride,
                                    const __half* bias, const __half* skip, const __half* gamma,
                                    const __half* beta, float epsilon, __half* y, int M, int N, float* y32,
                                    bool pdl) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  const bool a32 = (reinterpret_cast<uintptr_t>(xs) & 31u) == 0 && split_stride % 8 == 0;
  if (splits < 1 || N % 8 != 0 || N > 2048 || !a32 || !aligned16(y) || !aligned16(gamma) ||
      (bias && !aligned16(bias)) || (skip && !aligned16(skip)) || (beta && !aligned16(beta)) ||
      (y32 && !aligned16(y32)))
    return cudaErrorInvalidValue;
  LnParams p{nullptr, bias, skip, gamma, beta, y, nullptr, 1.0f, y32, epsilon, M, N};
  p.xs = xs;
  p.splits = splits;
  p.split_stride = split_stride;
  switch ((N / 8 + 31) / 32) {
    case 1: return launch_warp<1, true>(stream, pdl, p);
    case 2: return launch_warp<2, true>(stream, pdl, p);
    case 3: return launch_warp<3, true>(stream, pdl, p);
    case 4: return launch_warp<4, true>(stream, pdl, p);
    case 5:
    case 6: return launch_warp<6, true>(stream, pdl, p);
    default: return launch_warp<8, true>(stream, pdl, p);
  }
}

}  // namespace bertfuse
