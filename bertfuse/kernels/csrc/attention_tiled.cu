// The tiled tensor-core attention path (attention_tiled.h).
//
// Per CTA: Q tile [64, D] in shared memory (its fragments then live in registers), K and V in
// blocks of 64 keys, double-buffered. Per warp (16 queries) and key block:
//   S = Q K^T         mma.sync m16n8k16 fp16 -> fp32, 8 score tiles of 8 keys
//   m' = max(m, rowmax(S)),  c = 2^(m - m'),  l = c l + rowsum(2^(S - m')),  O = c O + P V
// and at the end O / l, staged through the warp's own Q rows for 16-byte stores. Scores are kept
// in the log2 domain (scale and mask pre-multiplied by log2 e). Keys past S get -inf (probability
// exactly 0) and zero K/V rows; key 0 is always real, so the first block's max is finite.
#include "attention_tiled.h"

#include <atomic>
#include <cmath>

#include "launch.h"
#include "warp_mma.cuh"

namespace bertfuse {
namespace {

using namespace mma;

constexpr int kWarps = 4;
constexpr int kMaxDevices = 64;
constexpr int kRowsQ = 16 * kWarps;
constexpr int kKB = 64;  // keys per block
constexpr float kMaskFilter = -10000.0f;  // ORT Attention's mask_filter_value default
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
__host__ __device__ constexpr int ld() { return D + 8; }  // smem row stride in halves: ldmatrix rows on distinct banks

// Rows [row0, row0 + rows) of one D-wide column block into smem rows; rows at or past `valid`
// are zero-filled, not read.
template <int D>
__device__ __forceinline__ void load_rows(__half* dst, const __half* src, size_t stride, int row0, int rows,
                                          int valid, int tid) {
  for (int c = tid; c < rows * (D / 8); c += kWarps * 32) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    __half* d = dst + r * ld<D>() + col;
    if (row0 + r < valid) {
      cp_async16(d, src + static_cast<size_t>(row0 + r) * stride + col);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Zeroes this head's D columns of rows [r0, r1), spread over `parts` CTAs (this one is `part`).
template <int D>
__device__ __forceinline__ void zero_rows(__half* out, int H, int head, int r0, int r1, int part, int parts,
                                          int tid) {
  const int chunks = (r1 - r0) * (D / 8);
  for (int c = part * kWarps * 32 + tid; c < chunks; c += parts * kWarps * 32) {
    const int r = r0 + c / (D / 8), col = (c % (D / 8)) * 8;
    *reinterpret_cast<uint4*>(out + static_cast<size_t>(r) * H + head * D + col) = make_uint4(0u, 0u, 0u, 0u);
  }
}

template <int D>
size_t smem_bytes(int S) {
  const int blocks = (S + kKB - 1) / kKB;
  return sizeof(__half) * static_cast<size_t>(kRowsQ + 4 * kKB) * ld<D>() + sizeof(float) * blocks * kKB;
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    tiled_kernel(const __half* __restrict__ qkv, const int32_t* __restrict__ mask, int mask_rank,
                 const int32_t* __restrict__ cu, int T, int R, int S, int H, float scale_log2,
                 __half* __restrict__ out) {
  constexpr int LD = ld<D>();
  constexpr int NT = kKB / 8;  // 8-key score tiles per block
  extern __shared__ __align__(16) unsigned char smem_raw[];
  wait_for_producer();  // every input comes from the kernels before: nothing is read earlier
  __half* Qs = reinterpret_cast<__half*>(smem_raw);
  __half* Ks = Qs + kRowsQ * LD;     // [2][kKB][LD]
  __half* Vs = Ks + 2 * kKB * LD;    // [2][kKB][LD]
  float* madd = reinterpret_cast<float*>(Vs + 2 * kKB * LD);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int q0 = blockIdx.x * kRowsQ, head = blockIdx.y, b = blockIdx.z;
  // Padded: batch row b is rows [b S, b S + S) of qkv. Packed (cu given): sequence b is rows
  // [cu[b], cu[b + 1]), at most S of them attended, and the CTA row b == R zeroes the filler.
  size_t row0 = static_cast<size_t>(b) * S;
  int len = S;
  if (cu != nullptr) {
    if (b == R) {
      const int first = clampi(cu[0], 0, T), last = clampi(cu[R], first, T);
      zero_rows<D>(out, H, head, 0, first, blockIdx.x, gridDim.x, tid);
      zero_rows<D>(out, H, head, last, T, blockIdx.x, gridDim.x, tid);
      return;
    }
    const int start = clampi(cu[b], 0, T), end = clampi(cu[b + 1], start, T);
    len = end - start;
    if (len > S) {  // inconsistent inputs: attend the first S rows, zero the rest
      if (blockIdx.x == 0) zero_rows<D>(out, H, head, start + S, end, 0, 1, tid);
      len = S;
    }
    if (q0 >= len) return;  // CTA-uniform, before any barrier (an empty sequence too)
    row0 = start;
  }
  const size_t stride = 3 * static_cast<size_t>(H);
  const __half* base = qkv + row0 * stride + head * D;
  const int blocks = (len + kKB - 1) / kKB;

  load_rows<D>(Qs, base, stride, q0, kRowsQ, len, tid);
  load_rows<D>(Ks, base + H, stride, 0, kKB, len, tid);
  load_rows<D>(Vs, base + 2 * H, stride, 0, kKB, len, tid);
  cp_async_commit();
  for (int j = tid; j < blocks * kKB; j += kWarps * 32) {
    bool keep = true;  // raw mask: value > 0 keeps (ORT's rule); key lengths: j < len[b]
    if (j < len && mask_rank == 2) keep = mask[static_cast<size_t>(b) * S + j] > 0;
    if (j < len && mask_rank == 1) keep = j < mask[b];
    madd[j] = j >= len ? -INFINITY : (keep ? 0.0f : kMaskFilter * kLog2e);
  }

  const bool active = q0 + warp * 16 < len;  // warp-uniform; an idle warp still joins the syncs
  __half* Qw = Qs + warp * 16 * LD;
  uint32_t qa[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // rows g, g + 8 (lane partial sums)

  for (int blk = 0; blk < blocks; ++blk) {
    if (blk + 1 < blocks) {  // prefetch the next block into the other buffer
      const int nb = (blk + 1) & 1;
      load_rows<D>(Ks + nb * kKB * LD, base + H, stride, (blk + 1) * kKB, kKB, len, tid);
      load_rows<D>(Vs + nb * kKB * LD, base + 2 * H, stride, (blk + 1) * kKB, kKB, len, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (active) {
      if (blk == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(qa[kk], Qw + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
      }
      const __half* Kb = Ks + (blk & 1) * kKB * LD;
      const __half* Vb = Vs + (blk & 1) * kKB * LD;
      const float* mb = madd + blk * kKB;
      float acc[NT][4];
      float bm0 = -INFINITY, bm1 = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
        for (int p = 0; p < D / 32; ++p) {
          uint32_t kb[4];
          ldsm_x4(kb, Kb + (nt * 8 + (lane & 7)) * LD + p * 32 + (lane >> 3) * 8);
          mma16816(acc[nt], qa[2 * p], kb[0], kb[1]);
          mma16816(acc[nt], qa[2 * p + 1], kb[2], kb[3]);
        }
        const float2 m = *reinterpret_cast<const float2*>(mb + nt * 8 + 2 * t);
        acc[nt][0] = fmaf(acc[nt][0], scale_log2, m.x);
        acc[nt][1] = fmaf(acc[nt][1], scale_log2, m.y);
        acc[nt][2] = fmaf(acc[nt][2], scale_log2, m.x);
        acc[nt][3] = fmaf(acc[nt][3], scale_log2, m.y);
        bm0 = fmaxf(bm0, fmaxf(acc[nt][0], acc[nt][1]));
        bm1 = fmaxf(bm1, fmaxf(acc[nt][2], acc[nt][3]));
      }
      const float n0 = fmaxf(m0, quad_max(bm0)), n1 = fmaxf(m1, quad_max(bm1));
      const float c0 = fast_exp2(m0 - n0), c1 = fast_exp2(m1 - n1);  // m = -inf at first: 0
      m0 = n0;
      m1 = n1;
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc[nt][0] = fast_exp2(acc[nt][0] - n0);
        acc[nt][1] = fast_exp2(acc[nt][1] - n0);
        acc[nt][2] = fast_exp2(acc[nt][2] - n1);
        acc[nt][3] = fast_exp2(acc[nt][3] - n1);
        s0 += acc[nt][0] + acc[nt][1];
        s1 += acc[nt][2] + acc[nt][3];
      }
      l0 = l0 * c0 + s0;
      l1 = l1 * c1 + s1;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][0] *= c0;
        o[dt][1] *= c0;
        o[dt][2] *= c1;
        o[dt][3] *= c1;
      }
#pragma unroll
      for (int kk = 0; kk < kKB / 16; ++kk) pv_step<D, LD>(acc, kk, Vb, lane, o);
    }
    __syncthreads();  // every warp is done with this buffer before the next prefetch reuses it
  }
  if (!active) return;

  const float inv0 = 1.0f / quad_sum(l0), inv1 = 1.0f / quad_sum(l1);
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    *reinterpret_cast<__half2*>(Qw + g * LD + dt * 8 + 2 * t) = __floats2half2_rn(o[dt][0] * inv0, o[dt][1] * inv0);
    *reinterpret_cast<__half2*>(Qw + (g + 8) * LD + dt * 8 + 2 * t) =
        __floats2half2_rn(o[dt][2] * inv1, o[dt][3] * inv1);
  }
  __syncwarp();
  const int qw0 = q0 + warp * 16;
  for (int c = lane; c < 16 * (D / 8); c += 32) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    if (qw0 + r < len) {
      *reinterpret_cast<uint4*>(out + (row0 + qw0 + r) * H + head * D + col) =
          *reinterpret_cast<const uint4*>(Qw + r * LD + col);
    }
  }
}

// B: batch rows (padded) or sequences R (packed: cu given, T rows, one more CTA row for the filler).
template <int D>
cudaError_t launch(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank,
                   const int32_t* cu, int T, int B, int S, int num_heads, float scale_log2, __half* out) {
  const size_t smem = smem_bytes<D>(S);
  // Past 48 KB a kernel must opt in, per device; the most it can need is asked for once (not a
  // stream operation, so it is also safe while a CUDA graph is being captured).
  static std::atomic<bool> opted[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (!opted[dev].load(std::memory_order_acquire)) {
    const cudaError_t err = cudaFuncSetAttribute(tiled_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem_bytes<D>(kTiledMaxSeq)));
    if (err != cudaSuccess) return err;
    opted[dev].store(true, std::memory_order_release);
  }
  const dim3 grid((S + kRowsQ - 1) / kRowsQ, num_heads, cu != nullptr ? B + 1 : B);
  return LaunchPdl(tiled_kernel<D>, grid, dim3(kWarps * 32), smem, stream, true, qkv, mask, mask_rank, cu, T,
                   B, S, num_heads * D, scale_log2, out);
}

}  // namespace

const char* attention_tiled_unsupported(int B, int S, int num_heads, int head_size, int mask_rank) {
  if (B < 1 || S < 1 || num_heads < 1) return "batch, sequence length and num_heads must be >= 1";
  if (head_size != 32 && head_size != 64 && head_size != 128) return "head size must be 32, 64 or 128";
  if (S > kTiledMaxSeq) return "sequence length must be <= 1024";
  if (B > 65535 || num_heads > 65535) return "batch and num_heads must be <= 65535";
  if (mask_rank < 0 || mask_rank > 2) return "mask must be absent, rank 1 [B] key lengths or rank 2 [B, S] raw";
  return nullptr;
}

cudaError_t bf_attention_tiled_f16(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank,
                                   int B, int S, int num_heads, int head_size, float scale, __half* out) {
  if (attention_tiled_unsupported(B, S, num_heads, head_size, mask_rank) != nullptr) return cudaErrorInvalidValue;
  if (qkv == nullptr || out == nullptr || (mask_rank > 0 && mask == nullptr)) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(out)) % 16 != 0) return cudaErrorInvalidValue;
  if (mask_rank == 0) mask = nullptr;
  const float sc = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_size));
  const float scale_log2 = sc * kLog2e;
  switch (head_size) {
    case 32: return launch<32>(stream, qkv, mask, mask_rank, nullptr, B * S, B, S, num_heads, scale_log2, out);
    case 64: return launch<64>(stream, qkv, mask, mask_rank, nullptr, B * S, B, S, num_heads, scale_log2, out);
    default: return launch<128>(stream, qkv, mask, mask_rank, nullptr, B * S, B, S, num_heads, scale_log2, out);
  }
}

