// BertAttention kernel: one CTA per (query tile, head, batch row); each warp owns 16 queries per
// pass, and makes `passes` passes over the CTA's query tiles (1 or 2).
//
// The CTA copies its Q tiles and the head's K and V (read straight out of the [B, S, 3H] qkv
// layout, no transpose kernels) into shared memory with cp.async, turns the mask into an additive
// per-key term in shared memory (no separate mask pass), then per warp and pass:
//   S = Q K^T       mma.sync m16n8k16 fp16 -> fp32, all keys held in registers (S <= 128)
//   softmax         fp32 in registers, row max/sum over the 4 lanes sharing a row
//   O = P V         P re-packed from the score accumulators as fp16 A fragments
// and writes O through shared memory with 16-byte stores. Keys are padded to a multiple of 16
// inside the kernel: padded keys get -inf (probability exactly 0), padded K/V/Q rows are zeros.
// A second pass lets one CTA of 4 warps cover 128 queries: the head's K and V are read once
// instead of once per 64 queries, and a grid that needed two waves of CTAs fits in one.
// For grids of few CTAs, attention_split_kernel splits each query tile's keys between two warps
// (half the chain per warp) and merges their softmax partials in shared memory.
#include "attention.h"

#include <cuda_fp8.h>

#include "attention_general.h"
#include "bias_act.h"
#include "attention_tiled.h"

#include <atomic>
#include <cmath>

#include "launch.h"
#include "vec8.cuh"
#include "warp_mma.cuh"

