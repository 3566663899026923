// The elementwise kernels (launchers and contracts: elementwise.h; the GEMM's fallback epilogue: gemm.h). Included
// by elementwise.cu, gemm.cu and, compiled by g++, by tests/emu/test_elementwise_emu.cpp.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda::elementwise {

using detail::global_index;
using detail::grid_stride;

using detail::kGeluCubic;
using detail::kSqrt2OverPi;
// 3 x 0.044715, rounded to float once.
constexpr float kGeluCubic3 = static_cast<float>(3 * 0.044715);

// dinp = dout x GELU'(inp). T is the activation type (float or __nv_bfloat16); the arithmetic is fp32 either way.
template <typename T>
struct GeluGradient {
  __device__ T operator()(T inp, T dout) const {
    const float x = detail::to_float(inp);
    const float th = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float du_dx = kSqrt2OverPi * (1.0f + kGeluCubic3 * x * x);
    return detail::from_float<T>(detail::to_float(dout) * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx));
  }
};

// The streaming kernels below move V elements per access (V = 4: 16 bytes of fp32, 8 of bf16) where the pointers
// allow it (launch_packed). One element at a time, bf16's 2-byte accesses held the residual sum to 47% of a copy of
// its bytes on an H200 and fp32's to 74%.
template <typename T, int V>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  detail::zip_elements<V>(dinp, inp, dout, n, GeluGradient<T>{});
}

// cuBLASLt's forward epilogue where it has none for the problem (gemm.cu): v = out + bias; then pre = v,
// out = gelu(v) (kGelu) or out = v. V consecutive columns a thread (16-byte accesses of out and pre_gelu, where they
// are aligned and OC % V == 0; else V = 1), across threads (coalesced), rows across blockIdx.y; the thread's V bias
// values loaded one by one (the bias is what cuBLASLt refused: it may lie one element along) and kept down its rows.
// T is the activation type, the arithmetic fp32. One element a thread, bf16's 2-byte accesses moved its bytes at 40%
// of a copy's rate on an H200.
template <typename T, bool kGelu, int V>
__global__ void bias_gelu_epilogue_kernel(T* out, T* pre_gelu, const T* bias, int B, int OC) {
  for (int64_t pack = global_index(); pack < OC / V; pack += grid_stride()) {
    const int64_t o = pack * V;
    float b[V];
#pragma unroll
    for (int k = 0; k < V; ++k) b[k] = bias ? detail::to_float(bias[o + k]) : 0.0f;
    for (int64_t row = blockIdx.y; row < B; row += gridDim.y) {
      const int64_t i = row * OC + o;
      const detail::Pack<T, V> x = detail::load_pack<V>(out + i);
      detail::Pack<T, V> pre, y;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float v = detail::to_float(x.v[k]) + b[k];
        pre.v[k] = detail::from_float<T>(v);
        y.v[k] = kGelu ? detail::from_float<T>(detail::gelu_tanh(v)) : pre.v[k];
      }
      if constexpr (kGelu) detail::store_pack(pre_gelu + i, pre);
      detail::store_pack(out + i, y);
    }
  }
}

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <int V>
__global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t n) {
  detail::zip_elements<V>(out, a, b, n, Add{});
}

struct ScaleBy {
  float alpha;
  __device__ float operator()(float x) const { return x * alpha; }
};

template <int V>
__global__ void scale_kernel(float* y, float alpha, int64_t n) {
  detail::map_elements<V>(y, y, n, ScaleBy{alpha});
}

}  // namespace ddplab::cuda::elementwise
