// LayerNorm's launchers (see layernorm.h for the contracts): argument checks, then the launch sequences of
// layernorm_kernels.cuh (the kernels, and each launch's grid, block and shared memory) run with <<<>>> on the caller's
// stream.
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/layernorm_kernels.cuh"

namespace ddplab::cuda {
namespace {

void check_sizes(const char* what, int N, int C) {
  if (N < 0 || C <= 0)
    throw std::invalid_argument(std::string(what) + ": need N >= 0 and C > 0, got N=" + std::to_string(N) +
                                " C=" + std::to_string(C));
}

}  // namespace

// ---- launchers --------------------------------------------------------------------------------------------------

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const float* weight, const float* bias, int N,
                       int C, cudaStream_t stream) {
  check_sizes("layernorm_forward", N, C);
  if (N == 0) return;
  layernorm_forward_launches(detail::launch_on(stream), out, mean, rstd, inp, weight, bias, N, C);
}

int64_t layernorm_backward_scratch_floats(int N, int C) {
  check_sizes("layernorm_backward_scratch_floats", N, C);
  return int64_t{layernorm::backward_blocks(N, C)} * layernorm::kMaxSums * C;
}

template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, float* scratch, const T* dout, const T* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream,
                        bool accumulate, float* dinp_columns) {
  check_sizes("layernorm_backward", N, C);
  if (N == 0) {  // empty sums
    if (!accumulate)
      for (float* sums : {dweight, dbias, dinp_columns})
        if (sums) cudaCheck(cudaMemsetAsync(sums, 0, sizeof(float) * C, stream));
    return;
  }
  if (scratch == nullptr) throw std::invalid_argument("layernorm_backward: scratch is null");
  layernorm_backward_launches(detail::launch_on(stream, /*max_shared=*/true), dinp, dweight, dbias, dinp_columns,
                              scratch, dout, inp, weight, mean, rstd, N, C, accumulate);
}

#define DDPLAB_INSTANTIATE(T)                                                                                     \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const float*, const float*, int, int,          \
                                     cudaStream_t);                                                               \
  template void layernorm_backward<T>(T*, float*, float*, float*, const T*, const T*, const float*, const float*, \
                                      const float*, int, int, cudaStream_t, bool, float*);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(__nv_bfloat16)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cuda
