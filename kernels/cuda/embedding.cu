// The embedding launchers (kernels: embedding_kernels.cuh; contracts: embedding.h).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

using embedding::embedding_backward_wpe_kernel;
using embedding::embedding_backward_wte_kernel;
using embedding::embedding_forward_kernel;
using embedding::kBlock;
using embedding::kVec;
using embedding::kWarps;

void check_sizes(const char* what, int B, int S, int C) {
  if (B < 0 || S < 0 || C <= 0)
    throw std::invalid_argument(std::string(what) + ": need B >= 0, S >= 0 and C > 0, got B=" + std::to_string(B) +
                                " S=" + std::to_string(S) + " C=" + std::to_string(C));
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const int32_t* lengths, const float* wte, const float* wpe, int B,
                       int S, int C, cudaStream_t stream) {
  check_sizes("embedding_forward", B, S, C);
  const int64_t rows = int64_t{B} * S;
  if (rows == 0) return;
  const unsigned grid = detail::grid_size(rows, kWarps);
  constexpr int V = kVec<T>;
  if (C % V == 0 && detail::all_aligned(16, out) && detail::all_aligned(V * 4, wte, wpe))
    embedding_forward_kernel<T, V><<<grid, kBlock, 0, stream>>>(out, tokens, lengths, wte, wpe, B, S, C);
  else
    embedding_forward_kernel<T, 1><<<grid, kBlock, 0, stream>>>(out, tokens, lengths, wte, wpe, B, S, C);
  cudaCheck(cudaGetLastError());
}

template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, const int32_t* lengths, int B,
                        int S, int C, cudaStream_t stream) {
  check_sizes("embedding_backward", B, S, C);
  const int64_t rows = int64_t{B} * S;
  if (rows == 0) return;
  constexpr int V = kVec<T>;
  const bool vec = C % V == 0 && detail::all_aligned(16, dout) && detail::all_aligned(V * 4, dwte, dwpe);
  const unsigned grid = detail::grid_size(rows, kWarps);
  if (vec)
    embedding_backward_wte_kernel<T, V><<<grid, kBlock, 0, stream>>>(dwte, dout, tokens, lengths, B, S, C);
  else
    embedding_backward_wte_kernel<T, 1><<<grid, kBlock, 0, stream>>>(dwte, dout, tokens, lengths, B, S, C);
  cudaCheck(cudaGetLastError());
  if (dwpe != nullptr) {
    const int v = vec ? V : 1;
    const dim3 wpe_grid(static_cast<unsigned>((C / v + kBlock - 1) / kBlock),
                        static_cast<unsigned>(std::min(S, 65535)));
    if (vec)
      embedding_backward_wpe_kernel<T, V><<<wpe_grid, kBlock, 0, stream>>>(dwpe, dout, lengths, B, S, C);
    else
      embedding_backward_wpe_kernel<T, 1><<<wpe_grid, kBlock, 0, stream>>>(dwpe, dout, lengths, B, S, C);
    cudaCheck(cudaGetLastError());
  }
}

#define DDPLAB_INSTANTIATE(T)                                                                                       \
  template void embedding_forward<T>(T*, const int32_t*, const int32_t*, const float*, const float*, int, int, int, \
                                     cudaStream_t);                                                                 \
  template void embedding_backward<T>(float*, float*, const T*, const int32_t*, const int32_t*, int, int, int,      \
                                      cudaStream_t);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(__nv_bfloat16)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cuda
