// The conversion and gradient-check launchers (kernels: convert_kernels.cuh; contracts: convert.h).
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/convert_kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

using convert::bf16_to_f32_kernel;
using convert::f32_to_bf16_kernel;
using convert::scale_and_check_finite_kernel;

void check_count(const char* what, int64_t n) {
  if (n < 0) throw std::invalid_argument(std::string(what) + ": negative n " + std::to_string(n));
}

}  // namespace

void f32_to_bf16(__nv_bfloat16* dst, const float* src, int64_t n, cudaStream_t stream) {
  check_count("f32_to_bf16", n);
  if (n == 0) return;
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  detail::launch_packed(detail::map_packs_fit(d, src), n, stream, f32_to_bf16_kernel<4>, f32_to_bf16_kernel<1>, d, src,
                        n);
  cudaCheck(cudaGetLastError());
}

void bf16_to_f32(float* dst, const __nv_bfloat16* src, int64_t n, cudaStream_t stream) {
  check_count("bf16_to_f32", n);
  if (n == 0) return;
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  detail::launch_packed(detail::map_packs_fit(dst, s), n, stream, bf16_to_f32_kernel<4>, bf16_to_f32_kernel<1>, dst, s,
                        n);
  cudaCheck(cudaGetLastError());
}

void scale_and_check_finite(float* x, float s, int64_t n, int* flag, cudaStream_t stream) {
  check_count("scale_and_check_finite", n);
  if (n == 0) return;
  if (flag == nullptr) throw std::invalid_argument("scale_and_check_finite: flag is null");
  detail::launch_packed(detail::all_aligned(16, x), n, stream, scale_and_check_finite_kernel<4>,
                        scale_and_check_finite_kernel<1>, x, s, n, flag);
  cudaCheck(cudaGetLastError());
}

}  // namespace ddplab::cuda
