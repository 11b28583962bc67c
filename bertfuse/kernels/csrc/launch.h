// Kernel launches for the kernels that follow a GEMM (LayerNorm, bias/GELU, attention), with
// programmatic dependent launch (PDL): the kernel may start while the kernel before it is
// finishing, fetch its weights, and wait for that kernel's output at griddepcontrol.wait (CUDA
// graphs keep the programmatic edge). Measured on the H200: 0.4-0.8 us less per LayerNorm or
// GELU pass. On by default; BERTFUSE_PDL=0 (config.h) (or the check entry point bf_check_set_pdl) turns it
// off, and each launch asks for it only where its weights are not written just before it.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>

#include "config.h"

namespace bertfuse {

inline std::atomic<int>& PdlFlag() {
  static std::atomic<int> flag{Config().pdl};
  return flag;
}

constexpr int kMaxDevices = 16;

// ask(device) for the current device, asked once per device and kept in cache[device] (0: not
// asked yet, < 0: failed); 0 where CUDA cannot say. For launch shapes that depend on the device
// (SM counts, resident CTAs).
template <class Ask>
int per_device(std::atomic<int> (&cache)[kMaxDevices], Ask ask) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    cudaGetLastError();
    return 0;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = ask(dev);
    if (v <= 0) {
      cudaGetLastError();
      v = -1;
    }
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v > 0 ? v : 0;
}

inline int sm_count() {
  static std::atomic<int> cache[kMaxDevices];
  return per_device(cache, [](int dev) {
    int n = 0;
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess ? n : -1;
  });
}

// CTAs of `kernel` with `threads` threads and `smem` bytes of dynamic shared memory (the kernel's
// limit set to it first, as its launch does) resident at once on the current device (per SM
// times the SMs), asked once per device through `cache`; 0 if unknown.
template <typename... KArgs>
int resident_ctas_of(std::atomic<int> (&cache)[kMaxDevices], void (*kernel)(KArgs...), int threads,
                     size_t smem = 0) {
  return per_device(cache, [=](int) {
    int per_sm = 0;
    const bool ok = (smem == 0 || cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(smem)) == cudaSuccess) &&
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) == cudaSuccess;
    const int sms = ok ? sm_count() : 0;
    return ok && per_sm > 0 && sms > 0 ? per_sm * sms : -1;
  });
}

// The LayerNorm's register cap (BERTFUSE_LN_CAP, or bf_check_set_ln_cap): 0 where its CTAs would
// not all be resident at once (layernorm.cu), 1 never, 2 wherever the row fits; the forced forms
// are for comparisons (benchmarks/kernels/ln_probe.py, benchmarks/runtime/pdl_ab.py).
inline std::atomic<int>& LnCapFlag() {
  static std::atomic<int> flag{Config().ln_cap};
  return flag;
}

#ifdef __CUDACC__
// In a kernel launched by LaunchPdl or LaunchAfterGemm: waits for the kernel before it in the
// stream (a no-op without PDL). Everything before it may only read weights, never that kernel's
// output.
__device__ __forceinline__ void wait_for_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
#endif

template <typename... KArgs, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, bool pdl, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && PdlFlag().load(std::memory_order_relaxed) ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

template <typename... KArgs, typename... Args>
cudaError_t LaunchAfterGemm(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t stream,
                            bool pdl, Args... args) {
  return LaunchPdl(kernel, grid, block, 0, stream, pdl, args...);
}

}  // namespace bertfuse
