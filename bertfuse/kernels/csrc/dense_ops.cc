// ORT custom ops of the dense family (domain ai.bertfuse): DenseBias, DenseBiasGelu,
// DenseBiasSkipLayerNorm and their FP8-weight forms DenseBiasFp8, DenseBiasGeluFp8,
// DenseBiasSkipLayerNormFp8. The math lives in dense.cu (bf_dense_forward); this file checks
// shapes and types, reads attributes once, and hands ORT's pointers and stream over.
//
// FP8 form = the fp16 op's inputs with W replaced by Wt (float8e4m3fn [N, K], W transposed)
// and one more input appended, w_scale (float32 [1]); attribute x_scale (required, > 0) and
// fast_accum (int, default 1). Optional outputs: Yq (e4m3 copy of Y, with yq_scale) and, for the
// SkipLayerNorm ops, Y32 (Y in fp32). The GELU ops may leave Y off where Yq is there (nothing
// reads Y once an FP8 GEMM takes Yq): Y then lives in ORT scratch. See bertfuse/ops/README.md.
#include <cuda_fp16.h>

#include <memory>
#include <stdexcept>
#include <vector>

#include "dense.h"
#include "ort_scratch.h"
#include "registry.h"

namespace {

using bertfuse::DenseKind;

constexpr ONNXTensorElementDataType kF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr ONNXTensorElementDataType kE4M3 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;

// Static description of one op: name, kind, FP8 or not.
template <DenseKind Kind, bool Fp8>
struct Traits {
  static constexpr DenseKind kKind = Kind;
  static constexpr bool kFp8 = Fp8;
  static constexpr bool kYOptional = Kind == DenseKind::kBiasGelu;  // Y may be left off for Yq alone
  static constexpr size_t kBase = Kind == DenseKind::kBiasSkipLayerNorm ? 6 : 3;  // X W bias [skip gamma beta]
  static constexpr size_t kInputs = kBase + (Fp8 ? 1 : 0);                      // (+ w_scale)
  static constexpr const char* Name() {
    return Kind == DenseKind::kBias
               ? (Fp8 ? "DenseBiasFp8" : "DenseBias")
               : Kind == DenseKind::kBiasGelu
                     ? (Fp8 ? "DenseBiasGeluFp8" : "DenseBiasGelu")
                     : (Fp8 ? "DenseBiasSkipLayerNormFp8" : "DenseBiasSkipLayerNorm");
  }
  static ONNXTensorElementDataType InputType(size_t i) {
    // FP8 ops take X as float16 (quantized here) or float8e4m3fn (quantized upstream with the
    // same x_scale): declared untyped, checked in Compute.
    if (i == 0) return Fp8 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : kF16;
    if (i == 1) return Fp8 ? kE4M3 : kF16;
    if (Fp8 && i == kBase) return kF32;  // w_scale
    return kF16;
  }
};

// The device ORT created this kernel for: from the EP's allocator, else the current device.
int KernelDevice(const OrtKernelInfo* info) {
  const OrtApi& api = Ort::GetApi();
  OrtAllocator* alloc = nullptr;
  int device = -1;
  OrtStatusPtr st = api.KernelInfoGetAllocator(info, OrtMemTypeDefault, &alloc);
  if (st == nullptr && alloc != nullptr) {
    const OrtMemoryInfo* mi = nullptr;
    OrtStatusPtr s2 = api.AllocatorGetInfo(alloc, &mi);
    if (s2 == nullptr) {
      OrtStatusPtr s3 = api.MemoryInfoGetId(mi, &device);
      if (s3 != nullptr) {
        api.ReleaseStatus(s3);
        device = -1;
      }
    } else {
      api.ReleaseStatus(s2);
    }
    api.ReleaseAllocator(alloc);
  } else if (st != nullptr) {
    api.ReleaseStatus(st);
  }
  return device;
}

// One float in device memory on `device` (-1: the current one), for a cuBLASLt scale pointer.
class DeviceFloat {
 public:
  DeviceFloat(int device, float value) {
    int prev = -1;
    const bool swap = device >= 0 && cudaGetDevice(&prev) == cudaSuccess && prev != device;
    if (swap) cudaSetDevice(device);
    cudaError_t e = cudaMalloc(&ptr_, sizeof(float));
    if (e == cudaSuccess) e = cudaMemcpy(ptr_, &value, sizeof(float), cudaMemcpyHostToDevice);
    if (swap) cudaSetDevice(prev);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (ptr_) cudaFree(ptr_);
      throw std::runtime_error(std::string("device scale: ") + cudaGetErrorString(e));
    }
  }
  ~DeviceFloat() { cudaFree(ptr_); }
  DeviceFloat(const DeviceFloat&) = delete;
  DeviceFloat& operator=(const DeviceFloat&) = delete;
  const float* get() const { return static_cast<const float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

template <typename T>
class DenseKernel {
 public:
  static constexpr const char* kOp = T::Name();

  DenseKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) {
    approximate_ = static_cast<int>(bf::AttrInt(info, "approximate", 0));
    epsilon_ = bf::AttrFloat(info, "epsilon", 1e-12f);
    if (approximate_ != 0 && approximate_ != 1) {
      throw std::invalid_argument("attribute approximate must be 0 (erf) or 1 (tanh), got " +
                                  std::to_string(approximate_));
    }
    if (!(epsilon_ >= 0.f)) throw std::invalid_argument("attribute epsilon must be >= 0");
    if (T::kFp8) {
      x_scale_ = bf::AttrFloat(info, "x_scale", 0.f);
      fast_accum_ = bf::AttrInt(info, "fast_accum", 1) != 0;
      if (!(x_scale_ > 0.f) || x_scale_ == INFINITY) {
        throw std::invalid_argument("attribute x_scale (the activations' FP8 scale) is required and must be a finite float > 0");
      }
    }
    yq_scale_ = bf::AttrFloat(info, "yq_scale", 0.f);
    // The LayerNorm reads bias, gamma and beta before waiting for the GEMM (programmatic
    // dependent launch): only sound when they are initializers, as bertfuse's graphs have them.
    for (size_t i : {size_t{2}, size_t{4}, size_t{5}}) {
      if (i >= T::kBase) continue;
      int is_const = 0;
      const OrtValue* v = nullptr;
      OrtStatusPtr st = Ort::GetApi().KernelInfoGetConstantInput_tensor(info, i, &is_const, &v);
      if (st != nullptr) {
        Ort::GetApi().ReleaseStatus(st);
        is_const = 0;
      }
      weights_const_ = weights_const_ && is_const != 0;
    }
    const int device = KernelDevice(info);
    gemm_ = std::make_unique<bertfuse::DenseGemm>(device, bertfuse::DefaultWorkspaceBytes());
    // The FP8 GELU ops hand cuBLASLt 1 / yq_scale as a device float, so that the GEMM can write
    // Yq itself where Y is left off: one float, set here once (not inside a capture).
    if (T::kFp8 && T::kKind == DenseKind::kBiasGelu && yq_scale_ > 0.f && yq_scale_ != INFINITY)
      yq_dscale_ = std::make_unique<DeviceFloat>(device, 1.0f / yq_scale_);
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return bf::Guard(kOp, [&]() -> OrtStatusPtr { return Compute(context); });
  }

 private:
  OrtStatusPtr Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    bf::TensorArg x, w, bias, skip, gamma, beta, w_scale;
    BF_ORT_OK(bf::GetInput(kOp, ctx, 0, "X", true, &x));
    BF_ORT_OK(bf::GetInput(kOp, ctx, 1, T::kFp8 ? "Wt" : "W", true, &w));
    BF_ORT_OK(bf::GetInput(kOp, ctx, 2, "bias", true, &bias));
    const bool x_fp8 = T::kFp8 && x.type == kE4M3;
    if (!x_fp8) BF_ORT_OK(bf::ExpectType(kOp, x, "X", kF16));
    BF_ORT_OK(bf::ExpectType(kOp, w, T::kFp8 ? "Wt" : "W", T::InputType(1)));
    BF_ORT_OK(bf::ExpectType(kOp, bias, "bias", kF16));
    BF_ORT_OK(bf::ExpectRank(kOp, x, "X", 1, 8));
    BF_ORT_OK(bf::ExpectRank(kOp, w, T::kFp8 ? "Wt" : "W", 2, 2));
    const int64_t K = x.shape.back();
    const int64_t N = T::kFp8 ? w.shape[0] : w.shape[1];
    const int64_t wk = T::kFp8 ? w.shape[1] : w.shape[0];
    BF_REQUIRE(wk == K, (T::kFp8 ? "Wt " : "W ") << bf::ShapeStr(w.shape) << " does not match X "
                        << bf::ShapeStr(x.shape) << (T::kFp8 ? " (Wt is [N, K])" : " (W is [K, N])"));
    BF_REQUIRE(bias.shape.size() == 1 && bias.shape[0] == N,
               "bias " << bf::ShapeStr(bias.shape) << " must be [" << N << "]");
    const int64_t M = bf::LeadingProduct(x.shape);
    BF_REQUIRE(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && K > 0,
               "X " << bf::ShapeStr(x.shape) << " / W " << bf::ShapeStr(w.shape) << " out of range");
    const bf::Shape y_shape = bf::WithLastDim(x.shape, N);

    bertfuse::DenseArgs a;
    if (T::kKind == DenseKind::kBiasSkipLayerNorm) {
      BF_ORT_OK(bf::GetInput(kOp, ctx, 3, "skip", true, &skip));
      BF_ORT_OK(bf::GetInput(kOp, ctx, 4, "gamma", true, &gamma));
      BF_ORT_OK(bf::GetInput(kOp, ctx, 5, "beta", true, &beta));
      BF_ORT_OK(bf::ExpectType(kOp, skip, "skip", kF16));
      BF_ORT_OK(bf::ExpectType(kOp, gamma, "gamma", kF16));
      BF_ORT_OK(bf::ExpectType(kOp, beta, "beta", kF16));
      BF_REQUIRE(skip.shape == y_shape,
                 "skip " << bf::ShapeStr(skip.shape) << " must have Y's shape " << bf::ShapeStr(y_shape));
      BF_REQUIRE(gamma.shape.size() == 1 && gamma.shape[0] == N,
                 "gamma " << bf::ShapeStr(gamma.shape) << " must be [" << N << "]");
      BF_REQUIRE(beta.shape.size() == 1 && beta.shape[0] == N,
                 "beta " << bf::ShapeStr(beta.shape) << " must be [" << N << "]");
      a.skip = skip.as<__half>();
      a.gamma = gamma.as<__half>();
      a.beta = beta.as<__half>();
    }
    if (T::kFp8) {
      BF_ORT_OK(bf::GetInput(kOp, ctx, T::kBase, "w_scale", true, &w_scale));
      BF_ORT_OK(bf::ExpectType(kOp, w_scale, "w_scale", kF32));
      BF_REQUIRE(bf::Numel(w_scale.shape) == 1,
                 "w_scale " << bf::ShapeStr(w_scale.shape) << " must hold one float");
      BF_REQUIRE(K % 16 == 0, "FP8 weights need K % 16 == 0 (cuBLASLt), got K = " << K);
    }

    __half* y = T::kYOptional ? bf::OptionalOutput<__half>(ctx, 0, y_shape)
                              : reinterpret_cast<__half*>(bf::Output<Ort::Float16_t>(ctx, 0, y_shape));
    // Optional output 1: the e4m3 copy of Y for an FP8 GEMM downstream.
    uint8_t* yq = bf::OptionalOutput<uint8_t>(ctx, 1, y_shape);
    BF_REQUIRE(yq == nullptr || (yq_scale_ > 0.f && yq_scale_ != INFINITY),
               "output Yq needs the attribute yq_scale (finite, > 0): Yq = e4m3(Y / yq_scale)");
    BF_REQUIRE(y != nullptr || yq != nullptr, "neither Y nor Yq is asked for: the op would write nothing");
    // Optional output 2 (the SkipLayerNorm ops): Y in fp32, for a graph output.
    float* y32 = T::kKind == DenseKind::kBiasSkipLayerNorm ? bf::OptionalOutput<float>(ctx, 2, y_shape)
                                                           : nullptr;
    if (M == 0 || N == 0) return nullptr;
    const cudaStream_t stream = bf::ComputeStream(ctx);

    a.x = x_fp8 ? nullptr : x.as<__half>();
    a.yq = yq;
    a.yq_scale = yq_scale_;
    a.y32 = y32;
    a.weights_const = weights_const_;
    a.w = w.data;
    a.bias = bias.as<__half>();
    a.y = y;
    a.M = static_cast<int>(M);
    a.N = static_cast<int>(N);
    a.K = static_cast<int>(K);
    a.kind = T::kKind;
    a.approximate = approximate_;
    a.epsilon = epsilon_;

    bf::OrtScratch scratch(context, ctx.GetInput(0).GetTensorMemoryInfo());  // X's device
    if (y == nullptr) {  // Y left off: the GEMM and the GELU pass work in scratch, Yq is kept
      const size_t bytes = static_cast<size_t>(M) * static_cast<size_t>(N) * sizeof(__half);
      a.y = static_cast<__half*>(scratch.Get(bytes));
      a.y_unread = true;
      a.yq_dscale = yq_dscale_ ? yq_dscale_->get() : nullptr;
      BF_REQUIRE(a.y != nullptr, "no " << bytes << "-byte scratch buffer for Y");
    }
    if (x_fp8) {  // quantized upstream: read as is (bf_dense_forward never writes xq when x is null)
      a.xq = const_cast<uint8_t*>(x.as<uint8_t>());
    } else if (T::kFp8) {
      const size_t bytes = static_cast<size_t>(M) * static_cast<size_t>(K);
      a.xq = static_cast<uint8_t*>(scratch.Get(bytes));
      BF_REQUIRE(a.xq != nullptr, "no " << bytes << "-byte scratch buffer for the FP8 activations");
    }
    if (T::kFp8) {
      a.fp8 = true;
      a.w_scale = w_scale.as<float>();
      a.x_scale = x_scale_;
      a.fast_accum = fast_accum_;
    }
    BF_ORT_OK(bf::ToOrt(kOp, bertfuse::bf_dense_forward(*gemm_, stream, &scratch, a)));
    return nullptr;
  }

