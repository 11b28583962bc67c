// The ONNX Runtime entry point of libbertfuse_ops.so: SessionOptions.register_custom_ops_library
// dlopens the library and calls RegisterCustomOps, which adds the ai.bertfuse domain (opset 1)
// holding every op family's ops. The library does not link libonnxruntime: the API table comes
// from the host process (ORT_API_MANUAL_INIT, see common.h).
#include "registry.h"

#include <mutex>

#ifndef BF_VERSION
#define BF_VERSION "unknown"
#endif
#ifndef BF_CUDA_ARCHS
#define BF_CUDA_ARCHS "unknown"
#endif

#define BF_STR2(x) #x
#define BF_STR(x) BF_STR2(x)

namespace {

// Every domain ever registered. ORT keeps raw pointers to a domain in each session built from
// the options it was added to, so domains must outlive all sessions; they are deliberately
// leaked (a static destructor at exit could free one under a session still being torn down).
std::vector<Ort::CustomOpDomain>& Domains() {
    static auto* domains = new std::vector<Ort::CustomOpDomain>();
    return *domains;
}

std::mutex& DomainsMutex() {
    static auto* mu = new std::mutex();
    return *mu;
}

// The ops' names, comma-separated, in registration order (leaked like the domains).
std::string& OpNames() {
    static auto* names = new std::string();
    return *names;
}

// An error status for a host whose ORT is older than our headers: GetApi(ORT_API_VERSION)
// returns null there, so build the message with the newest API table the host does have.
OrtStatus* TooOldOrt(const OrtApiBase* api_base) {
    if (api_base == nullptr) return nullptr;
    for (uint32_t v = ORT_API_VERSION; v >= 1; --v) {
        if (const OrtApi* old = api_base->GetApi(v)) {
            std::string msg = std::string("bertfuse: libbertfuse_ops was built against ONNX Runtime API ") +
                              BF_STR(ORT_API_VERSION) + " but this onnxruntime (" + api_base->GetVersionString() +
                              ") offers at most API " + std::to_string(v) +
                              "; rebuild with `bertfuse kernels build --ort-include <its include dir>`";
            return old->CreateStatus(ORT_FAIL, msg.c_str());
        }
    }
    return nullptr;
}

}  // namespace

void bf::NoteOpName(const char* name) {
    std::string& all = OpNames();
    if (("," + all + ",").find(std::string(",") + name + ",") == std::string::npos) {
        all += (all.empty() ? "" : ",") + std::string(name);
    }
}

extern "C" BF_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                              const OrtApiBase* api_base) {
    const OrtApi* api = api_base != nullptr ? api_base->GetApi(ORT_API_VERSION) : nullptr;
    if (api == nullptr) return TooOldOrt(api_base);
    Ort::InitApi(api);
    return bf::Guard("RegisterCustomOps", [&]() -> OrtStatusPtr {
        std::lock_guard<std::mutex> lock(DomainsMutex());
        Ort::CustomOpDomain domain(bf::kDomain);
        AddDenseOps(domain);
        AddAttentionOps(domain);
        AddPackedOps(domain);
        AddPoolerOps(domain);
        AddEmbedOps(domain);
        Ort::UnownedSessionOptions(options).Add(domain);
        Domains().push_back(std::move(domain));
        return nullptr;
    });
}

// The names of the ops in the ai.bertfuse domain, comma-separated; empty until ONNX Runtime has
// called RegisterCustomOps once in this process (`bertfuse kernels check` lists unchecked ops).
extern "C" BF_EXPORT const char* bf_op_names() {
    std::lock_guard<std::mutex> lock(DomainsMutex());
    static auto* copy = new std::string();
    *copy = OpNames();
    return copy->c_str();
}

// One JSON object describing the build; read by `bertfuse kernels info` through ctypes (the
// library loads without ONNX Runtime, so this works before any session exists).
extern "C" BF_EXPORT const char* bf_library_info() {
    static const std::string info = std::string("{\"library\": \"bertfuse_ops\", \"version\": \"") + BF_VERSION +
                                    "\", \"domain\": \"" + bf::kDomain +
                                    "\", \"domain_version\": " + std::to_string(bf::kDomainVersion) +
                                    ", \"ort_api_version\": " + std::to_string(ORT_API_VERSION) +
                                    ", \"cuda_archs\": \"" + BF_CUDA_ARCHS +
                                    "\", \"cudart_version\": " + std::to_string(CUDART_VERSION) +
                                    ", \"cublas_version\": " + std::to_string(CUBLAS_VERSION) + "}";
    return info.c_str();
}
