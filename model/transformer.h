// A pre-LayerNorm transformer with forward and backward written by hand (no autograd). docs/TRANSFORMER.md has
// the maths, the masks and the FLOP count.
//
//   tokens [B, S] → wte[token] (+ wpe[t]) → L × { x += proj(attn(ln1(x)));  x += fcproj(gelu(fc(ln2(x)))) } → lnf
//     kClassify: mean-pool over the true length → Linear(d_model → num_classes) → cross-entropy, mean over B
//     kCausalLM: logits = x wte^T per position (the head tied to the embedding, as GPT-2's) → next-token
//                cross-entropy, mean over positions with a next token inside the sequence
//
// Variable lengths: sequence b occupies positions [0, lengths[b]) of its row of S; the rest is padding and has no
// effect at all (tokens there are never read; padded keys are masked, padded rows pass no gradient). Attention is
// bidirectional with a key-padding mask for kClassify, causal (plus padding) for kCausalLM.
// Packing (kCausalLM only): with positions, a row holds several sequences back to back; each is computed exactly as
// if it were alone in its own row (attention, positional embedding and next-token targets stay inside it).
//
// Parameters and gradients: a ParameterStore (model/parameters.h), as the MLP's, gradient pieces listed in the order
// backward finalises them (= ascending offset).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/parameters.h"
#include "runtime/choices.h"

namespace ddplab {

struct TransformerConfig {
  enum class Head { kClassify, kCausalLM };
  int vocab = 8192;
  int d_model = 48;
  int heads = 4;
  int layers = 1;
  int mlp_hidden = 96;
  int max_len = 256;
  int num_classes = 16;     // kClassify only
  bool learned_pos = true;  // a learned positional embedding wpe [max_len, d_model]; false: none
  Head head = Head::kClassify;

  bool causal() const { return head == Head::kCausalLM; }
  // The LM head's weight is wte itself, as GPT-2's and llm.c's: no parameters of its own (and no bias), and wte's
  // gradient holds both uses. The classifier's head is a Linear of its own.
  bool tied_head() const { return causal(); }
  // The head's outputs: the vocabulary's next-token logits, or the classes.
  int head_outputs() const { return causal() ? vocab : num_classes; }
  // The loss terms one sequence of `length` tokens adds (Transformer::loss_count): what a planner weighs batches by
  // before any forward.
  int64_t loss_terms(int64_t length) const { return causal() ? length - 1 : 1; }
  // How a count takes the attention's scores and weighted sum: the full seq_len x seq_len square (PaLM's convention,
  // nanoGPT's estimate_mfu), or its causal half, what a causal kernel computes (FlashAttention's convention; llm.c's
  // 6N + 6LCT). MFU differs by the convention: both are printed where MFU is.
  enum class AttentionCount { kFullSquare, kCausalHalf };
  // Forward FLOPs per token of a batch of sequences of length seq_len: 2 per weight of every Linear in the blocks,
  // 4 * seq_len * d_model per block for the attention scores and weighted sum (half that for kCausalHalf where the
  // model is causal: a bidirectional classifier's kernels compute the whole square either way), and the head (LM: 2
  // d_model vocab per token; classify: 2 d_model classes per sequence, spread over its tokens). Training costs about
  // 3x. Embeddings, LayerNorm, GELU, softmax are not counted.
  double flops_per_token(int seq_len, AttentionCount attention = AttentionCount::kFullSquare) const;
  // "tiny" (the token-skew lab's model), "small", "gpt2-small" (GPT-2 124M-like, causal LM, for the GPU).
  // Throws std::invalid_argument for any other name.
  static TransformerConfig preset(const std::string& name);
};
constexpr std::array<Named<TransformerConfig::Head>, 2> choice_names(TransformerConfig::Head) {
  return {{{TransformerConfig::Head::kClassify, "classify"}, {TransformerConfig::Head::kCausalLM, "lm"}}};
}

// A block's parameters in registration order: block l's parameter k has registration index
// (index of h.0.ln1.weight) + kParams * l + k.
namespace transformer_block {
// clang-format off
enum Param : int { kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcprojW, kFcprojB, kParams };
// clang-format on
}  // namespace transformer_block

template <typename T>
class Transformer : public ParameterStore<T> {
 public:
  // GPT-2 init, deterministic in seed (one sub-stream per parameter): weights and embeddings ~ N(0, 0.02), the two
  // residual projections per block (proj, fcproj) ~ N(0, 0.02 / sqrt(2 layers)), biases 0, LayerNorm weight 1.
  Transformer(const TransformerConfig& config, uint64_t seed);

  const TransformerConfig& config() const { return config_; }
  // parameters() in registration (forward) order: wte, wpe (if learned_pos), per block h.<l>.{ln1.weight, ln1.bias,
  // qkv.weight, qkv.bias, proj.weight, proj.bias, ln2.weight, ln2.bias, fc.weight, fc.bias, fcproj.weight,
  // fcproj.bias}, lnf.weight, lnf.bias, then the classifier's head.weight, head.bias (the LM head is wte). Linear
  // weights are [out, in].

