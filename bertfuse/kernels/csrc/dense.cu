// cuBLASLt GEMMs with epilogues, the erf-GELU and FP8-quantize kernels, the op-level forward
// shared by the ORT kernels and the ctypes check entry points (see dense.h).
#include "dense.h"

#include <cuda_fp8.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "gelu_erf.cuh"
#include "gemm_sm90.h"
#include "launch.h"
#include "layernorm.h"
#include "vec8.cuh"

namespace bertfuse {
namespace {

thread_local std::string g_error;

const char* Fail(const char* what, int code) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s (status %d)", what, code);
  g_error = buf;
  return g_error.c_str();
}

#define LT_TRY(expr)                                            \
  do {                                                          \
    cublasStatus_t st_ = (expr);                                \
    if (st_ != CUBLAS_STATUS_SUCCESS) return Fail(#expr, st_); \
  } while (0)

int AlignmentOf(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % a) != 0) a >>= 1;
  return a;
}

// Holds the stream for `ns` nanoseconds, so that the launches queued behind it are timed by
// the GPU alone: a candidate whose host launch is slower than its kernel would otherwise be
// timed by its launch.
__global__ void hold_stream(long long ns) {
  long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

constexpr int kTimedRuns = 8;

// One warm-up, then the mean of kTimedRuns back-to-back runs queued behind hold_stream.
float TimeCandidate(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1,
                    const std::function<const char*()>& run) {
  if (run() != nullptr) {
    cudaGetLastError();
    return -1.0f;
  }
  hold_stream<<<1, 1, 0, stream>>>(400000);
  if (cudaEventRecord(e0, stream) != cudaSuccess) return -1.0f;
  for (int i = 0; i < kTimedRuns; ++i) {
    if (run() != nullptr) {
      cudaGetLastError();
      return -1.0f;
    }
  }
  float ms = 0.0f;
  if (cudaEventRecord(e1, stream) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
      cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
    cudaGetLastError();
    return -1.0f;
  }
  return ms * 1000.0f / kTimedRuns;
}

// Events for TimeCandidate on `stream`, made only outside a CUDA-graph capture (nothing can be
// timed inside one): ok() is false inside a capture or when CUDA has no events to give.
class CandidateTimer {
 public:
  explicit CandidateTimer(cudaStream_t stream) : stream_(stream) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone ||
        cudaEventCreate(&e0_) != cudaSuccess || cudaEventCreate(&e1_) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    ok_ = true;
  }
  ~CandidateTimer() {
    if (e0_) cudaEventDestroy(e0_);
    if (e1_) cudaEventDestroy(e1_);
  }
  CandidateTimer(const CandidateTimer&) = delete;
  CandidateTimer& operator=(const CandidateTimer&) = delete;
  bool ok() const { return ok_; }
  float operator()(const std::function<const char*()>& run) { return TimeCandidate(stream_, e0_, e1_, run); }

 private:
  cudaStream_t stream_;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  bool ok_ = false;
};

}  // namespace

size_t DefaultWorkspaceBytes() {
  const char* s = std::getenv("BERTFUSE_GEMM_WORKSPACE_MB");
  long mb = s ? std::strtol(s, nullptr, 10) : 32;
  if (mb < 0) mb = 0;
  return static_cast<size_t>(mb) << 20;
}

int DenseGemm::DefaultAlgoRank() {
  // BERTFUSE_GEMM_TIMING=0: the heuristic's first choice, untimed (as before the timing).
  const char* s = std::getenv("BERTFUSE_GEMM_TIMING");
  return s && s[0] == '0' ? 0 : -1;
}

struct DenseGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;  // what the chosen algorithm needs
  // The heuristic's valid algorithms in its order, while the plan still has to time them
  // (emptied once timed: one candidate, a pinned rank, or the fastest found).
  std::vector<cublasLtMatmulHeuristicResult_t> untimed;
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

DenseGemm::DenseGemm(int device, size_t max_workspace_bytes) : max_workspace_(max_workspace_bytes) {
  int prev = -1;
  if (device >= 0 && cudaGetDevice(&prev) == cudaSuccess && prev != device) cudaSetDevice(device);
  const cublasStatus_t st = cublasLtCreate(&handle_);
  if (device >= 0 && prev >= 0 && prev != device) cudaSetDevice(prev);
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error("cublasLtCreate failed (status " + std::to_string(st) + ")");
  }
}

DenseGemm::~DenseGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

const char* DenseGemm::RunF16(cudaStream_t stream, WorkspaceSource* ws, const __half* X,
                              const __half* W, const __half* bias, const __half* C, __half* Y,
                              int M, int N, int K, Epilogue epi) {
  return Run(stream, ws, false, W, X, nullptr, 1.0f, bias, C, Y, M, N, K, epi, false);
}

const char* DenseGemm::RunFp8(cudaStream_t stream, WorkspaceSource* ws, const uint8_t* Xq, const uint8_t* Wt,
                              const float* w_scale, float x_scale, const __half* bias,
                              const __half* C, __half* Y, int M, int N, int K, Epilogue epi,
                              bool fast_accum) {
  return Run(stream, ws, true, Wt, Xq, w_scale, x_scale, bias, C, Y, M, N, K, epi, fast_accum);
}

const char* DenseGemm::RunFp8Quantized(cudaStream_t stream, WorkspaceSource* ws, const uint8_t* Xq,
                                       const uint8_t* Wt, const float* w_scale, float x_scale, const __half* bias,
                                       uint8_t* Dq, const float* d_scale, int M, int N, int K, Epilogue epi,
                                       bool fast_accum) {
  if (!d_scale) return Fail("e4m3 output needs its scale", 0);
  return Run(stream, ws, true, Wt, Xq, w_scale, x_scale, bias, nullptr, reinterpret_cast<__half*>(Dq), M, N, K,
             epi, fast_accum, d_scale);
}

