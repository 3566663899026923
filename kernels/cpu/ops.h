// CPU reference ops. Every op here is the reference its CUDA twin (kernels/cuda/) is tested against.
//
// Conventions (after llm.c):
//   - argument order: outputs, inputs, sizes;
//   - gradients carry a `d` prefix;
//   - parameter gradients (dweight, dbias) are ACCUMULATED with +=, so gradient accumulation and
//     bucket views work (accumulate = false overwrites instead: a step's first backward needs no zeroed
//     buffer, which saves a pass over every gradient); activation gradients (dinp) are OVERWRITTEN with =.
//   - row-major tensors; a Linear layer's weight is [out_features, in_features] like PyTorch.
// Every op is a template instantiated for float (training) and double (finite-difference tests).
#pragma once
#include <cstdint>

namespace ddplab::cpu {

// How many float lanes the kernels with two widths (GELU; the softmax's max and exp passes, the attention's exp among
// them) run on: 16 where sixteen_lanes_available() (twice the work per instruction; on Zen 5 GELU ran twice
// as fast, the softmax 1.6x), else 8. Either width gives the same bits, so a run's figures do not depend on the width
// (replicas stay identical anyway: every rank applies the same all-reduced gradients).
// set_float_lanes picks one (8, or 16 where available) for tests and benchmarks; it throws std::invalid_argument
// otherwise.
int float_lanes();
void set_float_lanes(int lanes);
// The CPU has AVX-512 (and the OS saves its registers), and this is an optimised GCC build for x86-64.
bool sixteen_lanes_available();

// out[B,OC] = inp[B,C] @ weight[OC,C]^T            (cblas gemm)
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, int B, int C, int OC);
// dinp[B,C] = dout @ weight (skipped when dinp is null);  dweight[OC,C] += dout^T @ inp
template <typename T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int B, int C, int OC);
// The two halves of matmul_backward, so a caller can finish (and announce) the weight gradient before it
// computes the input gradient, and can compute the weight gradient in blocks of rows:
//   dinp[B,C] = dout @ weight
//   dweight[r, :] += dout[:, r]^T @ inp   for rows r in [row_begin, row_end) of the [OC, C] weight
template <typename T>
void matmul_backward_input(T* dinp, const T* dout, const T* weight, int B, int C, int OC);
template <typename T>
void matmul_backward_weight(T* dweight, const T* dout, const T* inp, int B, int C, int OC, int row_begin, int row_end,
                            bool accumulate = true);

// out[B,OC] += bias[OC] (in place, broadcast over rows)
template <typename T>
void bias_forward(T* out, const T* bias, int B, int OC);
// dbias[OC] += sum over rows of dout[B,OC]
template <typename T>
void bias_backward(T* dbias, const T* dout, int B, int OC, bool accumulate = true);

// GELU, tanh approximation (as GPT-2 and llm.c): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);
// dinp = dout * gelu'(inp)
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);

// The cross-entropy of logits [N, V] against targets, the softmax left unnormalised: exps[n, :] = exp(logits[n, :] -
// their max) and row_sums[n] = the sum of that row (exps MAY ALIAS logits), losses[n] = -log(exps[n, target] /
// row_sums[n]). The probabilities are formed by the backward, which scales every element anyway: no pass over the
// rows scales them here. Rows with targets[n] < 0 are ignored: loss 0, their exps and row_sums not written. Returns
// the mean loss over the valid rows (0 when there are none); *num_valid (if not null) receives their count.
template <typename T>
T softmax_cross_entropy_forward(T* exps, T* row_sums, T* losses, const T* logits, const int32_t* targets, int N, int V,
                                int64_t* num_valid = nullptr);
// Gradient of scale x that mean: dlogits = scale (exps / row_sums - onehot(target)) / num_valid on valid rows, 0 on
// ignored rows (scale: the weight of this batch in a larger loss, e.g. one micro-batch of several). dlogits MAY
// ALIAS exps.
template <typename T>
void softmax_cross_entropy_backward(T* dlogits, const T* exps, const T* row_sums, const int32_t* targets, int N, int V,
                                    T scale = 1);

// AdamW (decoupled weight decay, bias-corrected), step t counts from 1. The update reads each gradient as
// grads[i] * grad_scale (gradient clipping's factor, kernels/grad_clip.h; 1 leaves every bit as it was).
template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t, T grad_scale = 1);
// SGD with optional momentum (PyTorch semantics: buf = momentum*buf + g; p -= lr*buf) and weight decay; the gradient
// read as grads[i] * grad_scale, as adamw_update's.
template <typename T>
void sgd_update(T* params, const T* grads, T* momentum_buf, int64_t n, float lr, float momentum, float weight_decay,
                T grad_scale = 1);

// The sum of x[i]^2 in double (no float overflow or loss of small terms), in an order fixed by n alone: 32 running
// sums over i mod 32, then added in lane order, then the n % 32 tail. The same buffer gives the same bits on every
// rank, and ranks that sum the same reduced gradients get the same gradient norm.
double sum_of_squares(const float* x, int64_t n);

// y *= alpha
template <typename T>
void scale(T* y, T alpha, int64_t n);

// Whether every element is finite (no NaN, no Inf). One vectorised pass: x*0 is 0 exactly when x is finite.
template <typename T>
bool all_finite(const T* x, int64_t n);

// scale(y, alpha, n) then all_finite(y, n), bit for bit, in one pass over y: the gradients' mean and NaN check where
// the ring's epilogue does not do them. alpha 1 leaves y as it is (only the check runs), as callers skip a scale by 1.
template <typename T>
bool scale_and_check_finite(T* y, T alpha, int64_t n);

}  // namespace ddplab::cpu
