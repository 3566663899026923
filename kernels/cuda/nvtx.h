// An NVTX range for a C++ scope: what Nsight Systems shows on the host timeline (the kernels it launches appear on
// their streams). NVTX3 is header-only; link CUDA::nvtx3 for the include path.
#pragma once
#include <nvtx3/nvToolsExt.h>

namespace ddplab::cuda {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace ddplab::cuda