// Column-major view of batch s: D_s[N,M] = W_s (col-major N x K/splits, ld N, the rows
// s*K/splits.. of row-major W, batch stride K/splits*N) * X_s (col-major K/splits x M, ld K, batch
// stride K/splits), D_s fp32 col-major N x M, batch stride M*N.
const char* DenseGemm::RunF16SplitK(cudaStream_t stream, const __half* X, const __half* W, float* D, int M,
                                    int N, int K, int splits) {
  if (M <= 0 || N <= 0) return nullptr;
  if (splits < 1 || K % (8 * splits) != 0) return Fail("split-K GEMM needs K % (8 * splits) == 0", K);
  std::lock_guard<std::mutex> lock(mu_);
  PlanKey key{0, 0, 0, M, N, K, AlignmentOf(W), AlignmentOf(X), AlignmentOf(D), AlignmentOf(D), 0, 0, 0};
  key.splits = splits;
  Plan* plan = nullptr;
  for (auto& kp : plans_) {
    if (kp.first == key) {
      plan = kp.second.get();
      break;
    }
  }
  if (!plan) {
    auto p = std::make_unique<Plan>();
    const int ks = K / splits;
    const int32_t batch = splits;
    const int64_t sa = static_cast<int64_t>(ks) * N, sb = ks, sd = static_cast<int64_t>(M) * N;
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_n = CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_n, sizeof(op_n)));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16F, N, ks, N));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16F, ks, M, K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, N, M, N));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, N, M, N));
    const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {{p->a, sa}, {p->b, sb}, {p->c, sd}, {p->d, sd}};
    for (const auto& ls : strided) {
      LT_TRY(cublasLtMatrixLayoutSetAttribute(ls.first, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
      LT_TRY(cublasLtMatrixLayoutSetAttribute(ls.first, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &ls.second,
                                              sizeof(ls.second)));
    }
    cublasLtMatmulPreference_t pref = nullptr;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    const size_t no_ws = 0;  // the partials are the reduction's only buffer
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &no_ws, sizeof(no_ws));
    cublasLtMatmulHeuristicResult_t res = {};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->d, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
      g_error = "cuBLASLt has no split-K (batched fp32) algorithm for M=" + std::to_string(M) + " N=" +
                std::to_string(N) + " K=" + std::to_string(K) + " splits=" + std::to_string(splits);
      return g_error.c_str();
    }
    p->algo = res.algo;
    plan = p.get();
    plans_.emplace_back(key, std::move(p));
  }
  const float alpha = 1.0f, beta = 0.0f;
  LT_TRY(cublasLtMatmul(handle_, plan->desc, &alpha, W, plan->a, X, plan->b, &beta, D, plan->c, D, plan->d,
                        &plan->algo, nullptr, 0, stream));
  return nullptr;
}

// Column-major view: D[N,M] = op(A)[N,K] * B[K,M] (+ C[N,M]), A = W (fp16: col-major N x K,
// ld N, no transpose; FP8: Wt col-major K x N, ld K, transposed), B = X col-major K x M, ld K.
const char* DenseGemm::Run(cudaStream_t stream, WorkspaceSource* ws, bool fp8, const void* A, const void* B,
                           const float* a_scale, float alpha, const __half* bias, const __half* C,
                           __half* Y, int M, int N, int K, Epilogue epi, bool fast_accum,
                           const float* d_scale) {
  if (M <= 0 || N <= 0) return nullptr;
  if (d_scale && C) return Fail("an e4m3 output takes no residual", 0);
  if (K <= 0) return Fail("GEMM with K <= 0", K);
  if (fp8 && K % 16 != 0) {  // both FP8 entry points
    g_error = "FP8 GEMM needs K % 16 == 0 (cuBLASLt), got K = " + std::to_string(K);
    return g_error.c_str();
  }
  if (epi != Epilogue::kNone && bias == nullptr) return Fail("epilogue needs a bias", 0);
  std::lock_guard<std::mutex> lock(mu_);
  const size_t ws_bytes = max_workspace_;
  PlanKey key{fp8 ? 1 : 0, static_cast<int>(epi), C ? 1 : 0, M, N, K, AlignmentOf(A),
              AlignmentOf(B), AlignmentOf(C ? C : Y), AlignmentOf(Y), fast_accum ? 1 : 0,
              algo_rank_, ws_bytes};
  key.d_fp8 = d_scale ? 1 : 0;
  Plan* plan = nullptr;
  for (auto& kp : plans_) {
    if (kp.first == key) {
      plan = kp.second.get();
      break;
    }
  }
  if (!plan) {
    auto p = std::make_unique<Plan>();
    const cudaDataType_t ab_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16F;
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = fp8 ? CUBLAS_OP_T : CUBLAS_OP_N, op_n = CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_DEFAULT;
    if (epi == Epilogue::kBias) e = CUBLASLT_EPILOGUE_BIAS;
    if (epi == Epilogue::kBiasGeluTanh) e = CUBLASLT_EPILOGUE_GELU_BIAS;
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)));
    if (epi != Epilogue::kNone) {
      const cudaDataType_t bias_type = CUDA_R_16F;
      LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                            &bias_type, sizeof(bias_type)));
      LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                            sizeof(bias)));
    }
    if (fp8) {
      const int8_t fa = fast_accum ? 1 : 0;
      LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)));
      LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                            sizeof(a_scale)));
    }
    if (d_scale) {  // e4m3 D: scaled in the epilogue; C (unread, beta 0) typed as the bias
      LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &d_scale,
                                            sizeof(d_scale)));
    }
    if (fp8) {
      LT_TRY(cublasLtMatrixLayoutCreate(&p->a, ab_type, K, N, K));
    } else {
      LT_TRY(cublasLtMatrixLayoutCreate(&p->a, ab_type, N, K, N));
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&p->b, ab_type, K, M, K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16F, N, M, N));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->d, d_scale ? CUDA_R_8F_E4M3 : CUDA_R_16F, N, M, N));

    cublasLtMatmulPreference_t pref = nullptr;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    const uint32_t al_a = AlignmentOf(A), al_b = AlignmentOf(B), al_c = AlignmentOf(C ? C : Y),
                   al_d = AlignmentOf(Y);
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d));
    cublasLtMatmulHeuristicResult_t res[8] = {};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->d, pref, 8, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    // NOT_SUPPORTED (no algorithm at all) is handled as an empty list below.
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
      return Fail("cublasLtMatmulAlgoGetHeuristic", st);
    }
    if (st != CUBLAS_STATUS_SUCCESS) found = 0;
    int pick = -1, valid = 0;
    const int rank = algo_rank_ < 0 ? 0 : algo_rank_;
    for (int i = 0; i < found; ++i) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > ws_bytes) continue;
      if (valid <= rank) pick = i;  // the rank-th valid one, else the last valid one
      ++valid;
      if (algo_rank_ < 0) p->untimed.push_back(res[i]);
    }
    if (p->untimed.size() < 2) p->untimed.clear();
    if (pick < 0) {
      unsupported_ |= d_scale ? QuantizedOutBit(epi) : ConfigBit(fp8, epi, C != nullptr);
      char buf[192];
      std::snprintf(buf, sizeof(buf), "cuBLASLt has no %s algorithm for M=%d N=%d K=%d epilogue=%d",
                    d_scale ? "FP8 (e4m3 out)" : fp8 ? "FP8" : "fp16", M, N, K, static_cast<int>(epi));
      g_error = buf;
      return g_error.c_str();
    }
    p->algo = res[pick].algo;
    p->workspace = res[pick].workspaceSize;
    plan = p.get();
    plans_.emplace_back(key, std::move(p));
  }
  Plan& p = *plan;
  // Pointers change between calls (ORT's arena, IO binding): set them on every call.
  if (epi != Epilogue::kNone) {
    LT_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (fp8) {
    LT_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                          sizeof(a_scale)));
  }
  if (d_scale) {
    LT_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &d_scale,
                                          sizeof(d_scale)));
  }
  if (!p.untimed.empty()) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      cudaGetLastError();
      device = -1;
    }
    if (device >= 0 && TakeSharedChoice(device, key, p)) {
      p.untimed.clear();
    } else if (C != Y) {  // (a residual that is Y would add up over the runs)
      const char* err = TimePlan(p, stream, ws, A, B, C, Y, alpha, C ? 1.0f : 0.0f, key);
      if (err) return err;
      if (device >= 0 && p.untimed.empty()) ShareChoice(device, key, p);  // timed (not in a capture)
    }
  }
  void* workspace = nullptr;
  if (p.workspace > 0) {
    workspace = ws ? ws->Get(p.workspace) : nullptr;
    if (!workspace) return Fail("no cuBLASLt workspace of the size the algorithm needs", static_cast<int>(p.workspace));
  }
  const float beta = C ? 1.0f : 0.0f;
  const void* c_ptr = d_scale ? nullptr : (C ? C : Y);  // an e4m3 D: C unread (beta 0) and absent
  const cublasStatus_t st = cublasLtMatmul(handle_, p.desc, &alpha, A, p.a, B, p.b, &beta, c_ptr, p.c, Y,
                                           p.d, &p.algo, workspace, p.workspace, stream);
  if (st != CUBLAS_STATUS_SUCCESS && d_scale) unsupported_ |= QuantizedOutBit(epi);
  if (st != CUBLAS_STATUS_SUCCESS) return Fail("cublasLtMatmul", st);
  return nullptr;
}

