// CHECK-ONLY: the attention and packing ops' ctypes entry points (raw device pointers, no ONNX
// Runtime) for `bertfuse kernels check`, the tests and the benchmarks/kernels probes: each kernel
// alone or in a chosen configuration, and why a shape is not covered. No ORT op calls anything
// here; they stay exported from the one library the check runs against (see check_dense.cu).
// Return 0 on success, -1 for an unsupported shape (reason from the *_unsupported functions),
// else a cudaError_t code.
#include <cstdint>

#include "attention.h"
#include "attention_tiled.h"
#include "pack.h"
#include "packed_attention.h"

// ---- attention.cu ---------------------------------------------------------------------

extern "C" int bf_check_attention_config(uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S, int num_heads,
                                         int head_size, float scale, uintptr_t out, uintptr_t stream, int warps,
                                         int passes) {
  // The tensor-core kernel alone, in a chosen configuration (warps 1..4 per CTA, passes 1..2 per
  // warp; 0 = the heuristic's): -1 where it does not cover the shape.
  if (bertfuse::attention_fast_unsupported(B, S, num_heads, head_size, mask_rank) != nullptr) return -1;
  return static_cast<int>(bertfuse::bf_attention_f16_warps(
      reinterpret_cast<cudaStream_t>(stream), reinterpret_cast<const __half*>(qkv),
      reinterpret_cast<const int32_t*>(mask), mask_rank, B, S, num_heads, head_size, scale,
      reinterpret_cast<__half*>(out), warps, passes));
}

extern "C" int bf_check_attention_split(uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S, int num_heads,
                                        int head_size, float scale, uintptr_t out, uintptr_t stream, int tiles) {
  // The keys-split kernel alone, `tiles` 16-query tiles per CTA (1..4; 0: as many as S fills, up
  // to 4): -1 where it does not cover the shape.
  if (bertfuse::attention_fast_unsupported(B, S, num_heads, head_size, mask_rank) != nullptr || S <= 16) return -1;
  return static_cast<int>(bertfuse::bf_attention_f16_split(
      reinterpret_cast<cudaStream_t>(stream), reinterpret_cast<const __half*>(qkv),
      reinterpret_cast<const int32_t*>(mask), mask_rank, B, S, num_heads, head_size, scale,
      reinterpret_cast<__half*>(out), tiles, nullptr, 1.0f));
}

extern "C" int bf_check_attention_warps(uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S, int num_heads,
                                        int head_size, float scale, uintptr_t out, uintptr_t stream, int warps) {
  // As bf_check_attention_config with one pass per warp (warps 0: the heuristic's, passes too).
  return bf_check_attention_config(qkv, mask, mask_rank, B, S, num_heads, head_size, scale, out, stream, warps,
                                   warps == 0 ? 0 : 1);
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

// ---- attention_tiled.cu ---------------------------------------------------------------

extern "C" __attribute__((visibility("default"))) int bf_check_attention_tiled(
    uintptr_t qkv, uintptr_t mask, int mask_rank, int B, int S, int num_heads, int head_size, float scale,
    uintptr_t out, uintptr_t stream) {
  // The tiled kernel alone (the device check compares it with the reference and the op's choice):
  // -1 where it does not cover the shape.
  if (bertfuse::attention_tiled_unsupported(B, S, num_heads, head_size, mask_rank) != nullptr) return -1;
  return static_cast<int>(bertfuse::bf_attention_tiled_f16(
      reinterpret_cast<cudaStream_t>(stream), reinterpret_cast<const __half*>(qkv),
      reinterpret_cast<const int32_t*>(mask), mask_rank, B, S, num_heads, head_size, scale,
      reinterpret_cast<__half*>(out)));
}

// ---- packed_attention.cu --------------------------------------------------------------

extern "C" int bf_check_packed_attention(uintptr_t qkv, uintptr_t cu_seqlens, int T, int R, int S_max, int num_heads,
                                         int head_size, float scale, uintptr_t out, uintptr_t stream, int warps) {
  if (bertfuse::packed_attention_unsupported(T, R, S_max, num_heads, head_size) != nullptr) return -1;
  return static_cast<int>(bertfuse::bf_packed_attention_f16(
      reinterpret_cast<cudaStream_t>(stream), reinterpret_cast<const __half*>(qkv),
      reinterpret_cast<const int32_t*>(cu_seqlens), T, R, S_max, num_heads, head_size, scale,
      reinterpret_cast<__half*>(out), warps));
}

extern "C" const char* bf_packed_attention_unsupported(int T, int R, int S_max, int num_heads, int head_size) {
  return bertfuse::packed_attention_unsupported(T, R, S_max, num_heads, head_size);
}

// ---- pack.cu --------------------------------------------------------------------------

extern "C" int bf_check_pack_tokens(uintptr_t mask, int B, int S, int T, uintptr_t token_index, uintptr_t token_slot,
                                    uintptr_t cu_seqlens, uintptr_t stream) {
  if (bertfuse::pack_tokens_unsupported(B, S, T) != nullptr) return -1;
  return static_cast<int>(bertfuse::bf_pack_tokens(
      reinterpret_cast<cudaStream_t>(stream), reinterpret_cast<const int32_t*>(mask), B, S, T,
      reinterpret_cast<int32_t*>(token_index), reinterpret_cast<int32_t*>(token_slot),
      reinterpret_cast<int32_t*>(cu_seqlens)));
}

extern "C" int bf_check_unpack_tokens(uintptr_t packed, int T, uintptr_t token_slot, int B, int S, long long row_bytes,
                                      uintptr_t out, uintptr_t stream) {
  if (bertfuse::unpack_tokens_unsupported(T, B, S, row_bytes) != nullptr) return -1;
  return static_cast<int>(bertfuse::bf_unpack_tokens(reinterpret_cast<cudaStream_t>(stream),
                                                     reinterpret_cast<const void*>(packed), T,
                                                     reinterpret_cast<const int32_t*>(token_slot), B, S, row_bytes,
                                                     reinterpret_cast<void*>(out)));
}

extern "C" const char* bf_pack_tokens_unsupported(int B, int S, int T) {
  return bertfuse::pack_tokens_unsupported(B, S, T);
}

extern "C" const char* bf_unpack_tokens_unsupported(int T, int B, int S, long long row_bytes) {
  return bertfuse::unpack_tokens_unsupported(T, B, S, row_bytes);
}
