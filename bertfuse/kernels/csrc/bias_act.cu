// The bias + activation and e4m3 quantize kernels (bias_act.h).
#include "bias_act.h"

#include <cuda_fp8.h>

#include "gelu_erf.cuh"
#include "launch.h"
#include "vec8.cuh"

namespace bertfuse {

namespace {

// Identity, the erf GELU (A&S erf, the production form), the tanh GELU cuBLASLt's epilogue
// computes, or the erf GELU with CUDA's erff (kept to measure against); fp32 math.
template <Act A>
__device__ __forceinline__ float act(float x) {
  if (A == Act::kGeluTanh) return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
  if (A == Act::kGeluErf) return gelu_erf_as(x);
  if (A == Act::kGeluErfLib) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
  return x;
}

// out = act(x (+ bias)) -> y (fp16) and/or yq (e4m3 of the fp16 value * yq_inv, saturating,
// round to nearest even: the same bytes a later quantize pass would write). y may be x.
struct ActOut {
  __half* y;
  uint8_t* yq;
  float yq_inv;  // 1 / yq_scale in fp32: one multiply per element instead of a divide
};

// 8 halves per thread (16-byte accesses); needs N % 8 == 0 and 16-byte (yq: 8-byte) alignment.
template <Act A>
__global__ void bias_act_vec8(const __half* x, const __half* bias, ActOut o, int N, size_t nvec) {
  wait_for_producer();
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < nvec;
       v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint4 u = reinterpret_cast<const uint4*>(x)[v];
    __half2* h = reinterpret_cast<__half2*>(&u);
    uint4 bu = make_uint4(0, 0, 0, 0);
    if (bias) bu = reinterpret_cast<const uint4*>(bias)[(v * 8 % N) / 8];
    const __half2* bh = reinterpret_cast<const __half2*>(&bu);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 f = __half22float2(h[j]);
      if (bias) {
        const float2 b = __half22float2(bh[j]);
        f.x += b.x;
        f.y += b.y;
      }
      h[j] = __floats2half2_rn(act<A>(f.x), act<A>(f.y));
    }
    if (o.y) reinterpret_cast<uint4*>(o.y)[v] = u;
    if (o.yq) reinterpret_cast<uint2*>(o.yq)[v] = e4m3x8(u, o.yq_inv);
  }
}

template <Act A>
__global__ void bias_act_scalar(const __half* x, const __half* bias, ActOut o, int N, size_t n) {
  wait_for_producer();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float v = __half2float(x[i]);
    if (bias) v += __half2float(bias[i % N]);
    const __half h = __float2half_rn(act<A>(v));
    if (o.y) o.y[i] = h;
    if (o.yq) o.yq[i] = __nv_cvt_float_to_fp8(__half2float(h) * o.yq_inv, __NV_SATFINITE, __NV_E4M3);
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

unsigned GridFor(size_t work, int threads) {
  // Enough blocks to fill an H200 several times over; grid-stride loops do the rest.
  size_t blocks = (work + threads - 1) / threads;
  if (blocks > 132 * 16) blocks = 132 * 16;
  return static_cast<unsigned>(blocks ? blocks : 1);
}

}  // namespace

template <Act A>
cudaError_t LaunchBiasAct(cudaStream_t stream, const __half* x, const __half* bias, ActOut o,
                          size_t n, int N) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  if (N % 8 == 0 && Aligned16(x) && (!o.y || Aligned16(o.y)) && (!bias || Aligned16(bias)) &&
      (reinterpret_cast<uintptr_t>(o.yq) & 7u) == 0) {
    // PDL is always safe here: these kernels read nothing before waiting for the one before.
    return LaunchAfterGemm(bias_act_vec8<A>, dim3(GridFor(n / 8, kThreads)), dim3(kThreads), stream,
                           true, x, bias, o, N, n / 8);
  }
  return LaunchAfterGemm(bias_act_scalar<A>, dim3(GridFor(n, kThreads)), dim3(kThreads), stream,
                         true, x, bias, o, N, n);
}

cudaError_t bf_bias_act_f16(cudaStream_t stream, const __half* x, __half* y, const __half* bias,
                            int M, int N, Act act, uint8_t* yq, float yq_scale) {
  const ActOut o{y, yq, 1.0f / yq_scale};
  const size_t n = static_cast<size_t>(M) * N;
  switch (act) {
    case Act::kGeluErf: return LaunchBiasAct<Act::kGeluErf>(stream, x, bias, o, n, N);
    case Act::kGeluTanh: return LaunchBiasAct<Act::kGeluTanh>(stream, x, bias, o, n, N);
    case Act::kGeluErfLib: return LaunchBiasAct<Act::kGeluErfLib>(stream, x, bias, o, n, N);
    default: return LaunchBiasAct<Act::kNone>(stream, x, bias, o, n, N);
  }
}

cudaError_t bf_quantize_e4m3(cudaStream_t stream, const __half* x, float scale, uint8_t* q,
                             size_t n) {
  // One row of n elements: the plain pass of the bias/activation kernel, fp8 output only.
  return LaunchBiasAct<Act::kNone>(stream, x, nullptr, ActOut{nullptr, q, 1.0f / scale}, n,
                                   n % 8 == 0 ? 8 : 1);
}

}  // namespace bertfuse