namespace {

// `us` as the JSON array that ends one record: 1.000,2.500]}
void AppendTimes(std::string& out, const float* us, size_t n) {
  char buf[32];
  for (size_t c = 0; c < n; ++c) {
    std::snprintf(buf, sizeof(buf), "%s%.3f", c ? "," : "", us[c]);
    out += buf;
  }
  out += "]}";
}

// A JSON array of `records` (guarded by `mu`): per record, `head(record, buf, size)` writes its
// head (`{"key":v,...,"us":[`) and returns its times as (pointer, count).
template <class T, class Head>
std::string JsonArray(std::mutex& mu, const std::vector<T>& records, Head head) {
  std::lock_guard<std::mutex> lock(mu);
  std::string out = "[";
  char buf[192];
  for (size_t i = 0; i < records.size(); ++i) {
    const std::pair<const float*, size_t> us = head(records[i], buf, sizeof(buf));
    out += i ? "," : "";
    out += buf;
    AppendTimes(out, us.first, us.second);
  }
  return out + "]";
}

// Process-wide record of what the cuBLASLt timing found, for bf_cublas_timings.
struct AlgoTiming {
  int fp8, epi, residual, M, N, K, chosen;
  std::vector<float> us;  // per valid heuristic algorithm, in the heuristic's order
};
std::mutex g_algo_mu;
std::vector<AlgoTiming> g_algo_timings;

}  // namespace

struct DenseGemm::Shared {
  struct Choice {
    int device;
    PlanKey key;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
  };
  std::mutex mu;
  std::vector<Choice> choices;
  const bool on = [] {
    const char* s = std::getenv("BERTFUSE_GEMM_SHARE");
    return !(s && s[0] == '0');
  }();
};

DenseGemm::Shared& DenseGemm::SharedChoices() {
  static Shared shared;  // process-wide, never destroyed before the last op (static storage)
  return shared;
}

bool DenseGemm::TakeSharedChoice(int device, const PlanKey& key, Plan& p) {
  Shared& s = SharedChoices();
  if (!s.on) return false;
  std::lock_guard<std::mutex> lock(s.mu);
  for (const Shared::Choice& c : s.choices) {
    if (c.device == device && c.key == key) {
      p.algo = c.algo;
      p.workspace = c.workspace;
      return true;
    }
  }
  return false;
}

void DenseGemm::ShareChoice(int device, const PlanKey& key, const Plan& p) {
  Shared& s = SharedChoices();
  if (!s.on) return;
  std::lock_guard<std::mutex> lock(s.mu);
  for (const Shared::Choice& c : s.choices)
    if (c.device == device && c.key == key) return;  // another instance shared it first
  s.choices.push_back({device, key, p.algo, p.workspace});
}

// Times each of the heuristic's valid algorithms for this plan on the call's own buffers (they
// only write Y, which the real run then overwrites) and keeps the fastest; the heuristic's first
// choice stays unless another is at least 2% faster, so noise does not flip it. Inside a CUDA
// graph capture nothing can be timed: the plan keeps the first choice and times on a later call.
const char* DenseGemm::TimePlan(Plan& p, cudaStream_t stream, WorkspaceSource* ws, const void* A,
                                const void* B, const __half* C, __half* Y, float alpha, float beta,
                                const PlanKey& key) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return nullptr;
  }
  size_t need = 0;
  for (const auto& r : p.untimed) need = r.workspaceSize > need ? r.workspaceSize : need;
  void* w = need ? (ws ? ws->Get(need) : nullptr) : nullptr;
  if (need && !w) return Fail("no cuBLASLt workspace for timing the algorithms", static_cast<int>(need));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    p.untimed.clear();
    return nullptr;
  }
  AlgoTiming t{key.fp8, key.epi, key.residual, key.M, key.N, key.K, 0, {}};
  int best = -1;
  for (size_t i = 0; i < p.untimed.size(); ++i) {
    const cublasLtMatmulHeuristicResult_t& r = p.untimed[i];
    const float us = TimeCandidate(stream, e0, e1, [&]() -> const char* {
      const cublasStatus_t st = cublasLtMatmul(handle_, p.desc, &alpha, A, p.a, B, p.b, &beta,
                                               key.d_fp8 ? nullptr : (C ? C : Y), p.c, Y, p.d, &r.algo, w,
                                               r.workspaceSize, stream);
      return st == CUBLAS_STATUS_SUCCESS ? nullptr : "cublasLtMatmul";
    });
    t.us.push_back(us);
    if (us < 0.0f) continue;
    if (best < 0 || (best == 0 ? us < 0.98f * t.us[0] : us < t.us[best])) best = static_cast<int>(i);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (best >= 0) {
    p.algo = p.untimed[best].algo;
    p.workspace = p.untimed[best].workspaceSize;
    t.chosen = best;
  }
  p.untimed.clear();
  std::lock_guard<std::mutex> lock(g_algo_mu);
  g_algo_timings.push_back(std::move(t));
  return nullptr;
}

std::string CublasTimingsJson() {
  return JsonArray(g_algo_mu, g_algo_timings, [](const AlgoTiming& t, char* buf, size_t size) {
    std::snprintf(buf, size, "{\"fp8\":%d,\"epilogue\":%d,\"residual\":%d,\"M\":%d,\"N\":%d,\"K\":%d,\"chosen\":%d,\"us\":[",
                  t.fp8, t.epi, t.residual, t.M, t.N, t.K, t.chosen);
    return std::make_pair(t.us.data(), t.us.size());
  });
}

// ---- elementwise kernels ----------------------------------------------------------------------

