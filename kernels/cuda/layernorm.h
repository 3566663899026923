// LayerNorm on the device: the CUDA twin of cpu::layernorm_forward / layernorm_backward
// (kernels/cpu/transformer_ops.h). Same math — biased variance by two passes, eps 1e-5, rstd = 1 / sqrt(var + eps) —
// and the same argument order, plus the scratch and stream the GPU needs.
//
// Precision: activations (inp, out, dout, dinp) are T = float or __nv_bfloat16; weight, bias, their gradients, mean
// and rstd are always fp32, and every kernel computes in fp32.
// Asynchronous; bad sizes throw std::invalid_argument, a failed launch std::runtime_error. N == 0 launches nothing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// out[n,:] = (inp[n,:] - mean[n]) * rstd[n] * weight + bias over N rows of C; saves mean[N] and rstd[N].
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const float* weight, const float* bias, int N,
                       int C, cudaStream_t stream);

// Floats of scratch that layernorm_backward needs for N rows of C (0 when N == 0).
int64_t layernorm_backward_scratch_floats(int N, int C);

// dinp += dL/dinp (ACCUMULATES, as the CPU reference: the residual stream's gradient), dweight += sum_n dout * xhat,
// dbias += sum_n dout (accumulate = false: = instead, for dweight, dbias and dinp_columns, not dinp, as the CPU's).
// dinp_columns, where not null: += (or =) sum_n of dinp's new values, i.e. cpu::bias_backward over dinp after the call,
// in the same pass: the bias gradient of a Linear whose output gradient the residual stream's is. Deterministic: the
// parameter gradients are summed in a fixed order that depends only on (N, C) and whether the operands allow 16-byte
// accesses, never on timing (per-block partials in `scratch`, then a fixed-order reduction; no atomics).
template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, float* scratch, const T* dout, const T* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream,
                        bool accumulate = true, float* dinp_columns = nullptr);

}  // namespace ddplab::cuda
