// The GEMM tuner: cuBLASLt plans (descriptors + the chosen algorithm) per shape, the timing of
// candidates on the GPU, and the process-wide choice cache every timed choice is kept in (the
// cuBLASLt algorithm per plan here; the sm_90a-or-cuBLASLt and split-K choices in dense.cu).
//
// Row-major X [M,K], W [K,N], Y [M,N]. cuBLASLt is column-major, so we compute the
// transposed problem D[N,M] = W(col-major N x K) * X(col-major K x M): no copies,
// and the bias (length N) runs along D's rows, which is what its BIAS epilogue adds.
//
// Nothing here allocates device memory or synchronises inside a run: the handle is made
// when the kernel is created, the cuBLASLt plans on the first call with a new shape (host-only
// work), and the workspace comes from the caller (WorkspaceSource), so CUDA graphs can capture
// every call.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublasLt.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "status.h"

namespace bertfuse {

using bf::Status;

enum class Epilogue : int {
  kNone = 0,          // D = X@W (+ beta*C)
  kBias = 1,          // D = X@W + bias (+ beta*C)
  kBiasGeluTanh = 2,  // D = gelu_tanh(X@W + bias); cuBLASLt's GELU epilogue is the tanh form
};

// Where a GEMM gets its cuBLASLt workspace (and the FP8 path its activation scratch) for one
// run: the ORT kernels take ORT's stream-aware scratch buffer (its arena: no cudaMalloc once
// warm, one per session and stream, so concurrent sessions never share one); the check entry
// points a buffer allocated once. Get returns nullptr when it cannot serve `bytes`.
class WorkspaceSource {
 public:
  virtual ~WorkspaceSource() = default;
  virtual void* Get(size_t bytes) = 0;
};

// The most workspace a GEMM may ask for: BERTFUSE_GEMM_WORKSPACE_MB (config.h), default 32 (what
// cuBLAS recommends on Hopper); each call takes only what its chosen algorithm needs.
size_t DefaultWorkspaceBytes();

// ---- timing candidates ------------------------------------------------------------------------

// Events for timing candidates on `stream`, made only outside a CUDA-graph capture (nothing can
// be timed inside one): ok() is false inside a capture or when CUDA has no events to give.
// operator() runs the candidate once (warm-up), then times 8 back-to-back runs queued behind a
// kernel that holds the stream (so the GPU alone times them) and returns the mean in us, or -1
// where the candidate failed.
class CandidateTimer {
 public:
  explicit CandidateTimer(cudaStream_t stream);
  ~CandidateTimer();
  CandidateTimer(const CandidateTimer&) = delete;
  CandidateTimer& operator=(const CandidateTimer&) = delete;
  bool ok() const { return ok_; }
  float operator()(const std::function<Status()>& run);

 private:
  cudaStream_t stream_;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  bool ok_ = false;
};

// ---- the choice cache -------------------------------------------------------------------------

// `us` as the JSON array that ends one record: 1.000,2.500]}
void AppendTimes(std::string& out, const float* us, size_t n);

// What a timing found, process-wide: one Record per key (Record has a `key` member with ==),
// in the order they were timed. Every session's kernels share what was timed for a shape on a
// device. Thread-safe.
template <class Key, class Record>
class ChoiceCache {
 public:
  // Copies the record of `key` into *out; false if none was kept yet.
  bool Find(const Key& key, Record* out) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Record& r : records_) {
      if (r.key == key) {
        *out = r;
        return true;
      }
    }
    return false;
  }
  void Add(Record r) {
    std::lock_guard<std::mutex> lock(mu_);
    records_.push_back(std::move(r));
  }
  // Adds `r` unless a record of its key is already there (another caller kept it first).
  void AddIfAbsent(Record r) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Record& o : records_)
      if (o.key == r.key) return;
    records_.push_back(std::move(r));
  }
  // A JSON array of the records: per record, `head(record, buf, size)` writes its head
  // (`{"key":v,...,"us":[`) and returns its times as (pointer, count).
  template <class Head>
  std::string Json(Head head) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out = "[";
    char buf[192];
    for (size_t i = 0; i < records_.size(); ++i) {
      const std::pair<const float*, size_t> us = head(records_[i], buf, sizeof(buf));
      out += i ? "," : "";
      out += buf;
      AppendTimes(out, us.first, us.second);
    }
    return out + "]";
  }

 private:
  mutable std::mutex mu_;
  std::vector<Record> records_;
};

