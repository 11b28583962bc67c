// Host-side staging of one padded request (no CUDA): the runtime's fast path
// (bertfuse/runtime/staging.py) for what its Python path does in several NumPy passes. One pass
// over the request writes the whole pinned staging buffer [n_inputs, bucket_batch, bucket_seq]
// int32 and tells the mask's form; anything the checked path must see (a value out of range, a
// dtype it does not take) returns -1 and nothing is decided here, so every error message stays
// in one place (runtime/request_checks.py).
//
// Semantics, equal to the Python path (tests/unit/runtime/test_staging.py holds them to it):
//   - values are read as int32 or int64 and cast to int32 (as NumPy's astype(int32));
//   - with validate, each role's values must lie in [0, upper) (upper <= 0: >= 0 only), and a
//     value past int32's range goes to the checked path;
//   - a mask row of all zeros is staged as all ones (requests.unmask_empty_rows);
//   - an absent mask is ones over [batch, seq]; an absent segment_ids (or ids) is zeros;
//   - the mask's rows past the batch get one key (position 0), never zero keys;
//   - the form (variants.mask_mode) of the mask as staged: 0 all ones (or no mask), 1 every row
//     ones then zeros, 2 anything else.
#include <cstdint>
#include <cstring>

namespace {

constexpr int kIds = 0, kMask = 1, kSegments = 2;

// One row into dst as int32 (NumPy's astype cast); false, with validate, on a value outside
// [0, limit). Branch-free so the compiler vectorises it: the largest value as unsigned (a
// negative one wraps past any limit, which is at most 2**31).
template <typename T, typename U>
bool CopyRow(const T* __restrict__ src, int seq, int32_t* __restrict__ dst, bool validate,
             uint64_t limit) {
  U top = 0;
  for (int j = 0; j < seq; ++j) {
    const U u = static_cast<U>(src[j]);
    top = u > top ? u : top;
    dst[j] = static_cast<int32_t>(src[j]);
  }
  return !validate || static_cast<uint64_t>(top) < limit;
}

// A mask row: CopyRow, and in the same pass what its form needs, from the int32 values as
// staged: the smallest, their OR (zero: all masked), and whether any rises (0 then 1: a hole
// or left padding).
struct MaskFacts {
  int32_t lo, nonzero;
  bool rises;
};

template <typename T, typename U>
bool MaskRow(const T* __restrict__ src, int seq, int32_t* __restrict__ dst, bool validate,
             uint64_t limit, MaskFacts* facts) {
  U top = static_cast<U>(src[0]);
  int32_t lo = static_cast<int32_t>(src[0]), nonzero = lo, rises = 0;
  dst[0] = lo;
  for (int j = 1; j < seq; ++j) {  // plain reductions, so they vectorise
    const U u = static_cast<U>(src[j]);
    const int32_t v = static_cast<int32_t>(src[j]), prev = static_cast<int32_t>(src[j - 1]);
    top = u > top ? u : top;
    lo = v < lo ? v : lo;
    nonzero |= v;
    rises |= prev < v;
    dst[j] = v;
  }
  *facts = {lo, nonzero, rises != 0};
  return !validate || static_cast<uint64_t>(top) < limit;
}

}  // namespace

// Built for AVX2 as well where the compiler can (the int64 -> int32 narrowing and the unsigned
// maxima take several SSE2 instructions each): the loader picks the clone the CPU runs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define BF_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define BF_CPU_CLONES
#endif

extern "C" __attribute__((visibility("default"))) BF_CPU_CLONES int bf_stage_request(
    const void* ids, int ids_bytes, const void* mask, int mask_bytes, const void* segments,
    int segments_bytes, const int* slot_role, int n_inputs, const int64_t* upper, int batch,
    int seq, int validate, int32_t* host, int bucket_batch, int bucket_seq) {
  if (batch < 1 || seq < 1 || batch > bucket_batch || seq > bucket_seq || n_inputs < 1 ||
      n_inputs > 3)
    return -1;
  const void* src[3] = {ids, mask, segments};
  const int bytes[3] = {ids_bytes, mask_bytes, segments_bytes};
  for (int r = 0; r < 3; ++r)
    if (src[r] && bytes[r] != 4 && bytes[r] != 8) return -1;
  uint64_t limit[3];  // per slot: values must lie in [0, limit) (int32's range at most)
  for (int s = 0; s < n_inputs; ++s)
    limit[s] = upper[s] > 0 && upper[s] < (int64_t{1} << 31) ? static_cast<uint64_t>(upper[s])
                                                             : uint64_t{1} << 31;
  const size_t plane = static_cast<size_t>(bucket_batch) * bucket_seq;
  const size_t tail = static_cast<size_t>(bucket_seq - seq) * sizeof(int32_t);
  bool all_ones = true, right_padded = true;
  for (int s = 0; s < n_inputs; ++s) {
    const int role = slot_role[s];
    if (role < kIds || role > kSegments) return -1;
    int32_t* out = host + s * plane;
    const bool check = validate != 0;
    for (int r = 0; r < batch; ++r) {
      int32_t* dst = out + static_cast<size_t>(r) * bucket_seq;
      if (!src[role]) {
        const int32_t fill = role == kMask ? 1 : 0;
        for (int j = 0; j < seq; ++j) dst[j] = fill;
      } else {
        const size_t at = static_cast<size_t>(r) * seq;
        const bool wide = bytes[role] == 8;
        const void* row = static_cast<const char*>(src[role]) + at * bytes[role];
        if (role != kMask) {
          const bool ok = wide ? CopyRow<int64_t, uint64_t>(static_cast<const int64_t*>(row), seq,
                                                            dst, check, limit[s])
                               : CopyRow<int32_t, uint32_t>(static_cast<const int32_t*>(row), seq,
                                                            dst, check, limit[s]);
          if (!ok) return -1;
        } else {
          MaskFacts f;
          const bool ok = wide ? MaskRow<int64_t, uint64_t>(static_cast<const int64_t*>(row), seq,
                                                            dst, check, limit[s], &f)
                               : MaskRow<int32_t, uint32_t>(static_cast<const int32_t*>(row), seq,
                                                            dst, check, limit[s], &f);
          if (!ok) return -1;
          if (!f.nonzero) {  // all masked: unmasked, as unmask_empty_rows does
            for (int j = 0; j < seq; ++j) dst[j] = 1;
            f = {1, 1, false};
          }
          all_ones = all_ones && f.lo > 0;
          right_padded = right_padded && !f.rises && dst[0] != 0;
        }
      }
      std::memset(dst + seq, 0, tail);
    }
    std::memset(out + static_cast<size_t>(batch) * bucket_seq, 0,
                static_cast<size_t>(bucket_batch - batch) * bucket_seq * sizeof(int32_t));
    if (role == kMask) {
      for (int r = batch; r < bucket_batch; ++r) out[static_cast<size_t>(r) * bucket_seq] = 1;
    }
  }
  if (all_ones) return 0;
  return right_padded ? 1 : 2;
}

