// Elementwise ops on the device: the CUDA twins of kernels/cpu/ops.h, same names and argument order (outputs, inputs,
// sizes), plus the stream they are enqueued on. fp32, and bf16 where a bf16 step needs them (GELU backward, the
// residual add); bf16 variants compute in fp32 and round the result once. The forward's bias and GELU are the GEMM's
// epilogue (gemm.h).
// Asynchronous: they return once the kernel is launched, and throw std::runtime_error if the launch fails. n == 0
// launches nothing. Plain C++ may include this header; the kernels live in elementwise.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// dinp = dout * gelu'(inp), OVERWRITTEN (an activation gradient), as cpu::gelu_backward. dinp may alias inp or dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream);
// The same on bf16 activations: fp32 arithmetic, the result rounded to bf16 once.
void gelu_backward(__nv_bfloat16* dinp, const __nv_bfloat16* inp, const __nv_bfloat16* dout, int64_t n,
                   cudaStream_t stream);

// out = a + b, fp32: the GPU ring all-reduce's reduction (comm/ring_cuda.h), the CPU's residual_forward on the GPU.
// out may alias a or b. (The models add their residual in the GEMM's epilogue: matmul_residual_forward.)
void residual_forward(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);

// y *= alpha
void scale(float* y, float alpha, int64_t n, cudaStream_t stream);

}  // namespace ddplab::cuda
