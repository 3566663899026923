// Owning handles of CUDA resources: device memory, pinned host memory, events and streams, released when the handle
// goes (never throwing: destructors run while errors unwind). Host code only; plain C++ may include it.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>

#include "kernels/cuda/check.cuh"

namespace ddplab::cuda {

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct CudaFreeHost {
  void operator()(void* p) const { cudaFreeHost(p); }
};
struct EventDestroy {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};
struct StreamDestroy {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};

using DeviceMemory = std::unique_ptr<void, CudaFree>;
using Event = std::unique_ptr<CUevent_st, EventDestroy>;
using Stream = std::unique_ptr<CUstream_st, StreamDestroy>;

inline Event make_event(unsigned flags) {
  cudaEvent_t e = nullptr;
  cudaCheck(cudaEventCreateWithFlags(&e, flags));
  return Event(e);
}

}  // namespace ddplab::cuda
