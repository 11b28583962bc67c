// Reads the library's switches from the environment (config.h): the only getenv in csrc/.
#include "config.h"

#include <cstdlib>
#include <cstring>

namespace bertfuse {
namespace {

RuntimeConfig ReadConfig() {
  RuntimeConfig c;
  if (const char* s = std::getenv("BERTFUSE_PDL")) c.pdl = s[0] == '0' ? 0 : 1;
  if (const char* s = std::getenv("BERTFUSE_LN_CAP")) {
    const int v = std::atoi(s);
    c.ln_cap = v >= 0 && v <= 2 ? v : 0;
  }
  {
    const char* s = std::getenv("BERTFUSE_GEMM_WORKSPACE_MB");
    long mb = s ? std::strtol(s, nullptr, 10) : 32;
    if (mb < 0) mb = 0;
    c.gemm_workspace_bytes = static_cast<size_t>(mb) << 20;
  }
  if (const char* s = std::getenv("BERTFUSE_GEMM_TIMING")) c.gemm_algo_rank = s[0] == '0' ? 0 : -1;
  if (const char* s = std::getenv("BERTFUSE_GEMM_SHARE")) c.gemm_share = s[0] != '0';
  if (const char* s = std::getenv("BERTFUSE_GEMM")) {
    if (std::strcmp(s, "cublas") == 0) c.gemm_mode = GemmMode::kCublas;
    if (std::strcmp(s, "sm90") == 0) c.gemm_mode = GemmMode::kSm90;
  }
  if (const char* s = std::getenv("BERTFUSE_GEMM_CONFIG")) c.gemm_config = static_cast<int>(std::strtol(s, nullptr, 10));
  if (const char* s = std::getenv("BERTFUSE_FP8_GEMM_OUT")) c.fp8_gemm_out = std::strcmp(s, "off") == 0 ? 0 : 1;
  if (const char* s = std::getenv("BERTFUSE_SPLIT_LN")) {
    if (std::strcmp(s, "auto") == 0) {
      c.split_ln = 0;
    } else if (std::strcmp(s, "off") == 0) {
      c.split_ln = -1;
    } else {
      const long n = std::strtol(s, nullptr, 10);
      c.split_ln = n >= 2 && n <= 16 ? static_cast<int>(n) : 0;
    }
  }
  return c;
}

}  // namespace

const RuntimeConfig& Config() {
  static const RuntimeConfig config = ReadConfig();
  return config;
}

}  // namespace bertfuse
