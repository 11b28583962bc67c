// The tiled tensor-core attention path: head sizes 32, 64 and 128, sequences up to 1024, padded
// and packed forms. Same inputs, outputs and math as BertAttention (attention.h):
//   scores = scale * Q K^T + (kept ? 0 : -10000), fp32 softmax over keys, context [B, S, H] fp16.
// One CTA per (64-query tile, head, batch row); keys in blocks of 64, K and V of the next block
// copied with cp.async while the current one is computed; an online softmax (running max and sum
// in fp32 registers) as flash attention does, so the length is bounded only by the per-key mask
// term kept in shared memory. attention.cu's kernel (all keys in registers) stays the choice at
// head size 64 and S <= 128; this one covers the rest of the common shapes.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bertfuse {

constexpr int kTiledMaxSeq = 1024;

// nullptr when the tiled kernel covers the shape, else a one-line reason (a string literal).
const char* attention_tiled_unsupported(int B, int S, int num_heads, int head_size, int mask_rank);

// Launch on `stream` (no allocation or synchronisation: CUDA-graph safe); scale <= 0 means
// 1/sqrt(head_size). qkv and out must be 16-byte aligned. cudaErrorInvalidValue where the shape
// is not covered.
cudaError_t bf_attention_tiled_f16(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank,
                                   int B, int S, int num_heads, int head_size, float scale, __half* out);

// Packed form (PackedBertAttention's contract, packed_attention.h): qkv [T, 3H], sequence r is
// rows cu[r]..cu[r+1]-1 (at most S_max attended), filler rows come back as zeros.
const char* packed_attention_tiled_unsupported(int T, int R, int S_max, int num_heads, int head_size);
cudaError_t bf_packed_attention_tiled_f16(cudaStream_t stream, const __half* qkv, const int32_t* cu_seqlens, int T,
                                          int R, int S_max, int num_heads, int head_size, float scale, __half* out);

}  // namespace bertfuse