namespace bertfuse {
namespace {

using namespace mma;  // cp.async, ldmatrix, mma.sync, ex2 and quad reductions (warp_mma.cuh)

constexpr int kD = kAttentionHeadSize;
constexpr int kLd = kD + 8;  // smem row stride in halves (144 B): ldmatrix rows hit distinct banks
constexpr int kMaxWarps = 4;
constexpr float kMaskFilter = -10000.0f;  // ORT Attention's mask_filter_value default (BERT's adder)
constexpr float kLog2e = 1.4426950408889634f;

// Copies rows [row0, row0 + rows) of one D-wide column block (row stride `stride` halves) into
// smem rows of kLd halves; rows at or past `valid` are zero-filled, not read.
__device__ __forceinline__ void load_rows(__half* dst, const __half* src, size_t stride, int row0, int rows,
                                          int valid, int tid, int nthreads) {
  for (int c = tid; c < rows * (kD / 8); c += nthreads) {
    const int r = c / (kD / 8), col = (c % (kD / 8)) * 8;
    __half* d = dst + r * kLd + col;
    if (row0 + r < valid) {
      cp_async16(d, src + (row0 + r) * stride + col);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// S = Q K^T for one warp's 16 queries, scaled into the log2 domain with the additive mask, then
// the softmax numerators exp2(s - max) in place and the two row sums (rows g and g + 8).
template <int KT>
__device__ __forceinline__ void scores(const __half* Qw, const __half* Ks, const float* madd, int lane, int t,
                                       float scale_log2, float (&acc)[2 * KT][4], float* sum0, float* sum1,
                                       float* max0 = nullptr, float* max1 = nullptr) {
  constexpr int NT = 2 * KT;  // 8-key score tiles per row
  uint32_t qa[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) ldsm_x4(qa[kk], Qw + (lane & 15) * kLd + kk * 16 + (lane >> 4) * 8);
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
    for (int p = 0; p < kD / 32; ++p) {
      uint32_t kb[4];  // B fragments of k-steps 2p and 2p+1 for keys nt*8 .. nt*8+7
      ldsm_x4(kb, Ks + (nt * 8 + (lane & 7)) * kLd + p * 32 + (lane >> 3) * 8);
      mma16816(acc[nt], qa[2 * p], kb[0], kb[1]);
      mma16816(acc[nt], qa[2 * p + 1], kb[2], kb[3]);
    }
    const float2 m = *reinterpret_cast<const float2*>(madd + nt * 8 + 2 * t);
    acc[nt][0] = fmaf(acc[nt][0], scale_log2, m.x);
    acc[nt][1] = fmaf(acc[nt][1], scale_log2, m.y);
    acc[nt][2] = fmaf(acc[nt][2], scale_log2, m.x);
    acc[nt][3] = fmaf(acc[nt][3], scale_log2, m.y);
    mx0 = fmaxf(mx0, fmaxf(acc[nt][0], acc[nt][1]));
    mx1 = fmaxf(mx1, fmaxf(acc[nt][2], acc[nt][3]));
  }
  // Maxima finite: the first key of the range is real (key 0, or in a split kernel's second half a
  // key below S), its term at worst -10000*log2e.
  exp2_rows(acc, mx0, mx1, sum0, sum1, max0, max1);
}

// O += P V for the warp's 16 queries over KT 16-key tiles (P: the score accumulators, unnormalised).
template <int KT>
__device__ __forceinline__ void pv(const float (&acc)[2 * KT][4], const __half* Vs, int lane, float (&o)[kD / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) pv_step<kD, kLd>(acc, kk, Vs, lane, o);
}

// The warp's O times inv0 / inv1 (rows g / g + 8), staged in the warp's own Q rows (no other warp
// reads them any more) and written to out rows qw0 .. qw0 + 15 (those below S) with 16-byte stores.
__device__ __forceinline__ void store_tile(const float (&o)[kD / 8][4], float inv0, float inv1, __half* Qw,
                                           int lane, int g, int t, __half* __restrict__ out,
                                           uint8_t* __restrict__ outq, float q_inv, int b, int S, int H, int head,
                                           int qw0) {
  __syncwarp();
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) {
    *reinterpret_cast<__half2*>(Qw + g * kLd + dt * 8 + 2 * t) = __floats2half2_rn(o[dt][0] * inv0, o[dt][1] * inv0);
    *reinterpret_cast<__half2*>(Qw + (g + 8) * kLd + dt * 8 + 2 * t) =
        __floats2half2_rn(o[dt][2] * inv1, o[dt][3] * inv1);
  }
  __syncwarp();
#pragma unroll
  for (int c = lane; c < 16 * (kD / 8); c += 32) {
    const int r = c / (kD / 8), col = (c % (kD / 8)) * 8;
    if (qw0 + r < S) {
      const size_t at = (static_cast<size_t>(b) * S + qw0 + r) * H + head * kD + col;
      const uint4 u = *reinterpret_cast<const uint4*>(Qw + r * kLd + col);
      if (out) *reinterpret_cast<uint4*>(out + at) = u;  // absent: only the e4m3 copy is read
      if (outq) *reinterpret_cast<uint2*>(outq + at) = e4m3x8(u, q_inv);
    }
  }
}

// O = P V for the warp's tile, normalised and stored (store_tile).
template <int KT>
__device__ __forceinline__ void context(const float (&acc)[2 * KT][4], const __half* Vs, __half* Qw, int lane,
                                        int g, int t, float sum0, float sum1, __half* __restrict__ out,
                                        uint8_t* __restrict__ outq, float q_inv, int b, int S, int H, int head,
                                        int qw0) {
  float o[kD / 8][4];
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  pv<KT>(acc, Vs, lane, o);
  store_tile(o, 1.0f / sum0, 1.0f / sum1, Qw, lane, g, t, out, outq, q_inv, b, S, H, head, qw0);
}

// The CTA's prologue, shared by both kernels: Q rows [q0, q0 + rows_q), the head's K and V
// (SP rows, zero past S) by cp.async in two groups (Q and K, then V), and the additive mask of
// SP keys in the log2 domain (padded keys -inf).
__device__ __forceinline__ void load_head(const __half* base, size_t stride, int H, int q0, int rows_q, int SP,
                                          int S, const int32_t* __restrict__ mask, int mask_rank, int b,
                                          __half* Qs, __half* Ks, __half* Vs, float* madd, int tid, int nthreads) {
  load_rows(Qs, base, stride, q0, rows_q, S, tid, nthreads);
  load_rows(Ks, base + H, stride, 0, SP, S, tid, nthreads);
  cp_async_commit();
  load_rows(Vs, base + 2 * H, stride, 0, SP, S, tid, nthreads);
  cp_async_commit();
  for (int j = tid; j < SP; j += nthreads) {
    bool keep = true;  // raw mask: value > 0 keeps (ORT's rule); key lengths: j < len[b]
    if (j < S && mask_rank == 2) keep = mask[static_cast<size_t>(b) * S + j] > 0;
    if (j < S && mask_rank == 1) keep = j < mask[b];
    madd[j] = j >= S ? -INFINITY : (keep ? 0.0f : kMaskFilter * kLog2e);
  }
}

// KT = number of 16-key tiles (keys padded to 16*KT >= S).
template <int KT>
__global__ void __launch_bounds__(kMaxWarps * 32)
    attention_kernel(const __half* __restrict__ qkv, const int32_t* __restrict__ mask, int mask_rank, int S,
                     int H, float scale_log2, int passes, __half* __restrict__ out,
                     uint8_t* __restrict__ outq, float q_inv) {
  constexpr int SP = 16 * KT;  // padded key count
  extern __shared__ __align__(16) unsigned char smem_raw[];
  wait_for_producer();  // Q, K, V (and the mask) come from the kernels before: nothing is read earlier
  const int nthreads = blockDim.x, warps = nthreads / 32;
  const int rows_q = 16 * warps * passes;
  __half* Qs = reinterpret_cast<__half*>(smem_raw);
  __half* Ks = Qs + rows_q * kLd;
  __half* Vs = Ks + SP * kLd;
  float* madd = reinterpret_cast<float*>(Vs + SP * kLd);  // additive mask, log2 domain

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // mma fragment row group / column pair
  constexpr int NT = 2 * KT;
  const int q0 = blockIdx.x * rows_q, head = blockIdx.y, b = blockIdx.z;
  const size_t stride = 3 * static_cast<size_t>(H);
  const __half* base = qkv + static_cast<size_t>(b) * S * stride + head * kD;

  load_head(base, stride, H, q0, rows_q, SP, S, mask, mask_rank, b, Qs, Ks, Vs, madd, tid, nthreads);
  cp_async_wait<1>();  // Q and K have landed; V may still be in flight
  __syncthreads();

#pragma unroll 1
  for (int pass = 0; pass < passes; ++pass) {
    const int tile = pass * warps + warp;  // this warp's 16-query tile in the CTA
    const bool active = q0 + tile * 16 < S;  // warp-uniform: a tail warp past S only syncs
    __half* Qw = Qs + tile * 16 * kLd;
    float acc[NT][4];
    float sum0 = 1.0f, sum1 = 1.0f;  // rows g and g + 8 of this warp's tile
    if (active) scores<KT>(Qw, Ks, madd, lane, t, scale_log2, acc, &sum0, &sum1);
    if (pass == 0) {  // V lands once, for every pass (the barrier is the whole CTA's)
      cp_async_wait<0>();
      __syncthreads();
    }
    if (active) context<KT>(acc, Vs, Qw, lane, g, t, sum0, sum1, out, outq, q_inv, b, S, H, head,
                            q0 + tile * 16);
  }
}

// Keys split in two: a CTA of 2W warps covers W 16-query tiles, and the tile's two warps take one
// half of the keys each (KH 16-key tiles, keys padded to 32*KH >= S), so each warp's chain of
// mma, softmax and PV is half as long. The second half's warp hands its unnormalised O, row maxima
// and sums to the first through shared memory, which rescales both to the common maximum
// (flash attention's merge, in the log2 domain) and stores. Used only where the second half holds a
// real key (S > 16*KH), so both halves' maxima are finite.
constexpr int kXchFloats = kD / 8 * 4 + 4;  // per lane: O (32), then the two rows' max and sum

template <int KH>
__global__ void __launch_bounds__(2 * kMaxWarps * 32)
    attention_split_kernel(const __half* __restrict__ qkv, const int32_t* __restrict__ mask, int mask_rank,
                           int S, int H, float scale_log2, __half* __restrict__ out, uint8_t* __restrict__ outq,
                           float q_inv) {
  constexpr int SP = 32 * KH;  // padded key count, both halves
  extern __shared__ __align__(16) unsigned char smem_raw[];
  wait_for_producer();
  const int nthreads = blockDim.x, tiles = nthreads / 64;
  const int rows_q = 16 * tiles;
  __half* Qs = reinterpret_cast<__half*>(smem_raw);
  __half* Ks = Qs + rows_q * kLd;
  __half* Vs = Ks + SP * kLd;
  float* madd = reinterpret_cast<float*>(Vs + SP * kLd);
  float* xch = madd + SP;  // [tiles][32 lanes][kXchFloats]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = warp % tiles, half = warp / tiles;
  const int q0 = blockIdx.x * rows_q, head = blockIdx.y, b = blockIdx.z;
  const size_t stride = 3 * static_cast<size_t>(H);
  const __half* base = qkv + static_cast<size_t>(b) * S * stride + head * kD;

  load_head(base, stride, H, q0, rows_q, SP, S, mask, mask_rank, b, Qs, Ks, Vs, madd, tid, nthreads);
  cp_async_wait<1>();
  __syncthreads();

  const bool active = q0 + tile * 16 < S;  // warp-uniform, the same for the tile's two warps
  __half* Qw = Qs + tile * 16 * kLd;
  const int k0 = half * 16 * KH;  // this warp's first key
  float acc[2 * KH][4];
  float sum0 = 1.0f, sum1 = 1.0f, max0 = 0.0f, max1 = 0.0f;
  if (active) scores<KH>(Qw, Ks + k0 * kLd, madd + k0, lane, t, scale_log2, acc, &sum0, &sum1, &max0, &max1);
  cp_async_wait<0>();
  __syncthreads();  // V has landed; every warp is done with Q
  float o[kD / 8][4];
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  if (active) pv<KH>(acc, Vs + k0 * kLd, lane, o);
  float* x = xch + (tile * 32 + lane) * kXchFloats;
  if (active && half == 1) {
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
      *reinterpret_cast<float4*>(x + dt * 4) = make_float4(o[dt][0], o[dt][1], o[dt][2], o[dt][3]);
    *reinterpret_cast<float4*>(x + kD / 2) = make_float4(max0, max1, sum0, sum1);
  }
  __syncthreads();
  if (!active || half == 1) return;
  const float4 ms = *reinterpret_cast<const float4*>(x + kD / 2);
  const float m0 = fmaxf(max0, ms.x), m1 = fmaxf(max1, ms.y);
  const float a0 = fast_exp2(max0 - m0), c0 = fast_exp2(ms.x - m0);
  const float a1 = fast_exp2(max1 - m1), c1 = fast_exp2(ms.y - m1);
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) {
    const float4 p = *reinterpret_cast<const float4*>(x + dt * 4);
    o[dt][0] = o[dt][0] * a0 + p.x * c0;
    o[dt][1] = o[dt][1] * a0 + p.y * c0;
    o[dt][2] = o[dt][2] * a1 + p.z * c1;
    o[dt][3] = o[dt][3] * a1 + p.w * c1;
  }
  store_tile(o, 1.0f / (sum0 * a0 + ms.z * c0), 1.0f / (sum1 * a1 + ms.w * c1), Qw, lane, g, t, out, outq,
             q_inv, b, S, H, head, q0 + tile * 16);
}

// As many warps (16-row query tiles) per CTA as the sequence fills, up to 4. Measured on the H200
// (benchmarks/kernels/kernels_attention.py): 4 warps was fastest or within 3% in every case, also where
// it leaves SMs idle (b1 s128 h12: 24 CTAs, 4.40 us; 1 warp and 96 CTAs, 6.48 us), because each
// CTA loads the head's whole K and V and smaller tiles repeat that load.
int pick_warps(int /*B*/, int S, int /*num_heads*/) {
  const int tiles16 = (S + 15) / 16;
  return tiles16 < kMaxWarps ? tiles16 : kMaxWarps;
}

size_t smem_bytes(int KT, int warps, int passes) {
  return sizeof(__half) * static_cast<size_t>(16 * warps * passes + 2 * 16 * KT) * kLd + sizeof(float) * 16 * KT;
}

// CTAs of attention_kernel<KT> (warps, passes) resident per SM on the current device times its SM
// count, asked once per device and configuration; 0 where CUDA cannot say.
template <int KT>
int resident_ctas(int warps, int passes) {
  static std::atomic<int> cache[kMaxWarps + 1][3][kMaxDevices];
  return resident_ctas_of(cache[warps][passes], attention_kernel<KT>, 32 * warps, smem_bytes(KT, warps, passes));
}

// Passes per warp: 2 where it takes fewer waves of CTAs than 1 (with S > 64 a CTA of 4 warps then
// covers the whole sequence and reads K and V once), else 1 (more CTAs, a shorter path each).
// Measured on the H200 (kernels_attention.py): base b32 s128 h12 goes from 768 CTAs in two waves
// to 384 in one.
template <int KT>
int pick_passes(int B, int S, int num_heads, int warps) {
  const int tiles16 = (S + 15) / 16;
  if (tiles16 <= warps) return 1;
  long long waves[3] = {0, 0, 0};
  for (int p = 1; p <= 2; ++p) {
    const long long ctas = static_cast<long long>((tiles16 + warps * p - 1) / (warps * p)) * num_heads * B;
    const int slots = resident_ctas<KT>(warps, p);
    if (slots <= 0) return 1;
    waves[p] = (ctas + slots - 1) / slots;
  }
  return waves[2] < waves[1] ? 2 : 1;
}

// Query tiles per CTA of the keys-split kernel, or 0 for the one- or two-pass kernel. Splitting the
// keys pays where the grid leaves most SMs idle (a request of a few sequences): 2 tiles per CTA
// where that grid fits the SMs once, else 4 where that one does. Measured on an H100
// (benchmarks/kernels/kernels_attention.py): b1 s128 h12 4.44 -> 3.61 us (48 CTAs), b4 s128 4.55
// -> 4.07 (4 tiles, 96 CTAs), b1 s64 3.32 -> 2.94; no gain past one wave (b8 s128, b20 s64).
int pick_split_tiles(int B, int S, int num_heads) {
  const int sms = sm_count();
  if (S <= 16 || sms == 0) return 0;
  const long long heads = static_cast<long long>(B) * num_heads;
  if (heads * ((S + 31) / 32) <= sms) return 2;
  if (heads * ((S + 63) / 64) <= sms) return 4;
  return 0;
}

template <int KT>
cudaError_t launch(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank, int B, int S,
                   int num_heads, float scale_log2, __half* out, uint8_t* outq, float q_inv, int warps,
                   int passes) {
  if (passes == 0) passes = pick_passes<KT>(B, S, num_heads, warps);
  const int rows_q = 16 * warps * passes;
  const dim3 grid((S + rows_q - 1) / rows_q, num_heads, B);
  const size_t smem = smem_bytes(KT, warps, passes);
  if (smem > 48 * 1024) {  // past the default dynamic shared memory cap: opt in (once is enough)
    const cudaError_t e = cudaFuncSetAttribute(attention_kernel<KT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  return LaunchPdl(attention_kernel<KT>, grid, dim3(32 * warps), smem, stream, true, qkv, mask, mask_rank, S,
                   num_heads * kD, scale_log2, passes, out, outq, q_inv);
}

size_t split_smem_bytes(int KH, int tiles) {
  return sizeof(__half) * static_cast<size_t>(16 * tiles + 2 * 32 * KH) * kLd +
         sizeof(float) * static_cast<size_t>(32 * KH + tiles * 32 * kXchFloats);
}

template <int KH>
cudaError_t launch_split(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank, int B,
                         int S, int num_heads, float scale_log2, __half* out, uint8_t* outq, float q_inv,
                         int tiles) {
  const int rows_q = 16 * tiles;
  const dim3 grid((S + rows_q - 1) / rows_q, num_heads, B);
  const size_t smem = split_smem_bytes(KH, tiles);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(attention_split_kernel<KH>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  return LaunchPdl(attention_split_kernel<KH>, grid, dim3(64 * tiles), smem, stream, true, qkv, mask, mask_rank,
                   S, num_heads * kD, scale_log2, out, outq, q_inv);
}

}  // namespace

cudaError_t bf_attention_f16_split(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank,
                                   int B, int S, int num_heads, int head_size, float scale, __half* out,
                                   int tiles, uint8_t* outq, float outq_scale) {
  if (attention_fast_unsupported(B, S, num_heads, head_size, mask_rank) != nullptr || S <= 16)
    return cudaErrorInvalidValue;  // S <= 16: no key in a second half
  if (qkv == nullptr || (out == nullptr && outq == nullptr) || (mask_rank > 0 && mask == nullptr))
    return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(out)) % 16 != 0) return cudaErrorInvalidValue;
  if (outq && (reinterpret_cast<uintptr_t>(outq) % 8 != 0 || !(outq_scale > 0.0f))) return cudaErrorInvalidValue;
  if (tiles < 0 || tiles > kMaxWarps) return cudaErrorInvalidValue;
  if (tiles == 0) tiles = pick_warps(B, S, num_heads);
  if (mask_rank == 0) mask = nullptr;
  const float q_inv = outq ? 1.0f / outq_scale : 1.0f;
  const float sc = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_size));
  const float scale_log2 = sc * kLog2e;
  switch ((S + 31) / 32) {
    case 1: return launch_split<1>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, tiles);
    case 2: return launch_split<2>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, tiles);
    case 3: return launch_split<3>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, tiles);
    case 4: return launch_split<4>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, tiles);
    default: return cudaErrorInvalidValue;
  }
}

