// PackedBertAttention kernel: one CTA per (query tile, head, sequence); each warp owns 16 queries.
//
// The CTA reads its sequence's bounds from cu_seqlens, copies its Q tile and the sequence's K and
// V rows (straight out of the [T, 3H] qkv layout) into shared memory with cp.async, then per warp:
//   S = Q K^T       mma.sync m16n8k16 fp16 -> fp32, key tiles past the sequence's end skipped
//   softmax         fp32 in registers, keys past the end get -inf (probability exactly 0)
//   O = P V         P re-packed from the score accumulators as fp16 A fragments
// and writes O through shared memory with 16-byte stores. Work follows each sequence's real
// length: query tiles past its end exit at once, key tiles past it are neither loaded nor
// multiplied. One extra CTA row (blockIdx.z == R) zeroes the rows no sequence covers (filler).
#include "packed_attention.h"

#include "attention_general.h"
#include "attention_tiled.h"

#include <cmath>

#include "launch.h"
#include "warp_mma.cuh"

namespace bertfuse {
namespace {

using namespace mma;

constexpr int kD = kPackedAttentionHeadSize;
constexpr int kLd = kD + 8;  // smem row stride in halves (144 B): ldmatrix rows hit distinct banks
constexpr int kMaxWarps = 4;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Zeroes this head's D columns of rows [r0, r1), spread over `parts` CTAs (this one is `part`).
__device__ __forceinline__ void zero_rows(__half* out, int H, int head, int r0, int r1, int part, int parts,
                                          int tid, int nthreads) {
  const int chunks = (r1 - r0) * (kD / 8);
  for (int c = part * nthreads + tid; c < chunks; c += parts * nthreads) {
    const int r = r0 + c / (kD / 8), col = (c % (kD / 8)) * 8;
    *reinterpret_cast<uint4*>(out + static_cast<size_t>(r) * H + head * kD + col) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// Copies rows [row0, row0 + rows) of one D-wide column block into smem rows of kLd halves; rows at
// or past `valid` are zero-filled, not read.
__device__ __forceinline__ void load_rows(__half* dst, const __half* src, size_t stride, int row0, int rows,
                                          int valid, int tid, int nthreads) {
  for (int c = tid; c < rows * (kD / 8); c += nthreads) {
    const int r = c / (kD / 8), col = (c % (kD / 8)) * 8;
    __half* d = dst + r * kLd + col;
    if (row0 + r < valid) {
      cp_async16(d, src + static_cast<size_t>(row0 + r) * stride + col);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// KT = number of 16-key tiles held in registers (16*KT >= S_max).
template <int KT>
__global__ void __launch_bounds__(kMaxWarps * 32)
    packed_attention_kernel(const __half* __restrict__ qkv, const int32_t* __restrict__ cu, int T, int R,
                            int S_max, int H, float scale_log2, __half* __restrict__ out) {
  constexpr int SP = 16 * KT;
  constexpr int NT = 2 * KT;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  wait_for_producer();  // Q, K, V and cu_seqlens come from the kernels before
  const int nthreads = blockDim.x, warps = nthreads / 32;
  const int rows_q = 16 * warps;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int q0 = blockIdx.x * rows_q, head = blockIdx.y, r = blockIdx.z;

  if (r == R) {  // filler: rows before cu[0] and at or past cu[R] belong to no sequence
    const int first = clampi(cu[0], 0, T), last = clampi(cu[R], first, T);
    zero_rows(out, H, head, 0, first, blockIdx.x, gridDim.x, tid, nthreads);
    zero_rows(out, H, head, last, T, blockIdx.x, gridDim.x, tid, nthreads);
    return;
  }
  const int start = clampi(cu[r], 0, T), end = clampi(cu[r + 1], start, T);
  int len = end - start;
  if (len > S_max) {  // inconsistent inputs: attend the first S_max rows, zero the rest
    if (blockIdx.x == 0) zero_rows(out, H, head, start + S_max, end, 0, 1, tid, nthreads);
    len = S_max;
  }
  if (q0 >= len) return;  // CTA-uniform, before any barrier

  __half* Qs = reinterpret_cast<__half*>(smem_raw);
  __half* Ks = Qs + rows_q * kLd;
  __half* Vs = Ks + SP * kLd;
  const size_t stride = 3 * static_cast<size_t>(H);
  const __half* base = qkv + static_cast<size_t>(start) * stride + head * kD;
  const int kv_rows = (len + 15) & ~15;  // key tiles of 16 the kernel touches

  load_rows(Qs, base, stride, q0, rows_q, len, tid, nthreads);
  load_rows(Ks, base + H, stride, 0, kv_rows, len, tid, nthreads);
  cp_async_commit();
  load_rows(Vs, base + 2 * H, stride, 0, kv_rows, len, tid, nthreads);
  cp_async_commit();
  cp_async_wait<1>();  // Q and K have landed; V may still be in flight
  __syncthreads();

  const bool active = q0 + warp * 16 < len;  // warp-uniform
  __half* Qw = Qs + warp * 16 * kLd;
  float acc[NT][4];
  float sum0 = 1.0f, sum1 = 1.0f;
  if (active) {
    uint32_t qa[kD / 16][4];
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) ldsm_x4(qa[kk], Qw + (lane & 15) * kLd + kk * 16 + (lane >> 4) * 8);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
      if (nt * 8 < len) {  // warp-uniform: key tiles past the end are not multiplied
#pragma unroll
        for (int p = 0; p < kD / 32; ++p) {
          uint32_t kb[4];  // B fragments of k-steps 2p and 2p+1 for keys nt*8 .. nt*8+7
          ldsm_x4(kb, Ks + (nt * 8 + (lane & 7)) * kLd + p * 32 + (lane >> 3) * 8);
          mma16816(acc[nt], qa[2 * p], kb[0], kb[1]);
          mma16816(acc[nt], qa[2 * p + 1], kb[2], kb[3]);
        }
      }
      const int j = nt * 8 + 2 * t;  // keys past the end: -inf, probability exactly 0
      const float m0 = j < len ? 0.0f : -INFINITY, m1 = j + 1 < len ? 0.0f : -INFINITY;
      acc[nt][0] = fmaf(acc[nt][0], scale_log2, m0);
      acc[nt][1] = fmaf(acc[nt][1], scale_log2, m1);
      acc[nt][2] = fmaf(acc[nt][2], scale_log2, m0);
      acc[nt][3] = fmaf(acc[nt][3], scale_log2, m1);
      mx0 = fmaxf(mx0, fmaxf(acc[nt][0], acc[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(acc[nt][2], acc[nt][3]));
    }
    exp2_rows(acc, mx0, mx1, &sum0, &sum1);  // maxima finite: key 0 is always real (len >= 1)
  }
  cp_async_wait<0>();
  __syncthreads();
  if (!active) return;

  float o[kD / 8][4];
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    if (kk * 16 < len) pv_step<kD, kLd>(acc, kk, Vs, lane, o);  // warp-uniform: P past the end is exactly 0
  }

  // Stage the normalised tile in this warp's own Q rows (only it read them), then 16-byte stores.
  const float inv0 = 1.0f / sum0, inv1 = 1.0f / sum1;
  __syncwarp();
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) {
    *reinterpret_cast<__half2*>(Qw + g * kLd + dt * 8 + 2 * t) = __floats2half2_rn(o[dt][0] * inv0, o[dt][1] * inv0);
    *reinterpret_cast<__half2*>(Qw + (g + 8) * kLd + dt * 8 + 2 * t) =
        __floats2half2_rn(o[dt][2] * inv1, o[dt][3] * inv1);
  }
  __syncwarp();
  const int qw0 = q0 + warp * 16;
#pragma unroll
  for (int c = lane; c < 16 * (kD / 8); c += 32) {
    const int row = c / (kD / 8), col = (c % (kD / 8)) * 8;
    if (qw0 + row < len) {
      *reinterpret_cast<uint4*>(out + (static_cast<size_t>(start) + qw0 + row) * H + head * kD + col) =
          *reinterpret_cast<const uint4*>(Qw + row * kLd + col);
    }
  }
}

// Warps per CTA from the mean sequence length (T / R): fewer, smaller query tiles until the CTAs
// that do work cover the SMs once.
int pick_warps(int T, int R, int S_max, int num_heads) {
  int mean = R > 0 ? (T + R - 1) / R : S_max;
  if (mean > S_max) mean = S_max;
  const int tiles16 = mean > 0 ? (mean + 15) / 16 : 1;
  int w = tiles16 < kMaxWarps ? tiles16 : kMaxWarps;
  const long long heads = static_cast<long long>(R) * num_heads;
  const int sms = sm_count();
  while (w > 1 && heads * ((tiles16 + w - 1) / w) < sms) w = (w + 1) / 2;
  return w;
}

template <int KT>
cudaError_t launch(cudaStream_t stream, const __half* qkv, const int32_t* cu, int T, int R, int S_max,
                   int num_heads, float scale_log2, __half* out, int warps) {
  const int rows_q = 16 * warps;
  const dim3 grid((S_max + rows_q - 1) / rows_q, num_heads, R + 1);
  const size_t smem = sizeof(__half) * static_cast<size_t>(rows_q + 2 * 16 * KT) * kLd;
  return LaunchPdl(packed_attention_kernel<KT>, grid, dim3(32 * warps), smem, stream, true, qkv, cu, T, R, S_max,
                   num_heads * kD, scale_log2, out);
}

}  // namespace

const char* packed_attention_fast_unsupported(int T, int R, int S_max, int num_heads, int head_size) {
  if (T < 1 || R < 1 || S_max < 1 || num_heads < 1)
    return "token count, sequence count, S_max and num_heads must be >= 1";
  if (head_size != kPackedAttentionHeadSize) return "head size (hidden / num_heads) must be 64";
  if (S_max > kPackedAttentionMaxSeq) return "S_max (the longest sequence) must be <= 128";
  if (R >= 65535 || num_heads > 65535) return "sequence count must be < 65535 and num_heads <= 65535";
  if (static_cast<long long>(T) * 3 * num_heads * head_size > INT32_MAX)
    return "qkv is too large (T * 3H must fit in int32)";
  return nullptr;
}

const char* packed_attention_unsupported(int T, int R, int S_max, int num_heads, int head_size) {
  if (T < 1 || R < 1 || S_max < 1 || num_heads < 1)
    return "token count, sequence count, S_max and num_heads must be >= 1";
  if (static_cast<long long>(T) * 3 * num_heads * head_size > INT32_MAX)
    return "qkv is too large (T * 3H must fit in int32)";
  return attention_general_unsupported(T, num_heads, head_size);
}

cudaError_t bf_packed_attention_f16(cudaStream_t stream, const __half* qkv, const int32_t* cu_seqlens, int T, int R,
                                    int S_max, int num_heads, int head_size, float scale, __half* out, int warps) {
  if (packed_attention_unsupported(T, R, S_max, num_heads, head_size) != nullptr) return cudaErrorInvalidValue;
  if (qkv == nullptr || cu_seqlens == nullptr || out == nullptr) return cudaErrorInvalidValue;
  // The tensor-core kernel where it covers the shape and its 16-byte aligned rows (D = 64 makes
  // the 3H and H strides multiples of 8 halves), the general path everywhere else.
  const bool aligned = (reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  if (packed_attention_fast_unsupported(T, R, S_max, num_heads, head_size) != nullptr || !aligned) {
    // The tiled tensor-core kernel (head sizes 32/64/128, S_max <= 1024), else the general path.
    if (aligned && packed_attention_tiled_unsupported(T, R, S_max, num_heads, head_size) == nullptr)
      return bf_packed_attention_tiled_f16(stream, qkv, cu_seqlens, T, R, S_max, num_heads, head_size, scale, out);
    return bf_packed_attention_general_f16(stream, qkv, cu_seqlens, T, R, S_max, num_heads, head_size, scale,
                                           out);
  }
  if (warps < 0 || warps > kMaxWarps) return cudaErrorInvalidValue;
  if (warps == 0) warps = pick_warps(T, R, S_max, num_heads);
  const float sc = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_size));
  const float sl = sc * kLog2e;
  switch ((S_max + 15) / 16) {
    case 1: return launch<1>(stream, qkv, cu_seqlens, T, R, S_max, num_heads, sl, out, warps);
    case 2: return launch<2>(stream, qkv, cu_seqlens, T, R, S_max, num_heads, sl, out, warps);
    case 3: return launch<3>(stream, qkv, cu_seqlens, T, R, S_max, num_heads, sl, out, warps);
    case 4: return launch<4>(stream, qkv, cu_seqlens, T, R, S_max, num_heads, sl, out, warps);
    case 5: return launch<5>(stream, qkv, cu_seqlens, T, R, S_max, num_heads, sl, out, warps);
    case 6: return launch<6>(stream, qkv, cu_seqlens, T, R, S_max, num_heads, sl, out, warps);
    case 7: return launch<7>(stream, qkv, cu_seqlens, T, R, S_max, num_heads, sl, out, warps);
    case 8: return launch<8>(stream, qkv, cu_seqlens, T, R, S_max, num_heads, sl, out, warps);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace bertfuse
