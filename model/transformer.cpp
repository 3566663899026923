#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/rng.h"
#include "kernels/cpu/transformer_ops.h"

namespace ddplab {
namespace {

using namespace transformer_block;  // NOLINT: the block's parameter names

template <typename T>
void EnsureSize(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

TransformerConfig TransformerConfig::preset(const std::string& name) {
  TransformerConfig c;  // the defaults are "tiny"
  if (name == "tiny") return c;
  if (name == "small") {
    c.d_model = 128;
    c.layers = 4;
    c.mlp_hidden = 512;
    return c;
  }
  if (name == "gpt2-small") {
    // GPT-2's 50257 rounded up to a multiple of 64 (llm.c's 50304): the logits' rows and the head's GEMM stay
    // 256-byte aligned. The extra ids are ordinary classes of the softmax: synthetic tokens use them, and GPT-2's
    // (--data) never have them as targets, so training drives their probability down (llm.c instead leaves them out
    // of its softmax: its first losses are a little lower, ln 50257 against ln 50304).
    c.vocab = 50304;
    c.d_model = 768;
    c.heads = 12;
    c.layers = 12;
    c.mlp_hidden = 3072;
    c.max_len = 1024;
    c.head = Head::kCausalLM;
    return c;
  }
  throw std::invalid_argument("unknown model preset '" + name + "' (expected tiny, small, gpt2-small)");
}

template <typename T>
Transformer<T>::Transformer(const TransformerConfig& config, uint64_t seed) : config_(config) {
  const TransformerConfig& c = config;
  if (c.vocab <= 0 || c.d_model <= 0 || c.heads <= 0 || c.layers < 0 || c.mlp_hidden <= 0 || c.max_len <= 0 ||
      (c.head == TransformerConfig::Head::kClassify && c.num_classes <= 0)) {
    throw std::invalid_argument(
        "Transformer: vocab, d_model, heads, mlp_hidden, max_len (and num_classes for the classifier) must be "
        "positive and layers non-negative");
  }
  if (c.d_model % c.heads != 0) {
    throw std::invalid_argument("Transformer: d_model " + std::to_string(c.d_model) + " is not a multiple of heads " +
                                std::to_string(c.heads));
  }
  const int64_t C = c.d_model, H = c.mlp_hidden;
  std::vector<double> init_std;  // per parameter: > 0 normal(0, std), 0 zeros, -1 ones
  // Backward reads a Linear's weight for its input's gradient, after the weight's gradient; it reads no bias and no
  // position table, each LayerNorm's weight before its gradient, and wte (the tied head's weight) before any.
  auto add = [&](std::string name, std::vector<int64_t> shape, double std, bool linear_weight = false) {
    init_std.push_back(std);
    const int id = this->add_parameter(std::move(name), std::move(shape));
    this->parameters()[id].read_after_its_gradient = linear_weight;
    return id;
  };
  const double residual_std = 0.02 / std::sqrt(2.0 * std::max(1, c.layers));
  add("wte", {c.vocab, C}, 0.02);
  if (c.learned_pos) {
    wpe_ = add("wpe", {c.max_len, C}, 0.02);
  }
  block_base_ = static_cast<int>(this->parameters().size());
  for (int l = 0; l < c.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln1.weight", {C}, -1);
    add(h + "ln1.bias", {C}, 0);
    add(h + "qkv.weight", {3 * C, C}, 0.02, true);
    add(h + "qkv.bias", {3 * C}, 0);
    add(h + "proj.weight", {C, C}, residual_std, true);
    add(h + "proj.bias", {C}, 0);
    add(h + "ln2.weight", {C}, -1);
    add(h + "ln2.bias", {C}, 0);
    add(h + "fc.weight", {H, C}, 0.02, true);
    add(h + "fc.bias", {H}, 0);
    add(h + "fcproj.weight", {C, H}, residual_std, true);
    add(h + "fcproj.bias", {C}, 0);
  }
  lnf_ = add("lnf.weight", {C}, -1);
  add("lnf.bias", {C}, 0);
  if (c.tied_head()) {
    head_ = 0;
  } else {
    head_ = add("head.weight", {config_.head_outputs(), C}, 0.02, true);
    add("head.bias", {config_.head_outputs()}, 0);
  }

  this->lay_out();
  for (size_t i = 0; i < this->parameters().size(); ++i) {
    Parameter<T>& p = P(static_cast<int>(i));
    const uint64_t stream = substream(seed, i);  // a tensor's init depends on neither the layout nor the others
    for (int64_t k = 0; k < p.numel; ++k) {
      p.data[k] = init_std[i] > 0 ? static_cast<T>(init_std[i] * normal(stream, k)) : T(init_std[i] < 0 ? 1 : 0);
    }
  }
  acts_.resize(c.layers);
}

template <typename T>
std::vector<int32_t> Transformer<T>::checked_lengths(const int32_t* tokens, const int32_t* lengths,
                                                     const int32_t* targets, int B, int S,
                                                     const int32_t* positions) const {
  const TransformerConfig& c = config_;
  const bool classify = c.head == TransformerConfig::Head::kClassify;
  if (B < 0) throw std::invalid_argument("Transformer::forward: negative batch size " + std::to_string(B));
  if (B > 0 && (S < 1 || S > c.max_len)) {
    throw std::invalid_argument("Transformer::forward: sequence length " + std::to_string(S) + " outside [1, " +
                                std::to_string(c.max_len) + "]");
  }
  if (B > 0 && classify && !targets) throw std::invalid_argument("Transformer::forward: the classifier needs targets");
  if (classify && positions) {
    throw std::invalid_argument("Transformer::forward: packed rows (positions) need the causal LM head");
  }
  std::vector<int32_t> checked(B, S);
  for (int b = 0; b < B; ++b) {
    if (lengths) checked[b] = lengths[b];
    if (checked[b] < 1 || checked[b] > S) {
      throw std::out_of_range("Transformer::forward: length " + std::to_string(checked[b]) + " of sequence " +
                              std::to_string(b) + " outside [1, " + std::to_string(S) + "]");
    }
    for (int t = 0; t < checked[b]; ++t) {
      const int32_t tok = tokens[static_cast<int64_t>(b) * S + t];
      if (tok < 0 || tok >= c.vocab) {
        throw std::out_of_range("Transformer::forward: token " + std::to_string(tok) + " at (" + std::to_string(b) +
                                ", " + std::to_string(t) + ") outside [0, " + std::to_string(c.vocab) + ")");
      }
    }
    for (int t = 0; positions && t < checked[b]; ++t) {
      const int32_t* row = positions + static_cast<int64_t>(b) * S;
      if (row[t] != 0 && (t == 0 || row[t] != row[t - 1] + 1)) {
        throw std::out_of_range("Transformer::forward: position " + std::to_string(row[t]) + " at (" +
                                std::to_string(b) + ", " + std::to_string(t) +
                                ") is neither 0 nor the previous position + 1");
      }
    }
    if (classify && (targets[b] < 0 || targets[b] >= c.num_classes)) {
      throw std::out_of_range("Transformer::forward: target " + std::to_string(targets[b]) + " of sequence " +
                              std::to_string(b) + " outside [0, " + std::to_string(c.num_classes) + ")");
    }
  }
  return checked;
}

template <typename T>
void Transformer<T>::take_batch(const int32_t* tokens, const int32_t* lengths, const int32_t* targets, int B, int S,
                                const int32_t* positions) {
  // Copy and validate everything first, so a bad batch throws before any state changes.
  std::vector<int32_t> checked = checked_lengths(tokens, lengths, targets, B, S, positions);
  const int64_t BS = static_cast<int64_t>(B) * S;
  lengths_ = std::move(checked);
  tokens_.assign(tokens, tokens + BS);
  if (positions) {
    positions_.assign(positions, positions + BS);
  } else {
    positions_.clear();
  }
  if (config_.head == TransformerConfig::Head::kClassify) {
    targets_.assign(targets, targets + B);
  } else {
    targets_.resize(BS);  // next token inside the sequence; the last position of each has none
    cpu::next_token_targets(targets_.data(), tokens_.data(), lengths_.data(), B, S,
                            positions_.empty() ? nullptr : positions_.data());
  }
  batch_ = B;
  seq_ = S;
  loss_count_ = 0;
}

template <typename T>
double Transformer<T>::activation_elements(const TransformerConfig& c, int B, int S) {
  const double BS = static_cast<double>(B) * S, BTC = BS * c.d_model;
  const bool classify = c.head == TransformerConfig::Head::kClassify;
  const double rows = classify ? B : BS;
  // Per layer (LayerActs): ln1, atty, res_attn, ln2, res_out; four LayerNorm statistics per token; qkv; the
  // attention's probabilities; fch and its GELU.
  const double layer = 5 * BTC + 4 * BS + 3 * BTC + BS * c.heads * S + 2 * BS * c.mlp_hidden;
  // Then encoded_, tmp_ and lnf_out_, lnf's statistics, the pooled rows, the logits, each row's loss and sum.
  return c.layers * layer + 3 * BTC + 2 * BS + (classify ? static_cast<double>(B) * c.d_model : 0) +
         rows * c.head_outputs() + 2 * rows;
}

template <typename T>
int64_t Transformer<T>::held_activation_elements() const {
  int64_t n = 0;
  for (const LayerActs& a : acts_)
    for (const auto* v : {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att, &a.atty, &a.res_attn, &a.ln2, &a.ln2_mean,
                          &a.ln2_rstd, &a.fch, &a.fch_gelu, &a.res_out})
      n += static_cast<int64_t>(v->size());
  for (const auto* v : {&encoded_, &tmp_, &lnf_out_, &lnf_mean_, &lnf_rstd_, &pooled_, &logits_, &losses_, &row_sums_})
    n += static_cast<int64_t>(v->size());
  return n;
}

template <typename T>
void Transformer<T>::reserve_activations() {
  const TransformerConfig& c = config_;
  const bool classify = c.head == TransformerConfig::Head::kClassify;
  const int B = batch_, S = seq_, C = c.d_model, H = c.mlp_hidden, NH = c.heads, K = config_.head_outputs();
  const int64_t BS = static_cast<int64_t>(B) * S;
  const int64_t BTC = BS * C;
  const int rows = classify ? B : static_cast<int>(BS);  // rows of logits
  EnsureSize(encoded_, BTC);
  EnsureSize(tmp_, BTC);
  for (LayerActs& a : acts_) {
    for (auto* v : {&a.ln1, &a.atty, &a.res_attn, &a.ln2, &a.res_out}) EnsureSize(*v, BTC);
    for (auto* v : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) EnsureSize(*v, BS);
    EnsureSize(a.qkv, 3 * BTC);
    EnsureSize(a.att, BS * NH * S);
    EnsureSize(a.fch, BS * H);
    EnsureSize(a.fch_gelu, BS * H);
  }
  EnsureSize(lnf_out_, BTC);
  EnsureSize(lnf_mean_, BS);
  EnsureSize(lnf_rstd_, BS);
  if (classify) EnsureSize(pooled_, static_cast<size_t>(B) * C);
  EnsureSize(logits_, static_cast<size_t>(rows) * K);
  EnsureSize(losses_, rows);
  EnsureSize(row_sums_, rows);
}

template <typename T>
const T* Transformer<T>::block_forward(int l, const T* x) {
  const TransformerConfig& c = config_;
  const int B = batch_, S = seq_, C = c.d_model, H = c.mlp_hidden, NH = c.heads;
  const int64_t BS = static_cast<int64_t>(B) * S;
  const int BT = static_cast<int>(BS);
  const int64_t BTC = BS * C;
  const int32_t* lens = lengths_.data();
  const int32_t* pos = positions_.empty() ? nullptr : positions_.data();
  LayerActs& a = acts_[l];
  auto W = [&](int k) { return P(block_param(l, k)).data; };
  // res_attn = x + proj(attn(ln1(x)))
  cpu::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, W(kLn1W), W(kLn1B), BT, C);
  cpu::matmul_forward(a.qkv.data(), a.ln1.data(), W(kQkvW), BT, C, 3 * C);
  cpu::bias_forward(a.qkv.data(), W(kQkvB), BT, 3 * C);
  cpu::attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), lens, B, S, C, NH, c.causal(), pos);
  cpu::matmul_forward(tmp_.data(), a.atty.data(), W(kProjW), BT, C, C);
  cpu::bias_forward(tmp_.data(), W(kProjB), BT, C);
  cpu::residual_forward(a.res_attn.data(), x, tmp_.data(), BTC);
  // res_out = res_attn + fcproj(gelu(fc(ln2(res_attn))))
  cpu::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res_attn.data(), W(kLn2W), W(kLn2B), BT,
                         C);
  cpu::matmul_forward(a.fch.data(), a.ln2.data(), W(kFcW), BT, C, H);
  cpu::bias_forward(a.fch.data(), W(kFcB), BT, H);
  cpu::gelu_forward(a.fch_gelu.data(), a.fch.data(), BS * H);
  cpu::matmul_forward(tmp_.data(), a.fch_gelu.data(), W(kFcprojW), BT, H, C);
  cpu::bias_forward(tmp_.data(), W(kFcprojB), BT, C);
  cpu::residual_forward(a.res_out.data(), a.res_attn.data(), tmp_.data(), BTC);
  return a.res_out.data();
}

