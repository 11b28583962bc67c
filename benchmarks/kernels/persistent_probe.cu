// What a kernel boundary costs against a grid-wide barrier inside one persistent kernel (GPU host).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 benchmarks/kernels/persistent_probe.cu -o /tmp/persistent_probe
//   /tmp/persistent_probe > persistent_probe.json
//
// The question behind it: at few tokens (base b1 s128, M = 128) a BERT layer is eight kernels of
// 2-8 us each, mostly latency. One persistent kernel per layer would replace each boundary with a
// grid-wide barrier. Measured here, per boundary, with one CTA of 128 threads per SM, each phase
// writing 4 KB per CTA that a different CTA reads after the boundary (so the boundary must order
// memory, as a layer's phases need):
//   graph:       N kernels captured in one CUDA graph, replayed (how ORT runs the model today)
//   graph + PDL: the same, each kernel launched with programmatic stream serialization and
//                waiting (griddepcontrol.wait) before its read, triggering its dependents first
//   grid.sync:   one cooperative kernel, N phases separated by cooperative_groups grid.sync()
//   flag barrier: the same kernel with a hand-written barrier (one atomic arrival per CTA, the
//                others spinning on a generation word with acquire loads)
//   phase work alone: the same kernel without the barriers (the phases' own time, racing)
// Prints one JSON object: the device, SM count, and microseconds per boundary (median of 15
// replays of 200 boundaries each).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace cg = cooperative_groups;

constexpr int kThreads = 128;
constexpr int kWords = 1024;  // 4 KB per CTA per phase
constexpr int kBoundaries = 200;
constexpr int kReps = 15;
constexpr int kWarmup = 3;

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

// One phase: read what CTA (b + 1) % grid wrote in the phase before, write this CTA's 4 KB.
__device__ __forceinline__ void phase(int* buf, int p) {
  const int b = blockIdx.x, n = gridDim.x;
  const int* src = buf + ((p & 1) * n + (b + 1) % n) * kWords;
  int* dst = buf + (((p + 1) & 1) * n + b) * kWords;
  for (int i = threadIdx.x; i < kWords; i += kThreads) dst[i] = src[i] + 1;
}

__global__ void __launch_bounds__(kThreads) phase_kernel(int* buf, int p, int pdl) {
  if (pdl) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  phase(buf, p);
}

__device__ unsigned int g_arrived = 0, g_generation = 0;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A grid barrier of one arrival per CTA: the last to arrive resets the count and bumps the
// generation the others spin on. (Co-residency from the cooperative launch.)
__device__ __forceinline__ void flag_barrier(unsigned n) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = ld_acquire(&g_generation);  // before arriving: cannot move on yet
    __threadfence();  // this CTA's phase writes before its arrival
    if (atomicAdd(&g_arrived, 1u) == n - 1) {
      atomicExch(&g_arrived, 0u);
      __threadfence();
      atomicAdd(&g_generation, 1u);
    } else {
      while (ld_acquire(&g_generation) == gen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// barrier: 0 none (the phases' own time), 1 cooperative_groups grid.sync(), 2 flag_barrier.
__global__ void __launch_bounds__(kThreads) persistent_kernel(int* buf, int phases, int barrier) {
  cg::grid_group grid = cg::this_grid();
  for (int p = 0; p < phases; ++p) {
    phase(buf, p);
    if (barrier == 1) grid.sync();
    if (barrier == 2) flag_barrier(gridDim.x);
  }
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// us per boundary: `launch` (kBoundaries phases on stream s) timed with events, kWarmup untimed
// runs first, the median of kReps.
template <class Launch>
static int time_per_boundary(cudaStream_t s, Launch launch, float* out) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < kWarmup + kReps; ++r) {
    CHECK(cudaEventRecord(a, s));
    CHECK(launch());
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= kWarmup) t.push_back(ms * 1000.0f / kBoundaries);
  }
  *out = median(t);
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return 0;
}

// kBoundaries phase kernels captured into one CUDA graph and replayed (with PDL: each launched
// with programmatic stream serialization).
static int time_graph(int sms, int* buf, cudaStream_t s, bool pdl, float* out) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int p = 0; p < kBoundaries; ++p) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(sms);
    cfg.blockDim = dim3(kThreads);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, phase_kernel, buf, p, pdl ? 1 : 0));
  }
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  if (time_per_boundary(s, [&] { return cudaGraphLaunch(exec, s); }, out)) return 1;
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return 0;
}

// One cooperative kernel of kBoundaries phases, `barrier` between them (persistent_kernel).
static int time_persistent(int sms, int* buf, cudaStream_t s, int barrier, float* out) {
  int phases = kBoundaries;
  void* args[] = {&buf, &phases, &barrier};
  return time_per_boundary(s, [&] {
    return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_kernel), dim3(sms), dim3(kThreads), args,
                                       0, s);
  }, out);
}

int main() {
  int dev = 0, sms = 0, coop = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  int* buf = nullptr;
  CHECK(cudaMalloc(&buf, sizeof(int) * 2 * sms * kWords));
  CHECK(cudaMemset(buf, 0, sizeof(int) * 2 * sms * kWords));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float graph_us = 0, pdl_us = 0, sync_us = -1, flag_us = -1, work_us = -1;
  if (time_graph(sms, buf, s, false, &graph_us) || time_graph(sms, buf, s, true, &pdl_us)) return 1;
  if (coop && (time_persistent(sms, buf, s, 1, &sync_us) || time_persistent(sms, buf, s, 2, &flag_us) ||
               time_persistent(sms, buf, s, 0, &work_us)))
    return 1;
  std::printf(
      "{\"device\": \"%s\", \"sms\": %d, \"ctas\": %d, \"threads\": %d, \"bytes_per_cta_phase\": %d, "
      "\"boundaries\": %d, \"reps\": %d, \"us_per_boundary\": {\"graph\": %.3f, \"graph_pdl\": %.3f, "
      "\"grid_sync\": %.3f, \"flag_barrier\": %.3f, \"phase_work_alone\": %.3f}}\n",
      prop.name, sms, sms, kThreads, kWords * 4, kBoundaries, kReps, graph_us, pdl_us, sync_us, flag_us, work_us);
  return 0;
}
