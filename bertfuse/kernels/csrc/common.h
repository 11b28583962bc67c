// Small helpers every bertfuse op uses: ORT's C++ API set up for a custom-op library, CUDA /
// cuBLASLt errors turned into ORT error statuses (a bad call never aborts the host process),
// the compute stream, attributes with defaults, and shape helpers.
//
// Include this header (not onnxruntime_cxx_api.h directly) in every file that touches ORT:
// ORT_API_MANUAL_INIT must be defined identically in every translation unit (ODR), and
// RegisterCustomOps (ops.cc) calls Ort::InitApi with the API the host process hands us.
//
// Kernel conventions (see bertfuse/kernels/README.md, "Building the op library", and the op contract):
//   - ops derive from bf::CudaOp<Op, Kernel> (status-returning ComputeV2, CUDA EP only);
//   - Kernel::ComputeV2 wraps its body in bf::Guard so no C++ exception crosses into ORT;
//   - launches go on bf::ComputeStream(ctx); nothing allocates or synchronises inside Compute.
#pragma once

#ifndef ORT_API_MANUAL_INIT
#define ORT_API_MANUAL_INIT
#endif
#include <onnxruntime_cxx_api.h>

#include <cuda_runtime.h>
#include <cublasLt.h>

#include <cstdint>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "status.h"

// Symbols are hidden by default (-fvisibility=hidden); only entry points carry BF_EXPORT.
#define BF_EXPORT __attribute__((visibility("default")))

namespace bf {

constexpr const char* kCudaEp = "CUDAExecutionProvider";

// ---- status construction -------------------------------------------------------------------

// Builds an ORT error status. Every message starts with "bertfuse <op>: " so a failure in a big
// graph names the op that raised it.
inline OrtStatusPtr Error(const char* op, const std::string& what, OrtErrorCode code = ORT_FAIL) {
    std::string msg = std::string("bertfuse ") + (op ? op : "op") + ": " + what;
    return Ort::GetApi().CreateStatus(code, msg.c_str());
}

inline OrtStatusPtr InvalidArgument(const char* op, const std::string& what) {
    return Error(op, what, ORT_INVALID_ARGUMENT);
}

// The op boundary's form of a bf::Status (status.h): nullptr when ok, else an ORT_EP_FAIL status
// with its message.
inline OrtStatusPtr ToOrt(const char* op, const Status& st) {
    return st.ok() ? nullptr : Error(op, st.message(), ORT_EP_FAIL);
}

inline OrtStatusPtr CudaError(const char* op, cudaError_t err, const char* expr, const char* file, int line) {
    std::ostringstream s(std::ios_base::out);  // see glibcxx_compat.cc
    s << "CUDA error " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") from " << expr
      << " at " << file << ":" << line;
    return Error(op, s.str(), ORT_EP_FAIL);
}

inline const char* CublasStatusName(cublasStatus_t st) {
    switch (st) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
        default: return "CUBLAS_STATUS_<unknown>";
    }
}

inline OrtStatusPtr CublasError(const char* op, cublasStatus_t st, const char* expr, const char* file, int line) {
    std::ostringstream s(std::ios_base::out);  // see glibcxx_compat.cc
    s << "cuBLAS error " << CublasStatusName(st) << " (" << static_cast<int>(st) << ") from " << expr << " at "
      << file << ":" << line;
    return Error(op, s.str(), ORT_EP_FAIL);
}

}  // namespace bf