template <typename T>
T Transformer<T>::head_forward(const T* x) {
  const TransformerConfig& c = config_;
  const bool classify = c.head == TransformerConfig::Head::kClassify;
  const int B = batch_, S = seq_, C = c.d_model, K = config_.head_outputs();
  const int BT = B * S;
  const int rows = classify ? B : BT;
  cpu::layernorm_forward(lnf_out_.data(), lnf_mean_.data(), lnf_rstd_.data(), x, P(lnf_).data, P(lnf_ + 1).data, BT, C);
  const T* features = lnf_out_.data();
  if (classify) {
    cpu::mean_pool_forward(pooled_.data(), lnf_out_.data(), lengths_.data(), B, S, C);
    features = pooled_.data();
  }
  cpu::matmul_forward(logits_.data(), features, P(head_).data, rows, C, K);
  if (!c.tied_head()) cpu::bias_forward(logits_.data(), P(head_ + 1).data, rows, K);
  // The softmax's exps in place of the logits: for the LM head this is the largest buffer by far.
  return cpu::softmax_cross_entropy_forward(logits_.data(), row_sums_.data(), losses_.data(), logits_.data(),
                                            targets_.data(), rows, K, &loss_count_);
}

template <typename T>
T Transformer<T>::forward(const int32_t* tokens, const int32_t* lengths, const int32_t* targets, int B, int S,
                          const int32_t* positions) {
  take_batch(tokens, lengths, targets, B, S, positions);
  if (B == 0) return T(0);
  reserve_activations();
  cpu::embedding_forward(encoded_.data(), tokens_.data(), lengths_.data(), P(0).data,
                         wpe_ >= 0 ? P(wpe_).data : nullptr, B, S, config_.d_model,
                         positions_.empty() ? nullptr : positions_.data());
  const T* x = encoded_.data();
  for (int l = 0; l < config_.layers; ++l) x = block_forward(l, x);
  return head_forward(x);
}

