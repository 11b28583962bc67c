// ORT custom ops of the packed family (domain ai.bertfuse): PackTokens, PackedBertAttention,
// UnpackTokens. The kernels live in pack.cu and packed_attention.cu; this file checks shapes
// and types, reads attributes once, and hands ORT's pointers and stream over.
//
//   input_mask [B,S] ──► PackTokens(token_bucket [T]) ──► token_index [T], token_slot [B,S], cu [B+1]
//   embeddings [B*S,H] ─► Gather(token_index) ─► [T,H] ─► DenseBias ─► qkv [T,3H]
//        ─► PackedBertAttention(token_slot, cu) ─► [T,H] ... ─► UnpackTokens(token_slot) ─► [B,S,H]
//
// token_bucket is a graph input whose shape alone sets T (its values are never read): ORT needs
// output shapes on the host, and device values cannot give them without a synchronisation.
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "pack.h"
#include "packed_attention.h"
#include "registry.h"

namespace {

constexpr ONNXTensorElementDataType kF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kI32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;

// Reads a rank-2 [B, S] int32 input (mask or token_slot) and checks it fits int32 indexing.
OrtStatusPtr GetRowsBySeq(const char* kOp, const Ort::KernelContext& ctx, size_t index, const char* name,
                          bf::TensorArg* out) {
  BF_ORT_OK(bf::GetInput(kOp, ctx, index, name, true, out));
  BF_ORT_OK(bf::ExpectType(kOp, *out, name, kI32));
  BF_ORT_OK(bf::ExpectRank(kOp, *out, name, 2, 2));
  BF_REQUIRE(out->shape[0] * out->shape[1] <= INT32_MAX, name << " " << bf::ShapeStr(out->shape) << " is too large");
  return nullptr;
}

// ---- PackTokens ----------------------------------------------------------------------------

struct PackTokensKernel {
  static constexpr const char* kOp = "PackTokens";
  PackTokensKernel(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return bf::Guard(kOp, [&]() -> OrtStatusPtr { return Compute(context); });
  }

 private:
  OrtStatusPtr Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    bf::TensorArg mask, bucket;
    BF_ORT_OK(GetRowsBySeq(kOp, ctx, 0, "mask", &mask));
    BF_ORT_OK(bf::GetInput(kOp, ctx, 1, "token_bucket", true, &bucket));
    BF_ORT_OK(bf::ExpectRank(kOp, bucket, "token_bucket", 1, 1));
    const int64_t B = mask.shape[0], S = mask.shape[1], T = bucket.shape[0];
    BF_REQUIRE(T <= INT32_MAX, "token_bucket " << bf::ShapeStr(bucket.shape) << " is too large");
    int32_t* index = bf::Output<int32_t>(ctx, 0, bf::Shape{T});
    int32_t* slot = bf::Output<int32_t>(ctx, 1, bf::Shape{B, S});
    int32_t* cu = bf::Output<int32_t>(ctx, 2, bf::Shape{B + 1});
    if (const char* why = bertfuse::pack_tokens_unsupported(static_cast<int>(B), static_cast<int>(S),
                                                            static_cast<int>(T))) {
      return bf::Error(kOp,
                       "unsupported shape: mask " + bf::ShapeStr(mask.shape) + ", token_bucket " +
                           bf::ShapeStr(bucket.shape) + ": " + why,
                       ORT_NOT_IMPLEMENTED);
    }
    BF_CUDA_OK(bertfuse::bf_pack_tokens(bf::ComputeStream(ctx), mask.as<int32_t>(), static_cast<int>(B),
                                        static_cast<int>(S), static_cast<int>(T), index, slot, cu));
    return nullptr;
  }
};

struct PackTokensOp : bf::CudaOp<PackTokensOp, PackTokensKernel> {
  const char* GetName() const { return PackTokensKernel::kOp; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t /*index*/) const { return kI32; }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return kI32; }
};

// ---- PackedBertAttention -------------------------------------------------------------------

