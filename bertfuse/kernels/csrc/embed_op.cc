// ai.bertfuse BertEmbedLayerNorm: the ORT custom op around bf_embed_layernorm_f16
// (embed_layernorm.cu).
//
//   input_ids [B, S] i32 ------------+
//   segment_ids [B, S] i32 (opt) ----+
//   word [V, H] f16 -----------------+
//   position [P, H] f16 -------------+--> BertEmbedLayerNorm(epsilon) --> Y [B, S, H] f16
//   segment [T, H] f16 (opt) --------+
//   gamma [H], beta [H] f16 ---------+
//   position_ids [B|1, S] i32 (opt) -+
//
// The slots are com.microsoft EmbedLayerNormalization's without the mask (the lowering keeps
// the contrib op where its mask_index or embedding_sum output is used). Shapes are checked
// here: an unsupported one is a clear ORT error, never a wrong answer.
#include "embed_layernorm.h"
#include "registry.h"

namespace {

constexpr const char* kOp = "BertEmbedLayerNorm";
constexpr ONNXTensorElementDataType kF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kI32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;

enum Slot : size_t { kIds, kSegs, kWord, kPos, kSeg, kGamma, kBeta, kPosIds, kSlots };

struct BertEmbedLayerNormKernel {
    BertEmbedLayerNormKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) {
        epsilon_ = bf::AttrFloat(info, "epsilon", 1e-12f);
        if (!(epsilon_ >= 0.f)) throw std::invalid_argument("attribute epsilon must be >= 0");
    }

    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return bf::Guard(kOp, [&]() -> OrtStatusPtr { return Compute(context); });
    }

   private:
    static OrtStatusPtr Table(const bf::TensorArg& t, const char* name, int64_t H) {
        BF_ORT_OK(bf::ExpectType(kOp, t, name, kF16));
        BF_ORT_OK(bf::ExpectRank(kOp, t, name, 2, 2));
        BF_REQUIRE(t.shape[1] == H && t.shape[0] > 0 && t.shape[0] <= INT32_MAX,
                   name << " " << bf::ShapeStr(t.shape) << " must be [rows, " << H << "]");
        return nullptr;
    }

    OrtStatusPtr Compute(OrtKernelContext* context) {
        Ort::KernelContext ctx(context);
        bf::TensorArg ids, segs, word, pos, seg, gamma, beta, pos_ids;
        BF_ORT_OK(bf::GetInput(kOp, ctx, kIds, "input_ids", true, &ids));
        BF_ORT_OK(bf::GetInput(kOp, ctx, kSegs, "segment_ids", false, &segs));
        BF_ORT_OK(bf::GetInput(kOp, ctx, kWord, "word_embedding", true, &word));
        BF_ORT_OK(bf::GetInput(kOp, ctx, kPos, "position_embedding", true, &pos));
        BF_ORT_OK(bf::GetInput(kOp, ctx, kSeg, "segment_embedding", false, &seg));
        BF_ORT_OK(bf::GetInput(kOp, ctx, kGamma, "gamma", true, &gamma));
        BF_ORT_OK(bf::GetInput(kOp, ctx, kBeta, "beta", true, &beta));
        BF_ORT_OK(bf::GetInput(kOp, ctx, kPosIds, "position_ids", false, &pos_ids));
        BF_ORT_OK(bf::ExpectType(kOp, ids, "input_ids", kI32));
        BF_ORT_OK(bf::ExpectRank(kOp, ids, "input_ids", 2, 2));
        const int64_t B = ids.shape[0], S = ids.shape[1], H = word.shape.size() == 2 ? word.shape[1] : -1;
        BF_ORT_OK(Table(word, "word_embedding", H));
        BF_ORT_OK(Table(pos, "position_embedding", H));
        BF_REQUIRE(segs.present == seg.present, "segment_ids and segment_embedding go together");
        if (segs.present) {
            BF_ORT_OK(bf::ExpectType(kOp, segs, "segment_ids", kI32));
            BF_REQUIRE(segs.shape == ids.shape, "segment_ids " << bf::ShapeStr(segs.shape)
                                                               << " must match input_ids " << bf::ShapeStr(ids.shape));
            BF_ORT_OK(Table(seg, "segment_embedding", H));
        }
        for (const bf::TensorArg* t : {&gamma, &beta}) {
            BF_ORT_OK(bf::ExpectType(kOp, *t, t == &gamma ? "gamma" : "beta", kF16));
            BF_REQUIRE(t->shape.size() == 1 && t->shape[0] == H,
                       (t == &gamma ? "gamma " : "beta ") << bf::ShapeStr(t->shape) << " must be [" << H << "]");
        }
        bool batched = false;
        if (pos_ids.present) {
            BF_ORT_OK(bf::ExpectType(kOp, pos_ids, "position_ids", kI32));
            BF_REQUIRE(pos_ids.shape.size() == 2 && pos_ids.shape[1] == S &&
                           (pos_ids.shape[0] == 1 || pos_ids.shape[0] == B),
                       "position_ids " << bf::ShapeStr(pos_ids.shape) << " must be [" << B << " or 1, " << S << "]");
            batched = pos_ids.shape[0] == B && B != 1;
        }
        BF_REQUIRE(B * S <= INT32_MAX, "input_ids " << bf::ShapeStr(ids.shape) << " is too large");
        __half* y = bf::Output<__half>(ctx, 0, bf::Shape{B, S, H});
        if (B == 0 || S == 0) return nullptr;
        if (const char* why = bertfuse::embed_layernorm_unsupported(static_cast<int>(H))) {
            return bf::Error(kOp, std::string("unsupported shape: word_embedding ") + bf::ShapeStr(word.shape) +
                                      ": " + why,
                             ORT_NOT_IMPLEMENTED);
        }
        BF_CUDA_OK(bertfuse::bf_embed_layernorm_f16(
            bf::ComputeStream(ctx), ids.as<int>(), segs.present ? segs.as<int>() : nullptr,
            pos_ids.present ? pos_ids.as<int>() : nullptr, batched, word.as<__half>(),
            static_cast<int>(word.shape[0]), pos.as<__half>(), static_cast<int>(pos.shape[0]),
            seg.present ? seg.as<__half>() : nullptr, seg.present ? static_cast<int>(seg.shape[0]) : 0,
            gamma.as<__half>(), beta.as<__half>(), epsilon_, y, static_cast<int>(B), static_cast<int>(S),
            static_cast<int>(H)));
        return nullptr;
    }

    float epsilon_ = 1e-12f;
};

struct BertEmbedLayerNormOp : bf::CudaOp<BertEmbedLayerNormOp, BertEmbedLayerNormKernel> {
    const char* GetName() const { return kOp; }
    size_t GetInputTypeCount() const { return kSlots; }
    ONNXTensorElementDataType GetInputType(size_t index) const {
        return index == kIds || index == kSegs || index == kPosIds ? kI32 : kF16;
    }
    OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
        return index == kSegs || index == kSeg || index == kPosIds
                   ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                   : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
    }
    size_t GetOutputTypeCount() const { return 1; }
    ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return kF16; }
};

}  // namespace

void AddEmbedOps(Ort::CustomOpDomain& domain) { bf::AddStaticOp<BertEmbedLayerNormOp>(domain); }