namespace {

// Identity, the erf GELU (A&S erf, the production form), the tanh GELU cuBLASLt's epilogue
// computes, or the erf GELU with CUDA's erff (kept to measure against); fp32 math.
template <Act A>
__device__ __forceinline__ float act(float x) {
  if (A == Act::kGeluTanh) return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
  if (A == Act::kGeluErf) return gelu_erf_as(x);
  if (A == Act::kGeluErfLib) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
  return x;
}

// out = act(x (+ bias)) -> y (fp16) and/or yq (e4m3 of the fp16 value * yq_inv, saturating,
// round to nearest even: the same bytes a later quantize pass would write). y may be x.
struct ActOut {
  __half* y;
  uint8_t* yq;
  float yq_inv;  // 1 / yq_scale in fp32: one multiply per element instead of a divide
};

// 8 halves per thread (16-byte accesses); needs N % 8 == 0 and 16-byte (yq: 8-byte) alignment.
template <Act A>
__global__ void bias_act_vec8(const __half* x, const __half* bias, ActOut o, int N, size_t nvec) {
  wait_for_producer();
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < nvec;
       v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint4 u = reinterpret_cast<const uint4*>(x)[v];
    __half2* h = reinterpret_cast<__half2*>(&u);
    uint4 bu = make_uint4(0, 0, 0, 0);
    if (bias) bu = reinterpret_cast<const uint4*>(bias)[(v * 8 % N) / 8];
    const __half2* bh = reinterpret_cast<const __half2*>(&bu);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 f = __half22float2(h[j]);
      if (bias) {
        const float2 b = __half22float2(bh[j]);
        f.x += b.x;
        f.y += b.y;
      }
      h[j] = __floats2half2_rn(act<A>(f.x), act<A>(f.y));
    }
    if (o.y) reinterpret_cast<uint4*>(o.y)[v] = u;
    if (o.yq) reinterpret_cast<uint2*>(o.yq)[v] = e4m3x8(u, o.yq_inv);
  }
}

template <Act A>
__global__ void bias_act_scalar(const __half* x, const __half* bias, ActOut o, int N, size_t n) {
  wait_for_producer();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float v = __half2float(x[i]);
    if (bias) v += __half2float(bias[i % N]);
    const __half h = __float2half_rn(act<A>(v));
    if (o.y) o.y[i] = h;
    if (o.yq) o.yq[i] = __nv_cvt_float_to_fp8(__half2float(h) * o.yq_inv, __NV_SATFINITE, __NV_E4M3);
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

unsigned GridFor(size_t work, int threads) {
  // Enough blocks to fill an H200 several times over; grid-stride loops do the rest.
  size_t blocks = (work + threads - 1) / threads;
  if (blocks > 132 * 16) blocks = 132 * 16;
  return static_cast<unsigned>(blocks ? blocks : 1);
}

}  // namespace

template <Act A>
cudaError_t LaunchBiasAct(cudaStream_t stream, const __half* x, const __half* bias, ActOut o,
                          size_t n, int N) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  if (N % 8 == 0 && Aligned16(x) && (!o.y || Aligned16(o.y)) && (!bias || Aligned16(bias)) &&
      (reinterpret_cast<uintptr_t>(o.yq) & 7u) == 0) {
    // PDL is always safe here: these kernels read nothing before waiting for the one before.
    return LaunchAfterGemm(bias_act_vec8<A>, dim3(GridFor(n / 8, kThreads)), dim3(kThreads), stream,
                           true, x, bias, o, N, n / 8);
  }
  return LaunchAfterGemm(bias_act_scalar<A>, dim3(GridFor(n, kThreads)), dim3(kThreads), stream,
                         true, x, bias, o, N, n);
}

cudaError_t bf_bias_act_f16(cudaStream_t stream, const __half* x, __half* y, const __half* bias,
                            int M, int N, Act act, uint8_t* yq, float yq_scale) {
  const ActOut o{y, yq, 1.0f / yq_scale};
  const size_t n = static_cast<size_t>(M) * N;
  switch (act) {
    case Act::kGeluErf: return LaunchBiasAct<Act::kGeluErf>(stream, x, bias, o, n, N);
    case Act::kGeluTanh: return LaunchBiasAct<Act::kGeluTanh>(stream, x, bias, o, n, N);
    case Act::kGeluErfLib: return LaunchBiasAct<Act::kGeluErfLib>(stream, x, bias, o, n, N);
    default: return LaunchBiasAct<Act::kNone>(stream, x, bias, o, n, N);
  }
}

cudaError_t bf_quantize_e4m3(cudaStream_t stream, const __half* x, float scale, uint8_t* q,
                             size_t n) {
  // One row of n elements: the plain pass of the bias/activation kernel, fp8 output only.
  return LaunchBiasAct<Act::kNone>(stream, x, nullptr, ActOut{nullptr, q, 1.0f / scale}, n,
                                   n % 8 == 0 ? 8 : 1);
}

// ---- op-level forward --------------------------------------------------------------------------

namespace {

const char* CudaFail(const char* what, cudaError_t err) {
  g_error = std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  return g_error.c_str();
}

}  // namespace

// ---- the sm_90a GEMMs against cuBLASLt, chosen per shape ---------------------------------------

std::atomic<int>& GemmModeFlag() {
  // BERTFUSE_GEMM: auto (default: the faster of cuBLASLt and the sm_90a configurations, timed
  // once per shape), cublas, or sm90 (the sm_90a GEMMs wherever they apply; BERTFUSE_GEMM_CONFIG=n
  // pins configuration n).
  static std::atomic<int> flag{[] {
    const char* s = std::getenv("BERTFUSE_GEMM");
    if (s && std::strcmp(s, "cublas") == 0) return static_cast<int>(GemmMode::kCublas);
    if (s && std::strcmp(s, "sm90") == 0) return static_cast<int>(GemmMode::kSm90);
    return static_cast<int>(GemmMode::kAuto);
  }()};
  return flag;
}

std::atomic<int>& GemmConfigFlag() {
  static std::atomic<int> flag{[] {
    const char* s = std::getenv("BERTFUSE_GEMM_CONFIG");
    return s ? static_cast<int>(std::strtol(s, nullptr, 10)) : -1;
  }()};
  return flag;
}

