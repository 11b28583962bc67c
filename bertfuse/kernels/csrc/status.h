// bf::Status, the one error type inside csrc/: a code and a message, ok() when the code is kOk.
//
// The rule: host code returns a Status; a kernel launcher returns CUDA's own cudaError_t (what
// cudaLaunchKernelEx gives) and its first caller turns it into a Status (Status::Cuda). A Status
// becomes an OrtStatusPtr only at the ORT op boundary (bf::ToOrt in common.h, in each op's
// Compute) and an int plus a last-error string only at the exported C entry points
// (check_dense.cu). No ORT header here: the .cu files include it without onnxruntime's headers.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

namespace bf {

enum class Code : int {
  kOk = 0,
  kInvalidArgument = 1,  // the caller's shapes or pointers
  kUnsupported = 2,      // no kernel or algorithm for this problem (asked by a can_implement)
  kCuda = 3,             // a CUDA runtime call or launch failed
  kCublas = 4,           // a cuBLASLt call failed
  kInternal = 5,         // anything else (an allocation, a missing workspace)
};

class Status {
 public:
  Status() = default;  // ok
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status Error(std::string message, Code code = Code::kInternal) { return Status(code, std::move(message)); }
  static Status Unsupported(std::string message) { return Status(Code::kUnsupported, std::move(message)); }
  // "what: cudaErrorX (its description)".
  static Status Cuda(const std::string& what, cudaError_t err) {
    return Status(Code::kCuda, what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  // "what (status N)", N the cublasStatus_t (or another library's status) as a number.
  static Status WithCode(const std::string& what, int status, Code code = Code::kCublas) {
    return Status(code, what + " (status " + std::to_string(status) + ")");
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace bf

// Returns the Status of `expr` from the enclosing function (which returns bf::Status) if not ok.
#define BF_RETURN_IF_ERROR(expr)              \
  do {                                        \
    ::bf::Status bf_status_ = (expr);         \
    if (!bf_status_.ok()) return bf_status_;  \
  } while (0)
