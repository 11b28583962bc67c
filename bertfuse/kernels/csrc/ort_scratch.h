// bf::OrtScratch, the ops' device scratch (dense_ops.cc, attention_op.cc).
#pragma once

#include <vector>

#include "common.h"
#include "dense.h"

namespace bf {

// Device scratch for one run from ORT's stream-aware scratch buffer (its arena: what ORT's own
// CUDA kernels use; no cudaMalloc once warm; per session, so concurrent sessions on other
// streams never share a buffer). Everything is handed back when Compute returns, as soon as
// the work is queued: later users of a chunk run after it on the same stream.
class OrtScratch : public bertfuse::WorkspaceSource {
 public:
  OrtScratch(OrtKernelContext* ctx, const OrtMemoryInfo* mem) : ctx_(ctx), mem_(mem) {}
  ~OrtScratch() override {
    for (void* p : ptrs_) alloc_->Free(alloc_, p);
    if (alloc_) Ort::GetApi().ReleaseAllocator(alloc_);
  }
  OrtScratch(const OrtScratch&) = delete;
  OrtScratch& operator=(const OrtScratch&) = delete;

  void* Get(size_t bytes) override {
    const OrtApi& api = Ort::GetApi();
    if (!alloc_) {
      if (OrtStatusPtr st = api.KernelContext_GetAllocator(ctx_, mem_, &alloc_)) {
        api.ReleaseStatus(st);
        alloc_ = nullptr;
        return nullptr;
      }
    }
    void* p = nullptr;
    if (OrtStatusPtr st = api.KernelContext_GetScratchBuffer(ctx_, mem_, bytes, &p)) {
      api.ReleaseStatus(st);
      return nullptr;
    }
    if (p) ptrs_.push_back(p);
    return p;
  }

 private:
  OrtKernelContext* ctx_;
  const OrtMemoryInfo* mem_;
  OrtAllocator* alloc_ = nullptr;
  std::vector<void*> ptrs_;
};

}  // namespace bf
