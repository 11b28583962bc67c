// The dense ops' forward: Y = X @ W + bias with an optional epilogue (tanh/erf GELU, residual +
// LayerNorm), fp16 in/out with fp32 accumulation, FP8 (e4m3) weights as an opt-in. One call of
// an op (DenseArgs) becomes: at most one GEMM (cuBLASLt through gemm_tuner.h, or bertfuse's
// sm_90a GEMM where timed faster), then at most one bias/activation pass (bias_act.h) and, for
// SkipLayerNorm, the LayerNorm kernel. Shared by the ORT kernels (dense_ops.cc) and the check
// entry points (check_dense.cu).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "bias_act.h"
#include "config.h"
#include "gemm_tuner.h"
#include "status.h"

namespace bertfuse {

enum class DenseKind : int { kBias = 0, kBiasGelu = 1, kBiasSkipLayerNorm = 2 };

// How the op's steps are split between the GEMM's epilogue and our kernels. kProduction is what
// the ORT ops run; the others are alternatives kept to measure against it (the check entry
// points take them as 1 and 2; they mean different things per kind):
enum class DenseVariant : int {
  // DenseBiasGelu (erf): bias epilogue, then erf GELU in place (A&S erf). DenseBiasSkipLayerNorm:
  // plain GEMM, the LayerNorm adds bias and residual.
  kProduction = 0,
  kGeluPlainGemm = 1,   // DenseBiasGelu: plain GEMM, then one bias + erf-GELU kernel
  kGeluErfLib = 2,      // DenseBiasGelu: as kProduction with CUDA's erff (Act::kGeluErfLib)
  kLnBiasEpilogue = 1,  // DenseBiasSkipLayerNorm: bias epilogue, the LayerNorm adds the residual
  kLnResidualAsC = 2,   // DenseBiasSkipLayerNorm: bias epilogue + residual as C (beta 1), LN in place
};

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
  DenseVariant variant = DenseVariant::kProduction;
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

// The run-time switches of the dense forward, each starting from its config.h value and settable
// by its check entry point (check_dense.cu):
// DenseBiasSkipLayerNorm's split-K form (BERTFUSE_SPLIT_LN, bf_check_set_split_ln): 0 auto (timed
// against the plain form once per shape, kept where it is at least 3% faster), -1 off, n >= 2
// always n splits where the shape allows.
std::atomic<int>& SplitLnFlag();
// The FP8 GEMM writing e4m3 itself (DenseArgs::yq_dscale): BERTFUSE_FP8_GEMM_OUT, or
// bf_check_set_fp8_out; 1 on, 0 off.
std::atomic<int>& Fp8OutFlag();
// Which GEMM runs the fp16 dense ops (BERTFUSE_GEMM=auto|cublas|sm90, or bf_check_set_gemm): auto
// times cuBLASLt against bertfuse's sm_90a GEMMs once per shape and keeps the faster.
// GemmConfigFlag (BERTFUSE_GEMM_CONFIG) pins one sm_90a configuration in sm90 mode.
std::atomic<int>& GemmModeFlag();
std::atomic<int>& GemmConfigFlag();

// What the timings found, per shape, as JSON arrays: the sm90-or-cuBLASLt choice
// (bf_gemm_choices) and the split-K choice (bf_split_ln_choices).
std::string GemmChoicesJson();
std::string SplitLnChoicesJson();

// Enqueues the whole op on `stream`, the GEMM's workspace from `ws`.
Status bf_dense_forward(DenseGemm& gemm, cudaStream_t stream, WorkspaceSource* ws, const DenseArgs& args);

}  // namespace bertfuse