template <typename T>
void Transformer<T>::reserve_gradients() {
  const TransformerConfig& c = config_;
  const bool classify = c.head == TransformerConfig::Head::kClassify;
  const int B = batch_, S = seq_, C = c.d_model, H = c.mlp_hidden, K = config_.head_outputs();
  const int BT = B * S;
  const int rows = classify ? B : BT;
  EnsureSize(dresid_, static_cast<int64_t>(BT) * C);
  EnsureSize(dsmall_, static_cast<int64_t>(BT) * C);
  EnsureSize(dbig_, static_cast<size_t>(BT) * std::max(3 * C, H));
  EnsureSize(dlogits_, static_cast<size_t>(rows) * K);
  if (classify) EnsureSize(dpooled_, static_cast<size_t>(B) * C);
}

// A Linear layer out = inp W^T + b: bias, then the weight's row blocks (each announced as soon as it is done, before
// the input gradient, which backward needs next but the communication engine does not).
template <typename T>
void Transformer<T>::linear_backward(PieceAnnouncer& announce, bool accumulate, int w, T* dinp, const T* dout,
                                     const T* inp, int N, int in, int out) {
  cpu::bias_backward(P(w + 1).grad, dout, N, out, accumulate);
  announce.all_of(w + 1);
  while (const GradPiece* g = announce.next_of(w)) {
    const int64_t first = g->first_row, count = g->numel / in;
    cpu::matmul_backward_weight(P(w).grad, dout, inp, N, in, out, static_cast<int>(first),
                                static_cast<int>(first + count), accumulate);
    announce.ready(w);
  }
  cpu::matmul_backward_input(dinp, dout, P(w).data, N, in, out);
}

