// PackedBertAttention: multi-head self-attention over packed tokens (one kernel, no mask).
//
// qkv [T, 3H] fp16 (bias already added): the real tokens of every sequence, sequence after
// sequence, columns as BertAttention's ([0,H) Q, [H,2H) K, [2H,3H) V; head n at columns
// n*D..n*D+D-1 of each block). cu_seqlens int32 [R + 1]: sequence r is rows cu[r]..cu[r+1]-1
// and attends to itself only. Rows at or past cu[R] (filler) come back as zeros, so every row
// of context [T, H] is written. Sequences may be empty. The register-resident tensor-core kernel
// covers head size 64, S_max <= 128 (S_max bounds every sequence's length: the [R, S] shape of the
// packed layout); the tiled tensor-core kernel (attention_tiled.h) head sizes 32, 64 and 128 up to
// S_max 1024; every other shape up to head size 256 runs on the general path (attention_general.h).
//
// Device values are trusted to within memory safety: cu is clamped into [0, T] and made
// non-decreasing, and a sequence longer than S_max has only its first S_max rows attended (the
// rest come back as zeros). Consistent inputs (PackTokens' outputs) never hit either case.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bertfuse {

constexpr int kPackedAttentionMaxSeq = 128;
constexpr int kPackedAttentionHeadSize = 64;

// nullptr when the op supports the shape (on either path), else a one-line reason (a string literal).
const char* packed_attention_unsupported(int T, int R, int S_max, int num_heads, int head_size);
// The same for the tensor-core kernel alone.
const char* packed_attention_fast_unsupported(int T, int R, int S_max, int num_heads, int head_size);

// Launch on `stream`; no allocation, no synchronisation (CUDA-graph safe). scale <= 0 means
// 1/sqrt(head_size). warps: the tensor-core kernel's warps per CTA (1..4; 0 = heuristic), each
// warp owns 16 queries; the general path ignores it. cudaErrorInvalidValue for an unsupported shape.
cudaError_t bf_packed_attention_f16(cudaStream_t stream, const __half* qkv, const int32_t* cu_seqlens, int T, int R,
                                    int S_max, int num_heads, int head_size, float scale, __half* out,
                                    int warps = 0);

}  // namespace bertfuse

// ctypes entry points for the device check (raw device pointers, no ONNX Runtime).
// 0 on success, -1 for an unsupported shape (reason from bf_packed_attention_unsupported), else a
// cudaError_t code.
#define BF_PACKED_EXPORT __attribute__((visibility("default")))
extern "C" {
BF_PACKED_EXPORT int bf_check_packed_attention(uintptr_t qkv, uintptr_t cu_seqlens, int T, int R, int S_max,
                                               int num_heads, int head_size, float scale, uintptr_t out,
                                               uintptr_t stream, int warps);
BF_PACKED_EXPORT const char* bf_packed_attention_unsupported(int T, int R, int S_max, int num_heads,
                                                             int head_size);
}
