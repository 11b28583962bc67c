// BERT's pooler, tanh(x[:, 0] @ W + bias), on tensor cores: one block per 8 output columns, its
// four warps splitting K (see pooler.h).
//
//   block (8 columns n0..n0+7), per 16-row tile of the batch:
//     warp w:  sum over its K steps (w, w+4, ...) of mma m16n8k16(x rows, wt columns) -> 16x8 fp32
//     smem:    the four partial tiles summed, + bias, tanh -> y (fp16), y32 (fp32)
//
// A dot product does not care which k goes where as long as A and B agree, so lane (g, t) reads
// 16 bytes (8 consecutive k) of row g, row g + 8 and column g per 32-k step and feeds them to
// two mma k-steps; no shared-memory staging or ldmatrix is needed.
#include "pooler.h"

#include "launch.h"
#include "warp_mma.cuh"

#include <cstdint>

namespace bertfuse {
namespace {

constexpr int kWarps = 4;  // K split four ways: a short dependent mma chain per warp
constexpr int kCols = 8;   // the mma's N
constexpr int kRows = 16;  // the mma's M
constexpr int kStepK = 32; // k per step: a quad's 4 lanes x 8 halves

__device__ __forceinline__ uint4 load16_or_zero(const __half* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
}

// STEPS >= the number of 32-k steps any one warp takes: ceil(ceil(K / 32) / kWarps).
template <int STEPS>
__global__ void __launch_bounds__(kWarps * 32)
    pooler_kernel(const __half* __restrict__ x, const __half* __restrict__ wt,
                  const __half* __restrict__ bias, __half* __restrict__ y, float* __restrict__ y32,
                  int B, int S, int K, int N) {
  __shared__ float part[kWarps][kRows * kCols];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * kCols;
  // The weights (and bias) are initializers: read them before waiting on the kernel before.
  uint4 w[STEPS];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    const int k = (warp + s * kWarps) * kStepK + t * 8;
    w[s] = load16_or_zero(wt + static_cast<size_t>(n0 + g) * K + k, n0 + g < N && k < K);
  }
  const int out_row = threadIdx.x / kCols, out_col = threadIdx.x % kCols;  // 128 threads: the 16x8 tile
  const int n_out = n0 + out_col;
  const float b_n = n_out < N ? __half2float(bias[n_out]) : 0.f;
  wait_for_producer();
  const size_t row_stride = static_cast<size_t>(S) * K;
  for (int m0 = 0; m0 < B; m0 += kRows) {
    const int r0 = m0 + g, r1 = m0 + g + 8;
    float c[4] = {0.f, 0.f, 0.f, 0.f}, d[4] = {0.f, 0.f, 0.f, 0.f};  // two chains, summed below
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
      const int k = (warp + s * kWarps) * kStepK + t * 8;
      const uint4 a0 = load16_or_zero(x + r0 * row_stride + k, r0 < B && k < K);
      const uint4 a1 = load16_or_zero(x + r1 * row_stride + k, r1 < B && k < K);
      // k .. k+1 -> slots 2t, 2t+1 and k+2 .. k+3 -> slots 2t+8, 2t+9 of the first k-step;
      // k+4 .. k+7 the same of the second.
      const uint32_t lo[4] = {a0.x, a1.x, a0.y, a1.y};
      const uint32_t hi[4] = {a0.z, a1.z, a0.w, a1.w};
      mma::mma16816(c, lo, w[s].x, w[s].y);
      mma::mma16816(d, hi, w[s].z, w[s].w);
    }
    // Accumulator (row g, cols 2t, 2t+1) and (row g + 8, same cols).
    float* p = part[warp];
    p[g * kCols + 2 * t] = c[0] + d[0];
    p[g * kCols + 2 * t + 1] = c[1] + d[1];
    p[(g + 8) * kCols + 2 * t] = c[2] + d[2];
    p[(g + 8) * kCols + 2 * t + 1] = c[3] + d[3];
    __syncthreads();
    const int r = m0 + out_row;
    if (r < B && n_out < N) {
      float sum = b_n;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) sum += part[i][threadIdx.x];
      const float v = tanhf(sum);
      const size_t at = static_cast<size_t>(r) * N + n_out;
      y[at] = __float2half_rn(v);
      if (y32) y32[at] = v;
    }
    __syncthreads();  // part is rewritten by the next tile
  }
}

template <int STEPS>
cudaError_t launch(cudaStream_t stream, const __half* x, const __half* wt, const __half* bias,
                   __half* y, float* y32, int B, int S, int K, int N) {
  const dim3 grid((N + kCols - 1) / kCols);
  return LaunchPdl(pooler_kernel<STEPS>, grid, dim3(kWarps * 32), 0, stream, true, x, wt, bias, y,
                   y32, B, S, K, N);
}

}  // namespace

const char* pooler_unsupported(int K) {
  if (K < 8 || K % 8 != 0) return "hidden size must be a multiple of 8";
  if (K > kPoolerMaxK) return "hidden size must be <= 2048";
  return nullptr;
}

cudaError_t bf_pooler_f16(cudaStream_t stream, const __half* x, const __half* wt, const __half* bias,
                          __half* y, float* y32, int B, int S, int K, int N) {
  if (pooler_unsupported(K) != nullptr || N < 1 || S < 1) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(wt)) % 16 != 0) return cudaErrorInvalidValue;
  if (B <= 0) return cudaSuccess;
  const int steps = ((K + kStepK - 1) / kStepK + kWarps - 1) / kWarps;
  if (steps <= 1) return launch<1>(stream, x, wt, bias, y, y32, B, S, K, N);
  if (steps <= 2) return launch<2>(stream, x, wt, bias, y, y32, B, S, K, N);
  if (steps <= 4) return launch<4>(stream, x, wt, bias, y, y32, B, S, K, N);
  if (steps <= 6) return launch<6>(stream, x, wt, bias, y, y32, B, S, K, N);
  if (steps <= 8) return launch<8>(stream, x, wt, bias, y, y32, B, S, K, N);
  if (steps <= 12) return launch<12>(stream, x, wt, bias, y, y32, B, S, K, N);
  return launch<16>(stream, x, wt, bias, y, y32, B, S, K, N);  // K <= 2048: 16 steps
}

}  // namespace bertfuse
