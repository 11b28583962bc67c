// ai.bertfuse BertAttention: the ORT custom op around bf_attention_f16 (attention.cu).
//
//   qkv [B, S, 3H] f16 (bias added) --+
//   mask int32 [B, S] raw | [B] lens -+--> BertAttention(num_heads, scale) --> context [B, S, H] f16
//                                                        (yq_scale) --> Yq [B, S, H] e4m3, optional
//
// Yq = e4m3_satfinite(context * (1 / yq_scale)) for an FP8 GEMM downstream (the attention-out
// DenseBiasSkipLayerNormFp8), written in the kernel's store where the tensor-core kernel runs.
// The context may be left off where Yq is there (the FP8 model reads only Yq): the tensor-core
// kernel then writes Yq alone; the other paths write the context into ORT scratch first.
// Shapes are checked here so an unsupported one is a clear ORT error, never a wrong answer.
#include "attention.h"
#include "ort_scratch.h"
#include "registry.h"

#include <stdexcept>

namespace {

constexpr const char* kOp = "BertAttention";

struct BertAttentionKernel {
    BertAttentionKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) {
        bf::HeadAttrs(info, &num_heads_, &scale_);
        yq_scale_ = bf::AttrFloat(info, "yq_scale", 0.f);
    }

    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return bf::Guard(kOp, [&]() -> OrtStatusPtr { return Compute(context); });
    }

   private:
    OrtStatusPtr Compute(OrtKernelContext* context) {
        Ort::KernelContext ctx(context);
        bf::TensorArg qkv, mask;
        BF_ORT_OK(bf::GetInput(kOp, ctx, 0, "qkv", true, &qkv));
        BF_ORT_OK(bf::GetInput(kOp, ctx, 1, "mask", false, &mask));
        BF_ORT_OK(bf::ExpectType(kOp, qkv, "qkv", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16));
        BF_ORT_OK(bf::ExpectRank(kOp, qkv, "qkv", 3, 3));
        const int64_t B = qkv.shape[0], S = qkv.shape[1], H3 = qkv.shape[2];
        BF_REQUIRE(H3 % (3 * num_heads_) == 0,
                   "qkv " << bf::ShapeStr(qkv.shape) << ": last dim must be 3 * num_heads (" << num_heads_
                          << ") * head size");
        const int64_t H = H3 / 3, D = H / num_heads_;

        int mask_rank = 0;
        if (mask.present) {
            BF_ORT_OK(bf::ExpectType(kOp, mask, "mask", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32));
            mask_rank = static_cast<int>(mask.shape.size());
            const bool raw = mask_rank == 2 && mask.shape[0] == B && mask.shape[1] == S;
            const bool lens = mask_rank == 1 && mask.shape[0] == B;
            BF_REQUIRE(raw || lens, "mask " << bf::ShapeStr(mask.shape) << " must be [B, S] = [" << B << ", " << S
                                            << "] (raw 0/1) or [B] = [" << B << "] (key lengths)");
        }

        __half* out = bf::OptionalOutput<__half>(ctx, 0, bf::Shape{B, S, H});
        uint8_t* yq = bf::OptionalOutput<uint8_t>(ctx, 1, bf::Shape{B, S, H});
        BF_REQUIRE(yq == nullptr || (yq_scale_ > 0.f && yq_scale_ != INFINITY),
                   "output Yq needs the attribute yq_scale (finite, > 0): Yq = e4m3(context / yq_scale)");
        BF_REQUIRE(out != nullptr || yq != nullptr, "neither context nor Yq is asked for");
        if (B == 0 || S == 0) return nullptr;  // empty batch: nothing to compute
        BF_REQUIRE(B <= INT32_MAX && S <= INT32_MAX, "qkv " << bf::ShapeStr(qkv.shape) << " is too large");
        if (const char* why = bertfuse::attention_unsupported(static_cast<int>(B), static_cast<int>(S),
                                                               static_cast<int>(num_heads_), static_cast<int>(D),
                                                               mask_rank)) {
            return bf::Error(kOp,
                             std::string("unsupported shape: qkv ") + bf::ShapeStr(qkv.shape) +
                                 " with num_heads " + std::to_string(num_heads_) + " (head size " +
                                 std::to_string(D) + "): " + why,
                             ORT_NOT_IMPLEMENTED);
        }
        bf::OrtScratch scratch(context, ctx.GetInput(0).GetTensorMemoryInfo());  // qkv's device
        if (out == nullptr &&
            !bertfuse::attention_e4m3_only(static_cast<const __half*>(qkv.data), yq, static_cast<int>(B),
                                           static_cast<int>(S), static_cast<int>(num_heads_), static_cast<int>(D),
                                           mask_rank)) {
            const size_t bytes = sizeof(__half) * static_cast<size_t>(B * S * H);
            out = static_cast<__half*>(scratch.Get(bytes));  // the path quantises the context after
            BF_REQUIRE(out != nullptr, "no " << bytes << "-byte scratch buffer for the context");
        }
        BF_CUDA_OK(bertfuse::bf_attention_f16(bf::ComputeStream(ctx), static_cast<const __half*>(qkv.data),
                                              mask.as<int32_t>(), mask_rank, static_cast<int>(B),
                                              static_cast<int>(S), static_cast<int>(num_heads_),
                                              static_cast<int>(D), scale_, out, yq, yq_scale_));
        return nullptr;
    }

    int64_t num_heads_ = 0;
    float scale_ = 0.0f;
    float yq_scale_ = 0.0f;
};

struct BertAttentionOp : bf::CudaOp<BertAttentionOp, BertAttentionKernel> {
    const char* GetName() const { return kOp; }
    size_t GetInputTypeCount() const { return 2; }
    ONNXTensorElementDataType GetInputType(size_t index) const {
        return index == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    }
    OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
        return index == 0 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
                          : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;
    }
    size_t GetOutputTypeCount() const { return 2; }
    ONNXTensorElementDataType GetOutputType(size_t index) const {
        return index == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
    }
    OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t /*index*/) const {
        return OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;  // context or Yq may be left off
    }
};

}  // namespace

void AddAttentionOps(Ort::CustomOpDomain& domain) { bf::AddStaticOp<BertAttentionOp>(domain); }
