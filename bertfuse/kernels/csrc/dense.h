// GEMM ops of the bertfuse op library: Y = X @ W + bias with an optional epilogue
// (tanh/erf GELU, residual + LayerNorm), fp16 in/out with fp32 accumulation, through
// cuBLASLt; FP8 (e4m3) weights as an opt-in.
//
// Row-major X [M,K], W [K,N], Y [M,N]. cuBLASLt is column-major, so we compute the
// transposed problem D[N,M] = W(col-major N x K) * X(col-major K x M): no copies,
// and the bias (length N) runs along D's rows, which is what its BIAS epilogue adds.
//
// Nothing here allocates device memory or synchronises inside a run: the handle is made
// when the kernel is created, the cuBLASLt plans (descriptors + chosen algorithm) on the
// first call with a new shape (host-only work), and the workspace comes from the caller
// (WorkspaceSource), so CUDA graphs can capture every call.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublasLt.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace bertfuse {

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

// The most workspace a GEMM may ask for: env BERTFUSE_GEMM_WORKSPACE_MB, default 32 (what
// cuBLAS recommends on Hopper); each call takes only what its chosen algorithm needs.
size_t DefaultWorkspaceBytes();

class DenseGemm {
 public:
  // Creates the cuBLASLt handle on `device` (-1: the current one). Throws std::runtime_error.
  DenseGemm(int device, size_t max_workspace_bytes);
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // Y[M,N] = epilogue(X[M,K] @ W[K,N] + bias) + (C ? C : 0), all fp16, fp32 accumulate.
  // bias may be null only with Epilogue::kNone. C (the residual, [M,N]) may be null;
  // C may alias Y. Returns nullptr on success, else a message (valid until the next
  // call on this thread).
  const char* RunF16(cudaStream_t stream, WorkspaceSource* ws, const __half* X, const __half* W,
                     const __half* bias, const __half* C, __half* Y, int M, int N, int K,
                     Epilogue epi);

  // FP8: Xq[M,K] e4m3 (= X / x_scale), Wt[N,K] e4m3 (W transposed; W_real = Wt^T * w_scale),
  // w_scale a device float[1]. Y = epilogue(x_scale * w_scale * Xq@Wt^T + bias) + C.
  // cuBLASLt FP8 needs the "TN" form (A transposed): A = Wt, col-major K x N, op T.
  // K must be a multiple of 16.
  const char* RunFp8(cudaStream_t stream, WorkspaceSource* ws, const uint8_t* Xq, const uint8_t* Wt,
                     const float* w_scale, float x_scale, const __half* bias, const __half* C,
                     __half* Y, int M, int N, int K, Epilogue epi, bool fast_accum);

  // FP8 in, e4m3 out: Dq[M,N] = e4m3_satfinite(epilogue(x_scale * w_scale * Xq@Wt^T + bias) *
  // d_scale[0]) in cuBLASLt's epilogue (no fp16 Y, no pass after); d_scale a device float[1]
  // (1 / the output's scale). No residual. Marks the epilogue unsupported where cuBLASLt offers no
  // algorithm (SupportsQuantizedOut), and returns a message.
  const char* RunFp8Quantized(cudaStream_t stream, WorkspaceSource* ws, const uint8_t* Xq, const uint8_t* Wt,
                              const float* w_scale, float x_scale, const __half* bias, uint8_t* Dq,
                              const float* d_scale, int M, int N, int K, Epilogue epi, bool fast_accum);

  // Split-K without the reduction: D[s][M,N] = X[:, s*K/splits .. (s+1)*K/splits) @ W[same rows, :]
  // in fp32, s = 0 .. splits-1, as one strided-batched cuBLASLt GEMM (no workspace, no
  // epilogue): the caller's next kernel adds the partials (bf_layernorm_splits_f16). Needs
  // K % (8 * splits) == 0.
  const char* RunF16SplitK(cudaStream_t stream, const __half* X, const __half* W, float* D, int M, int N,
                           int K, int splits);

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

  struct Plan;  // defined in dense.cu

