// BertAttention: fused multi-head self-attention over a packed QKV tensor (one kernel).
//
// qkv [B, S, 3H] fp16 (bias already added), columns [0,H) Q, [H,2H) K, [2H,3H) V, head n at
// columns n*D..n*D+D-1 of each block. mask: nullptr (mask_rank 0), raw int32 [B, S] (rank 2,
// value > 0 keeps key j) or int32 key lengths [B] (rank 1, key j kept iff j < len[b]).
// scores = scale * Q K^T + (kept ? 0 : -10000), fp32 softmax over keys, context [B, S, H] fp16.
// The tensor-core kernel covers 1 <= S <= 128 at head size 64, the tiled one (attention_tiled.h)
// head sizes 32, 64 and 128 up to S 1024; every other shape up to head size 256 runs on the
// general path (attention_general.h). Anything else is refused, never computed wrongly.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bertfuse {

constexpr int kAttentionMaxSeq = 128;
constexpr int kAttentionHeadSize = 64;

// nullptr when the op supports the shape (on either path), else a one-line reason (a string literal).
const char* attention_unsupported(int B, int S, int num_heads, int head_size, int mask_rank);
// The same for the tensor-core kernel alone.
const char* attention_fast_unsupported(int B, int S, int num_heads, int head_size, int mask_rank);

// True where bf_attention_f16 runs with out = nullptr: the tensor-core kernel covers the shape and
// writes outq (non-null) in its store, so the fp16 context need not be written at all.
bool attention_e4m3_only(const __half* qkv, const uint8_t* outq, int B, int S, int num_heads, int head_size,
                         int mask_rank);

// Launch on `stream`; no allocation, no synchronisation (CUDA-graph safe). scale <= 0 means
// 1/sqrt(head_size). The tensor-core kernel where it covers the shape, else the general path.
// outq (optional, 8-byte aligned, B*S*H bytes) receives e4m3_satfinite(context * (1 / outq_scale))
// for an FP8 GEMM downstream: written by the tensor-core kernel's store, else by one more pass.
// out may be nullptr where attention_e4m3_only says so (only outq is written).
// Returns cudaErrorInvalidValue for an unsupported shape (see attention_unsupported), else the
// launch status.
cudaError_t bf_attention_f16(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank,
                             int B, int S, int num_heads, int head_size, float scale, __half* out,
                             uint8_t* outq = nullptr, float outq_scale = 1.0f);

// The tensor-core kernel alone, with an explicit number of warps per CTA (1..4) and of passes per
// warp (1..2): each warp owns 16 queries per pass. warps 0 and passes 0: the heuristic's choice,
// which may be the keys-split kernel (bf_attention_f16_split) for grids of few CTAs.
// cudaErrorInvalidValue where it does not cover the shape.
cudaError_t bf_attention_f16_warps(cudaStream_t stream, const __half* qkv, const int32_t* mask,
                                   int mask_rank, int B, int S, int num_heads, int head_size, float scale,
                                   __half* out, int warps, int passes = 1, uint8_t* outq = nullptr,
                                   float outq_scale = 1.0f);

// The keys-split kernel alone: `tiles` 16-query tiles per CTA (1..4; 0 = as many as S fills),
// each tile's keys split between two warps. cudaErrorInvalidValue where it does not cover the
// shape (as above, and S <= 16).
cudaError_t bf_attention_f16_split(cudaStream_t stream, const __half* qkv, const int32_t* mask, int mask_rank,
                                   int B, int S, int num_heads, int head_size, float scale, __half* out,
                                   int tiles, uint8_t* outq = nullptr, float outq_scale = 1.0f);

}  // namespace bertfuse

// ctypes entry points for the device check (raw device pointers, no ONNX Runtime).
// Return 0 on success, -1 for an unsupported shape (reason from bf_attention_unsupported), else a
// cudaError_t code.
// Exported even under -fvisibility=hidden (the library's default).
#define BF_ATTENTION_EXPORT __attribute__((visibility("default")))
extern "C" {
BF_ATTENTION_EXPORT int bf_check_attention(uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S, int num_heads,
                       int head_size, float scale, uintptr_t out, uintptr_t stream);
BF_ATTENTION_EXPORT int bf_check_attention_config(uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S,
                                                  int num_heads, int head_size, float scale, uintptr_t out,
                                                  uintptr_t stream, int warps, int passes);
BF_ATTENTION_EXPORT int bf_check_attention_split(uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S,
                                                 int num_heads, int head_size, float scale, uintptr_t out,
                                                 uintptr_t stream, int tiles);
BF_ATTENTION_EXPORT int bf_check_attention_warps(uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S, int num_heads,
                             int head_size, float scale, uintptr_t out, uintptr_t stream, int warps);
BF_ATTENTION_EXPORT const char* bf_attention_unsupported(int B, int S, int num_heads, int head_size,
                                                          int mask_rank);
}