const char* attention_fast_unsupported(int B, int S, int num_heads, int head_size, int mask_rank) {
  if (B < 1 || S < 1 || num_heads < 1) return "batch, sequence length and num_heads must be >= 1";
  if (head_size != kAttentionHeadSize) return "head size (hidden / num_heads) must be 64";
  if (S > kAttentionMaxSeq) return "sequence length must be <= 128";
  if (B > 65535 || num_heads > 65535) return "batch and num_heads must be <= 65535";
  if (mask_rank < 0 || mask_rank > 2) return "mask must be absent, rank 1 [B] key lengths or rank 2 [B, S] raw";
  return nullptr;
}

const char* attention_unsupported(int B, int S, int num_heads, int head_size, int mask_rank) {
  if (B < 1 || S < 1 || num_heads < 1) return "batch, sequence length and num_heads must be >= 1";
  if (mask_rank < 0 || mask_rank > 2) return "mask must be absent, rank 1 [B] key lengths or rank 2 [B, S] raw";
  if (static_cast<long long>(B) * S > 0x7fffffffLL) return "batch x sequence length is too large";
  return attention_general_unsupported(B * S, num_heads, head_size);
}

bool attention_e4m3_only(const __half* qkv, const uint8_t* outq, int B, int S, int num_heads, int head_size,
                         int mask_rank) {
  return outq != nullptr &&
         ((reinterpret_cast<uintptr_t>(qkv) % 16) | (reinterpret_cast<uintptr_t>(outq) % 8)) == 0 &&
         attention_fast_unsupported(B, S, num_heads, head_size, mask_rank) == nullptr;
}