 private:
  // d_scale non-null: D (at Y) is e4m3, scaled by d_scale[0] (a device float), no residual.
  const char* Run(cudaStream_t stream, WorkspaceSource* ws, bool fp8, const void* A, const void* B, const float* a_scale,
                  float alpha, const __half* bias, const __half* C, __half* Y, int M, int N,
                  int K, Epilogue epi, bool fast_accum, const float* d_scale = nullptr);

  cublasLtHandle_t handle_ = nullptr;
  size_t max_workspace_ = 0;
  static int ConfigBit(bool fp8, Epilogue epi, bool residual) {
    return 1 << (static_cast<int>(epi) * 4 + (fp8 ? 2 : 0) + (residual ? 1 : 0));
  }
  static int QuantizedOutBit(Epilogue epi) { return 1 << (16 + static_cast<int>(epi)); }

  int algo_rank_ = DefaultAlgoRank();
  static int DefaultAlgoRank();
  std::atomic<int> unsupported_{0};
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
  const char* TimePlan(Plan& p, cudaStream_t stream, WorkspaceSource* ws, const void* A,
                       const void* B, const __half* C, __half* Y, float alpha, float beta,
                       const PlanKey& key);
  // The algorithm the first timed plan of a (device, key) kept, shared by every DenseGemm in the
  // process (one per op instance, so one per layer): the others take it instead of timing the
  // candidates again, as the split-K and sm90 choices are shared. BERTFUSE_GEMM_SHARE=0: each
  // plan times its own.
  struct Shared;
  static Shared& SharedChoices();
  static bool TakeSharedChoice(int device, const PlanKey& key, Plan& p);
  static void ShareChoice(int device, const PlanKey& key, const Plan& p);
  std::mutex mu_;  // guards plans_ (ORT may call Compute from several threads)
  std::vector<std::pair<PlanKey, std::unique_ptr<Plan>>> plans_;
};

enum class DenseKind : int { kBias = 0, kBiasGelu = 1, kBiasSkipLayerNorm = 2 };

// One call of a dense op, as the ORT kernels and the check entry points see it.
struct DenseArgs {
  const __half* x = nullptr;      // [M, K]
  const void* w = nullptr;        // fp16 W [K, N], or FP8 Wt [N, K]
  const __half* bias = nullptr;   // [N]
  const __half* skip = nullptr;   // [M, N] (SkipLayerNorm)
  const __half* gamma = nullptr;  // [N] (SkipLayerNorm)
  const __half* beta = nullptr;   // [N] (SkipLayerNorm; may be null)
  __half* y = nullptr;            // [M, N]
  int M = 0, N = 0, K = 0;
  DenseKind kind = DenseKind::kBias;
  int approximate = 0;            // GELU: 0 erf, 1 tanh
  float epsilon = 1e-12f;
  // 0 = the production path. GELU erf: 1 = plain GEMM + one bias+erf kernel, 2 = as 0 with
  // CUDA's erff (Act::kGeluErfLib) (default 0: bias epilogue + erf GELU in place, A&S erf). SkipLayerNorm: 1 = bias epilogue, LN adds skip; 2 = bias
  // epilogue with skip as C (beta = 1), LN in place (default 0: plain GEMM, LN adds bias+skip).
  int variant = 0;
  // FP8 (e4m3) weights: w is Wt [N, K]; w_scale device float[1]; xq device scratch [M*K] bytes
  // = e4m3(X * (1 / x_scale)), 1/x_scale rounded to fp32 once
  // (x null: xq already holds X quantized with x_scale, and only the GEMM runs).
  bool fp8 = false;
  const float* w_scale = nullptr;
  float x_scale = 1.0f;
  uint8_t* xq = nullptr;
  bool fast_accum = true;  // Hopper's FP8 fast accumulation: faster, less exact
  // bias, gamma and beta are not written by the kernel just before this op (initializers): the
  // LayerNorm may then read them before waiting for the GEMM (programmatic dependent launch).
  bool weights_const = true;
  // Optional e4m3 copy of Y for an FP8 GEMM downstream: yq [M*N] bytes = e4m3(Y * (1/yq_scale)),
  // written by the kernel that writes Y last (the LayerNorm, the GELU pass, else one pass).
  uint8_t* yq = nullptr;
  float yq_scale = 1.0f;
  // y is scratch that nothing reads (the op's Y left off): the last pass writes only yq.
  bool y_unread = false;
  // device float[1] = 1 / yq_scale: with y_unread, an FP8 tanh-GELU op has cuBLASLt write yq
  // itself from its fp32 epilogue (no fp16 Y, no pass), where Fp8OutFlag allows.
  const float* yq_dscale = nullptr;
  // DenseBiasSkipLayerNorm only, optional: the fp32 copy of Y (before its fp16 rounding),
  // [M*N] floats, written by the LayerNorm beside Y.
  float* y32 = nullptr;
  // DenseBiasSkipLayerNorm: never the split-K form (set by its own timing, for the other side).
  bool no_split = false;
};

