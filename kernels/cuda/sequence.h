// Ops that follow the sequences of a padded batch [B, S, ...] on the device: the classifier's mean pool, the
// causal LM's next-token targets, and zeroing padded rows. CUDA twins of cpu::mean_pool_forward / mean_pool_backward /
// next_token_targets (kernels/cpu/transformer_ops.h), same arguments plus the stream, same padding rule: `lengths`
// (int32 [B], device memory, each clamped to [0, S]; null = every sequence is S long) marks t >= lengths[b] as padding.
// Of packed rows (positions), only the causal LM's targets need to know: the classifier's pool never sees them.
//
// Precision: inp/out/dout/dinp are T = float or __nv_bfloat16; the sums and the scaling are fp32, rounded once.
// For fp32 the results are bitwise the CPU's (the same additions in the same order, then one multiply).
// Asynchronous; bad sizes throw std::invalid_argument, a failed launch std::runtime_error. Empty problems launch
// nothing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// out[b,:] = mean over t < len[b] of inp[b,t,:] (0 for a zero-length sequence). inp [B, S, C], out [B, C] OVERWRITTEN.
template <typename T>
void mean_pool_forward(T* out, const T* inp, const int32_t* lengths, int B, int S, int C, cudaStream_t stream);

// dinp[b,t,:] = dout[b,:] / len[b] for t < len[b], 0 for padded t: OVERWRITTEN (an activation gradient).
template <typename T>
void mean_pool_backward(T* dinp, const T* dout, const int32_t* lengths, int B, int S, int C, cudaStream_t stream);

// targets[b,t] = tokens[b,t+1] for t + 1 < len[b] where token t + 1 is of the same sequence (positions[b,t+1] != 0
// when packed: positions as cpu::next_token_targets', device memory, or null), else -1 (ignored by
// softmax_cross_entropy_fused). [B, S] int32, OVERWRITTEN; tokens at padded positions are never read.
void next_token_targets(int32_t* targets, const int32_t* tokens, const int32_t* lengths, const int32_t* positions,
                        int B, int S, cudaStream_t stream);

// x[b,t,:] = 0 for every padded t (t >= len[b]); valid rows untouched. x [B, S, width] bf16. For outputs whose
// padded rows a library leaves unspecified (cudnn_attention.h).
void zero_padded_rows(__nv_bfloat16* x, const int32_t* lengths, int B, int S, int width, cudaStream_t stream);

}  // namespace ddplab::cuda
