// The GEMM tuner (gemm_tuner.h): cuBLASLt plans per shape, the timing of their candidate
// algorithms, and the process-wide record of what was chosen.
#include "gemm_tuner.h"

#include <cstdio>
#include <stdexcept>

#include "config.h"

namespace bertfuse {
namespace {

#define LT_TRY(expr)                                                            \
  do {                                                                          \
    cublasStatus_t st_ = (expr);                                                \
    if (st_ != CUBLAS_STATUS_SUCCESS) return Status::WithCode(#expr, st_);      \
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
float TimeCandidate(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, const std::function<Status()>& run) {
  if (!run().ok()) {
    cudaGetLastError();
    return -1.0f;
  }
  hold_stream<<<1, 1, 0, stream>>>(400000);
  if (cudaEventRecord(e0, stream) != cudaSuccess) return -1.0f;
  for (int i = 0; i < kTimedRuns; ++i) {
    if (!run().ok()) {
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

// Process-wide record of what the cuBLASLt timing found, for bf_cublas_timings.
struct AlgoTiming {
  int fp8, epi, residual, M, N, K, chosen;
  std::vector<float> us;  // per valid heuristic algorithm, in the heuristic's order
};
ChoiceCache<int, AlgoTiming> g_algo_timings;  // every timing, in order (never looked up by key)

// The algorithm the first timed plan of a (device, plan key) kept (DenseGemm::ShareChoice).
struct SharedKey {
  int device;
  DenseGemm::PlanKey key;
  bool operator==(const SharedKey& o) const { return device == o.device && key == o.key; }
};
struct SharedChoice {
  SharedKey key;
  cublasLtMatmulAlgo_t algo;
  size_t workspace;
};
ChoiceCache<SharedKey, SharedChoice>& SharedChoices() {
  static ChoiceCache<SharedKey, SharedChoice> shared;  // process-wide, never destroyed before the last op
  return shared;
}

}  // namespace

void AppendTimes(std::string& out, const float* us, size_t n) {
  char buf[32];
  for (size_t c = 0; c < n; ++c) {
    std::snprintf(buf, sizeof(buf), "%s%.3f", c ? "," : "", us[c]);
    out += buf;
  }
  out += "]}";
}

CandidateTimer::CandidateTimer(cudaStream_t stream) : stream_(stream) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone ||
      cudaEventCreate(&e0_) != cudaSuccess || cudaEventCreate(&e1_) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  ok_ = true;
}

CandidateTimer::~CandidateTimer() {
  if (e0_) cudaEventDestroy(e0_);
  if (e1_) cudaEventDestroy(e1_);
}

float CandidateTimer::operator()(const std::function<Status()>& run) { return TimeCandidate(stream_, e0_, e1_, run); }

size_t DefaultWorkspaceBytes() { return Config().gemm_workspace_bytes; }

int DenseGemm::DefaultAlgoRank() {
  // BERTFUSE_GEMM_TIMING=0: the heuristic's first choice, untimed (as before the timing).
  return Config().gemm_algo_rank;
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

Status DenseGemm::RunF16(cudaStream_t stream, WorkspaceSource* ws, const __half* X, const __half* W,
                         const __half* bias, const __half* C, __half* Y, int M, int N, int K, Epilogue epi) {
  return Run(stream, ws, MakeCall(false, W, X, nullptr, 1.0f, bias, C, Y, M, N, K, epi, false));
}

Status DenseGemm::RunFp8(cudaStream_t stream, WorkspaceSource* ws, const uint8_t* Xq, const uint8_t* Wt,
                         const float* w_scale, float x_scale, const __half* bias, const __half* C, __half* Y,
                         int M, int N, int K, Epilogue epi, bool fast_accum) {
  return Run(stream, ws, MakeCall(true, Wt, Xq, w_scale, x_scale, bias, C, Y, M, N, K, epi, fast_accum));
}

Status DenseGemm::RunFp8Quantized(cudaStream_t stream, WorkspaceSource* ws, const uint8_t* Xq, const uint8_t* Wt,
                                  const float* w_scale, float x_scale, const __half* bias, uint8_t* Dq,
                                  const float* d_scale, int M, int N, int K, Epilogue epi, bool fast_accum) {
  if (!d_scale) return Status::WithCode("e4m3 output needs its scale", 0, bf::Code::kInvalidArgument);
  return Run(stream, ws, MakeCall(true, Wt, Xq, w_scale, x_scale, bias, nullptr, reinterpret_cast<__half*>(Dq),
                                  M, N, K, epi, fast_accum, d_scale));
}

Status DenseGemm::CanImplementF16(WorkspaceSource*, const __half* X, const __half* W, const __half* bias,
                                  const __half* C, __half* Y, int M, int N, int K, Epilogue epi) {
  std::lock_guard<std::mutex> lock(mu_);
  PlanKey key{};
  Plan* plan = nullptr;
  return Prepare(MakeCall(false, W, X, nullptr, 1.0f, bias, C, Y, M, N, K, epi, false), &key, &plan);
}

Status DenseGemm::CanImplementFp8(WorkspaceSource*, const uint8_t* Xq, const uint8_t* Wt, const float* w_scale,
                                  const __half* bias, const __half* C, __half* Y, int M, int N, int K,
                                  Epilogue epi, bool fast_accum) {
  std::lock_guard<std::mutex> lock(mu_);
  PlanKey key{};
  Plan* plan = nullptr;
  return Prepare(MakeCall(true, Wt, Xq, w_scale, 1.0f, bias, C, Y, M, N, K, epi, fast_accum), &key, &plan);
}

Status DenseGemm::CanImplementFp8Quantized(const uint8_t* Xq, const uint8_t* Wt, const float* w_scale,
                                           const __half* bias, uint8_t* Dq, const float* d_scale, int M, int N,
                                           int K, Epilogue epi, bool fast_accum) {
  if (!d_scale) return Status::WithCode("e4m3 output needs its scale", 0, bf::Code::kInvalidArgument);
  if (!SupportsQuantizedOut(epi)) return Status::Unsupported("cuBLASLt has no FP8 (e4m3 out) algorithm here");
  std::lock_guard<std::mutex> lock(mu_);
  PlanKey key{};
  Plan* plan = nullptr;
  return Prepare(MakeCall(true, Wt, Xq, w_scale, 1.0f, bias, nullptr, reinterpret_cast<__half*>(Dq), M, N, K,
                          epi, fast_accum, d_scale),
                 &key, &plan);
}

Status DenseGemm::CanImplementF16SplitK(const __half* X, const __half* W, float* D, int M, int N, int K,
                                        int splits) {
  std::lock_guard<std::mutex> lock(mu_);
  Plan* plan = nullptr;
  return PrepareSplitK(X, W, D, M, N, K, splits, &plan);
}

// Column-major view of batch s: D_s[N,M] = W_s (col-major N x K/splits, ld N, the rows
// s*K/splits.. of row-major W, batch stride K/splits*N) * X_s (col-major K/splits x M, ld K, batch
// stride K/splits), D_s fp32 col-major N x M, batch stride M*N.
Status DenseGemm::PrepareSplitK(const __half* X, const __half* W, float* D, int M, int N, int K, int splits,
                                Plan** out) {
  *out = nullptr;
  if (M <= 0 || N <= 0) return Status::Ok();
  if (splits < 1 || K % (8 * splits) != 0)
    return Status::WithCode("split-K GEMM needs K % (8 * splits) == 0", K, bf::Code::kInvalidArgument);
  PlanKey key{0, 0, 0, M, N, K, AlignmentOf(W), AlignmentOf(X), AlignmentOf(D), AlignmentOf(D), 0, 0, 0};
  key.splits = splits;
  for (auto& kp : plans_) {
    if (kp.first == key) {
      *out = kp.second.get();
      return Status::Ok();
    }
  }
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
    return Status::Unsupported("cuBLASLt has no split-K (batched fp32) algorithm for M=" + std::to_string(M) +
                               " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                               " splits=" + std::to_string(splits));
  }
  p->algo = res.algo;
  *out = p.get();
  plans_.emplace_back(key, std::move(p));
  return Status::Ok();
}

Status DenseGemm::RunF16SplitK(cudaStream_t stream, const __half* X, const __half* W, float* D, int M, int N,
                               int K, int splits) {
  std::lock_guard<std::mutex> lock(mu_);
  Plan* plan = nullptr;
  BF_RETURN_IF_ERROR(PrepareSplitK(X, W, D, M, N, K, splits, &plan));
  if (!plan) return Status::Ok();
  const float alpha = 1.0f, beta = 0.0f;
  LT_TRY(cublasLtMatmul(handle_, plan->desc, &alpha, W, plan->a, X, plan->b, &beta, D, plan->c, D, plan->d,
                        &plan->algo, nullptr, 0, stream));
  return Status::Ok();
}

// Column-major view: D[N,M] = op(A)[N,K] * B[K,M] (+ C[N,M]), A = W (fp16: col-major N x K,
// ld N, no transpose; FP8: Wt col-major K x N, ld K, transposed), B = X col-major K x M, ld K.
Status DenseGemm::Prepare(const Call& c, PlanKey* key_out, Plan** out) {
  *out = nullptr;
  const bool fp8 = c.fp8;
  const Epilogue epi = c.epi;
  const int M = c.M, N = c.N, K = c.K;
  const void* A = c.A;
  const void* B = c.B;
  const __half* C = c.C;
  const __half* bias = c.bias;
  const float* a_scale = c.a_scale;
  const float* d_scale = c.d_scale;
  __half* Y = c.Y;
  if (M <= 0 || N <= 0) return Status::Ok();
  if (d_scale && C) return Status::WithCode("an e4m3 output takes no residual", 0, bf::Code::kInvalidArgument);
  if (K <= 0) return Status::WithCode("GEMM with K <= 0", K, bf::Code::kInvalidArgument);
  if (fp8 && K % 16 != 0) {  // both FP8 entry points
    return Status::Error("FP8 GEMM needs K % 16 == 0 (cuBLASLt), got K = " + std::to_string(K),
                         bf::Code::kInvalidArgument);
  }
  if (epi != Epilogue::kNone && bias == nullptr)
    return Status::WithCode("epilogue needs a bias", 0, bf::Code::kInvalidArgument);
  const size_t ws_bytes = max_workspace_;
  PlanKey key{fp8 ? 1 : 0, static_cast<int>(epi), C ? 1 : 0, M, N, K, AlignmentOf(A),
              AlignmentOf(B), AlignmentOf(C ? C : Y), AlignmentOf(Y), c.fast_accum ? 1 : 0,
              algo_rank_, ws_bytes};
  key.d_fp8 = d_scale ? 1 : 0;
  *key_out = key;
  for (auto& kp : plans_) {
    if (kp.first == key) {
      *out = kp.second.get();
      return Status::Ok();
    }
  }
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
    const int8_t fa = c.fast_accum ? 1 : 0;
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
    return Status::WithCode("cublasLtMatmulAlgoGetHeuristic", st);
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
    return Status::Unsupported(buf);
  }
  p->algo = res[pick].algo;
  p->workspace = res[pick].workspaceSize;
  *out = p.get();
  plans_.emplace_back(key, std::move(p));
  return Status::Ok();
}

Status DenseGemm::Run(cudaStream_t stream, WorkspaceSource* ws, const Call& c) {
  std::lock_guard<std::mutex> lock(mu_);
  PlanKey key{};
  Plan* plan = nullptr;
  BF_RETURN_IF_ERROR(Prepare(c, &key, &plan));
  if (!plan) return Status::Ok();  // no work (M or N 0)
  Plan& p = *plan;
  const __half* bias = c.bias;
  const float* a_scale = c.a_scale;
  const float* d_scale = c.d_scale;
  const __half* C = c.C;
  __half* Y = c.Y;
  // Pointers change between calls (ORT's arena, IO binding): set them on every call.
  if (c.epi != Epilogue::kNone) {
    LT_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (c.fp8) {
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
      BF_RETURN_IF_ERROR(TimePlan(p, stream, ws, c.A, c.B, C, Y, c.alpha, C ? 1.0f : 0.0f, key));
      if (device >= 0 && p.untimed.empty()) ShareChoice(device, key, p);  // timed (not in a capture)
    }
  }
  void* workspace = nullptr;
  if (p.workspace > 0) {
    workspace = ws ? ws->Get(p.workspace) : nullptr;
    if (!workspace)
      return Status::WithCode("no cuBLASLt workspace of the size the algorithm needs", static_cast<int>(p.workspace),
                              bf::Code::kInternal);
  }
  const float beta = C ? 1.0f : 0.0f;
  const void* c_ptr = d_scale ? nullptr : (C ? C : Y);  // an e4m3 D: C unread (beta 0) and absent
  const cublasStatus_t st = cublasLtMatmul(handle_, p.desc, &c.alpha, c.A, p.a, c.B, p.b, &beta, c_ptr, p.c, Y,
                                           p.d, &p.algo, workspace, p.workspace, stream);
  if (st != CUBLAS_STATUS_SUCCESS && d_scale) unsupported_ |= QuantizedOutBit(c.epi);
  if (st != CUBLAS_STATUS_SUCCESS) return Status::WithCode("cublasLtMatmul", st);
  return Status::Ok();
}

bool DenseGemm::TakeSharedChoice(int device, const PlanKey& key, Plan& p) {
  if (!Config().gemm_share) return false;
  SharedChoice c;
  if (!SharedChoices().Find(SharedKey{device, key}, &c)) return false;
  p.algo = c.algo;
  p.workspace = c.workspace;
  return true;
}

void DenseGemm::ShareChoice(int device, const PlanKey& key, const Plan& p) {
  if (!Config().gemm_share) return;
  SharedChoices().AddIfAbsent(SharedChoice{SharedKey{device, key}, p.algo, p.workspace});
}

// Times each of the heuristic's valid algorithms for this plan on the call's own buffers (they
// only write Y, which the real run then overwrites) and keeps the fastest; the heuristic's first
// choice stays unless another is at least 2% faster, so noise does not flip it. Inside a CUDA
// graph capture nothing can be timed: the plan keeps the first choice and times on a later call.
Status DenseGemm::TimePlan(Plan& p, cudaStream_t stream, WorkspaceSource* ws, const void* A, const void* B,
                           const __half* C, __half* Y, float alpha, float beta, const PlanKey& key) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return Status::Ok();
  }
  size_t need = 0;
  for (const auto& r : p.untimed) need = r.workspaceSize > need ? r.workspaceSize : need;
  void* w = need ? (ws ? ws->Get(need) : nullptr) : nullptr;
  if (need && !w)
    return Status::WithCode("no cuBLASLt workspace for timing the algorithms", static_cast<int>(need),
                            bf::Code::kInternal);
  CandidateTimer time(stream);
  if (!time.ok()) {
    p.untimed.clear();
    return Status::Ok();
  }
  AlgoTiming t{key.fp8, key.epi, key.residual, key.M, key.N, key.K, 0, {}};
  int best = -1;
  for (size_t i = 0; i < p.untimed.size(); ++i) {
    const cublasLtMatmulHeuristicResult_t& r = p.untimed[i];
    const float us = time([&]() -> Status {
      const cublasStatus_t st = cublasLtMatmul(handle_, p.desc, &alpha, A, p.a, B, p.b, &beta,
                                               key.d_fp8 ? nullptr : (C ? C : Y), p.c, Y, p.d, &r.algo, w,
                                               r.workspaceSize, stream);
      return st == CUBLAS_STATUS_SUCCESS ? Status::Ok() : Status::WithCode("cublasLtMatmul", st);
    });
    t.us.push_back(us);
    if (us < 0.0f) continue;
    if (best < 0 || (best == 0 ? us < 0.98f * t.us[0] : us < t.us[best])) best = static_cast<int>(i);
  }
  if (best >= 0) {
    p.algo = p.untimed[best].algo;
    p.workspace = p.untimed[best].workspaceSize;
    t.chosen = best;
  }
  p.untimed.clear();
  g_algo_timings.Add(std::move(t));
  return Status::Ok();
}

std::string CublasTimingsJson() {
  return g_algo_timings.Json([](const AlgoTiming& t, char* buf, size_t size) {
    std::snprintf(buf, size, "{\"fp8\":%d,\"epilogue\":%d,\"residual\":%d,\"M\":%d,\"N\":%d,\"K\":%d,\"chosen\":%d,\"us\":[",
                  t.fp8, t.epi, t.residual, t.M, t.N, t.K, t.chosen);
    return std::make_pair(static_cast<const float*>(t.us.data()), t.us.size());
  });
}

}  // namespace bertfuse