// A LayerNorm on the residual stream: adds its branch's share to dresid_.
template <typename T>
void Transformer<T>::layernorm_backward(PieceAnnouncer& announce, bool accumulate, int w, const T* dout, const T* inp,
                                        const T* mean, const T* rstd) {
  cpu::layernorm_backward(dresid_.data(), P(w).grad, P(w + 1).grad, dout, inp, P(w).data, mean, rstd, batch_ * seq_,
                          config_.d_model, accumulate);
  announce.all_of(w + 1);
  announce.all_of(w);
}

// The loss through the head (and the mean pool) to dsmall_ = dL/d lnf_out.
template <typename T>
void Transformer<T>::head_backward(PieceAnnouncer& announce, bool accumulate, T loss_scale) {
  const bool classify = config_.head == TransformerConfig::Head::kClassify;
  const int B = batch_, S = seq_, C = config_.d_model, K = config_.head_outputs();
  const int BT = B * S;
  const int rows = classify ? B : BT;
  cpu::softmax_cross_entropy_backward(dlogits_.data(), logits_.data(), row_sums_.data(), targets_.data(), rows, K,
                                      loss_scale);
  if (classify) {
    linear_backward(announce, accumulate, head_, dpooled_.data(), dlogits_.data(), pooled_.data(), B, C, K);
    cpu::mean_pool_backward(dsmall_.data(), dpooled_.data(), lengths_.data(), B, S, C);
  } else {
    // The tied head: its weight gradient is wte's first share (overwriting it where the gradient is discarded); the
    // embedding backward adds the rest and announces wte.
    cpu::matmul_backward_weight(P(head_).grad, dlogits_.data(), lnf_out_.data(), BT, C, K, 0, K, accumulate);
    cpu::matmul_backward_input(dsmall_.data(), dlogits_.data(), P(head_).data, BT, C, K);
  }
}

