// CHECK-ONLY: the dense family's ctypes entry points (raw device pointers, no ONNX Runtime) for
// `bertfuse kernels check`, the tests and the benchmarks/kernels probes. No ORT op calls anything
// here; the production ops run dense_ops.cc. They stay exported from the one library (the check
// runs against the very library a user loads, the platform wheel's included), and they are the
// only place that turns a bf::Status into the C ABI's form: 0 on success, else non-zero with the
// message in bf_dense_last_error().
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "dense.h"
#include "gemm_sm90.h"
#include "launch.h"
#include "layernorm.h"

namespace {

thread_local std::string g_last_error;

// The C ABI's form of a Status: 0, or 1 with its message kept for bf_dense_last_error.
int ToC(const bf::Status& st) {
  if (st.ok()) return 0;
  g_last_error = st.message();
  return 1;
}

int ToC(cudaError_t e) {
  if (e == cudaSuccess) return 0;
  g_last_error = cudaGetErrorString(e);
  return 1;
}

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

// One per process (never freed: it would outlive the CUDA context at interpreter exit); null
// with the reason in g_last_error where it cannot be made.
CheckState* Check() {
  static CheckState* state = nullptr;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!state) {
    try {
      auto* ws = new CheckWorkspace(bertfuse::DefaultWorkspaceBytes());
      state = new CheckState{new bertfuse::DenseGemm(-1, ws->bytes()), ws};
    } catch (const std::exception& e) {
      g_last_error = e.what();
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
  a.variant = static_cast<bertfuse::DenseVariant>(variant);
  return a;
}

int RunCheck(const bertfuse::DenseArgs& args, uintptr_t stream) {
  CheckState* st = Check();
  if (!st) return 1;
  return ToC(bertfuse::bf_dense_forward(*st->gemm, reinterpret_cast<cudaStream_t>(stream), st->ws, args));
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
  return ToC(bertfuse::bf_layernorm_f16(
      reinterpret_cast<cudaStream_t>(stream), Ptr<const __half>(x), Ptr<const __half>(bias),
      Ptr<const __half>(skip), Ptr<const __half>(gamma), Ptr<const __half>(beta), epsilon,
      Ptr<__half>(y), M, N, Ptr<uint8_t>(yq), yq_scale));
}

// The bias + activation kernel alone, y = act(x + bias) over [M, N] (y may be x): act 0 none,
// 1 erf GELU (A&S erf, the production form), 2 tanh GELU, 3 erf GELU with CUDA's erff.
BF_DENSE_EXPORT int bf_check_bias_act(uintptr_t x, uintptr_t y, uintptr_t bias, int M, int N,
                                      int act, uintptr_t stream) {
  return ToC(bertfuse::bf_bias_act_f16(reinterpret_cast<cudaStream_t>(stream),
                                       Ptr<const __half>(x), Ptr<__half>(y),
                                       Ptr<const __half>(bias), M, N,
                                       static_cast<bertfuse::Act>(act)));
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
  CheckState* st = Check();
  if (!st) return 1;
  st->gemm->set_algo_rank(rank);
  return 0;
}

// Which epilogue/residual combinations cuBLASLt had no algorithm for so far (and so ran as our
// kernels): bit (epilogue * 4 + fp8 * 2 + residual), epilogue 0 none, 1 bias, 2 bias+tanh GELU.
BF_DENSE_EXPORT int bf_check_unsupported_mask() {
  CheckState* st = Check();
  return st ? st->gemm->unsupported_mask() : -1;
}

// The workspace cap the check entry points give cuBLASLt's heuristic, in MiB (at most
// BERTFUSE_GEMM_WORKSPACE_MB); 0 = only algorithms that need none.
BF_DENSE_EXPORT int bf_check_set_workspace_mb(int mb) {
  CheckState* st = Check();
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

BF_DENSE_EXPORT const char* bf_dense_last_error() { return g_last_error.c_str(); }
