// BertAttention kernel: one CTA per (query tile, head, batch row); each warp owns 16 queries.
//
// The CTA copies its Q tile and the head's K and V (read straight out of the [B, S, 3H] qkv
// layout, no transpose kernels) into shared memory with cp.async, turns the mask into an additive
// per-key term in shared memory (no separate mask pass), then per warp:
//   S = Q K^T       mma.sync m16n8k16 fp16 -> fp32, all keys held in registers (S <= 128)
//   softmax         fp32 in registers, row max/sum over the 4 lanes sharing a row
//   O = P V         P re-packed from the score accumulators as fp16 A fragments
// and writes O through shared memory with 16-byte stores. Keys are padded to a multiple of 16
// inside the kernel: padded keys get -inf (probability exactly 0), padded K/V/Q rows are zeros.
#include "attention.h"

#include "attention_general.h"
#include "attention_tiled.h"

#include <cmath>

#include "launch.h"
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

// KT = number of 16-key tiles (keys padded to 16*KT >= S).
template <int KT>
__global__ void __launch_bounds__(kMaxWarps * 32)
    attention_kernel(const __half* __restrict__ qkv, const int32_t* __restrict__ mask, int mask_rank, int S,
                     int H, float scale_log2, __half* __restrict__ out) {
  constexpr int SP = 16 * KT;  // padded key count
  constexpr int NT = 2 * KT;   // 8-key score tiles per row
  extern __shared__ __align__(16) unsigned char smem_raw[];
  wait_for_producer();  // Q, K, V (and the mask) come from the kernels before: nothing is read earlier
  const int nthreads = blockDim.x, warps = nthreads / 32;
  const int rows_q = 16 * warps;
  __half* Qs = reinterpret_cast<__half*>(smem_raw);
  __half* Ks = Qs + rows_q * kLd;
  __half* Vs = Ks + SP * kLd;
  float* madd = reinterpret_cast<float*>(Vs + SP * kLd);  // additive mask, log2 domain

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // mma fragment row group / column pair
  const int q0 = blockIdx.x * rows_q, head = blockIdx.y, b = blockIdx.z;
  const size_t stride = 3 * static_cast<size_t>(H);
  const __half* base = qkv + static_cast<size_t>(b) * S * stride + head * kD;

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
  cp_async_wait<1>();  // Q and K have landed; V may still be in flight
  __syncthreads();

  const bool active = q0 + warp * 16 < S;  // warp-uniform: a tail warp past S only syncs
  __half* Qw = Qs + warp * 16 * kLd;
  float acc[NT][4];
  float sum0 = 1.0f, sum1 = 1.0f;  // rows g and g + 8 of this warp's tile
  if (active) {
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
    mx0 = quad_max(mx0);  // finite: key 0 is real, its term is at worst -10000*log2e
    mx1 = quad_max(mx1);
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
    sum0 = quad_sum(s0);
    sum1 = quad_sum(s1);
  }
  cp_async_wait<0>();
  __syncthreads();
  if (!active) return;

  float o[kD / 8][4];
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    // The C layout of score tiles 2kk, 2kk+1 is the A layout of keys 16kk .. 16kk+15.
    const uint32_t pa[4] = {pack_half2(acc[2 * kk][0], acc[2 * kk][1]), pack_half2(acc[2 * kk][2], acc[2 * kk][3]),
                            pack_half2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]),
                            pack_half2(acc[2 * kk + 1][2], acc[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < kD / 16; ++np) {
      uint32_t vb[4];  // B fragments (both key halves) of d-tiles 2np and 2np+1
      ldsm_x4_trans(vb, Vs + (kk * 16 + (lane & 15)) * kLd + np * 16 + (lane >> 4) * 8);
      mma16816(o[2 * np], pa, vb[0], vb[1]);
      mma16816(o[2 * np + 1], pa, vb[2], vb[3]);
    }
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
    const int r = c / (kD / 8), col = (c % (kD / 8)) * 8;
    if (qw0 + r < S) {
      *reinterpret_cast<uint4*>(out + (static_cast<size_t>(b) * S + qw0 + r) * H + head * kD + col) =
          *reinterpret_cast<const uint4*>(Qw + r * kLd + col);
    }
  }
}

// As many warps (16-row query tiles) per CTA as the sequence fills, up to 4. Measured on the H200
// (benchmarks/kernels/kernels_attention.py): 4 warps was fastest or within 3% in every case, also where
// it leaves SMs idle (b1 s128 h12: 24 CTAs, 4.40 us; 1 warp and 96 CTAs, 6.48 us), because each
// CTA loads the head's whole K and V and smaller tiles repeat that load.
int pick_warps(int /*B*/, int S, int /*num_heads*/) {
  const int tiles16 = (S + 15) / 16;
  return tiles16 < kMaxWarps ? tiles16 : kMaxWarps;
}