// ---- cuBLASLt ----------------------------------------------------------------------------------

class DenseGemm {
 public:
  // Creates the cuBLASLt handle on `device` (-1: the current one). Throws std::runtime_error.
  DenseGemm(int device, size_t max_workspace_bytes);
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // Y[M,N] = epilogue(X[M,K] @ W[K,N] + bias) + (C ? C : 0), all fp16, fp32 accumulate.
  // bias may be null only with Epilogue::kNone. C (the residual, [M,N]) may be null;
  // C may alias Y.
  Status RunF16(cudaStream_t stream, WorkspaceSource* ws, const __half* X, const __half* W,
                const __half* bias, const __half* C, __half* Y, int M, int N, int K, Epilogue epi);

  // FP8: Xq[M,K] e4m3 (= X / x_scale), Wt[N,K] e4m3 (W transposed; W_real = Wt^T * w_scale),
  // w_scale a device float[1]. Y = epilogue(x_scale * w_scale * Xq@Wt^T + bias) + C.
  // cuBLASLt FP8 needs the "TN" form (A transposed): A = Wt, col-major K x N, op T.
  // K must be a multiple of 16.
  Status RunFp8(cudaStream_t stream, WorkspaceSource* ws, const uint8_t* Xq, const uint8_t* Wt,
                const float* w_scale, float x_scale, const __half* bias, const __half* C, __half* Y,
                int M, int N, int K, Epilogue epi, bool fast_accum);

  // FP8 in, e4m3 out: Dq[M,N] = e4m3_satfinite(epilogue(x_scale * w_scale * Xq@Wt^T + bias) *
  // d_scale[0]) in cuBLASLt's epilogue (no fp16 Y, no pass after); d_scale a device float[1]
  // (1 / the output's scale). No residual. CanImplementFp8Quantized asks first.
  Status RunFp8Quantized(cudaStream_t stream, WorkspaceSource* ws, const uint8_t* Xq, const uint8_t* Wt,
                         const float* w_scale, float x_scale, const __half* bias, uint8_t* Dq,
                         const float* d_scale, int M, int N, int K, Epilogue epi, bool fast_accum);

  // Split-K without the reduction: D[s][M,N] = X[:, s*K/splits .. (s+1)*K/splits) @ W[same rows, :]
  // in fp32, s = 0 .. splits-1, as one strided-batched cuBLASLt GEMM (no workspace, no
  // epilogue): the caller's next kernel adds the partials (bf_layernorm_splits_f16). Needs
  // K % (8 * splits) == 0.
  Status RunF16SplitK(cudaStream_t stream, const __half* X, const __half* W, float* D, int M, int N,
                      int K, int splits);

  // can_implement: whether cuBLASLt has an algorithm for the run with these arguments (the plan
  // is made, and kept, now: host-only work, nothing enqueued). Ok, or kUnsupported (then also
  // remembered: Supports / SupportsQuantizedOut turn false), or another error.
  Status CanImplementF16(WorkspaceSource* ws, const __half* X, const __half* W, const __half* bias,
                         const __half* C, __half* Y, int M, int N, int K, Epilogue epi);
  Status CanImplementFp8(WorkspaceSource* ws, const uint8_t* Xq, const uint8_t* Wt, const float* w_scale,
                         const __half* bias, const __half* C, __half* Y, int M, int N, int K, Epilogue epi,
                         bool fast_accum);
  Status CanImplementFp8Quantized(const uint8_t* Xq, const uint8_t* Wt, const float* w_scale,
                                  const __half* bias, uint8_t* Dq, const float* d_scale, int M, int N, int K,
                                  Epilogue epi, bool fast_accum);
  Status CanImplementF16SplitK(const __half* X, const __half* W, float* D, int M, int N, int K, int splits);

  // Which of the heuristic's valid algorithms to use: -1 (the default, unless
  // BERTFUSE_GEMM_TIMING=0) times each on the first call of a shape outside a CUDA-graph
  // capture and keeps the fastest; rank >= 0 pins the rank-th (0 = the heuristic's first
  // choice), which the device check sets to see what the timing gains.
  void set_algo_rank(int rank) { algo_rank_ = rank < 0 ? -1 : rank; }
  // The workspace cap the heuristic is given (the check measures 0 against the default).
  void set_max_workspace(size_t bytes) { max_workspace_ = bytes; }

