// The general attention path (attention_general.h): one warp per (query row, head), online
// softmax over the keys in fp32, any head size up to 256 and any sequence length.
#include "attention_general.h"

#include <cmath>

namespace bertfuse {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr float kMaskFilter = -10000.0f;  // ORT Attention's mask_filter_value default (BERT's adder)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Where one query row's keys are: rows key0 .. key0 + nkeys - 1 of the qkv tensor, and whether
// key j is kept (padded form: the mask; packed form: every key of the sequence).
struct Keys {
  long long query = -1;  // the query's qkv row; -1: write zeros
  long long key0 = 0;
  int nkeys = 0;
  int b = 0;             // padded form: the batch row (for the mask)
};

struct Padded {
  const int32_t* mask;
  int mask_rank, B, S;
  __device__ long long rows() const { return static_cast<long long>(B) * S; }
  __device__ Keys keys(long long row) const {
    Keys k;
    k.b = static_cast<int>(row / S);
    k.query = row;
    k.key0 = static_cast<long long>(k.b) * S;
    k.nkeys = S;
    return k;
  }
  __device__ bool kept(const Keys& k, int j) const {
    if (mask_rank == 2) return mask[static_cast<long long>(k.b) * S + j] > 0;
    if (mask_rank == 1) return j < mask[k.b];
    return true;
  }
};

struct Packed {
  const int32_t* cu;
  int T, R, S_max;
  __device__ long long rows() const { return T; }
  __device__ int at(int r) const {  // cu[r], clamped into [0, T] and made non-decreasing
    int v = 0;
    for (int i = 0; i <= r; ++i) v = max(v, min(max(cu[i], 0), T));
    return v;
  }
  __device__ Keys keys(long long row) const {
    Keys k;
    // The sequence holding `row`: the last r with cu[r] <= row (binary search on the clamped,
    // non-decreasing cu).
    int lo = 0, hi = R;  // invariant: at(lo) <= row, answer in [lo, hi)
    if (row < at(0) || row >= at(R)) return k;  // outside every sequence (filler): zeros
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (at(mid) <= row) lo = mid; else hi = mid;
    }
    const int start = at(lo), len = at(lo + 1) - start;
    if (row - start >= S_max) return k;  // past S_max in its sequence: zeros
    k.query = row;
    k.key0 = start;
    k.nkeys = min(len, S_max);
    return k;
  }
  __device__ bool kept(const Keys&, int) const { return true; }
};

// NI: columns per lane (head size <= 32 * NI).
template <int NI, class Layout>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    general_kernel(const __half* __restrict__ qkv, Layout layout, int H, int D, float scale,
                   __half* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int head = blockIdx.y;
  if (row >= layout.rows()) return;
  const Keys k = layout.keys(row);
  const long long stride = 3LL * H;
  __half* o = out + row * H + static_cast<long long>(head) * D;
  if (k.query < 0) {
    for (int d = lane; d < D; d += 32) o[d] = __float2half(0.0f);
    return;
  }
  float q[NI], acc[NI];
  const __half* qrow = qkv + k.query * stride + static_cast<long long>(head) * D;
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < D ? __half2float(qrow[d]) * scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < k.nkeys; ++j) {
    const __half* krow = qkv + (k.key0 + j) * stride + H + static_cast<long long>(head) * D;
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int d = lane + 32 * i;
      if (d < D) part += q[i] * __half2float(krow[d]);
    }
    const float s = warp_sum(part) + (layout.kept(k, j) ? 0.0f : kMaskFilter);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
    m = m_new;
    const __half* vrow = krow + H;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < D ? p * __half2float(vrow[d]) : 0.0f);
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // nkeys == 0 (an empty sequence): zeros
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int d = lane + 32 * i;
    if (d < D) o[d] = __float2half(acc[i] * inv);
  }
}

template <class Layout>
cudaError_t launch(cudaStream_t stream, const __half* qkv, Layout layout, long long rows,
                   int num_heads, int D, float scale, __half* out) {
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(num_heads));
  const dim3 block(kWarpsPerBlock * 32);
  const int H = num_heads * D;
  const float sc = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(D));
  switch ((D + 31) / 32) {
#define BF_GENERAL_CASE(N) \
  case N: general_kernel<N, Layout><<<grid, block, 0, stream>>>(qkv, layout, H, D, sc, out); break;
    BF_GENERAL_CASE(1) BF_GENERAL_CASE(2) BF_GENERAL_CASE(3) BF_GENERAL_CASE(4)
    BF_GENERAL_CASE(5) BF_GENERAL_CASE(6) BF_GENERAL_CASE(7) BF_GENERAL_CASE(8)
#undef BF_GENERAL_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

const char* attention_general_unsupported(int rows, int num_heads, int head_size) {
  if (rows < 0 || num_heads < 1) return "the row count must be >= 0 and num_heads >= 1";
  if (head_size < 1 || head_size > kGeneralMaxHeadSize) return "head size must be 1..256";
  if (num_heads > 65535) return "num_heads must be <= 65535";
  if ((static_cast<long long>(rows) + kWarpsPerBlock - 1) / kWarpsPerBlock > 0x7fffffffLL)
    return "too many rows";
  return nullptr;
}

cudaError_t bf_attention_general_f16(cudaStream_t stream, const __half* qkv, const int32_t* mask,
                                     int mask_rank, int B, int S, int num_heads, int head_size,
                                     float scale, __half* out) {
  const long long rows = static_cast<long long>(B) * S;
  if (B < 1 || S < 1 || rows > 0x7fffffffLL) return cudaErrorInvalidValue;
  if (attention_general_unsupported(static_cast<int>(rows), num_heads, head_size) != nullptr)
    return cudaErrorInvalidValue;
  if (qkv == nullptr || out == nullptr || mask_rank < 0 || mask_rank > 2 ||
      (mask_rank > 0 && mask == nullptr))
    return cudaErrorInvalidValue;
  return launch(stream, qkv, Padded{mask_rank > 0 ? mask : nullptr, mask_rank, B, S}, rows,
                num_heads, head_size, scale, out);
}

cudaError_t bf_packed_attention_general_f16(cudaStream_t stream, const __half* qkv,
                                            const int32_t* cu_seqlens, int T, int R, int S_max,
                                            int num_heads, int head_size, float scale, __half* out) {
  if (T < 0 || R < 0 || S_max < 0) return cudaErrorInvalidValue;
  if (attention_general_unsupported(T, num_heads, head_size) != nullptr) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  if (qkv == nullptr || out == nullptr || cu_seqlens == nullptr) return cudaErrorInvalidValue;
  return launch(stream, qkv, Packed{cu_seqlens, T, R, S_max}, T, num_heads, head_size, scale, out);
}

}  // namespace bertfuse
