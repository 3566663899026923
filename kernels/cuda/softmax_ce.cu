// Fused softmax cross-entropy (see softmax_ce.h for the contract): the argument checks; the
// kernels and their launch sequence are softmax_ce_kernels.cuh's.
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/softmax_ce.h"
#include "kernels/cuda/softmax_ce_kernels.cuh"

namespace ddplab::cuda {

template <typename T>
void softmax_cross_entropy_fused(T* dlogits, float* losses, float* mean_loss, int* num_valid, const T* logits,
                                 const int32_t* targets, int N, int V, float grad_scale, cudaStream_t stream,
                                 CrossEntropyRows rows) {
  if (N < 0 || V <= 0)
    throw std::invalid_argument("softmax_cross_entropy_fused: need N >= 0 and V > 0, got N=" + std::to_string(N) +
                                " V=" + std::to_string(V));
  if (num_valid == nullptr || (N > 0 && losses == nullptr))
    throw std::invalid_argument("softmax_cross_entropy_fused: num_valid and losses must not be null");
  int device = 0, max_block_smem = 0;
  if (rows == CrossEntropyRows::kStaged) {
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&max_block_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  }
  softmax_cross_entropy_launches(detail::launch_on(stream, /*max_shared=*/rows == CrossEntropyRows::kStaged), dlogits,
                                 losses, mean_loss, num_valid, logits, targets, N, V, grad_scale, rows,
                                 detail::kMaxGridSize, static_cast<size_t>(max_block_smem));
}

template void softmax_cross_entropy_fused<float>(float*, float*, float*, int*, const float*, const int32_t*, int, int,
                                                 float, cudaStream_t, CrossEntropyRows);
template void softmax_cross_entropy_fused<__nv_bfloat16>(__nv_bfloat16*, float*, float*, int*, const __nv_bfloat16*,
                                                         const int32_t*, int, int, float, cudaStream_t,
                                                         CrossEntropyRows);

}  // namespace ddplab::cuda
