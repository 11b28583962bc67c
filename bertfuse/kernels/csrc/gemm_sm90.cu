// The table of sm_90a GEMM configurations (gemm_sm90.h). Without CUTLASS, or for another
// architecture, the library has none and dense.cu runs cuBLASLt alone.
#include "gemm_sm90.h"

#include <cstdint>

namespace bertfuse {
namespace sm90 {

namespace {
struct Config {
  const char* name;
  size_t (*workspace)(const Problem&);
  bf::Status (*run)(const Problem&, cudaStream_t, void*, size_t);
};
}  // namespace

#ifdef BF_HAVE_SM90_GEMM
#define BF_DECLARE(NAME)                     \
  size_t NAME##_workspace(const Problem& p); \
  bf::Status NAME##_run(const Problem& p, cudaStream_t s, void* ws, size_t n);
BF_DECLARE(pingpong_64x128)
BF_DECLARE(pingpong_64x128_c2)
BF_DECLARE(pingpong_128x128)
BF_DECLARE(coop_128x128_c2)
BF_DECLARE(coop_128x256)
#undef BF_DECLARE

namespace {
const Config kConfigs[kNumConfigs] = {
    {"ping-pong 64x128", pingpong_64x128_workspace, pingpong_64x128_run},
    {"ping-pong 64x128 cluster 2x1", pingpong_64x128_c2_workspace, pingpong_64x128_c2_run},
    {"ping-pong 128x128", pingpong_128x128_workspace, pingpong_128x128_run},
    {"cooperative 128x128 cluster 2x1", coop_128x128_c2_workspace, coop_128x128_c2_run},
    {"cooperative 128x256", coop_128x256_workspace, coop_128x256_run},
};
}  // namespace

int SmCount() {
  static const int count = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n;
  }();
  return count;
}

bool Available() {
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;  // sm_90a code runs on compute capability 9.0 only
  }();
  return ok;
}
#else
namespace {
const Config kConfigs[kNumConfigs] = {};
}  // namespace
bool Available() { return false; }
#endif

namespace {
bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
}  // namespace

const char* ConfigName(int cfg) {
  if (cfg < 0 || cfg >= kNumConfigs || !kConfigs[cfg].name) return "none";
  return kConfigs[cfg].name;
}

bool Eligible(const Problem& p) {
  return p.M > 0 && p.N % 8 == 0 && p.K % 8 == 0 && p.K > 0 && p.bias && Aligned16(p.x) &&
         Aligned16(p.w) && Aligned16(p.y) && Aligned16(p.bias) &&
         (p.beta == 0.0f || (p.c && Aligned16(p.c)));
}

size_t WorkspaceBytes(int cfg, const Problem& p) {
  if (!Available() || cfg < 0 || cfg >= kNumConfigs) return 0;
  return kConfigs[cfg].workspace(p);
}

bf::Status Run(int cfg, const Problem& p, cudaStream_t stream, void* workspace, size_t ws_bytes) {
  if (!Available() || cfg < 0 || cfg >= kNumConfigs)
    return bf::Status::Unsupported("sm90 GEMM: not in this build or not on this device");
  if (!Eligible(p)) return bf::Status::Unsupported("sm90 GEMM: shape or alignment not covered");
  return kConfigs[cfg].run(p, stream, workspace, ws_bytes);
}

}  // namespace sm90
}  // namespace bertfuse