cudaError_t bf_attention_f16_warps(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank,
                                   int B, int S, int num_heads, int head_size, float scale, __half* out,
                                   int warps, int passes, uint8_t* outq, float outq_scale) {
  if (attention_fast_unsupported(B, S, num_heads, head_size, mask_rank) != nullptr) return cudaErrorInvalidValue;
  if (qkv == nullptr || (out == nullptr && outq == nullptr) || (mask_rank > 0 && mask == nullptr))
    return cudaErrorInvalidValue;
  // 16-byte vector access: the row strides (3H, H halves) are multiples of 8 since D = 64.
  if ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(out)) % 16 != 0) return cudaErrorInvalidValue;
  if (outq && (reinterpret_cast<uintptr_t>(outq) % 8 != 0 || !(outq_scale > 0.0f))) return cudaErrorInvalidValue;
  if (mask_rank == 0) mask = nullptr;
  const float q_inv = outq ? 1.0f / outq_scale : 1.0f;  // fp32 reciprocal, as the quantize pass
  if (warps < 0 || warps > kMaxWarps || passes < 0 || passes > 2) return cudaErrorInvalidValue;
  if (warps == 0 && passes == 0) {  // the heuristic's choice: the keys-split kernel for few CTAs
    const int tiles = pick_split_tiles(B, S, num_heads);
    if (tiles > 0)
      return bf_attention_f16_split(stream, qkv, mask, mask_rank, B, S, num_heads, head_size, scale, out, tiles,
                                    outq, outq_scale);
  }
  if (warps == 0) warps = pick_warps(B, S, num_heads);
  const float sc = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_size));
  const float scale_log2 = sc * kLog2e;
  switch ((S + 15) / 16) {
    case 1: return launch<1>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, warps, passes);
    case 2: return launch<2>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, warps, passes);
    case 3: return launch<3>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, warps, passes);
    case 4: return launch<4>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, warps, passes);
    case 5: return launch<5>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, warps, passes);
    case 6: return launch<6>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, warps, passes);
    case 7: return launch<7>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, warps, passes);
    case 8: return launch<8>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, outq, q_inv, warps, passes);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t bf_attention_f16(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank, int B,
                             int S, int num_heads, int head_size, float scale, __half* out, uint8_t* outq,
                             float outq_scale) {
  // The tensor-core kernel where it covers the shape (head size 64, S <= 128), the tiled one
  // at head sizes 32/64/128 up to S 1024 (both read 16-byte aligned rows), the general path
  // everywhere else. The e4m3 copy: in the tensor-core kernel's store, else one quantize pass
  // (which reads the fp16 context: only the tensor-core kernel runs without `out`).
  const bool aligned = ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(out)) % 16) == 0 &&
                       reinterpret_cast<uintptr_t>(outq) % 8 == 0;
  if (aligned && attention_fast_unsupported(B, S, num_heads, head_size, mask_rank) == nullptr)
    return bf_attention_f16_warps(stream, qkv, mask, mask_rank, B, S, num_heads, head_size, scale, out, 0, 0,
                                  outq, outq_scale);
  if (out == nullptr) return cudaErrorInvalidValue;
  cudaError_t e;
  if (aligned && attention_tiled_unsupported(B, S, num_heads, head_size, mask_rank) == nullptr)
    e = bf_attention_tiled_f16(stream, qkv, mask, mask_rank, B, S, num_heads, head_size, scale, out);
  else
    e = bf_attention_general_f16(stream, qkv, mask, mask_rank, B, S, num_heads, head_size, scale, out);
  if (e != cudaSuccess || !outq) return e;
  return bf_quantize_e4m3(stream, out, outq_scale, outq, static_cast<size_t>(B) * S * num_heads * head_size);
}

}  // namespace bertfuse
