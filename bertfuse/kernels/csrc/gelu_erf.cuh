// The erf GELU both GEMM paths compute: dense.cu's elementwise pass after cuBLASLt, and the
// epilogue of the sm_90a GEMMs (sm90/gemm_sm90.cuh). Device-only.
#pragma once

namespace bertfuse {

// The erf GELU, 0.5 x (1 + erf(x / sqrt 2)), with erf from Abramowitz & Stegun 7.1.28:
// erf(t) = 1 - (1 + a1 t + ... + a6 t^6)^-16 for t >= 0, |error| <= 3e-7 (about 2e-6 in fp32,
// far below fp16's resolution; the fp16 results match erff's). Here t = |x| / sqrt 2 is folded
// into the coefficients (b_i = a_i / sqrt(2)^i). No branch and one approximate reciprocal,
// where erff's two ranges diverge inside a warp: measured 5.8 us against 7.7 for the pass over
// [1280, 3072] on the H200. This is the erf form, not the tanh approximation.
__device__ __forceinline__ float gelu_erf_as(float x) {
  const float t = fabsf(x);
  float p = fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(5.38297490e-6f, t, 4.88906371e-5f), t, 3.80035744e-5f), t,
                                3.27762635e-3f), t, 2.11410057e-2f), t, 4.98673469e-2f), t, 1.0f);
  p *= p;
  p *= p;
  p *= p;
  p *= p;  // ^16; inf for large |x|, and 1/inf = 0
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(p));  // 1 ulp; p >= 1 here
  // 1 + erf(x / sqrt 2) = 2 - r for x >= 0, r for x < 0: a select, and no 1 - (1 - r)
  // cancellation in the negative tail.
  return 0.5f * x * (x >= 0.0f ? 2.0f - r : r);
}

}  // namespace bertfuse
