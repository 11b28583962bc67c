// The general attention path: any head size up to 256 and any sequence length, for the shapes
// the fast tensor-core kernels (attention.cu, packed_attention.cu: head size 64, S <= 128) do not
// cover. Same inputs, outputs and math as BertAttention / PackedBertAttention:
//   scores = scale * Q K^T + (kept ? 0 : -10000), fp32 softmax over keys, context fp16.
// One warp per (query row, head): each lane holds ceil(D / 32) of the head's columns, the keys are
// visited in order with an online (running max and sum) softmax in fp32, so nothing is stored
// per key and any length runs. Correct first: it reads K and V once per query row, not once per
// tile as the fast kernels do.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bertfuse {

constexpr int kGeneralMaxHeadSize = 256;

// nullptr when the general path supports the shape, else a one-line reason (a string literal).
const char* attention_general_unsupported(int rows, int num_heads, int head_size);

// Padded: qkv [B, S, 3H], mask as BertAttention's (rank 0 none, 1 key lengths [B], 2 raw [B, S]).
cudaError_t bf_attention_general_f16(cudaStream_t stream, const __half* qkv, const int32_t* mask,
                                     int mask_rank, int B, int S, int num_heads, int head_size,
                                     float scale, __half* out);

// Packed: qkv [T, 3H], cu_seqlens [R + 1] as PackedBertAttention's (rows past cu[R] and rows
// past S_max in their sequence come back as zeros; cu is clamped into [0, T], non-decreasing).
cudaError_t bf_packed_attention_general_f16(cudaStream_t stream, const __half* qkv,
                                            const int32_t* cu_seqlens, int T, int R, int S_max,
                                            int num_heads, int head_size, float scale, __half* out);

}  // namespace bertfuse
