// Softmax cross-entropy on the device, forward and backward fused: one read of the logits gives the per-row loss
// and dlogits, and the probabilities are never stored. The twin of cpu::softmax_cross_entropy_forward followed by
// cpu::softmax_cross_entropy_backward (kernels/cpu/ops.h), with the same ignore rule: rows with
// targets[n] < 0 are padding.
//
// Precision: logits and dlogits are T = float or __nv_bfloat16; losses, the mean and all arithmetic are fp32 (the
// mean is summed in double, as the CPU reference does).
// Asynchronous; bad sizes throw std::invalid_argument, a failed launch std::runtime_error. N == 0 writes
// *num_valid = 0 and *mean_loss = 0.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// How the row kernel reads a row: twice from memory (streamed: any width), or once, staged in shared memory where the
// row fits a block's (bf16 rows to ~113K, fp32 to ~56K on an H100/H200; wider rows, and rows that do not take 16-byte
// packs, are streamed). Staged is the default: on an H200 it took gpt2-small's bf16 rows in 0.555 ms against 0.588
// and its fp32 ones in 1.009 against 1.157 (docs/BENCHMARKS.md).
enum class CrossEntropyRows { kStreamed, kStaged };

// For the N rows of logits [N, V]:
//   losses[n]    = logsumexp(logits[n, :]) - logits[n, targets[n]] on valid rows, 0 on ignored rows;
//   dlogits[n,:] = grad_scale x (softmax(logits[n, :]) - onehot(targets[n])) / num_valid on valid rows, 0 on
//                  ignored rows: the gradient of grad_scale x the mean loss (a micro-batch's or rank's weight in a
//                  larger loss, at no extra pass), OVERWRITTEN. dlogits MAY ALIAS logits; null computes the forward
//                  only;
//   *num_valid   = the number of valid rows (device memory, required: the gradient needs it);
//   *mean_loss   = the mean of losses over the valid rows, 0 when there are none (device memory; may be null).
// A target >= V is a caller bug; its row's loss is NaN (visible) rather than a read out of bounds.
template <typename T>
void softmax_cross_entropy_fused(T* dlogits, float* losses, float* mean_loss, int* num_valid, const T* logits,
                                 const int32_t* targets, int N, int V, float grad_scale, cudaStream_t stream,
                                 CrossEntropyRows rows = CrossEntropyRows::kStaged);

}  // namespace ddplab::cuda