const char* packed_attention_tiled_unsupported(int T, int R, int S_max, int num_heads, int head_size) {
  if (T < 1 || R < 1) return "tokens and sequences must be >= 1";
  if (R >= 65535) return "sequences must be < 65535";
  return attention_tiled_unsupported(1, S_max, num_heads, head_size, 0);
}

cudaError_t bf_packed_attention_tiled_f16(cudaStream_t stream, const __half* qkv, const int32_t* cu_seqlens, int T,
                                          int R, int S_max, int num_heads, int head_size, float scale, __half* out) {
  if (packed_attention_tiled_unsupported(T, R, S_max, num_heads, head_size) != nullptr) return cudaErrorInvalidValue;
  if (qkv == nullptr || cu_seqlens == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(out)) % 16 != 0) return cudaErrorInvalidValue;
  const float sc = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_size));
  const float sl = sc * kLog2e;
  switch (head_size) {
    case 32: return launch<32>(stream, qkv, nullptr, 0, cu_seqlens, T, R, S_max, num_heads, sl, out);
    case 64: return launch<64>(stream, qkv, nullptr, 0, cu_seqlens, T, R, S_max, num_heads, sl, out);
    default: return launch<128>(stream, qkv, nullptr, 0, cu_seqlens, T, R, S_max, num_heads, sl, out);
  }
}

}  // namespace bertfuse