namespace {

struct ChoiceKey {
  int device, act, residual, M, N, K;
  bool operator==(const ChoiceKey& o) const {
    return device == o.device && act == o.act && residual == o.residual && M == o.M && N == o.N &&
           K == o.K;
  }
};

struct GemmTiming {
  ChoiceKey key;
  int choice;                        // -1 cuBLASLt, else the sm90 configuration
  float us[1 + sm90::kNumConfigs];   // per candidate (cuBLASLt first); < 0: not run
};

// Process-wide: every session's kernels share what was timed for a shape on a device.
std::mutex g_choice_mu;
std::vector<GemmTiming> g_choices;

const char* RunSm90(int cfg, const sm90::Problem& p, cudaStream_t stream, WorkspaceSource* ws) {
  const size_t need = sm90::WorkspaceBytes(cfg, p);
  void* w = need ? (ws ? ws->Get(need) : nullptr) : nullptr;
  if (need && !w) return "no workspace for the sm90 GEMM";
  return sm90::Run(cfg, p, stream, w, need);
}

// Which GEMM computes `p`: -1 cuBLASLt (`cublas` enqueues its whole part), else the sm90
// configuration. The first call per shape, outside a CUDA-graph capture, times every candidate
// on the call's own buffers (the candidates only write Y, never read it, so the run that follows
// is unaffected); inside a capture an untimed shape goes to cuBLASLt.
int ChooseGemm(cudaStream_t stream, WorkspaceSource* ws, const sm90::Problem& p,
               const std::function<const char*()>& cublas) {
  const int mode = GemmModeFlag().load();
  if (mode == static_cast<int>(GemmMode::kCublas) || !sm90::Available() || !sm90::Eligible(p)) return -1;
  const int pinned = GemmConfigFlag().load();
  if (mode == static_cast<int>(GemmMode::kSm90) && pinned >= 0 && pinned < sm90::kNumConfigs) return pinned;
  int device = 0;
  cudaGetDevice(&device);
  const ChoiceKey key{device, static_cast<int>(p.act), p.beta != 0.0f, p.M, p.N, p.K};
  {
    std::lock_guard<std::mutex> lock(g_choice_mu);
    for (const auto& t : g_choices)
      if (t.key == key) return mode == static_cast<int>(GemmMode::kSm90) && t.choice < 0 ? 0 : t.choice;
  }
  CandidateTimer time(stream);
  if (!time.ok()) return mode == static_cast<int>(GemmMode::kSm90) ? 0 : -1;
  GemmTiming t{key, -1, {}};
  t.us[0] = mode == static_cast<int>(GemmMode::kSm90) ? -1.0f : time(cublas);
  float best = t.us[0];
  for (int c = 0; c < sm90::kNumConfigs; ++c) {
    t.us[1 + c] = time([&] { return RunSm90(c, p, stream, ws); });
    if (t.us[1 + c] >= 0.0f && (best < 0.0f || t.us[1 + c] < best)) {
      best = t.us[1 + c];
      t.choice = c;
    }
  }
  if (best < 0.0f) t.choice = -1;  // nothing ran: cuBLASLt, whose error the caller then sees
  std::lock_guard<std::mutex> lock(g_choice_mu);
  g_choices.push_back(t);
  return t.choice;
}

}  // namespace

std::string GemmChoicesJson() {
  return JsonArray(g_choice_mu, g_choices, [](const GemmTiming& t, char* buf, size_t size) {
    std::snprintf(buf, size, "{\"device\":%d,\"M\":%d,\"N\":%d,\"K\":%d,\"gelu\":%d,\"residual\":%d,\"choice\":\"%s\",\"us\":[",
                  t.key.device, t.key.M, t.key.N, t.key.K, t.key.act, t.key.residual,
                  t.choice < 0 ? "cublas" : sm90::ConfigName(t.choice));
    return std::make_pair(static_cast<const float*>(t.us), static_cast<size_t>(1 + sm90::kNumConfigs));
  });
}

// ---- DenseBiasSkipLayerNorm as split-K GEMM + reduction in the LayerNorm -----------------------
//
// Where M is small (BERT-base at b1: M = 128) cuBLASLt splits K and reduces the partials in a
// kernel of its own, then the LayerNorm reads the sum back: two kernels after the GEMM. Here the
// GEMM writes its fp32 partials (one strided-batched call) and the LayerNorm adds them with the
// bias and residual: one kernel, and the partials stay fp32 until the normalisation.

std::atomic<int>& Fp8OutFlag() {
  static std::atomic<int> flag{[] {
    const char* s = std::getenv("BERTFUSE_FP8_GEMM_OUT");
    return s && std::strcmp(s, "off") == 0 ? 0 : 1;
  }()};
  return flag;
}

std::atomic<int>& SplitLnFlag() {
  static std::atomic<int> flag{[] {
    const char* s = std::getenv("BERTFUSE_SPLIT_LN");
    if (!s || std::strcmp(s, "auto") == 0) return 0;
    if (std::strcmp(s, "off") == 0) return -1;
    const long n = std::strtol(s, nullptr, 10);
    return n >= 2 && n <= 16 ? static_cast<int>(n) : 0;
  }()};
  return flag;
}

namespace {

constexpr int kSplitCandidates[] = {2, 3, 4, 6, 8};

struct SplitKey {
  int device, M, N, K, y32;
  bool operator==(const SplitKey& o) const {
    return device == o.device && M == o.M && N == o.N && K == o.K && y32 == o.y32;
  }
};
struct SplitTiming {
  SplitKey key;
  int splits;  // 0: the plain form
  float us[1 + sizeof(kSplitCandidates) / sizeof(int)];  // plain, then each candidate; < 0 not run
};
std::mutex g_split_mu;
std::vector<SplitTiming> g_splits;

bool SplitAllowed(const DenseArgs& a, int splits) {
  return splits >= 2 && a.K % (8 * splits) == 0 &&
         static_cast<size_t>(splits) * a.M * a.N * sizeof(float) <= DefaultWorkspaceBytes();
}

bool SplitEligible(const DenseArgs& a) {
  const auto al16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return a.kind == DenseKind::kBiasSkipLayerNorm && !a.fp8 && !a.yq && !a.no_split && a.variant == 0 &&
         a.bias && a.N % 8 == 0 && a.N <= 2048 && a.M > 0 && al16(a.y) && al16(a.gamma) && al16(a.bias) &&
         (!a.skip || al16(a.skip)) && (!a.beta || al16(a.beta)) && (!a.y32 || al16(a.y32));
}

const char* RunSplitLn(DenseGemm& gemm, cudaStream_t stream, WorkspaceSource* ws, const DenseArgs& a,
                       int splits) {
  const size_t stride = static_cast<size_t>(a.M) * a.N;
  float* parts = static_cast<float*>(ws ? ws->Get(splits * stride * sizeof(float)) : nullptr);
  if (!parts) return "no workspace for the split-K partials";
  if (const char* e = gemm.RunF16SplitK(stream, a.x, static_cast<const __half*>(a.w), parts, a.M, a.N, a.K, splits))
    return e;
  const cudaError_t le = bf_layernorm_splits_f16(stream, parts, splits, stride, a.bias, a.skip, a.gamma, a.beta,
                                                 a.epsilon, a.y, a.M, a.N, a.y32, a.weights_const);
  return le == cudaSuccess ? nullptr : CudaFail("split-K LayerNorm", le);
}

// The split count for this call (0: the plain form). Timed on the first call of a shape outside a
// CUDA-graph capture (both forms only write Y and Y32); inside a capture an untimed shape runs plain.
int ChooseSplitLn(DenseGemm& gemm, cudaStream_t stream, WorkspaceSource* ws, const DenseArgs& a) {
  const int flag = SplitLnFlag().load();
  if (flag < 0 || !SplitEligible(a)) return 0;
  if (flag >= 2) return SplitAllowed(a, flag) ? flag : 0;
  int device = 0;
  cudaGetDevice(&device);
  const SplitKey key{device, a.M, a.N, a.K, a.y32 != nullptr};
  {
    std::lock_guard<std::mutex> lock(g_split_mu);
    for (const auto& t : g_splits)
      if (t.key == key) return t.splits;
  }
  CandidateTimer time(stream);
  if (!time.ok()) return 0;
  SplitTiming t{key, 0, {}};
  DenseArgs plain = a;
  plain.no_split = true;
  t.us[0] = time([&] { return bf_dense_forward(gemm, stream, ws, plain); });
  float best = t.us[0];
  for (size_t c = 0; c < sizeof(kSplitCandidates) / sizeof(int); ++c) {
    const int n = kSplitCandidates[c];
    t.us[1 + c] = SplitAllowed(a, n) ? time([&] { return RunSplitLn(gemm, stream, ws, a, n); }) : -1.0f;
    // Kept only where clearly faster than the plain form (3%), so noise does not flip it.
    if (t.us[1 + c] >= 0.0f && (t.us[0] < 0.0f || t.us[1 + c] < 0.97f * t.us[0]) && (best < 0.0f || t.us[1 + c] < best)) {
      best = t.us[1 + c];
      t.splits = n;
    }
  }
  std::lock_guard<std::mutex> lock(g_split_mu);
  g_splits.push_back(t);
  return t.splits;
}

}  // namespace

