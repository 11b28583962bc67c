// bertfuse's own Hopper GEMMs (sm_90a: TMA loads, wgmma, warp-specialised producer/consumer
// warps, built from CUTLASS's CuTe collectives) with the dense ops' epilogues fused in:
//
//   Y[M,N] = act(X[M,K] @ W[K,N] + bias[N] + beta * C[M,N])      act: identity | erf GELU
//
// fp16 in and out, fp32 accumulation, row-major X, W, C, Y (W N-contiguous, as the ONNX
// initializer is stored). Several tile configurations are compiled; dense.cu times them against
// cuBLASLt once per shape and keeps the fastest (cuBLASLt stays the fallback, and the only path
// where the library was built without CUTLASS or for another architecture).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "status.h"

namespace bertfuse {
namespace sm90 {

enum class Act : int { kIdentity = 0, kGeluErf = 1 };

struct Problem {
  const __half* x = nullptr;     // [M, K]
  const __half* w = nullptr;     // [K, N]
  const __half* bias = nullptr;  // [N], required
  const __half* c = nullptr;     // [M, N], read only when beta != 0
  __half* y = nullptr;           // [M, N]
  int M = 0, N = 0, K = 0;
  float beta = 0.0f;
  Act act = Act::kIdentity;
};

// Tile configurations, in the order the tuner tries them (names for logs and the check).
constexpr int kNumConfigs = 5;
const char* ConfigName(int cfg);

// True when the library holds the sm_90a kernels (built with CUTLASS for compute capability 9.0)
// and the current device is compute capability 9.0.
bool Available();

// The problem's own constraints: 16-byte aligned pointers, N and K multiples of 8.
bool Eligible(const Problem& p);

// Device workspace `cfg` needs for `p` (stream-K's partial tiles), in bytes.
size_t WorkspaceBytes(int cfg, const Problem& p);

// Enqueues the GEMM on `stream`.
bf::Status Run(int cfg, const Problem& p, cudaStream_t stream, void* workspace, size_t ws_bytes);

}  // namespace sm90
}  // namespace bertfuse
