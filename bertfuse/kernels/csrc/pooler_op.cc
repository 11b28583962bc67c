// ai.bertfuse BertPooler: the ORT custom op around bf_pooler_f16 (pooler.cu).
//
//   X [B, S, K] f16 --+
//   Wt [N, K] f16 ----+--> BertPooler --> Y [B, N] f16 (and optional Y32 [B, N] f32)
//   bias [N] f16 -----+
//
// Y = tanh(X[:, 0, :] @ Wt^T + bias). Shapes are checked here: an unsupported one is a clear ORT
// error, never a wrong answer.
#include "pooler.h"
#include "registry.h"

namespace {

constexpr const char* kOp = "BertPooler";
constexpr ONNXTensorElementDataType kF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;

struct BertPoolerKernel {
    BertPoolerKernel(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/) {}

    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return bf::Guard(kOp, [&]() -> OrtStatusPtr { return Compute(context); });
    }

   private:
    OrtStatusPtr Compute(OrtKernelContext* context) {
        Ort::KernelContext ctx(context);
        bf::TensorArg x, wt, bias;
        BF_ORT_OK(bf::GetInput(kOp, ctx, 0, "X", true, &x));
        BF_ORT_OK(bf::GetInput(kOp, ctx, 1, "Wt", true, &wt));
        BF_ORT_OK(bf::GetInput(kOp, ctx, 2, "bias", true, &bias));
        BF_ORT_OK(bf::ExpectType(kOp, x, "X", kF16));
        BF_ORT_OK(bf::ExpectType(kOp, wt, "Wt", kF16));
        BF_ORT_OK(bf::ExpectType(kOp, bias, "bias", kF16));
        BF_ORT_OK(bf::ExpectRank(kOp, x, "X", 3, 3));
        BF_ORT_OK(bf::ExpectRank(kOp, wt, "Wt", 2, 2));
        const int64_t B = x.shape[0], S = x.shape[1], K = x.shape[2], N = wt.shape[0];
        BF_REQUIRE(wt.shape[1] == K, "Wt " << bf::ShapeStr(wt.shape) << " does not match X "
                                           << bf::ShapeStr(x.shape) << " (Wt is [N, K])");
        BF_REQUIRE(bias.shape.size() == 1 && bias.shape[0] == N,
                   "bias " << bf::ShapeStr(bias.shape) << " must be [" << N << "]");
        BF_REQUIRE(B <= INT32_MAX && S <= INT32_MAX && N <= INT32_MAX && B * S * K < (int64_t{1} << 40),
                   "X " << bf::ShapeStr(x.shape) << " is too large");
        const bf::Shape y_shape{B, N};
        __half* y = bf::Output<__half>(ctx, 0, y_shape);
        float* y32 = bf::OptionalOutput<float>(ctx, 1, y_shape);
        if (B == 0 || N == 0) return nullptr;
        BF_REQUIRE(S > 0, "X " << bf::ShapeStr(x.shape) << " has no first token");
        if (const char* why = bertfuse::pooler_unsupported(static_cast<int>(K))) {
            return bf::Error(kOp, std::string("unsupported shape: X ") + bf::ShapeStr(x.shape) + ": " + why,
                             ORT_NOT_IMPLEMENTED);
        }
        BF_CUDA_OK(bertfuse::bf_pooler_f16(bf::ComputeStream(ctx), x.as<__half>(), wt.as<__half>(),
                                           bias.as<__half>(), y, y32, static_cast<int>(B),
                                           static_cast<int>(S), static_cast<int>(K), static_cast<int>(N)));
        return nullptr;
    }
};

struct BertPoolerOp : bf::CudaOp<BertPoolerOp, BertPoolerKernel> {
    const char* GetName() const { return kOp; }
    size_t GetInputTypeCount() const { return 3; }
    ONNXTensorElementDataType GetInputType(size_t /*index*/) const { return kF16; }
    size_t GetOutputTypeCount() const { return 2; }  // Y, optional Y32
    ONNXTensorElementDataType GetOutputType(size_t index) const {
        return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : kF16;
    }
    OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const {
        return index == 1 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                          : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
    }
};

}  // namespace

void AddPoolerOps(Ort::CustomOpDomain& domain) { bf::AddStaticOp<BertPoolerOp>(domain); }
