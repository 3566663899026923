// The line every GPU benchmark starts with: the device it runs on, or why it cannot run.
#pragma once
#include <cstdio>

#include "kernels/cuda/device.h"

namespace ddplab::bench {

// Prints the device line; false, with the reason on stderr, where there is no GPU.
inline bool report_device(const char* bench) {
  const cuda::CudaInfo info = cuda::query_cuda();
  std::printf("device: %s\n", cuda::describe(info).c_str());
  if (info.available) return true;
  std::fprintf(stderr, "%s: needs a GPU: %s\n", bench, info.reason.c_str());
  return false;
}

}  // namespace ddplab::bench