  // False once cuBLASLt has offered no algorithm for this epilogue / residual combination
  // (fp16 or FP8 inputs); bf_dense_forward then moves that work into its own kernels.
  bool Supports(bool fp8, Epilogue epi, bool residual) const {
    return (unsupported_ & ConfigBit(fp8, epi, residual)) == 0;
  }

  bool SupportsQuantizedOut(Epilogue epi) const { return (unsupported_ & QuantizedOutBit(epi)) == 0; }

  // Bit (epilogue * 4 + fp8 * 2 + residual) set for each combination found unsupported; bit
  // 16 + epilogue for an FP8 GEMM writing e4m3.
  int unsupported_mask() const { return unsupported_; }

  struct Plan;  // defined in gemm_tuner.cu
  // What makes a plan: a kernel sees few shapes (one per batch/sequence bucket), so a linear
  // search over a vector beats hashing a string key on the host path of every call.
  struct PlanKey {
    int fp8, epi, residual, M, N, K, al_a, al_b, al_c, al_d, fast_accum, rank;
    size_t workspace;
    int splits = 0;  // RunF16SplitK's plans: the batch count (0: the ordinary plans)
    int d_fp8 = 0;   // D in e4m3 (RunFp8Quantized)
    bool operator==(const PlanKey& o) const {
      return fp8 == o.fp8 && epi == o.epi && residual == o.residual && M == o.M && N == o.N &&
             K == o.K && al_a == o.al_a && al_b == o.al_b && al_c == o.al_c && al_d == o.al_d &&
             fast_accum == o.fast_accum && rank == o.rank && workspace == o.workspace &&
             splits == o.splits && d_fp8 == o.d_fp8;
    }
  };

 private:
  // One GEMM call's arguments (Run's and Prepare's). d_scale non-null: D (at Y) is e4m3, scaled
  // by d_scale[0] (a device float), no residual.
  struct Call {
    bool fp8;
    const void* A;
    const void* B;
    const float* a_scale;
    float alpha;
    const __half* bias;
    const __half* C;
    __half* Y;
    int M, N, K;
    Epilogue epi;
    bool fast_accum;
    const float* d_scale;
  };
  static Call MakeCall(bool fp8, const void* A, const void* B, const float* a_scale, float alpha,
                       const __half* bias, const __half* C, __half* Y, int M, int N, int K, Epilogue epi,
                       bool fast_accum, const float* d_scale = nullptr) {
    return Call{fp8, A, B, a_scale, alpha, bias, C, Y, M, N, K, epi, fast_accum, d_scale};
  }
  // The call's plan, made on first use (the heuristic); *plan null where the call has no work
  // (M or N 0). Caller holds mu_.
  Status Prepare(const Call& c, PlanKey* key, Plan** plan);
  Status PrepareSplitK(const __half* X, const __half* W, float* D, int M, int N, int K, int splits,
                       Plan** plan);
  Status Run(cudaStream_t stream, WorkspaceSource* ws, const Call& c);

  cublasLtHandle_t handle_ = nullptr;
  size_t max_workspace_ = 0;
  static int ConfigBit(bool fp8, Epilogue epi, bool residual) {
    return 1 << (static_cast<int>(epi) * 4 + (fp8 ? 2 : 0) + (residual ? 1 : 0));
  }
  static int QuantizedOutBit(Epilogue epi) { return 1 << (16 + static_cast<int>(epi)); }

  int algo_rank_ = DefaultAlgoRank();
  static int DefaultAlgoRank();
  std::atomic<int> unsupported_{0};
  Status TimePlan(Plan& p, cudaStream_t stream, WorkspaceSource* ws, const void* A, const void* B,
                  const __half* C, __half* Y, float alpha, float beta, const PlanKey& key);
  // The algorithm the first timed plan of a (device, key) kept, shared by every DenseGemm in the
  // process (one per op instance, so one per layer): the others take it instead of timing the
  // candidates again, as the split-K and sm90 choices are shared. BERTFUSE_GEMM_SHARE=0: each
  // plan times its own.
  static bool TakeSharedChoice(int device, const PlanKey& key, Plan& p);
  static void ShareChoice(int device, const PlanKey& key, const Plan& p);
  std::mutex mu_;  // guards plans_ (ORT may call Compute from several threads)
  std::vector<std::pair<PlanKey, std::unique_ptr<Plan>>> plans_;
};

// What DenseGemm's timing of cuBLASLt's algorithms found, per plan (bf_cublas_timings).
std::string CublasTimingsJson();

}  // namespace bertfuse