// DenseBiasSkipLayerNorm's split-K form (env BERTFUSE_SPLIT_LN, or bf_check_set_split_ln):
// 0 auto (timed against the plain form once per shape, kept where it is at least 3% faster),
// -1 off, n >= 2 always n splits where the shape allows.
std::atomic<int>& SplitLnFlag();
// The FP8 GEMM writing e4m3 itself (DenseArgs::yq_dscale): env BERTFUSE_FP8_GEMM_OUT (on, or
// off), or bf_check_set_fp8_out; 1 on, 0 off.
std::atomic<int>& Fp8OutFlag();
// What the split-K timing found, per shape (bf_split_ln_choices).
std::string SplitLnChoicesJson();

// Which GEMM runs the fp16 dense ops (env BERTFUSE_GEMM=auto|cublas|sm90, or
// bf_check_set_gemm): auto times cuBLASLt against bertfuse's sm_90a GEMMs once per shape and
// keeps the faster. GemmConfigFlag (BERTFUSE_GEMM_CONFIG) pins one sm_90a configuration in
// sm90 mode. GemmChoicesJson: what was timed and chosen, per shape.
enum class GemmMode : int { kAuto = 0, kCublas = 1, kSm90 = 2 };
std::atomic<int>& GemmModeFlag();
std::atomic<int>& GemmConfigFlag();
std::string GemmChoicesJson();
// What DenseGemm's timing of cuBLASLt's algorithms found, per plan (bf_cublas_timings).
std::string CublasTimingsJson();

// Enqueues the whole op on `stream`, the GEMM's workspace from `ws`. nullptr on success, else
// a message.
const char* bf_dense_forward(DenseGemm& gemm, cudaStream_t stream, WorkspaceSource* ws,
                             const DenseArgs& args);

// kGeluErf: the erf GELU with erf from Abramowitz & Stegun 7.1.28 (branch-free, one
// reciprocal; |erf error| <= 2e-6 in fp32, far below fp16's resolution). kGeluErfLib: the same
// with CUDA's erff (slower: its two ranges diverge inside a warp), kept to measure against.
enum class Act : int { kNone = 0, kGeluErf = 1, kGeluTanh = 2, kGeluErfLib = 3 };

// y = act(x (+ bias)) over [M,N], fp32 math; y may be x (in place on the GEMM output). The
// erf GELU that cuBLASLt has no epilogue for; the bias and tanh GELU only where cuBLASLt
// offers no algorithm with them. bias may be null. yq (optional): also e4m3(y / yq_scale),
// the FP8 input of a GEMM downstream; y may then be null (fp8 output only).
cudaError_t bf_bias_act_f16(cudaStream_t stream, const __half* x, __half* y, const __half* bias,
                            int M, int N, Act act, uint8_t* yq = nullptr, float yq_scale = 1.0f);

// q[i] = e4m3(x[i] / scale), saturating to +-448 (round to nearest even), n elements.
cudaError_t bf_quantize_e4m3(cudaStream_t stream, const __half* x, float scale, uint8_t* q,
                             size_t n);

}  // namespace bertfuse
