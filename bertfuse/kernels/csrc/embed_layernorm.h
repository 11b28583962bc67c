// BERT's embedding block in one kernel: three table lookups, their sum and the LayerNorm.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bertfuse {

constexpr int kEmbedMaxHidden = 2048;

// For each token t = (b, s) of [B, S]:
//   e = word[ids[t]] + position[pos] + segment[segs[t]]   (the segment term only with segs)
//   y[t] = (e - mean(e)) / sqrt(var(e) + epsilon) * gamma + beta
// pos = position_ids[b or 0, s] with position_ids ([B, S] when pos_ids_batched, else [1, S]),
// else s. The tables are [V, H], [P, H], [T, H] fp16; the sum and the statistics are fp32
// (two passes over registers), y fp16 [B, S, H]. An index outside its table writes NaN to the
// token's row (the runtime refuses such requests before they reach the GPU; the kernel never
// reads outside a table). Needs H % 8 == 0, H <= kEmbedMaxHidden and 16-byte aligned tables,
// gamma, beta and y (cudaErrorInvalidValue otherwise). One warp per token.
cudaError_t bf_embed_layernorm_f16(cudaStream_t stream, const int* ids, const int* segs,
                                   const int* position_ids, bool pos_ids_batched,
                                   const __half* word, int V, const __half* position, int P,
                                   const __half* segment, int T, const __half* gamma,
                                   const __half* beta, float epsilon, __half* y, int B, int S,
                                   int H);

// nullptr when the kernel covers hidden size H, else the reason.
const char* embed_layernorm_unsupported(int H);

}  // namespace bertfuse
