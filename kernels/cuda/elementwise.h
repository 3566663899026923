// Elementwise fp32 ops on the device: the CUDA twins of kernels/cpu/ops.h, same names and argument order
// (outputs, inputs, sizes), plus the stream they are enqueued on. Asynchronous: they return once the kernel is
// launched, and throw std::runtime_error if the launch fails. n == 0 launches nothing.
// Plain C++ may include this header (cuda_runtime_api.h is C); the kernels live in elementwise.cu.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// GELU, tanh approximation, the same formula as cpu::gelu_forward. out may alias inp.
void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream);
// dinp = dout * gelu'(inp), OVERWRITTEN (an activation gradient), as cpu::gelu_backward.
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream);

// out[B,OC] += bias[OC] (in place, broadcast over rows)
void bias_forward(float* out, const float* bias, int B, int OC, cudaStream_t stream);

// y *= alpha
void scale(float* y, float alpha, int64_t n, cudaStream_t stream);

}  // namespace ddplab::cuda
