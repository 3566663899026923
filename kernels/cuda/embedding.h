// Token + position embedding on the device: the CUDA twin of cpu::embedding_forward / embedding_backward
// (kernels/cpu/transformer_ops.h), same padding rule: rows t >= lengths[b] are 0 and their tokens are never read
// (lengths null: every sequence is S long). Tokens of valid rows must lie in [0, V) of wte [V, C]; wpe is [>= S, C].
//
// Precision: out and dout are T = float or __nv_bfloat16; the tables and their gradients are fp32.
// Asynchronous; bad sizes throw std::invalid_argument, a failed launch std::runtime_error. B*S == 0 launches nothing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] for t < len[b] (no wpe term when wpe is null); 0 for padded t.
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const int32_t* lengths, const float* wte, const float* wpe, int B,
                       int S, int C, cudaStream_t stream);

// dwte[tokens[b,t],:] += dout[b,t,:] and dwpe[t,:] += dout[b,t,:] for t < len[b] (dwpe may be null); ACCUMULATES.
//   dwpe: deterministic and, for fp32 dout, bitwise equal to the CPU: one thread per (t, c) sums over b in order.
//   dwte: atomics (fp32 atomicAdd, 16-byte vector atomics on sm_90). A token that occurs more than once in the batch
//         is summed in an order that can change from run to run, so its row may differ in the last bits. (A
//         deterministic dwte needs the rows grouped by token, i.e. a sort; not done here.)
template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, const int32_t* lengths, int B,
                        int S, int C, cudaStream_t stream);

}  // namespace ddplab::cuda
