// Checked calls, one macro per library (after llm.c): cudaCheck, cublasCheck, ncclCheck.
//
// Library code never exits: a failed call throws std::runtime_error carrying file:line, the call as written and
// the library's own error string; only the program's edge (launcher, test main) decides to print and exit.
// Only plain-C library headers are included, so plain C++ files (.cpp built by the host compiler) may use these
// too, e.g. an NCCL transport in comm/.
#pragma once
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace ddplab::cuda::detail {

[[noreturn]] inline void throw_call_error(const char* library, const char* call, const char* file, int line,
                                          const std::string& what) {
  throw std::runtime_error(std::string(library) + " error at " + file + ":" + std::to_string(line) + ": " + call +
                           ": " + what);
}

inline void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw_call_error("CUDA", call, file, line, std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")");
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw_call_error("cuBLAS", call, file, line,
                   std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")");
}

inline void check_nccl(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return;
  std::string what = ncclGetErrorString(result);
  // NCCL keeps a more specific message (which rank, which transport) than the generic result string.
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') what += std::string(": ") + last;
  throw_call_error("NCCL", call, file, line, what);
}

}  // namespace ddplab::cuda::detail

// One function per library so that passing another library's status type is a compile error, not a wrong report.
#define cudaCheck(call) ::ddplab::cuda::detail::check_cuda((call), #call, __FILE__, __LINE__)
#define cublasCheck(call) ::ddplab::cuda::detail::check_cublas((call), #call, __FILE__, __LINE__)
#define ncclCheck(call) ::ddplab::cuda::detail::check_nccl((call), #call, __FILE__, __LINE__)
