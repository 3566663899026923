// The sequence kernels' launchers (kernels: sequence_kernels.cuh; contracts: sequence.h).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sequence.h"
#include "kernels/cuda/sequence_kernels.cuh"

namespace ddplab::cuda {
namespace {

using sequence::mean_pool_backward_kernel;
using sequence::mean_pool_forward_kernel;
using sequence::next_token_targets_kernel;
using sequence::zero_padded_rows_kernel;

void check_sizes(const char* what, int B, int S, int C) {
  if (B < 0 || S < 0 || C <= 0)
    throw std::invalid_argument(std::string(what) + ": need B >= 0, S >= 0 and C > 0, got B=" + std::to_string(B) +
                                " S=" + std::to_string(S) + " C=" + std::to_string(C));
}

// The kernels that give a warp each row of [B, S, width]: its rows per block of kBlockSize threads.
constexpr int kRowsPerBlock = detail::kBlockSize / 32;

}  // namespace

template <typename T>
void mean_pool_forward(T* out, const T* inp, const int32_t* lengths, int B, int S, int C, cudaStream_t stream) {
  check_sizes("mean_pool_forward", B, S, C);
  if (B == 0) return;
  // 32 columns a block and a warp for each part of the sequence (kernels/mean_pool.h).
  const dim3 grid(detail::grid_size(C, 32), static_cast<unsigned>(std::min(B, 65535)));
  mean_pool_forward_kernel<T>
      <<<grid, 32 * mean_pool::kParts, sequence::mean_pool_smem_bytes, stream>>>(out, inp, lengths, B, S, C);
  cudaCheck(cudaGetLastError());
}

template <typename T>
void mean_pool_backward(T* dinp, const T* dout, const int32_t* lengths, int B, int S, int C, cudaStream_t stream) {
  check_sizes("mean_pool_backward", B, S, C);
  const int64_t n = int64_t{B} * S * C;
  if (n == 0) return;
  constexpr int kPack = 16 / sizeof(T);  // elements in a 16-byte access
  const bool packed = C % kPack == 0 && detail::all_aligned(16, dinp, dout);
  const unsigned grid = detail::grid_size(int64_t{B} * S, kRowsPerBlock);
  if (packed)
    mean_pool_backward_kernel<T, kPack><<<grid, detail::kBlockSize, 0, stream>>>(dinp, dout, lengths, B, S, C);
  else
    mean_pool_backward_kernel<T, 1><<<grid, detail::kBlockSize, 0, stream>>>(dinp, dout, lengths, B, S, C);
  cudaCheck(cudaGetLastError());
}

void next_token_targets(int32_t* targets, const int32_t* tokens, const int32_t* lengths, const int32_t* positions,
                        int B, int S, cudaStream_t stream) {
  check_sizes("next_token_targets", B, S, 1);
  const int64_t n = int64_t{B} * S;
  if (n == 0) return;
  next_token_targets_kernel<<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(targets, tokens, lengths,
                                                                                     positions, B, S);
  cudaCheck(cudaGetLastError());
}

void zero_padded_rows(__nv_bfloat16* x, const int32_t* lengths, int B, int S, int width, cudaStream_t stream) {
  check_sizes("zero_padded_rows", B, S, width);
  const int64_t n = int64_t{B} * S * width;
  if (n == 0 || lengths == nullptr) return;
  zero_padded_rows_kernel<<<detail::grid_size(int64_t{B} * S, kRowsPerBlock), detail::kBlockSize, 0, stream>>>(
      x, lengths, B, S, width);
  cudaCheck(cudaGetLastError());
}

#define DDPLAB_INSTANTIATE(T)                                                                    \
  template void mean_pool_forward<T>(T*, const T*, const int32_t*, int, int, int, cudaStream_t); \
  template void mean_pool_backward<T>(T*, const T*, const int32_t*, int, int, int, cudaStream_t);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(__nv_bfloat16)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cuda