std::string SplitLnChoicesJson() {
  return JsonArray(g_split_mu, g_splits, [](const SplitTiming& t, char* buf, size_t size) {
    std::snprintf(buf, size, "{\"device\":%d,\"M\":%d,\"N\":%d,\"K\":%d,\"y32\":%d,\"splits\":%d,\"us\":[",
                  t.key.device, t.key.M, t.key.N, t.key.K, t.key.y32, t.splits);
    return std::make_pair(static_cast<const float*>(t.us), sizeof(t.us) / sizeof(float));
  });
}

const char* bf_dense_forward(DenseGemm& gemm, cudaStream_t stream, WorkspaceSource* ws,
                             const DenseArgs& a) {
  const int M = a.M, N = a.N, K = a.K;
  const bool sln = a.kind == DenseKind::kBiasSkipLayerNorm;
  if (sln && SplitEligible(a)) {
    const int splits = ChooseSplitLn(gemm, stream, ws, a);
    if (splits > 0 && RunSplitLn(gemm, stream, ws, a, splits) == nullptr) return nullptr;
    cudaGetLastError();  // a split form that failed leaves the op to the plain form below
  }
  // The plan: the GEMM's epilogue and residual (C), then at most one elementwise kernel
  // (bias + activation) and, for SkipLayerNorm, the LayerNorm kernel (adding what the GEMM
  // did not).
  Epilogue epi = Epilogue::kBias;
  const __half* C = nullptr;
  Act act = Act::kNone;
  bool post = false;  // run bf_bias_act_f16 after the GEMM
  const __half* post_bias = nullptr;
  const __half* ln_bias = nullptr;
  const __half* ln_skip = nullptr;
  switch (a.kind) {
    case DenseKind::kBias:
      break;
    case DenseKind::kBiasGelu:
      post = true;
      act = a.approximate ? Act::kGeluTanh : Act::kGeluErf;
      if (a.approximate) {  // cuBLASLt's GELU epilogue is the tanh form: one kernel
        epi = Epilogue::kBiasGeluTanh;
        post = false;
      } else if (a.variant == 1) {  // plain GEMM, then one bias + erf-GELU kernel
        epi = Epilogue::kNone;
        post_bias = a.bias;
      } else if (a.variant == 2) {  // as the default, erf by CUDA's erff
        act = Act::kGeluErfLib;
      }  // else: GEMM with the bias epilogue, then erf-GELU in place
      break;
    case DenseKind::kBiasSkipLayerNorm:
      // Measured on the H200 (M = 1280, 128, 4096): the plain GEMM with the LN adding bias and
      // residual is fastest (shenma FFN down 13.8 us against 14.9 with the residual as C).
      if (a.variant == 1) {  // bias epilogue, LN adds the residual
        ln_skip = a.skip;
      } else if (a.variant == 2) {  // bias epilogue + residual as C (beta = 1), LN in place
        C = a.skip;
      } else {  // plain GEMM, LN adds bias and residual
        epi = Epilogue::kNone;
        ln_bias = a.bias;
        ln_skip = a.skip;
      }
      break;
    default:
      g_error = "unknown dense kind " + std::to_string(static_cast<int>(a.kind));
      return g_error.c_str();
  }
  // Where cuBLASLt offered no algorithm for a combination (found once, then remembered), its
  // parts move into our kernels: tanh GELU first, then bias and residual.
  if (epi == Epilogue::kBiasGeluTanh && !gemm.Supports(a.fp8, epi, false)) {
    epi = Epilogue::kBias;
    post = true;
  }
  if ((epi != Epilogue::kNone || C) && !gemm.Supports(a.fp8, epi, C != nullptr)) {
    if (sln) {
      ln_bias = epi == Epilogue::kBias ? a.bias : ln_bias;
      ln_skip = a.skip;
      C = nullptr;
    } else {
      post = true;
      post_bias = a.bias;
    }
    epi = Epilogue::kNone;
  }
  const char* err = nullptr;
  // fp16 with the production variant: bertfuse's sm_90a GEMM, with bias and erf GELU in its
  // epilogue, where it beats cuBLASLt at this shape (tanh GELU stays on cuBLASLt's epilogue).
  if (!a.fp8 && a.variant == 0 && !(a.kind == DenseKind::kBiasGelu && a.approximate) &&
      sm90::Available()) {
    sm90::Problem p;
    p.x = a.x;
    p.w = static_cast<const __half*>(a.w);
    p.bias = a.bias;
    p.y = a.y;
    p.M = M;
    p.N = N;
    p.K = K;
    p.act = a.kind == DenseKind::kBiasGelu ? sm90::Act::kGeluErf : sm90::Act::kIdentity;
    const auto cublas_part = [&]() -> const char* {
      const char* e = gemm.RunF16(stream, ws, a.x, static_cast<const __half*>(a.w),
                                  epi == Epilogue::kNone ? nullptr : a.bias, C, a.y, M, N, K, epi);
      if (e || !post) return e;
      const cudaError_t pe = bf_bias_act_f16(stream, a.y, a.y, post_bias, M, N, act);
      return pe == cudaSuccess ? nullptr : CudaFail("bias/GELU", pe);
    };
    const int cfg = ChooseGemm(stream, ws, p, cublas_part);
    if (cfg >= 0 && RunSm90(cfg, p, stream, ws) == nullptr) {
      if (a.yq && !sln) {  // the e4m3 copy for an FP8 GEMM downstream
        const cudaError_t qe = bf_bias_act_f16(stream, a.y, nullptr, nullptr, M, N, Act::kNone, a.yq, a.yq_scale);
        if (qe != cudaSuccess) return CudaFail("e4m3 copy", qe);
      }
      if (sln) {  // the bias is in; the LayerNorm adds the residual
        const cudaError_t le = bf_layernorm_f16(stream, a.y, nullptr, a.skip, a.gamma, a.beta,
                                                a.epsilon, a.y, M, N, a.yq, a.yq_scale, a.y32, a.weights_const);
        if (le != cudaSuccess) return CudaFail("LayerNorm", le);
      }
      return nullptr;
    }
    cudaGetLastError();  // an sm90 launch that failed leaves the work to cuBLASLt below
  }
  if (a.fp8) {
    if (!a.xq) return "FP8 dense: no scratch buffer for the quantized activations";
    if (a.x) {  // else xq already holds them (quantized upstream)
      const cudaError_t qe = bf_quantize_e4m3(stream, a.x, a.x_scale, a.xq, static_cast<size_t>(M) * K);
      if (qe != cudaSuccess) return CudaFail("FP8 activation quantize", qe);
    }
    // Only the e4m3 copy is read, and the epilogue is all cuBLASLt's (tanh GELU, or the bias):
    // the GEMM writes it, from fp32, with no fp16 Y and no pass after.
    if (a.yq && a.y_unread && a.yq_dscale && !post && !C && epi != Epilogue::kNone && !sln &&
        Fp8OutFlag().load() && gemm.SupportsQuantizedOut(epi)) {
      if (gemm.RunFp8Quantized(stream, ws, a.xq, static_cast<const uint8_t*>(a.w), a.w_scale, a.x_scale, a.bias,
                               a.yq, a.yq_dscale, M, N, K, epi, a.fast_accum) == nullptr)
        return nullptr;
      cudaGetLastError();  // no such algorithm here: the fp16 Y and the pass below
    }
    err = gemm.RunFp8(stream, ws, a.xq, static_cast<const uint8_t*>(a.w), a.w_scale, a.x_scale,
                      epi == Epilogue::kNone ? nullptr : a.bias, C, a.y, M, N, K, epi,
                      a.fast_accum);
  } else {
    err = gemm.RunF16(stream, ws, a.x, static_cast<const __half*>(a.w),
                      epi == Epilogue::kNone ? nullptr : a.bias, C, a.y, M, N, K, epi);
  }
  if (err && (epi != Epilogue::kNone || C) && !gemm.Supports(a.fp8, epi, C != nullptr)) {
    return bf_dense_forward(gemm, stream, ws, a);  // just marked unsupported: the fallback
  }
  if (err) return err;
  if (post || (a.yq && !sln)) {  // a pass only for the e4m3 copy leaves Y as the GEMM wrote it
    // y's own write is skipped where nothing reads it (y_unread: only the e4m3 copy is kept)
    const cudaError_t pe = bf_bias_act_f16(stream, a.y, post && !(a.y_unread && a.yq) ? a.y : nullptr,
                                           post_bias, M, N, post ? act : Act::kNone, a.yq, a.yq_scale);
    if (pe != cudaSuccess) return CudaFail("bias/GELU", pe);
  }
  if (sln) {
    const cudaError_t le = bf_layernorm_f16(stream, a.y, ln_bias, ln_skip, a.gamma, a.beta,
                                            a.epsilon, a.y, M, N, a.yq, a.yq_scale, a.y32, a.weights_const);
    if (le != cudaSuccess) return CudaFail("LayerNorm", le);
  }
  return nullptr;
}

}  // namespace bertfuse