struct PackedBertAttentionKernel {
  static constexpr const char* kOp = "PackedBertAttention";
  PackedBertAttentionKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) {
    bf::HeadAttrs(info, &num_heads_, &scale_);
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return bf::Guard(kOp, [&]() -> OrtStatusPtr { return Compute(context); });
  }

 private:
  OrtStatusPtr Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    bf::TensorArg qkv, slot, cu;
    BF_ORT_OK(bf::GetInput(kOp, ctx, 0, "qkv", true, &qkv));
    BF_ORT_OK(bf::ExpectType(kOp, qkv, "qkv", kF16));
    BF_ORT_OK(bf::ExpectRank(kOp, qkv, "qkv", 2, 2));
    BF_ORT_OK(GetRowsBySeq(kOp, ctx, 1, "token_slot", &slot));
    BF_ORT_OK(bf::GetInput(kOp, ctx, 2, "cumulative_sequence_length", true, &cu));
    BF_ORT_OK(bf::ExpectType(kOp, cu, "cumulative_sequence_length", kI32));
    const int64_t T = qkv.shape[0], H3 = qkv.shape[1], R = slot.shape[0], S = slot.shape[1];
    BF_REQUIRE(cu.shape.size() == 1 && cu.shape[0] == R + 1,
               "cumulative_sequence_length " << bf::ShapeStr(cu.shape) << " must be [R + 1] = [" << R + 1
                                             << "] for token_slot " << bf::ShapeStr(slot.shape));
    BF_REQUIRE(H3 % (3 * num_heads_) == 0, "qkv " << bf::ShapeStr(qkv.shape)
                                                  << ": last dim must be 3 * num_heads (" << num_heads_
                                                  << ") * head size");
    const int64_t H = H3 / 3, D = H / num_heads_;
    __half* out = bf::Output<__half>(ctx, 0, bf::Shape{T, H});
    if (T == 0) return nullptr;
    BF_REQUIRE(T <= INT32_MAX, "qkv " << bf::ShapeStr(qkv.shape) << " is too large");
    if (const char* why = bertfuse::packed_attention_unsupported(static_cast<int>(T), static_cast<int>(R),
                                                                 static_cast<int>(S), static_cast<int>(num_heads_),
                                                                 static_cast<int>(D))) {
      return bf::Error(kOp,
                       "unsupported shape: qkv " + bf::ShapeStr(qkv.shape) + ", token_slot " +
                           bf::ShapeStr(slot.shape) + " with num_heads " + std::to_string(num_heads_) +
                           " (head size " + std::to_string(D) + "): " + why,
                       ORT_NOT_IMPLEMENTED);
    }
    BF_CUDA_OK(bertfuse::bf_packed_attention_f16(bf::ComputeStream(ctx), static_cast<const __half*>(qkv.data),
                                                 cu.as<int32_t>(), static_cast<int>(T), static_cast<int>(R),
                                                 static_cast<int>(S), static_cast<int>(num_heads_),
                                                 static_cast<int>(D), scale_, out));
    return nullptr;
  }

  int64_t num_heads_ = 0;
  float scale_ = 0.0f;
};

struct PackedBertAttentionOp : bf::CudaOp<PackedBertAttentionOp, PackedBertAttentionKernel> {
  const char* GetName() const { return PackedBertAttentionKernel::kOp; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t index) const { return index == 0 ? kF16 : kI32; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return kF16; }
};

// ---- UnpackTokens --------------------------------------------------------------------------

struct UnpackTokensKernel {
  static constexpr const char* kOp = "UnpackTokens";
  UnpackTokensKernel(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return bf::Guard(kOp, [&]() -> OrtStatusPtr { return Compute(context); });
  }

 private:
  OrtStatusPtr Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    bf::TensorArg packed, slot;
    BF_ORT_OK(bf::GetInput(kOp, ctx, 0, "packed", true, &packed));
    BF_ORT_OK(bf::ExpectType(kOp, packed, "packed", kF16));
    BF_ORT_OK(bf::ExpectRank(kOp, packed, "packed", 2, 2));
    BF_ORT_OK(GetRowsBySeq(kOp, ctx, 1, "token_slot", &slot));
    const int64_t T = packed.shape[0], H = packed.shape[1], B = slot.shape[0], S = slot.shape[1];
    void* out = bf::Output<__half>(ctx, 0, bf::Shape{B, S, H});
    if (B * S * H == 0) return nullptr;
    BF_REQUIRE(T >= 1 && T <= INT32_MAX, "packed " << bf::ShapeStr(packed.shape) << " must have 1 to 2^31-1 rows");
    const long long row_bytes = static_cast<long long>(H) * sizeof(__half);
    if (const char* why = bertfuse::unpack_tokens_unsupported(static_cast<int>(T), static_cast<int>(B),
                                                              static_cast<int>(S), row_bytes)) {
      return bf::Error(kOp, "unsupported shape: packed " + bf::ShapeStr(packed.shape) + ", token_slot " +
                                bf::ShapeStr(slot.shape) + ": " + why,
                       ORT_NOT_IMPLEMENTED);
    }
    BF_CUDA_OK(bertfuse::bf_unpack_tokens(bf::ComputeStream(ctx), packed.data, static_cast<int>(T),
                                          slot.as<int32_t>(), static_cast<int>(B), static_cast<int>(S), row_bytes,
                                          out));
    return nullptr;
  }
};

struct UnpackTokensOp : bf::CudaOp<UnpackTokensOp, UnpackTokensKernel> {
  const char* GetName() const { return UnpackTokensKernel::kOp; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t index) const { return index == 0 ? kF16 : kI32; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return kF16; }
};

}  // namespace

void AddPackedOps(Ort::CustomOpDomain& domain) {
  bf::AddStaticOp<PackTokensOp>(domain);
  bf::AddStaticOp<PackedBertAttentionOp>(domain);
  bf::AddStaticOp<UnpackTokensOp>(domain);
}
