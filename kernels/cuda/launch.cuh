// Grid arithmetic shared by the launchers (nvcc only). Kernels use grid-stride loops over int64 indices, so the
// grid is capped and any n >= 0 is covered, including n beyond 2^31.
#pragma once
#include <algorithm>
#include <cstdint>

namespace ddplab::cuda::detail {

constexpr int kBlockSize = 256;
// Enough blocks to fill an H100/H200 many times over (132 SMs x 8 resident blocks of 256); more only adds tails.
constexpr int64_t kMaxGridSize = 65535;

inline unsigned grid_size(int64_t n, int block = kBlockSize) {
  return static_cast<unsigned>(std::min<int64_t>((n + block - 1) / block, kMaxGridSize));
}

__device__ inline int64_t global_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace ddplab::cuda::detail