// Block l, with dresid_ = dL/d res_out on entry and dL/d x on return.
template <typename T>
void Transformer<T>::block_backward(PieceAnnouncer& announce, bool accumulate, int l) {
  const TransformerConfig& c = config_;
  const int B = batch_, S = seq_, C = c.d_model, H = c.mlp_hidden, NH = c.heads;
  const int BT = B * S;
  const int32_t* lens = lengths_.data();
  const int32_t* pos = positions_.empty() ? nullptr : positions_.data();
  LayerActs& a = acts_[l];
  const T* x_in = l > 0 ? acts_[l - 1].res_out.data() : encoded_.data();
  auto id = [&](int k) { return block_param(l, k); };
  // dresid_ = dL/d res_out: through the MLP branch ...
  linear_backward(announce, accumulate, id(kFcprojW), dbig_.data(), dresid_.data(), a.fch_gelu.data(), BT, H, C);
  cpu::gelu_backward(dbig_.data(), a.fch.data(), dbig_.data(), static_cast<int64_t>(BT) * H);
  linear_backward(announce, accumulate, id(kFcW), dsmall_.data(), dbig_.data(), a.ln2.data(), BT, C, H);
  layernorm_backward(announce, accumulate, id(kLn2W), dsmall_.data(), a.res_attn.data(), a.ln2_mean.data(),
                     a.ln2_rstd.data());
  // ... now dL/d res_attn: through the attention branch.
  linear_backward(announce, accumulate, id(kProjW), dsmall_.data(), dresid_.data(), a.atty.data(), BT, C, C);
  cpu::attention_backward(dbig_.data(), dsmall_.data(), a.qkv.data(), a.att.data(), lens, B, S, C,
                          NH, c.causal(), pos);
  linear_backward(announce, accumulate, id(kQkvW), dsmall_.data(), dbig_.data(), a.ln1.data(), BT, C, 3 * C);
  layernorm_backward(announce, accumulate, id(kLn1W), dsmall_.data(), x_in, a.ln1_mean.data(), a.ln1_rstd.data());
}