  // tokens [B, S] (S <= max_len); lengths [B] in [1, S], or null for all S; tokens at t < lengths[b] in [0, vocab),
  // tokens at padded positions are ignored. targets: kClassify, [B] classes in [0, num_classes); kCausalLM,
  // ignored (may be null): the target at t is tokens[b, t+1] for t + 1 < lengths[b]. The inputs are copied.
  // positions (kCausalLM only; null: one sequence per row): [B, S], for t < lengths[b] the position of token t in
  // its own sequence, so that a packed row holds several: 0 at t = 0, then 0 (a sequence starts) or the previous + 1.
  // A token whose successor starts a new sequence has no target. Returns the mean cross-entropy over loss_count()
  // terms (0 when B == 0).
  T forward(const int32_t* tokens, const int32_t* lengths, const int32_t* targets, int B, int S,
            const int32_t* positions = nullptr);
  // Backward of loss_scale x the last forward's mean loss; ACCUMULATES into the gradients (zero_grad() or
  // discard_grad() first unless accumulating) and may be called again for the same forward. Calls on_ready(k) for
  // grad_pieces()[k] in order, as soon as that piece is final: the classifier's head, lnf, blocks last to first, and
  // the embeddings (wpe, wte) at the very end (the tied LM head's share of wte's gradient is added first). loss_scale
  // weighs this batch within a larger loss (micro-batches of unequal loss counts).
  void backward(const GradReadyHook& on_ready = nullptr, T loss_scale = 1);

  // How many terms the last loss averaged: B for kClassify, the positions with a next token for kCausalLM. A DDP
  // trainer that wants the mean over the GLOBAL batch scales its rank's gradient by count * world / global count.
  int64_t loss_count() const { return loss_count_; }
  // TransformerConfig::flops_per_token.
  double flops_per_token(int seq_len) const { return config_.flops_per_token(seq_len); }

  // The elements of the activations a forward of B rows of S tokens keeps for backward (reserve_activations' buffers),
  // for the memory check before any work (launcher/cli.cpp: in doubles, since a size past any memory overflows an
  // integer count); and those this model holds after its forwards so far, which a test holds against it.
  static double activation_elements(const TransformerConfig& c, int B, int S);
  int64_t held_activation_elements() const;

 private:
  struct LayerActs {
    std::vector<T> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res_attn, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, res_out;
  };
  Parameter<T>& P(int i) { return this->parameters()[i]; }
  int block_param(int layer, int k) const { return block_base_ + transformer_block::kParams * layer + k; }

  // forward, in order: the batch checked and copied, the buffers grown, then embeddings, blocks, head and loss.
  std::vector<int32_t> checked_lengths(const int32_t* tokens, const int32_t* lengths, const int32_t* targets, int B,
                                       int S, const int32_t* positions) const;
  void take_batch(const int32_t* tokens, const int32_t* lengths, const int32_t* targets, int B, int S,
                  const int32_t* positions);
  void reserve_activations();
  const T* block_forward(int layer, const T* x);  // returns the block's output, res_out
  T head_forward(const T* x);                     // the mean loss
  // backward, in order: the head, lnf, the blocks last to first, the embeddings.
  void reserve_gradients();
  void linear_backward(PieceAnnouncer& announce, bool accumulate, int w, T* dinp, const T* dout, const T* inp, int N,
                       int in, int out);
  void layernorm_backward(PieceAnnouncer& announce, bool accumulate, int w, const T* dout, const T* inp,
                          const T* mean, const T* rstd);
  void head_backward(PieceAnnouncer& announce, bool accumulate, T loss_scale);
  void block_backward(PieceAnnouncer& announce, bool accumulate, int layer);
  void embedding_backward(PieceAnnouncer& announce, bool accumulate);

  TransformerConfig config_;
  // Registration indices (a weight's bias is +1). head_: the classifier's head.weight, or wte (0) where tied.
  int wpe_ = -1, block_base_ = 0, lnf_ = 0, head_ = 0;

  // The last forward (grow-only buffers: a step no larger than before allocates nothing).
  int batch_ = -1, seq_ = 0;  // -1: no forward yet
  int64_t loss_count_ = 0;
  std::vector<int32_t> tokens_, lengths_, targets_;  // targets_: [B] classes or [B*S] next tokens (-1: none)
  std::vector<int32_t> positions_;                   // [B*S] when packed, else empty
  std::vector<T> encoded_, lnf_out_, lnf_mean_, lnf_rstd_, pooled_, logits_, losses_, row_sums_;  // logits_: the exps
  std::vector<LayerActs> acts_;
  std::vector<T> tmp_, dresid_, dbig_, dsmall_, dpooled_, dlogits_;
};

}  // namespace ddplab
