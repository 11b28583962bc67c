// The CUTLASS 3 (CuTe) template behind gemm_sm90.h: one GemmUniversal per tile configuration and
// activation, each instantiated in its own .cu file so the build compiles them in parallel.
#pragma once

#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <string>

#include "../gelu_erf.cuh"
#include "../gemm_sm90.h"

namespace bertfuse {
namespace sm90 {

inline bf::Status Sm90Fail(const char* what, cutlass::Status st, bf::Code code = bf::Code::kCuda) {
  return bf::Status(code, std::string("sm90 GEMM ") + what + ": " + cutlassGetStatusString(st));
}

int SmCount();  // gemm_sm90.cu: the current device's SM count, queried once

// The erf GELU of the epilogue, with erf from Abramowitz & Stegun 7.1.28 as dense.cu's GELU
// pass computes it (gelu_erf.cuh: |erf error| <= 3e-7, branch-free, one approximate
// reciprocal). CUTLASS's own GELU calls erff, whose cost is not hidden in the epilogue (measured
// on the H200: with it the FFN-up GEMM took 1.45x the bare GEMM). The Array form is what the
// fusion callbacks instantiate.
template <class T>
struct GeluErfAS {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& value) const {
    const float x = static_cast<float>(value);
#if defined(__CUDA_ARCH__)
    return T(gelu_erf_as(x));
#else
    return T(0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)));
#endif
  }
};

template <class T, int N>
struct GeluErfAS<cutlass::Array<T, N>> {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& value) const {
    cutlass::Array<T, N> y;
    GeluErfAS<T> op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = op(value[i]);
    return y;
  }
};

template <class MainloopSchedule, class EpilogueSchedule, class TileShape, class ClusterShape,
          class TileScheduler, template <class> class ActFn>
struct Sm90Gemm {
  using T = cutlass::half_t;
  using Layout = cutlass::layout::RowMajor;  // X [M,K] K-major; W [K,N] N-major; C, Y [M,N]
  static constexpr int kAlign = 8;           // 16 bytes of fp16: what TMA needs

  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<ActFn, T, float, T, T, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, T, Layout, kAlign, T, Layout,
      kAlign, EpilogueSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, Layout, kAlign, T, Layout, kAlign,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments Args(const Problem& p) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    const auto a = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(p.M, p.K, 1));
    const auto b = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(p.N, p.K, 1));
    const auto c = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(p.M, p.N, 1));
    const auto d = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(p.M, p.N, 1));
    cutlass::KernelHardwareInfo hw;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = SmCount();
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.M, p.N, p.K, 1},
        {reinterpret_cast<const T*>(p.x), a, reinterpret_cast<const T*>(p.w), b},
        {{},
         // With beta == 0 the epilogue never reads C; Y stands in as a valid address.
         reinterpret_cast<const T*>(p.beta != 0.0f && p.c ? p.c : p.y), c,
         reinterpret_cast<T*>(p.y), d},
        hw};
    auto& t = args.epilogue.thread;
    t.alpha = 1.0f;
    t.beta = p.beta;
    t.bias_ptr = reinterpret_cast<const T*>(p.bias);
    return args;
  }

  static size_t Workspace(const Problem& p) { return Gemm::get_workspace_size(Args(p)); }

  static bf::Status Run(const Problem& p, cudaStream_t stream, void* ws, size_t ws_bytes) {
    Gemm gemm;
    const auto args = Args(p);
    cutlass::Status st = gemm.can_implement(args);
    if (st != cutlass::Status::kSuccess) return Sm90Fail("cannot run this shape", st, bf::Code::kUnsupported);
    if (Gemm::get_workspace_size(args) > ws_bytes) return bf::Status::Error("sm90 GEMM: workspace too small");
    st = gemm.initialize(args, ws, stream);
    if (st != cutlass::Status::kSuccess) return Sm90Fail("initialize", st);
    st = gemm.run(stream);
    if (st != cutlass::Status::kSuccess) return Sm90Fail("launch", st);
    return bf::Status::Ok();
  }
};

// One configuration: both activations.
template <class MainloopSchedule, class EpilogueSchedule, class TileShape, class ClusterShape,
          class TileScheduler>
struct Sm90Config {
  template <template <class> class A>
  using G = Sm90Gemm<MainloopSchedule, EpilogueSchedule, TileShape, ClusterShape, TileScheduler, A>;

  static size_t Workspace(const Problem& p) {
    return p.act == Act::kGeluErf ? G<GeluErfAS>::Workspace(p)
                                  : G<cutlass::epilogue::thread::Identity>::Workspace(p);
  }
  static bf::Status Run(const Problem& p, cudaStream_t s, void* ws, size_t ws_bytes) {
    return p.act == Act::kGeluErf ? G<GeluErfAS>::Run(p, s, ws, ws_bytes)
                                  : G<cutlass::epilogue::thread::Identity>::Run(p, s, ws, ws_bytes);
  }
};

// The entry each configuration's .cu file defines.
#define BF_SM90_CONFIG(NAME, ...)                                                         \
  size_t NAME##_workspace(const Problem& p) { return Sm90Config<__VA_ARGS__>::Workspace(p); } \
  bf::Status NAME##_run(const Problem& p, cudaStream_t s, void* ws, size_t n) {           \
    return Sm90Config<__VA_ARGS__>::Run(p, s, ws, n);                                     \
  }

}  // namespace sm90
}  // namespace bertfuse
