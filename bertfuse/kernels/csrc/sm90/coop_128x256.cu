// Tile configuration "cooperative 128x256x64, persistent" of the sm_90a GEMMs (see gemm_sm90.h).
#include "gemm_sm90.cuh"

namespace bertfuse {
namespace sm90 {
using namespace cute;
BF_SM90_CONFIG(coop_128x256, cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative, Shape<_128, _256, _64>, Shape<_1, _1, _1>, cutlass::gemm::PersistentScheduler)
}  // namespace sm90
}  // namespace bertfuse
