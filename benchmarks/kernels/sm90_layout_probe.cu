// Probe (GPU host): does the weight's layout explain why bertfuse's sm_90a CUTLASS GEMMs trail
// cuBLAS? Times Y = X @ W + bias with W stored [K, N] (N-contiguous, as the ONNX initializer and
// today's dense ops: wgmma's B operand MN-major) against W stored [N, K] (K-contiguous, as the FP8
// ops store it), same tiles, at the BERT shapes; median per call over CUDA-graph replays.
//
//   nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I$CUTLASS/include -I$CUTLASS/tools/util/include -Ibertfuse/kernels/csrc \
//        benchmarks/kernels/sm90_layout_probe.cu -o /tmp/probe && /tmp/probe
//
// Timing only: the operands are left uninitialised (zeros from cudaMemset); correctness of the
// shipped [K, N] form is `kernels_gemm.py`'s job.
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <algorithm>
#include <cstdio>
#include <vector>

using namespace cute;
using T = cutlass::half_t;

template <class LayoutB, class Sched, class ESched, class Tile, class Cluster>
struct G {
  using L = cutlass::layout::RowMajor;
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::Identity, T, float, T, T, float>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, T, L, 8, T, L, 8, ESched, Fusion>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, L, 8, T, LayoutB, 8, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      Sched>::CollectiveOp;
  using K = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<K>;

  static float Time(int M, int N, int Kd, T* x, T* w, T* b, T* y, int sms) {
    auto sa = cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(M, Kd, 1));
    auto sb = cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(N, Kd, 1));
    auto sc = cutlass::make_cute_packed_stride(typename K::StrideC{}, make_shape(M, N, 1));
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = sms;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {M, N, Kd, 1}, {x, sa, w, sb},
                                  {{}, y, sc, y, sc}, hw};
    args.epilogue.thread.bias_ptr = b;
    Gemm g;
    if (g.can_implement(args) != cutlass::Status::kSuccess) return -1.f;
    cudaStream_t s;
    cudaStreamCreate(&s);
    g.initialize(args, nullptr, s);
    g.run(s);
    cudaStreamSynchronize(s);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    const int reps = 20;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < reps; ++i) g.run(s);
    cudaStreamEndCapture(s, &graph);
    cudaGraphInstantiate(&exec, graph, 0);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> t;
    for (int it = 0; it < 30; ++it) {
      cudaEventRecord(e0, s);
      cudaGraphLaunch(exec, s);
      cudaEventRecord(e1, s);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms * 1000.f / reps);
    }
    std::sort(t.begin(), t.end());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    return t[t.size() / 2];
  }
};

using PP = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PE = cutlass::epilogue::TmaWarpSpecialized;
using CO = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CE = cutlass::epilogue::TmaWarpSpecializedCooperative;
using NMaj = cutlass::layout::RowMajor;     // W [K, N]
using KMaj = cutlass::layout::ColumnMajor;  // W [N, K]

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  T *x, *w, *b, *y;
  const size_t big = size_t(4096) * 3072;
  cudaMalloc(&x, big * 2);
  cudaMalloc(&w, big * 2);
  cudaMalloc(&b, 4096 * 2);
  cudaMalloc(&y, big * 2);
  cudaMemset(x, 0, big * 2);
  cudaMemset(w, 0, big * 2);
  cudaMemset(b, 0, 4096 * 2);
  struct S { const char* name; int M, N, K; };
  const S shapes[] = {{"shenma qkv", 1280, 2304, 768}, {"shenma ffn_up", 1280, 3072, 768},
                      {"shenma ffn_down", 1280, 768, 3072}, {"shenma attn_out", 1280, 768, 768},
                      {"b32 qkv", 4096, 2304, 768}, {"b32 ffn_up", 4096, 3072, 768},
                      {"b32 ffn_down", 4096, 768, 3072}};
  std::printf("%-16s %6s %6s %6s | %-28s %9s %9s\n", "shape", "M", "N", "K", "tiles", "W[K,N] us", "W[N,K] us");
  for (const S& p : shapes) {
    std::printf("%-16s %6d %6d %6d | %-28s %9.2f %9.2f\n", p.name, p.M, p.N, p.K, "ping-pong 64x128",
                G<NMaj, PP, PE, Shape<_64, _128, _64>, Shape<_1, _1, _1>>::Time(p.M, p.N, p.K, x, w, b, y, sms),
                G<KMaj, PP, PE, Shape<_64, _128, _64>, Shape<_1, _1, _1>>::Time(p.M, p.N, p.K, x, w, b, y, sms));
    std::printf("%-16s %6d %6d %6d | %-28s %9.2f %9.2f\n", p.name, p.M, p.N, p.K, "cooperative 128x256",
                G<NMaj, CO, CE, Shape<_128, _256, _64>, Shape<_1, _1, _1>>::Time(p.M, p.N, p.K, x, w, b, y, sms),
                G<KMaj, CO, CE, Shape<_128, _256, _64>, Shape<_1, _1, _1>>::Time(p.M, p.N, p.K, x, w, b, y, sms));
    std::printf("%-16s %6d %6d %6d | %-28s %9.2f %9.2f\n", p.name, p.M, p.N, p.K, "cooperative 128x128 c2x1",
                G<NMaj, CO, CE, Shape<_128, _128, _64>, Shape<_2, _1, _1>>::Time(p.M, p.N, p.K, x, w, b, y, sms),
                G<KMaj, CO, CE, Shape<_128, _128, _64>, Shape<_2, _1, _1>>::Time(p.M, p.N, p.K, x, w, b, y, sms));
  }
  return 0;
}