// Each macro returns an ORT error status from the enclosing function (which must return
// OrtStatusPtr) and expects a `const char* kOp` (or any expression named kOp) naming the op in
// scope, e.g. `static constexpr const char* kOp = "DenseBias";` in the kernel class.
#define BF_CUDA_OK(expr)                                                              \
    do {                                                                              \
        cudaError_t bf_err_ = (expr);                                                 \
        if (bf_err_ != cudaSuccess) return ::bf::CudaError(kOp, bf_err_, #expr, __FILE__, __LINE__); \
    } while (0)

#define BF_CUBLAS_OK(expr)                                                            \
    do {                                                                              \
        cublasStatus_t bf_st_ = (expr);                                               \
        if (bf_st_ != CUBLAS_STATUS_SUCCESS)                                          \
            return ::bf::CublasError(kOp, bf_st_, #expr, __FILE__, __LINE__);         \
    } while (0)

// Propagates an OrtStatusPtr (nullptr = success) from a helper call.
#define BF_ORT_OK(expr)                                                               \
    do {                                                                              \
        OrtStatusPtr bf_status_ = (expr);                                             \
        if (bf_status_ != nullptr) return bf_status_;                                 \
    } while (0)

// Returns an ORT_INVALID_ARGUMENT status built from a stream expression when cond is false:
//   BF_REQUIRE(K == W_rows, "X's last dim " << K << " != W's rows " << W_rows);
#define BF_REQUIRE(cond, stream_msg)                                                  \
    do {                                                                              \
        if (!(cond)) {                                                                \
            std::ostringstream bf_msg_(std::ios_base::out);                          \
            bf_msg_ << stream_msg;                                                    \
            return ::bf::InvalidArgument(kOp, bf_msg_.str());                         \
        }                                                                             \
    } while (0)

namespace bf {

// Runs body (returning OrtStatusPtr) and turns any C++ exception into an ORT error status:
// the Ort:: C++ wrappers throw Ort::Exception, and an exception must never unwind into ORT.
template <typename F>
OrtStatusPtr Guard(const char* op, F&& body) noexcept {
    try {
        return std::forward<F>(body)();
    } catch (const Ort::Exception& e) {
        return Error(op, e.what(), e.GetOrtErrorCode());
    } catch (const std::exception& e) {
        return Error(op, e.what());
    } catch (...) {
        return Error(op, "unknown C++ exception");
    }
}

// ---- compute stream ------------------------------------------------------------------------

// The CUDA EP's compute stream for this run. Every launch and cuBLASLt call goes on it (never the
// legacy default stream), so ORT's CUDA graph capture records them.
inline cudaStream_t ComputeStream(const Ort::KernelContext& ctx) {
    return reinterpret_cast<cudaStream_t>(ctx.GetGPUComputeStream());
}

// ---- attributes with defaults (read once, in the kernel constructor) ------------------------

inline int64_t AttrInt(const OrtKernelInfo* info, const char* name, int64_t dflt) {
    int64_t v = dflt;
    OrtStatusPtr st = Ort::GetApi().KernelInfoGetAttribute_int64(info, name, &v);
    if (st != nullptr) {  // absent attribute
        Ort::GetApi().ReleaseStatus(st);
        return dflt;
    }
    return v;
}

inline float AttrFloat(const OrtKernelInfo* info, const char* name, float dflt) {
    float v = dflt;
    OrtStatusPtr st = Ort::GetApi().KernelInfoGetAttribute_float(info, name, &v);
    if (st != nullptr) {
        Ort::GetApi().ReleaseStatus(st);
        return dflt;
    }
    return v;
}

// The attention ops' attributes: num_heads (required, >= 1) and scale (>= 0; 0 = 1/sqrt(head
// size)). Throws at kernel creation, which ORT reports as the session's load error.
inline void HeadAttrs(const OrtKernelInfo* info, int64_t* num_heads, float* scale) {
    *num_heads = AttrInt(info, "num_heads", 0);
    if (*num_heads < 1) throw std::runtime_error("attribute num_heads is required and must be >= 1");
    *scale = AttrFloat(info, "scale", 0.0f);
    if (!(*scale >= 0.0f)) throw std::runtime_error("attribute scale must be >= 0 (0 = 1/sqrt(head size))");
}

// ---- shapes --------------------------------------------------------------------------------

using Shape = std::vector<int64_t>;

inline std::string ShapeStr(const Shape& s) {
    std::ostringstream o(std::ios_base::out);
    o << "[";
    for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
    o << "]";
    return o.str();
}

inline int64_t Numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

// Product of the leading dims (all but the last): the GEMM M of an [.., K] activation.
inline int64_t LeadingProduct(const Shape& s) {
    int64_t n = 1;
    for (size_t i = 0; i + 1 < s.size(); ++i) n *= s[i];
    return n;
}

// Same leading dims as `like`, last dim replaced by `last`: the output shape of a dense op.
inline Shape WithLastDim(Shape like, int64_t last) {
    if (like.empty()) like.push_back(last);
    else like.back() = last;
    return like;
}

inline const char* ElemTypeName(ONNXTensorElementDataType t) {
    switch (t) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN: return "float8e4m3fn";
        default: return "<other>";
    }
}

// One input as the kernel sees it: device pointer, shape, element type. `present` is false for an
// omitted optional input (ORT hands a null value or the slot is past the input count).
struct TensorArg {
    bool present = false;
    const void* data = nullptr;
    Shape shape;
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;

    template <typename T>
    const T* as() const { return static_cast<const T*>(data); }
};

// Reads input `index`; `name` is only for messages. With required=true a missing input is an error.
inline OrtStatusPtr GetInput(const char* kOp, const Ort::KernelContext& ctx, size_t index, const char* name,
                             bool required, TensorArg* out) {
    *out = TensorArg{};
    if (index >= ctx.GetInputCount()) {
        BF_REQUIRE(!required, "missing required input " << index << " '" << name << "'");
        return nullptr;
    }
    Ort::ConstValue v = ctx.GetInput(index);
    if (v == nullptr) {  // omitted optional slot
        BF_REQUIRE(!required, "missing required input " << index << " '" << name << "'");
        return nullptr;
    }
    auto info = v.GetTensorTypeAndShapeInfo();
    out->present = true;
    out->shape = info.GetShape();
    out->type = info.GetElementType();
    out->data = v.GetTensorRawData();
    return nullptr;
}

// Checks an input's element type (the graph may be wrong; ORT's type check covers declared types
// only, and optional/multi-type slots are declared UNDEFINED).
inline OrtStatusPtr ExpectType(const char* kOp, const TensorArg& t, const char* name, ONNXTensorElementDataType want) {
    BF_REQUIRE(t.type == want, "input '" << name << "' is " << ElemTypeName(t.type) << ", expected " << ElemTypeName(want));
    return nullptr;
}

inline OrtStatusPtr ExpectRank(const char* kOp, const TensorArg& t, const char* name, size_t lo, size_t hi) {
    BF_REQUIRE(t.shape.size() >= lo && t.shape.size() <= hi,
               "input '" << name << "' has shape " << ShapeStr(t.shape) << "; expected rank " << lo
                         << (hi != lo ? (" to " + std::to_string(hi)) : std::string()));
    return nullptr;
}

// Allocates output `index` (ORT owns the memory; no cudaMalloc in Compute).
template <typename T>
inline T* Output(Ort::KernelContext& ctx, size_t index, const Shape& shape) {
    Ort::UnownedValue v = ctx.GetOutput(index, shape.data(), shape.size());
    return v.GetTensorMutableData<T>();
}

// Output `index` where the node has it (an optional output the graph asks for), else nullptr.
template <typename T>
inline T* OptionalOutput(Ort::KernelContext& ctx, size_t index, const Shape& shape) {
    if (ctx.GetOutputCount() <= index) return nullptr;
    OrtValue* v = nullptr;
    Ort::ThrowOnError(Ort::GetApi().KernelContext_GetOutput(ctx.GetOrtKernelContext(), index, shape.data(),
                                                              shape.size(), &v));
    return v == nullptr ? nullptr : Ort::UnownedValue(v).GetTensorMutableData<T>();
}

// ---- op base -------------------------------------------------------------------------------

// A CUDA-EP custom op whose kernel returns a status (ComputeV2) instead of throwing.
// Derive as `struct DenseBiasOp : bf::CudaOp<DenseBiasOp, DenseBiasKernel> { ... }` and provide
// GetName, GetInputTypeCount/GetInputType, GetOutputTypeCount/GetOutputType (and
// GetInputCharacteristic for optional inputs). The kernel class provides
// `OrtStatusPtr ComputeV2(OrtKernelContext*)` and a constructor `Kernel(const OrtApi&, const OrtKernelInfo*)`.
// The kernel constructor may not fail loudly (it runs inside CreateKernelV2 below, which catches).
template <typename TOp, typename TKernel>
struct CudaOp : Ort::CustomOpBase<TOp, TKernel, /*WithStatus=*/true> {
    const char* GetExecutionProviderType() const { return kCudaEp; }

    OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
        *kernel = nullptr;
        return Guard(static_cast<const TOp*>(this)->GetName(), [&]() -> OrtStatusPtr {
            *kernel = new TKernel(api, info);
            return nullptr;
        });
    }
};

}  // namespace bf
