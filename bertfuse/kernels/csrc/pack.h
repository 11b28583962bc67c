// Device-side packing for the packed path: the host copies the padded request ([B, S] ids,
// segments, mask) and picks a token bucket T; these kernels do the rest on the stream.
//
// bf_pack_tokens (ONE kernel, one CTA, a block-wide prefix sum over the B*S mask in row order):
//   mask        int32 [B, S]  key kept iff mask != 0 (the packed layout's rule)
//   token_index int32 [T]     flat position b*S+s of packed token i, row by row; entries past the
//                              kept-token count (filler) are 0, a valid row of [B*S, H]
//   token_slot  int32 [B, S]  packed row of position (b, s), or -1 where nothing is kept
//   cu_seqlens  int32 [B + 1] sequence b is packed rows cu[b]..cu[b+1]-1; cu[B] = kept tokens
// Rows cu[B]..T-1 are filler: no sequence covers them (PackedBertAttention writes zeros there).
// When the mask keeps more than T tokens the packed order is cut at T: the cut tokens get slot
// -1 and every cu entry is clamped to T (the runtime picks T >= the kept-token count).
//
// bf_unpack_tokens: padded [B, S, W] from packed [T, W] (W bytes per row, a gather: every output
// byte written once): row (b, s) = packed[token_slot[b, s]], zeros where the slot is < 0 or >= T.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace bertfuse {

// nullptr when the shapes are supported, else a one-line reason (a string literal).
const char* pack_tokens_unsupported(int B, int S, int T);
const char* unpack_tokens_unsupported(int T, int B, int S, long long row_bytes);

// Launches on `stream`; no allocation, no synchronisation (CUDA-graph safe).
cudaError_t bf_pack_tokens(cudaStream_t stream, const int32_t* mask, int B, int S, int T, int32_t* token_index,
                           int32_t* token_slot, int32_t* cu_seqlens);

// row_bytes = W * element size. 16-byte vector copies when row_bytes and both pointers allow.
cudaError_t bf_unpack_tokens(cudaStream_t stream, const void* packed, int T, const int32_t* token_slot, int B, int S,
                             long long row_bytes, void* out);

}  // namespace bertfuse

// ctypes entry points for the device check (raw device pointers, no ONNX Runtime): 0 on success,
// -1 for unsupported shapes (reason from the *_unsupported functions), else a cudaError_t code.
#define BF_PACK_EXPORT __attribute__((visibility("default")))
extern "C" {
BF_PACK_EXPORT int bf_check_pack_tokens(uintptr_t mask, int B, int S, int T, uintptr_t token_index,
                                        uintptr_t token_slot, uintptr_t cu_seqlens, uintptr_t stream);
BF_PACK_EXPORT int bf_check_unpack_tokens(uintptr_t packed, int T, uintptr_t token_slot, int B, int S,
                                          long long row_bytes, uintptr_t out, uintptr_t stream);
BF_PACK_EXPORT const char* bf_pack_tokens_unsupported(int B, int S, int T);
BF_PACK_EXPORT const char* bf_unpack_tokens_unsupported(int T, int B, int S, long long row_bytes);
}