// The embeddings are final only now (and wte is the largest tensor): the communication engine's last bucket. The
// scatter adds to the batch's rows only, so a discarded embedding gradient is zeroed first, the one pass left; wte's
// is not where the tied head has written it.
template <typename T>
void Transformer<T>::embedding_backward(PieceAnnouncer& announce, bool accumulate) {
  if (!accumulate) {
    for (int e : {config_.tied_head() ? -1 : 0, wpe_}) {
      if (e >= 0) std::fill(P(e).grad, P(e).grad + P(e).numel, T(0));
    }
  }
  cpu::embedding_backward(P(0).grad, wpe_ >= 0 ? P(wpe_).grad : nullptr, dresid_.data(), tokens_.data(),
                          lengths_.data(), batch_, seq_, config_.d_model,
                          positions_.empty() ? nullptr : positions_.data());
  if (wpe_ >= 0) announce.all_of(wpe_);
  announce.all_of(0);
}

template <typename T>
void Transformer<T>::backward(const GradReadyHook& on_ready, T loss_scale) {
  if (batch_ < 0) throw std::logic_error("Transformer::backward called before forward");
  PieceAnnouncer announce(this->grad_pieces(), on_ready);
  // discard_grad(): each gradient's first write below overwrites it (GEMMs with beta 0, bias and LayerNorm sums
  // started from zero), so no pass zeroes the whole buffer first.
  const bool accumulate = !this->take_discard();
  if (batch_ == 0) {  // nothing to add: every gradient is final as it is (zero, when discarded)
    if (!accumulate) this->zero_grad();
    for (int p = static_cast<int>(this->parameters().size()) - 1; p >= 0; --p) announce.all_of(p);
    return;
  }
  reserve_gradients();
  head_backward(announce, accumulate, loss_scale);
  // dresid_ is the gradient of the residual stream; every LayerNorm on it adds its branch's share.
  std::fill(dresid_.begin(), dresid_.begin() + static_cast<int64_t>(batch_) * seq_ * config_.d_model, T(0));
  const T* x_final = config_.layers > 0 ? acts_.back().res_out.data() : encoded_.data();
  layernorm_backward(announce, accumulate, lnf_, dsmall_.data(), x_final, lnf_mean_.data(), lnf_rstd_.data());
  for (int l = config_.layers - 1; l >= 0; --l) block_backward(announce, accumulate, l);
  embedding_backward(announce, accumulate);
  if (!announce.done()) throw std::logic_error("Transformer: not every gradient piece was announced");
}

double TransformerConfig::flops_per_token(int seq_len, AttentionCount attention) const {
  const double C = d_model, H = mlp_hidden, L = layers;
  const double square = 4.0 * seq_len * C;
  const double blocks =
      L * (2 * (4 * C * C + 2 * C * H) + (attention == AttentionCount::kCausalHalf && causal() ? square / 2 : square));
  const double head_flops = head == Head::kClassify ? 2 * C * num_classes / std::max(1, seq_len) : 2 * C * vocab;
  return blocks + head_flops;
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace ddplab
