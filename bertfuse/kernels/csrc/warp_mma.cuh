// Warp-level tensor-core primitives (sm_80+) for the attention and pooler kernels: cp.async
// copies, ldmatrix loads, the m16n8k16 fp16 mma with fp32 accumulation, ex2 and quad reductions,
// and the attention kernels' P·V step. Device-only, header-only; shared by attention.cu,
// attention_tiled.cu, packed_attention.cu and pooler.cu.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace bertfuse {
namespace mma {
namespace {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane l supplies the row address of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}

// c += a * b for one 16x8x16 tile (A row-major fp16, B column-major fp16, C fp32).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);  // .x (low 16 bits) = lo = the lower column index
  return *reinterpret_cast<uint32_t*>(&h);
}

// Max / sum over the 4 lanes that share an mma accumulator row.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The softmax numerators of an m16 x (8 * NT) score tile in the mma C layout (rows g and g + 8 of
// each lane): exp2(s - row max) in place, with mx0 / mx1 the lane's partial row maxima (finite),
// and the two rows' sums over their quad.
// max0 / max1 (optional) receive the two rows' maxima over the quad.
template <int NT>
__device__ __forceinline__ void exp2_rows(float (&acc)[NT][4], float mx0, float mx1, float* sum0, float* sum1,
                                          float* max0 = nullptr, float* max1 = nullptr) {
  mx0 = quad_max(mx0);
  mx1 = quad_max(mx1);
  if (max0) *max0 = mx0, *max1 = mx1;
  float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    acc[nt][0] = fast_exp2(acc[nt][0] - mx0);
    acc[nt][1] = fast_exp2(acc[nt][1] - mx0);
    acc[nt][2] = fast_exp2(acc[nt][2] - mx1);
    acc[nt][3] = fast_exp2(acc[nt][3] - mx1);
    s0 += acc[nt][0] + acc[nt][1];
    s1 += acc[nt][2] + acc[nt][3];
  }
  *sum0 = quad_sum(s0);
  *sum1 = quad_sum(s1);
}

// O += P V over the 16-key step kk, for a warp's 16 query rows: P is score tiles 2kk and 2kk + 1 of
// the accumulators (the unnormalised probabilities), V the 16 key rows at Vs + kk * 16 rows of LD
// halves each, D head dims (O: D / 8 tiles of the mma C layout).
template <int D, int LD, int NT>
__device__ __forceinline__ void pv_step(const float (&acc)[NT][4], int kk, const __half* Vs, int lane,
                                        float (&o)[D / 8][4]) {
  // The C layout of score tiles 2kk, 2kk+1 is the A layout of keys 16kk .. 16kk+15.
  const uint32_t pa[4] = {pack_half2(acc[2 * kk][0], acc[2 * kk][1]), pack_half2(acc[2 * kk][2], acc[2 * kk][3]),
                          pack_half2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]),
                          pack_half2(acc[2 * kk + 1][2], acc[2 * kk + 1][3])};
#pragma unroll
  for (int np = 0; np < D / 16; ++np) {
    uint32_t vb[4];  // B fragments (both key halves) of d-tiles 2np and 2np+1
    ldsm_x4_trans(vb, Vs + (kk * 16 + (lane & 15)) * LD + np * 16 + (lane >> 4) * 8);
    mma16816(o[2 * np], pa, vb[0], vb[1]);
    mma16816(o[2 * np + 1], pa, vb[2], vb[3]);
  }
}

}  // namespace
}  // namespace mma
}  // namespace bertfuse
