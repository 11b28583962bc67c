// The request's inputs from the pinned staging buffer into the bucket's device buffer, as a
// kernel: the first node of the fast lane's own CUDA graph (runtime/buckets.py), in place of a
// memcpy node, which measured 4.3-4.5 us of GPU time for the 15 KB of a 20 x 64 request on an
// H100 (benchmarks/runtime/own_graph.py). Every thread moves 16 bytes, so the request crosses
// the bus in one round of loads.
//
//   src: the staging buffer's device address (page-locked host memory, runtime/pinned.py), read
//        with ld.global.cv: no cache keeps a line of it, so each replay reads what the host
//        staged just before
//   dst: the bucket's device buffer [n_inputs, batch, seq] int32
//   bytes: a multiple of 4; src and dst 16-byte aligned
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace {

__global__ void copy_in_kernel(const uint4* src, uint4* dst, int n16, const unsigned* src_tail,
                               unsigned* dst_tail, int n_tail) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n16) {
    dst[i] = __ldcv(src + i);
  } else if (i - n16 < n_tail) {
    dst_tail[i - n16] = __ldcv(src_tail + (i - n16));
  }
}

}  // namespace

// Queues the copy on `stream`; a CUDA error code (0: queued).
extern "C" __attribute__((visibility("default"))) int bf_copy_in(void* dst, const void* src,
                                                                 size_t bytes, void* stream) {
  if (bytes == 0) return cudaSuccess;
  if (bytes % 4 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(src) % 16 != 0 || bytes / 16 > (size_t{1} << 30))
    return cudaErrorInvalidValue;
  const int n16 = static_cast<int>(bytes / 16), n_tail = static_cast<int>(bytes % 16 / 4);
  constexpr int kThreads = 256;
  const int blocks = (n16 + n_tail + kThreads - 1) / kThreads;
  const size_t done = static_cast<size_t>(n16) * 16;
  copy_in_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), n16,
      reinterpret_cast<const unsigned*>(static_cast<const char*>(src) + done),
      reinterpret_cast<unsigned*>(static_cast<char*>(dst) + done), n_tail);
  return cudaGetLastError();
}
