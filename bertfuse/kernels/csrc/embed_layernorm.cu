// Word + position + segment lookups and LayerNorm in one pass (see embed_layernorm.h).
#include "embed_layernorm.h"

#include "launch.h"
#include "vec8.cuh"

#include <cstdint>

namespace bertfuse {
namespace {

struct EmbedParams {
  const int *ids, *segs, *pos_ids;
  bool pos_batched;
  const __half *word, *pos, *seg, *gamma, *beta;
  int V, P, T;
  __half* y;
  float eps;
  int B, S, H;
};

// One warp per token; lane l holds 8-element chunks l, l+32, ... (VPT of them), as the
// LayerNorm kernel does. gamma and beta are fetched before the token's indices, so their
// latency overlaps the dependent row loads.
template <int VPT>
__global__ void embed_ln_kernel(EmbedParams p) {
  const int tokens = p.B * p.S, H = p.H;
  const int token = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 wg[VPT], wb[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = (lane + 32 * i) * 8;
    wg[i] = c < H ? *reinterpret_cast<const uint4*>(p.gamma + c) : zero;
    wb[i] = c < H ? *reinterpret_cast<const uint4*>(p.beta + c) : zero;
  }
  if (token >= tokens) return;
  const int b = token / p.S, s = token - b * p.S;
  const int id = p.ids[token];
  const int sg = p.segs ? p.segs[token] : 0;
  const int ps = p.pos_ids ? p.pos_ids[(p.pos_batched ? b * p.S : 0) + s] : s;
  __half* out = p.y + static_cast<size_t>(token) * H;
  if (id < 0 || id >= p.V || ps < 0 || ps >= p.P || (p.seg && (sg < 0 || sg >= p.T))) {
    const __half nan = __float2half(__int_as_float(0x7fc00000));
    for (int c = lane; c < H; c += 32) out[c] = nan;
    return;
  }
  const __half* w = p.word + static_cast<size_t>(id) * H;
  const __half* q = p.pos + static_cast<size_t>(ps) * H;
  const __half* g = p.seg ? p.seg + static_cast<size_t>(sg) * H : nullptr;
  float v[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = (lane + 32 * i) * 8;
    if (c < H) {
      load8(w + c, v[i]);
      add8(q + c, v[i]);
      if (g) add8(g + c, v[i]);
    }
  }
  float mean, rstd;
  warp_row_stats<VPT>(v, lane, H, p.eps, &mean, &rstd);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = (lane + 32 * i) * 8;
    if (c < H) {
      float r[8];
      ln_chunk(v[i], mean, rstd, wg[i], wb[i], r);
      *reinterpret_cast<uint4*>(out + c) = pack8(r);
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int VPT>
cudaError_t launch(cudaStream_t stream, const EmbedParams& p) {
  constexpr int kWarps = 4;
  const int blocks = (p.B * p.S + kWarps - 1) / kWarps;
  // No programmatic dependent launch: the ids are what the op before (a copy) writes.
  return LaunchPdl(embed_ln_kernel<VPT>, dim3(blocks), dim3(kWarps * 32), 0, stream, false, p);
}

}  // namespace

const char* embed_layernorm_unsupported(int H) {
  if (H % 8 != 0) return "the hidden size is not a multiple of 8";
  if (H > kEmbedMaxHidden) return "the hidden size is over 2048";
  return nullptr;
}

cudaError_t bf_embed_layernorm_f16(cudaStream_t stream, const int* ids, const int* segs,
                                   const int* position_ids, bool pos_ids_batched,
                                   const __half* word, int V, const __half* position, int P,
                                   const __half* segment, int T, const __half* gamma,
                                   const __half* beta, float epsilon, __half* y, int B, int S,
                                   int H) {
  if (B <= 0 || S <= 0 || H <= 0) return cudaSuccess;
  if (embed_layernorm_unsupported(H) || !aligned16(word) || !aligned16(position) ||
      (segment && !aligned16(segment)) || !aligned16(gamma) || !aligned16(beta) || !aligned16(y) ||
      (segment != nullptr) != (segs != nullptr)) {
    return cudaErrorInvalidValue;
  }
  const EmbedParams p{ids, segs, position_ids, pos_ids_batched, word, position, segment, gamma,
                      beta, V, P, T, y, epsilon, B, S, H};
  switch ((H / 8 + 31) / 32) {  // 8-element chunks per lane
    case 1: return launch<1>(stream, p);
    case 2: return launch<2>(stream, p);
    case 3: return launch<3>(stream, p);
    case 4: return launch<4>(stream, p);
    case 5:
    case 6: return launch<6>(stream, p);
    default: return launch<8>(stream, p);
  }
}

}  // namespace bertfuse