  int approximate_ = 0;
  float epsilon_ = 1e-12f;
  float x_scale_ = 1.f;
  bool fast_accum_ = true;
  float yq_scale_ = 0.f;
  bool weights_const_ = true;
  std::unique_ptr<bertfuse::DenseGemm> gemm_;
  std::unique_ptr<DeviceFloat> yq_dscale_;
};

template <typename T>
struct DenseOp : bf::CudaOp<DenseOp<T>, DenseKernel<T>> {
  const char* GetName() const { return T::Name(); }
  size_t GetInputTypeCount() const { return T::kInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const { return T::InputType(i); }
  // Y, optional Yq; the SkipLayerNorm ops also optional Y32
  size_t GetOutputTypeCount() const { return T::kKind == DenseKind::kBiasSkipLayerNorm ? 3 : 2; }
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    return i == 1 ? kE4M3 : i == 2 ? kF32 : kF16;
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i >= 1 || T::kYOptional ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                                   : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
};

}  // namespace

void AddDenseOps(Ort::CustomOpDomain& domain) {
  bf::AddStaticOp<DenseOp<Traits<DenseKind::kBias, false>>>(domain);
  bf::AddStaticOp<DenseOp<Traits<DenseKind::kBiasGelu, false>>>(domain);
  bf::AddStaticOp<DenseOp<Traits<DenseKind::kBiasSkipLayerNorm, false>>>(domain);
  bf::AddStaticOp<DenseOp<Traits<DenseKind::kBias, true>>>(domain);
  bf::AddStaticOp<DenseOp<Traits<DenseKind::kBiasGelu, true>>>(domain);
  bf::AddStaticOp<DenseOp<Traits<DenseKind::kBiasSkipLayerNorm, true>>>(domain);
}