template <int KT>
cudaError_t launch(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank, int B, int S,
                   int num_heads, float scale_log2, __half* out, int warps) {
  const int rows_q = 16 * warps;
  const dim3 grid((S + rows_q - 1) / rows_q, num_heads, B);
  const size_t smem = sizeof(__half) * static_cast<size_t>(rows_q + 2 * 16 * KT) * kLd + sizeof(float) * 16 * KT;
  return LaunchPdl(attention_kernel<KT>, grid, dim3(32 * warps), smem, stream, true, qkv, mask, mask_rank, S,
                   num_heads * kD, scale_log2, out);
}

}  // namespace

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

cudaError_t bf_attention_f16_warps(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank,
                                   int B, int S, int num_heads, int head_size, float scale, __half* out,
                                   int warps) {
  if (attention_fast_unsupported(B, S, num_heads, head_size, mask_rank) != nullptr) return cudaErrorInvalidValue;
  if (qkv == nullptr || out == nullptr || (mask_rank > 0 && mask == nullptr)) return cudaErrorInvalidValue;
  // 16-byte vector access: the row strides (3H, H halves) are multiples of 8 since D = 64.
  if ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(out)) % 16 != 0) return cudaErrorInvalidValue;
  if (mask_rank == 0) mask = nullptr;
  if (warps < 0 || warps > kMaxWarps) return cudaErrorInvalidValue;
  if (warps == 0) warps = pick_warps(B, S, num_heads);
  const float sc = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_size));
  const float scale_log2 = sc * kLog2e;
  switch ((S + 15) / 16) {
    case 1: return launch<1>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, warps);
    case 2: return launch<2>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, warps);
    case 3: return launch<3>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, warps);
    case 4: return launch<4>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, warps);
    case 5: return launch<5>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, warps);
    case 6: return launch<6>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, warps);
    case 7: return launch<7>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, warps);
    case 8: return launch<8>(stream, qkv, mask, mask_rank, B, S, num_heads, scale_log2, out, warps);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t bf_attention_f16(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank, int B,
                             int S, int num_heads, int head_size, float scale, __half* out) {
  // The tensor-core kernel where it covers the shape (head size 64, S <= 128), the tiled one
  // at head sizes 32/64/128 up to S 1024 (both read 16-byte aligned rows), the general path
  // everywhere else.
  const bool aligned = ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(out)) % 16) == 0;
  if (aligned && attention_fast_unsupported(B, S, num_heads, head_size, mask_rank) == nullptr)
    return bf_attention_f16_warps(stream, qkv, mask, mask_rank, B, S, num_heads, head_size, scale, out, 0);
  if (aligned && attention_tiled_unsupported(B, S, num_heads, head_size, mask_rank) == nullptr)
    return bf_attention_tiled_f16(stream, qkv, mask, mask_rank, B, S, num_heads, head_size, scale, out);
  return bf_attention_general_f16(stream, qkv, mask, mask_rank, B, S, num_heads, head_size, scale, out);
}

}  // namespace bertfuse

extern "C" int bf_check_attention_warps(uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S, int num_heads,
                                        int head_size, float scale, uintptr_t out, uintptr_t stream, int warps) {
  // The tensor-core kernel alone (warps picks its CTA size): -1 where it does not cover the shape.
  if (bertfuse::attention_fast_unsupported(B, S, num_heads, head_size, mask_rank) != nullptr) return -1;
  return static_cast<int>(bertfuse::bf_attention_f16_warps(
      reinterpret_cast<cudaStream_t>(stream), reinterpret_cast<const __half*>(qkv),
      reinterpret_cast<const int32_t*>(mask), mask_rank, B, S, num_heads, head_size, scale,
      reinterpret_cast<__half*>(out), warps));
}

extern "C" int bf_check_attention(uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S, int num_heads,
                                  int head_size, float scale, uintptr_t out, uintptr_t stream) {
  // What the op runs: the tensor-core kernel or the general path.
  if (bertfuse::attention_unsupported(B, S, num_heads, head_size, mask_rank) != nullptr) return -1;
  return static_cast<int>(bertfuse::bf_attention_f16(
      reinterpret_cast<cudaStream_t>(stream), reinterpret_cast<const __half*>(qkv),
      reinterpret_cast<const int32_t*>(mask), mask_rank, B, S, num_heads, head_size, scale,
      reinterpret_cast<__half*>(out)));
}

extern "C" const char* bf_attention_unsupported(int B, int S, int num_heads, int head_size, int mask_rank) {
  return bertfuse::attention_unsupported(B, S, num_heads, head_size, mask_rank);
}