// ---- ctypes check entry points (raw device pointers, no ONNX Runtime) -------------------------

namespace {

// The check entry points' workspace: one buffer of the default cap, allocated with the GEMM.
// They are for a harness on one stream at a time, not for concurrent use.
class CheckWorkspace : public bertfuse::WorkspaceSource {
 public:
  explicit CheckWorkspace(size_t bytes) : bytes_(bytes) {
    if (bytes_ && cudaMalloc(&ptr_, bytes_) != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error("cudaMalloc of the check workspace failed");
    }
  }
  void* Get(size_t bytes) override { return bytes <= bytes_ ? ptr_ : nullptr; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

struct CheckState {
  bertfuse::DenseGemm* gemm;
  CheckWorkspace* ws;
};

CheckState* Check(const char** err) {
  // One per process (never freed: it would outlive the CUDA context at interpreter exit).
  static CheckState* state = nullptr;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!state) {
    try {
      auto* ws = new CheckWorkspace(bertfuse::DefaultWorkspaceBytes());
      state = new CheckState{new bertfuse::DenseGemm(-1, ws->bytes()), ws};
    } catch (const std::exception& e) {
      bertfuse::g_error = e.what();
      *err = bertfuse::g_error.c_str();
      return nullptr;
    }
  }
  return state;
}

template <typename T>
T* Ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

bertfuse::DenseArgs Args(uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t skip, uintptr_t gamma,
                         uintptr_t beta, uintptr_t y, int M, int N, int K, int kind,
                         int approximate, float epsilon, int variant) {
  bertfuse::DenseArgs a;
  a.x = Ptr<const __half>(x);
  a.w = Ptr<const void>(w);
  a.bias = Ptr<const __half>(bias);
  a.skip = Ptr<const __half>(skip);
  a.gamma = Ptr<const __half>(gamma);
  a.beta = Ptr<const __half>(beta);
  a.y = Ptr<__half>(y);
  a.M = M;
  a.N = N;
  a.K = K;
  a.kind = static_cast<bertfuse::DenseKind>(kind);
  a.approximate = approximate;
  a.epsilon = epsilon;
  a.variant = variant;
  return a;
}

int RunCheck(const bertfuse::DenseArgs& args, uintptr_t stream) {
  const char* err = nullptr;
  CheckState* st = Check(&err);
  if (!st) return 1;
  err = bertfuse::bf_dense_forward(*st->gemm, reinterpret_cast<cudaStream_t>(stream), st->ws, args);
  if (err) {
    if (err != bertfuse::g_error.c_str()) bertfuse::g_error = err;
    return 1;
  }
  return 0;
}

}  // namespace

#define BF_DENSE_EXPORT extern "C" __attribute__((visibility("default")))

// kind: 0 DenseBias, 1 DenseBiasGelu, 2 DenseBiasSkipLayerNorm. variant 0 is what the ORT ops
// run; 1/2 are the alternatives measured against it (see bf_dense_forward). yq (0 = none):
// the e4m3 copy of Y, e4m3(Y / yq_scale). Returns 0 on success, else non-zero with the
// message in bf_dense_last_error().
BF_DENSE_EXPORT int bf_check_dense(uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t skip,
                                   uintptr_t gamma, uintptr_t beta, uintptr_t y, int M, int N,
                                   int K, int kind, int approximate, float epsilon, int variant,
                                   uintptr_t yq, float yq_scale, uintptr_t stream) {
  bertfuse::DenseArgs a = Args(x, w, bias, skip, gamma, beta, y, M, N, K, kind, approximate, epsilon, variant);
  a.yq = Ptr<uint8_t>(yq);
  a.yq_scale = yq_scale;
  return RunCheck(a, stream);
}

// FP8: wt is float8e4m3fn [N, K] (W transposed), w_scale a device float[1], xq a device
// scratch of M*K bytes for the quantized activations; x = 0 means xq already holds them.
BF_DENSE_EXPORT int bf_check_dense_fp8(uintptr_t x, uintptr_t wt, uintptr_t w_scale, float x_scale,
                                       uintptr_t xq, uintptr_t bias, uintptr_t skip,
                                       uintptr_t gamma, uintptr_t beta, uintptr_t y, int M, int N,
                                       int K, int kind, int approximate, float epsilon,
                                       int variant, int fast_accum, uintptr_t yq, float yq_scale,
                                       uintptr_t stream) {
  bertfuse::DenseArgs a = Args(x, wt, bias, skip, gamma, beta, y, M, N, K, kind, approximate, epsilon, variant);
  a.yq = Ptr<uint8_t>(yq);
  a.yq_scale = yq_scale;
  a.fp8 = true;
  a.w_scale = Ptr<const float>(w_scale);
  a.x_scale = x_scale;
  a.xq = Ptr<uint8_t>(xq);
  a.fast_accum = fast_accum != 0;
  return RunCheck(a, stream);
}

// LayerNorm alone (y may alias x); yq (optional, 0 = none) receives e4m3(y / yq_scale).
BF_DENSE_EXPORT int bf_check_layernorm(uintptr_t x, uintptr_t bias, uintptr_t skip,
                                       uintptr_t gamma, uintptr_t beta, float epsilon,
                                       uintptr_t y, int M, int N, uintptr_t yq, float yq_scale,
                                       uintptr_t stream) {
  const cudaError_t e = bertfuse::bf_layernorm_f16(
      reinterpret_cast<cudaStream_t>(stream), Ptr<const __half>(x), Ptr<const __half>(bias),
      Ptr<const __half>(skip), Ptr<const __half>(gamma), Ptr<const __half>(beta), epsilon,
      Ptr<__half>(y), M, N, Ptr<uint8_t>(yq), yq_scale);
  if (e != cudaSuccess) {
    bertfuse::g_error = cudaGetErrorString(e);
    return 1;
  }
  return 0;
}

// The bias + activation kernel alone, y = act(x + bias) over [M, N] (y may be x): act 0 none,
// 1 erf GELU (A&S erf, the production form), 2 tanh GELU, 3 erf GELU with CUDA's erff.
BF_DENSE_EXPORT int bf_check_bias_act(uintptr_t x, uintptr_t y, uintptr_t bias, int M, int N,
                                      int act, uintptr_t stream) {
  const cudaError_t e = bertfuse::bf_bias_act_f16(reinterpret_cast<cudaStream_t>(stream),
                                                  Ptr<const __half>(x), Ptr<__half>(y),
                                                  Ptr<const __half>(bias), M, N,
                                                  static_cast<bertfuse::Act>(act));
  if (e != cudaSuccess) {
    bertfuse::g_error = cudaGetErrorString(e);
    return 1;
  }
  return 0;
}

// Programmatic dependent launch for the kernels after the GEMM: 1 on, 0 off (BERTFUSE_PDL).
BF_DENSE_EXPORT int bf_check_set_pdl(int on) {
  bertfuse::PdlFlag().store(on ? 1 : 0);
  return 0;
}

// The LayerNorm's register cap from now on (launch.h, BERTFUSE_LN_CAP): 0 where needed, 1 never,
// 2 wherever the row fits.
BF_DENSE_EXPORT int bf_check_set_ln_cap(int mode) {
  bertfuse::LnCapFlag().store(mode >= 0 && mode <= 2 ? mode : 0);
  return 0;
}

// Which cuBLASLt algorithm the check entry points use from now on: rank >= 0 pins the
// heuristic's rank-th valid one (0 = its first choice), -1 times them and keeps the fastest
// (the default, as the ORT ops; BERTFUSE_GEMM_TIMING=0 makes rank 0 their default).
BF_DENSE_EXPORT int bf_check_set_algo_rank(int rank) {
  const char* err = nullptr;
  CheckState* st = Check(&err);
  if (!st) return 1;
  st->gemm->set_algo_rank(rank);
  return 0;
}

// Which epilogue/residual combinations cuBLASLt had no algorithm for so far (and so ran as our
// kernels): bit (epilogue * 4 + fp8 * 2 + residual), epilogue 0 none, 1 bias, 2 bias+tanh GELU.
BF_DENSE_EXPORT int bf_check_unsupported_mask() {
  const char* err = nullptr;
  CheckState* st = Check(&err);
  return st ? st->gemm->unsupported_mask() : -1;
}

// The workspace cap the check entry points give cuBLASLt's heuristic, in MiB (at most
// BERTFUSE_GEMM_WORKSPACE_MB); 0 = only algorithms that need none.
BF_DENSE_EXPORT int bf_check_set_workspace_mb(int mb) {
  const char* err = nullptr;
  CheckState* st = Check(&err);
  if (!st) return 1;
  const size_t bytes = static_cast<size_t>(mb < 0 ? 0 : mb) << 20;
  st->gemm->set_max_workspace(bytes < st->ws->bytes() ? bytes : st->ws->bytes());
  return 0;
}

// Which GEMM the dense ops run from now on: mode 0 auto (timed per shape), 1 cuBLASLt, 2 the
// sm_90a GEMMs (config >= 0 pins one, -1 the fastest of them); as BERTFUSE_GEMM(_CONFIG).
BF_DENSE_EXPORT int bf_check_set_gemm(int mode, int config) {
  if (mode < 0 || mode > 2) return 1;
  bertfuse::GemmModeFlag().store(mode);
  bertfuse::GemmConfigFlag().store(config);
  return 0;
}

// What auto mode timed so far, one JSON array: shape, candidate times (cuBLASLt first, then
// each sm_90a configuration; -1 = could not run), and the choice.
BF_DENSE_EXPORT const char* bf_gemm_choices() {
  static thread_local std::string json;
  json = bertfuse::GemmChoicesJson();
  return json.c_str();
}

// What the cuBLASLt timing found so far, one JSON array: per plan its shape, epilogue, the
// time of each valid heuristic algorithm (in the heuristic's order; -1 = could not run) and the
// index chosen.
BF_DENSE_EXPORT const char* bf_cublas_timings() {
  static thread_local std::string json;
  json = bertfuse::CublasTimingsJson();
  return json.c_str();
}

// The sm_90a configurations in this build (empty when built without them), as a JSON array.
BF_DENSE_EXPORT const char* bf_sm90_configs() {
  static thread_local std::string json;
  json = "[";
  for (int c = 0; c < bertfuse::sm90::kNumConfigs; ++c) {
    if (std::strcmp(bertfuse::sm90::ConfigName(c), "none") == 0) continue;
    json += std::string(json.size() > 1 ? "," : "") + "\"" + bertfuse::sm90::ConfigName(c) + "\"";
  }
  json += "]";
  return json.c_str();
}

// DenseBiasSkipLayerNorm's split-K form from now on: 0 auto (timed per shape), -1 off, n >= 2
// always n splits where the shape allows (as BERTFUSE_SPLIT_LN).
BF_DENSE_EXPORT int bf_check_set_fp8_out(int on) {
  // The FP8 GEMM writing e4m3 itself from now on (1), or the fp16 Y and a pass (0).
  if (on != 0 && on != 1) return 1;
  bertfuse::Fp8OutFlag().store(on);
  return 0;
}

BF_DENSE_EXPORT int bf_check_set_split_ln(int mode) {
  if (mode < -1 || mode == 1 || mode > 16) return 1;
  bertfuse::SplitLnFlag().store(mode);
  return 0;
}

// What the split-K timing found so far, one JSON array: shape, the plain form's time then each
// split count's (-1 = not allowed at this shape), and the choice (0 = plain).
BF_DENSE_EXPORT const char* bf_split_ln_choices() {
  static thread_local std::string json;
  json = bertfuse::SplitLnChoicesJson();
  return json.c_str();
}

BF_DENSE_EXPORT const char* bf_dense_last_error() { return bertfuse::g_error.c_str(); }
