// Tile configuration "ping-pong 64x128x64, cluster 2x1, persistent" of the sm_90a GEMMs (see gemm_sm90.h).
#include "gemm_sm90.cuh"

namespace bertfuse {
namespace sm90 {
using namespace cute;
BF_SM90_CONFIG(pingpong_64x128_c2, cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized, Shape<_64, _128, _64>, Shape<_2, _1, _1>, cutlass::gemm::PersistentScheduler)
}  // namespace sm90
}  // namespace bertfuse
