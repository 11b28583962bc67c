// The library's process-wide switches, read from the environment in ONE place (config.cc), once,
// at the first use of any of them. Each is also settable at run time through its check entry
// point (check_dense.cu), which stores into the atomic flag that starts from this value.
//
//   BERTFUSE_PDL               0 turns programmatic dependent launch off (launch.h)
//   BERTFUSE_LN_CAP            the LayerNorm's register cap: 0 where needed, 1 never, 2 always
//   BERTFUSE_GEMM_WORKSPACE_MB the most cuBLASLt workspace a GEMM may ask for (default 32)
//   BERTFUSE_GEMM_TIMING       0: cuBLASLt's heuristic's first algorithm, untimed
//   BERTFUSE_GEMM_SHARE        0: each DenseGemm times its own plans (no process-wide choice)
//   BERTFUSE_GEMM              auto | cublas | sm90: which GEMM runs the fp16 dense ops
//   BERTFUSE_GEMM_CONFIG       n: pins sm_90a configuration n (with BERTFUSE_GEMM=sm90)
//   BERTFUSE_FP8_GEMM_OUT      off: the FP8 GEMM never writes the e4m3 copy itself
//   BERTFUSE_SPLIT_LN          auto | off | n: DenseBiasSkipLayerNorm's split-K form
#pragma once

#include <cstddef>

namespace bertfuse {

enum class GemmMode : int { kAuto = 0, kCublas = 1, kSm90 = 2 };

struct RuntimeConfig {
  int pdl = 1;                        // BERTFUSE_PDL: 1 on, 0 off
  int ln_cap = 0;                     // BERTFUSE_LN_CAP: 0, 1 or 2
  size_t gemm_workspace_bytes = 32u << 20;  // BERTFUSE_GEMM_WORKSPACE_MB, in bytes
  int gemm_algo_rank = -1;            // BERTFUSE_GEMM_TIMING: -1 timed, 0 the heuristic's first
  bool gemm_share = true;             // BERTFUSE_GEMM_SHARE
  GemmMode gemm_mode = GemmMode::kAuto;  // BERTFUSE_GEMM
  int gemm_config = -1;               // BERTFUSE_GEMM_CONFIG: -1 none pinned
  int fp8_gemm_out = 1;               // BERTFUSE_FP8_GEMM_OUT: 1 on, 0 off
  int split_ln = 0;                   // BERTFUSE_SPLIT_LN: 0 auto, -1 off, n >= 2 splits
};

// The switches as the environment set them when first asked (static storage, never changes).
const RuntimeConfig& Config();

}  // namespace bertfuse