// The fast lane in one call (runtime/staging.py): bf_stage_request, then, where the bucket holds
// an own CUDA graph for the request's variant that starts with the host->device copy
// (runtime/graphs.py), its launch, the copies of the outputs asked for into their page-locked
// host mirrors (the request's batch rows only), and the wait for all of it. The launch, copy and
// sync functions are the CUDA runtime's that ONNX Runtime loaded, passed in, so this file stays
// free of CUDA and the graph is launched by the runtime that instantiated it. Python fills
// BfLane once per bucket (the mirrors as they are first asked for).
constexpr int kLaneOutputs = 4;

struct BfLane {
  const int* slot_role;
  int n_inputs;
  const int64_t* upper;
  int32_t* host;
  int bucket_batch, bucket_seq;
  void* graphs[2][3];  // [the request fills the bucket][form]; nullptr: no graph, the caller runs
  int (*launch)(void* graph_exec, void* stream);  // cudaGraphLaunch
  int (*sync)(void* stream);                      // cudaStreamSynchronize
  int (*copy)(void* dst, const void* src, size_t bytes, int kind, void* stream);  // cudaMemcpyAsync
  void* stream;
  void* out_host[kLaneOutputs];       // page-locked mirror of output i (nullptr: none yet)
  const void* out_dev[kLaneOutputs];  // the bucket's output i on the device
  int64_t out_row_bytes[kLaneOutputs];  // bytes of one batch row of output i
  int status;  // the CUDA error of a failed call
  int failed;  // which call failed: 0 the launch, 1 the sync, 2 an output's copy
};

// Returns the form (0-2) when no graph was launched (the caller goes on as after
// bf_stage_request), 8 + form when the graph ran, the outputs in `want` (bit i: output i, where
// it has a mirror) are in their mirrors and the stream is idle again, -1 when staging refused the
// request, -2 on a CUDA error (lane->status, lane->failed).
extern "C" __attribute__((visibility("default"))) int bf_stage_launch(
    const void* ids, int ids_bytes, const void* mask, int mask_bytes, const void* segments,
    int segments_bytes, int batch, int seq, int validate, BfLane* lane, unsigned want) {
  const int form = bf_stage_request(ids, ids_bytes, mask, mask_bytes, segments, segments_bytes,
                                    lane->slot_role, lane->n_inputs, lane->upper, batch, seq,
                                    validate, lane->host, lane->bucket_batch, lane->bucket_seq);
  if (form < 0) return form;
  const int full = batch == lane->bucket_batch && seq == lane->bucket_seq;
  void* graph = lane->graphs[full][form];
  if (!graph || !lane->launch || !lane->sync) return form;
  lane->failed = 0;
  lane->status = lane->launch(graph, lane->stream);
  constexpr int kDeviceToHost = 2;  // cudaMemcpyDeviceToHost
  for (int i = 0; i < kLaneOutputs && lane->status == 0; ++i) {
    if (!(want >> i & 1u) || !lane->out_host[i] || !lane->copy) continue;
    lane->failed = 2;
    lane->status = lane->copy(lane->out_host[i], lane->out_dev[i],
                              static_cast<size_t>(batch) * lane->out_row_bytes[i], kDeviceToHost,
                              lane->stream);
  }
  // The wait even after a failed copy: the stream must be idle before the caller goes on.
  const int synced = lane->sync(lane->stream);
  if (lane->status == 0 && synced != 0) {
    lane->status = synced;
    lane->failed = 1;
  }
  return lane->status == 0 ? 8 + form : -2;
}
