// PackTokens / UnpackTokens kernels (see pack.h for the layout).
//
// Packing is one CTA of 1024 threads walking the [B, S] mask in tiles of 4096 positions: each
// thread counts its 4 consecutive positions, a warp-shuffle + shared-memory scan gives every
// thread its exclusive prefix, a running carry links the tiles. Row ends write cu_seqlens, kept
// positions write token_index / token_slot, the tail of token_index is filled with 0. One launch,
// no atomics, deterministic; B*S = 2,560 (b20 s64) is a single tile.
#include "pack.h"

namespace bertfuse {
namespace {

constexpr int kPackThreads = 1024;
constexpr int kPackItems = 4;
constexpr int kPackWarps = kPackThreads / 32;

__global__ void __launch_bounds__(kPackThreads)
    pack_tokens_kernel(const int32_t* __restrict__ mask, int B, int S, int T, int32_t* __restrict__ token_index,
                       int32_t* __restrict__ token_slot, int32_t* __restrict__ cu) {
  __shared__ int warp_prefix[kPackWarps];
  __shared__ int tile_total;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long N = static_cast<long long>(B) * S;
  if (tid == 0) cu[0] = 0;
  int carry = 0;  // kept tokens before this tile (block-uniform)
  for (long long tile0 = 0; tile0 < N; tile0 += kPackThreads * kPackItems) {
    const long long p0 = tile0 + static_cast<long long>(tid) * kPackItems;
    bool keep[kPackItems];
    int count = 0;
#pragma unroll
    for (int i = 0; i < kPackItems; ++i) {
      keep[i] = p0 + i < N && mask[p0 + i] != 0;
      count += keep[i];
    }
    int incl = count;  // inclusive scan within the warp
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    if (lane == 31) warp_prefix[warp] = incl;
    __syncthreads();
    if (warp == 0) {  // scan of the warp totals (kPackWarps == 32)
      const int total = warp_prefix[lane];
      int w = total;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, w, d);
        if (lane >= d) w += v;
      }
      warp_prefix[lane] = w - total;  // exclusive
      if (lane == 31) tile_total = w;
    }
    __syncthreads();
    int rank = carry + warp_prefix[warp] + incl - count;  // kept tokens before p0
#pragma unroll
    for (int i = 0; i < kPackItems; ++i) {
      const long long p = p0 + i;
      if (p >= N) break;
      int slot = -1;
      if (keep[i]) {
        if (rank < T) {
          slot = rank;
          token_index[rank] = static_cast<int32_t>(p);
        }
        ++rank;
      }
      token_slot[p] = slot;
      if ((p + 1) % S == 0) cu[(p + 1) / S] = rank < T ? rank : T;
    }
    carry += tile_total;
    __syncthreads();  // warp_prefix / tile_total are rewritten by the next tile
  }
  for (int r = (carry < T ? carry : T) + tid; r < T; r += kPackThreads) token_index[r] = 0;  // filler
}

// One 16-byte chunk per thread: out[(b,s), c] = packed[slot, c] or 0.
__global__ void unpack_vec_kernel(const uint4* __restrict__ packed, int T, const int32_t* __restrict__ slot,
                                  long long positions, int chunks, uint4* __restrict__ out) {
  const long long n = positions * chunks;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long p = i / chunks;
    const int c = static_cast<int>(i - p * chunks);
    const int s = slot[p];
    out[i] = (s >= 0 && s < T) ? packed[static_cast<long long>(s) * chunks + c] : make_uint4(0u, 0u, 0u, 0u);
  }
}

// Byte-wise fallback for row sizes or pointers that are not 16-byte aligned.
__global__ void unpack_byte_kernel(const unsigned char* __restrict__ packed, int T, const int32_t* __restrict__ slot,
                                   long long positions, long long row_bytes, unsigned char* __restrict__ out) {
  const long long n = positions * row_bytes;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long p = i / row_bytes, c = i - p * row_bytes;
    const int s = slot[p];
    out[i] = (s >= 0 && s < T) ? packed[s * row_bytes + c] : 0;
  }
}

}  // namespace

const char* pack_tokens_unsupported(int B, int S, int T) {
  if (B < 1 || S < 1 || T < 1) return "batch, sequence length and token count must be >= 1";
  if (static_cast<long long>(B) * S > INT32_MAX) return "B * S must fit in int32";
  return nullptr;
}

const char* unpack_tokens_unsupported(int T, int B, int S, long long row_bytes) {
  if (T < 1 || B < 1 || S < 1 || row_bytes < 1) return "token count, batch, sequence length and width must be >= 1";
  if (static_cast<long long>(B) * S > INT32_MAX) return "B * S must fit in int32";
  return nullptr;
}

cudaError_t bf_pack_tokens(cudaStream_t stream, const int32_t* mask, int B, int S, int T, int32_t* token_index,
                           int32_t* token_slot, int32_t* cu_seqlens) {
  if (pack_tokens_unsupported(B, S, T) != nullptr) return cudaErrorInvalidValue;
  if (mask == nullptr || token_index == nullptr || token_slot == nullptr || cu_seqlens == nullptr)
    return cudaErrorInvalidValue;
  pack_tokens_kernel<<<1, kPackThreads, 0, stream>>>(mask, B, S, T, token_index, token_slot, cu_seqlens);
  return cudaGetLastError();
}

cudaError_t bf_unpack_tokens(cudaStream_t stream, const void* packed, int T, const int32_t* token_slot, int B, int S,
                             long long row_bytes, void* out) {
  if (unpack_tokens_unsupported(T, B, S, row_bytes) != nullptr) return cudaErrorInvalidValue;
  if (packed == nullptr || token_slot == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const long long positions = static_cast<long long>(B) * S;
  constexpr int kThreads = 256;
  const bool vec = row_bytes % 16 == 0 &&
                   (reinterpret_cast<uintptr_t>(packed) | reinterpret_cast<uintptr_t>(out)) % 16 == 0 &&
                   row_bytes / 16 <= INT32_MAX;
  const long long work = positions * (vec ? row_bytes / 16 : row_bytes);
  long long blocks = (work + kThreads - 1) / kThreads;
  if (blocks > 65535LL * 8) blocks = 65535LL * 8;  // grid-stride beyond this
  if (vec) {
    unpack_vec_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const uint4*>(packed), T, token_slot, positions, static_cast<int>(row_bytes / 16),
        static_cast<uint4*>(out));
  } else {
    unpack_byte_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const unsigned char*>(packed), T, token_slot, positions, row_bytes,
        static_cast<unsigned char*>(out));
  }
  return cudaGetLastError();
}

}  // namespace bertfuse
