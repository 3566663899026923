// CPU reference ops of the transformer (model/transformer.h). Matmul, bias, GELU and the cross-entropy come from
// ops.h.
//
// Conventions as in ops.h (after llm.c): outputs, inputs, sizes; parameter gradients ACCUMULATE (+=); activation
// gradients OVERWRITE (=), except layernorm_backward's dinp, which accumulates because a LayerNorm always sits on
// a residual branch (documented there). Row-major; a sequence batch is [B, S, ...] with S the padded length.
//
// Variable lengths: `lengths` (int32 [B], each in [0, S]; null means every sequence is S long) marks positions
// t >= lengths[b] as padding. Every op below treats padding so that it has NO effect on anything real:
//   - embedding: padded rows are 0 and their tokens are never read (any value, even out of range, is fine);
//   - attention: padded keys get weight exactly 0, padded query rows output 0 and pass no gradient back;
//   - mean pool: averages over the true length only;
//   - cross-entropy (ops.h): rows with a negative target are ignored; the mean is over the valid rows.
// Hence the gradient reaching a padded row is exactly 0, and so is its contribution to every parameter gradient.
//
// Packed rows: `positions` (int32 [B, S], or null) gives each valid token's position within its own sequence, so a
// row may hold several sequences back to back, each starting at position 0 (as Hugging Face's position_ids for
// packed batches). The embedding adds wpe[position] and attention stays within each sequence (a block-diagonal
// mask). The caller guarantees the form: positions[b, 0] == 0, then each is 0 (a new sequence) or the previous
// plus 1. Null positions: one sequence per row, position t.
#pragma once
#include <cstdint>

namespace ddplab::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[p,:] for t < len[b], p = positions[b,t] or t (no wpe term when wpe is
// null); out[b,t,:] = 0 for padded t. wte [V, C], wpe [>= S, C].
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const int32_t* lengths, const T* wte, const T* wpe, int B, int S,
                       int C, const int32_t* positions = nullptr);
// dwte[tokens[b,t],:] += dout[b,t,:] and dwpe[p,:] += dout[b,t,:] for t < len[b] (dwpe may be null).
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, const int32_t* lengths, int B, int S,
                        int C, const int32_t* positions = nullptr);
// dwte as the GPU sums it (cuda::embedding_backward): each token's valid rows in row order, cut into pieces of
// piece_rows rows; the first piece added onto dwte row by row, each later piece summed from zero, then added onto dwte
// in order. With no token on more than piece_rows rows, embedding_backward's dwte bit for bit.
void embedding_backward_wte_in_pieces(float* dwte, const float* dout, const int32_t* tokens, const int32_t* lengths,
                                      int B, int S, int C, int piece_rows);

// out[n,:] = (inp[n,:] - mean) * rstd * weight + bias over N rows of C, rstd = 1/sqrt(var + 1e-5) (biased var).
// Saves mean[N] and rstd[N] for backward.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C);
// dinp += dL/dinp (ACCUMULATES: the caller passes the residual stream's gradient, which the LayerNorm branch adds
// to); dweight += sum_n dout * xhat; dbias += sum_n dout (accumulate = false: = instead of +=, for dweight and
// dbias only).
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                        const T* rstd, int N, int C, bool accumulate = true);

// Multi-head scaled dot-product self-attention over qkv [B, S, 3C] (q | k | v, each C = NH heads of hs = C/NH):
//   att[b,h,t,:] = softmax_j (q_t . k_j / sqrt(hs)) over valid keys j, out[b,t,h*hs:(h+1)*hs] = sum_j att v_j.
// Valid keys of query t: j < len[b], and j <= t when causal; with positions, only the keys of t's own sequence.
// Query rows t >= len[b] output 0 and their att row is 0; masked entries of att are exactly 0. att [B, NH, S, S] is
// saved for backward. Every valid query has at least one valid key (itself), so no row divides by zero.
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, const int32_t* lengths, int B, int S, int C, int NH, bool causal,
                       const int32_t* positions = nullptr);
// dqkv [B, S, 3C] = gradient (OVERWRITTEN; 0 on padded rows). Reads dout only on valid rows. The kernels keep their
// packed copies in per-thread buffers (transformer_ops.cpp). Both directions are register-tiled for small heads
// (docs/TRANSFORMER.md).
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, const int32_t* lengths, int B,
                        int S, int C, int NH, bool causal, const int32_t* positions = nullptr);

// out[n] = a[n] + b[n] (the residual connection; its backward is the identity on both branches).
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n);

// The causal LM's targets: targets[b,t] = tokens[b,t+1] when t + 1 < len[b] and token t + 1 belongs to the same
// sequence (positions[b,t+1] != 0 when packed), else -1 (no target: ignored by the cross-entropy). [B, S] each.
void next_token_targets(int32_t* targets, const int32_t* tokens, const int32_t* lengths, int B, int S,
                        const int32_t* positions = nullptr);

// out[b,:] = mean over t < len[b] of inp[b,t,:] (0 for a zero-length sequence), the rows added in the order of
// kernels/mean_pool.h. inp [B, S, C], out [B, C].
template <typename T>
void mean_pool_forward(T* out, const T* inp, const int32_t* lengths, int B, int S, int C);
// dinp[b,t,:] = dout[b,:] / len[b] for t < len[b], 0 for padded t (OVERWRITTEN).
template <typename T>
void mean_pool_backward(T* dinp, const T* dout, const int32_t* lengths, int B, int S, int C);

}  // namespace ddplab::cpu
