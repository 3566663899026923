// TransformerCuda: see transformer_cuda.h. Host code only: every kernel it runs is a kernels/cuda launcher, so the
// host compiler builds this file. Forward and backward follow Transformer<T>::forward/backward line for line
// (model/transformer.cpp); the comments here say only where the GPU differs.
#include "model/transformer_cuda.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/sequence.h"
#include "kernels/cuda/softmax_ce.h"

namespace ddplab {
namespace {

using bf16 = __nv_bfloat16;
using cuda_model::as;
using cuda_model::NvtxRange;

// The unfused attention in bf16 runs on fp32 copies placed after its workspace, each [tokens, C] floats: forward's
// qkv (3) and out (1), backward's dout (1), qkv (3) and dqkv (3). The workspace's size and the carve-ups both count
// them here.
constexpr int kForwardFp32Copies = 3 + 1, kBackwardFp32Copies = 1 + 3 + 3;
using namespace transformer_block;  // NOLINT: the block's parameter names

int index_of(const std::vector<Parameter<float>>& params, const std::string& name) {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name) return static_cast<int>(i);
  return -1;
}

// The attention asked for against the precision and the head size (std::invalid_argument).
void check_attention(const TransformerConfig& config, Precision precision, AttentionKind attention) {
  const bool fused = attention == AttentionKind::kFused, with_cudnn = attention == AttentionKind::kCudnn;
  if ((fused || with_cudnn) && precision != Precision::kBf16)
    throw std::invalid_argument(std::string("TransformerCuda: the ") + to_string(attention) +
                                " attention is bf16 only (got precision " + to_string(precision) + ")");
  if (with_cudnn && !cuda::cudnn_attention_supports_head_size(config.d_model / config.heads))
    throw std::invalid_argument("TransformerCuda: cuDNN's attention takes heads of a multiple of 8 up to 128 "
                                "dimensions, not " + std::to_string(config.d_model / config.heads));
  if (fused && !cuda::flash_attention_supports_head_size(config.d_model / config.heads))
    throw std::invalid_argument("TransformerCuda: the fused attention has kernels for heads of " +
                                std::string(fused_attention_head_sizes()) + " dimensions, not " +
                                std::to_string(config.d_model / config.heads) + " (d_model " +
                                std::to_string(config.d_model) + " / " + std::to_string(config.heads) + " heads)");
}

}  // namespace

// Where each buffer starts in memory_, in bytes, and the bytes of them all.
struct TransformerCuda::BufferOffsets {
  struct Block {
    size_t ln1, ln1_mean, ln1_rstd, qkv, att, atty, res_attn, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, res_out;
  };
  size_t params, grads, weights_bf16, activations, encoded;
  std::vector<Block> blocks;
  size_t lnf_out, lnf_mean, lnf_rstd, pooled, logits, lm_targets, dresid, dsmall, dbig, dpooled, scratch, losses,
      mean_loss, num_valid, rows_by_token, rows_by_token_bytes;
  size_t bytes;
};

TransformerCuda::TransformerCuda(const TransformerConfig& config, uint64_t seed, Precision precision,
                                 int64_t max_tokens, int max_seq, cudaStream_t stream, AttentionKind attention,
                                 bool deterministic, cuda::CudnnShapes cudnn_shapes)
    : DeviceParameters(stream),
      precision_(precision),
      attention_(attention),
      deterministic_(deterministic),
      max_tokens_(max_tokens),
      max_seq_(max_seq),
      // TF32 in bf16 mode too: the only fp32 GEMMs there are the unfused attention's. Those on q, k, v and dout take
      // bf16 values (exact in TF32); those on the fp32 softmax and its gradient round them to TF32, well within the
      // bf16 step's error. The Linear layers' bf16 GEMMs accumulate in fp32 whatever the math.
      gemm_(precision == Precision::kFp32 ? cuda::GemmMath::kFp32 : cuda::GemmMath::kTf32) {
  if (max_tokens < 1 || max_tokens > INT_MAX || max_seq < 1)
    throw std::invalid_argument("TransformerCuda: max_tokens must be in [1, 2^31) and max_seq positive, got " +
                                std::to_string(max_tokens) + " and " + std::to_string(max_seq));
  // The CPU model defines the registration, the layout and the initial values; taking them from it keeps the two
  // identical by construction. It also validates the config, on the host.
  const Transformer<float> reference(config, seed);
  config_ = reference.config();
  if (max_seq > config_.max_len)
    throw std::invalid_argument("TransformerCuda: max_seq " + std::to_string(max_seq) + " exceeds max_len " +
                                std::to_string(config_.max_len));
  check_attention(config_, precision, attention);
  if (attention == AttentionKind::kCudnn) cudnn_ = std::make_unique<cuda::CudnnAttention>(deterministic, cudnn_shapes);
  take_layout(reference);
  wpe_ = index_of(params_, "wpe");
  lnf_ = index_of(params_, "lnf.weight");
  head_ = config_.tied_head() ? 0 : index_of(params_, "head.weight");  // the LM head is wte, as the CPU's
  block_base_ = lnf_ - kParams * config_.layers;
  for (int l = 0; l < config_.layers; ++l) {
    nvtx_forward_.push_back("h" + std::to_string(l) + " forward");
    nvtx_backward_.push_back("h" + std::to_string(l) + " backward");
  }

  const BufferOffsets at = buffer_offsets();
  memory_ = cuda_model::allocate_model_memory("TransformerCuda", at.bytes, at.activations, at.losses - at.scratch,
                                              max_tokens_, "tokens");
  char* const bytes = static_cast<char*>(memory_.get());
  point_into(bytes, at);
  place_on_device(reinterpret_cast<float*>(bytes + at.params), reinterpret_cast<float*>(bytes + at.grads),
                  reference.flat_params());
  // Activations start as NaN (0xFF bytes): a kernel that reads an element no earlier kernel wrote turns the loss or
  // a gradient into NaN, which the tests see.
  cudaCheck(cudaMemsetAsync(bytes + at.activations, 0xFF, at.bytes - at.activations, stream_));
  cudaCheck(cudaStreamSynchronize(stream_));  // `reference` is freed on return
  loss_host_.emplace();
  set_grad_piece_elements(0);
}

std::optional<cuda::CudnnBuildStats> TransformerCuda::cudnn_build_stats() const {
  if (!cudnn_) return std::nullopt;
  return cudnn_->build_stats();
}

int64_t TransformerCuda::scratch_floats() const {
  const bool is_bf16 = precision_ == Precision::kBf16;
  const bool fused = attention_ == AttentionKind::kFused, with_cudnn = attention_ == AttentionKind::kCudnn;
  const int d_model = config_.d_model, heads = config_.heads;
  // The unfused attention's workspace grows with B * S and S: B * S <= max_tokens rows of at most max_seq are within
  // that of ceil(max_tokens / max_seq) rows of max_seq. In bf16 it is followed by fp32 copies of its inputs and
  // outputs. The fused one needs only backward's dQ accumulator and D, which grow with B * S alone; deterministic, a
  // dQ share per key block of S as well: either way one max_seq row's workspace times the rows, as the unfused one's
  // bound (sized by rows, not as one sequence of every token, which the kernels' grid could not launch).
  const int rows_at_max_seq = static_cast<int>((max_tokens_ + max_seq_ - 1) / max_seq_);
  const int64_t bf16_copies = is_bf16 ? max_tokens_ * d_model : 0;  // floats per [tokens, C] copy
  // cuDNN's attention keeps its own workspace (cudnn_attention.h) and needs none here.
  const int64_t attention_floats =
      with_cudnn ? 0
      : fused    ? rows_at_max_seq *
                    cuda::flash_attention_backward_workspace_floats(1, max_seq_, d_model, heads, deterministic_)
              : std::max(cuda::attention_forward_workspace_floats(rows_at_max_seq, max_seq_, d_model, heads) +
                             kForwardFp32Copies * bf16_copies,
                         cuda::attention_backward_workspace_floats(rows_at_max_seq, max_seq_, d_model, heads) +
                             kBackwardFp32Copies * bf16_copies);
  return std::max(attention_floats, cuda::layernorm_backward_scratch_floats(static_cast<int>(max_tokens_), d_model));
}

TransformerCuda::BufferOffsets TransformerCuda::buffer_offsets() const {
  const bool is_bf16 = precision_ == Precision::kBf16, classify = !config_.causal();
  const bool unfused = attention_ != AttentionKind::kFused && attention_ != AttentionKind::kCudnn;
  const size_t act = is_bf16 ? sizeof(bf16) : sizeof(float), f32 = sizeof(float);
  const size_t tokens = static_cast<size_t>(max_tokens_), C = config_.d_model, H = config_.mlp_hidden;
  const size_t NH = config_.heads, K = config_.head_outputs();
  cuda_model::BufferLayout layout;
  BufferOffsets at;
  at.params = layout.reserve(flat_size_ * f32);
  at.grads = layout.reserve(flat_size_ * f32);
  at.weights_bf16 = is_bf16 ? layout.reserve(flat_size_ * sizeof(bf16)) : 0;
  at.activations = layout.reserve(0);  // from here on: poisoned by the constructor
  at.encoded = layout.reserve(tokens * C * act);
  for (int l = 0; l < config_.layers; ++l) {
    BufferOffsets::Block o;
    o.ln1 = layout.reserve(tokens * C * act);
    o.ln1_mean = layout.reserve(tokens * f32);
    o.ln1_rstd = layout.reserve(tokens * f32);
    o.qkv = layout.reserve(3 * tokens * C * act);
    o.att = layout.reserve(NH * tokens * (unfused ? max_seq_ : 1) * f32);  // fused: the lse, not P
    o.atty = layout.reserve(tokens * C * act);
    o.res_attn = layout.reserve(tokens * C * act);
    o.ln2 = layout.reserve(tokens * C * act);
    o.ln2_mean = layout.reserve(tokens * f32);
    o.ln2_rstd = layout.reserve(tokens * f32);
    o.fch = layout.reserve(tokens * H * act);
    o.fch_gelu = layout.reserve(tokens * H * act);
    o.res_out = layout.reserve(tokens * C * act);
    at.blocks.push_back(o);
  }
  at.lnf_out = layout.reserve(tokens * C * act);
  at.lnf_mean = layout.reserve(tokens * f32);
  at.lnf_rstd = layout.reserve(tokens * f32);
  at.pooled = classify ? layout.reserve(tokens * C * act) : 0;  // B <= max_tokens rows
  at.logits = layout.reserve(tokens * K * act);                 // B or B * S rows
  at.lm_targets = classify ? 0 : layout.reserve(tokens * sizeof(int32_t));
  at.dresid = layout.reserve(tokens * C * act);
  at.dsmall = layout.reserve(tokens * C * act);
  at.dbig = layout.reserve(tokens * std::max(3 * C, H) * act);
  at.dpooled = classify ? layout.reserve(tokens * C * act) : 0;
  at.scratch = layout.reserve(scratch_floats() * f32);
  at.losses = layout.reserve(tokens * f32);
  at.mean_loss = layout.reserve(f32);
  at.num_valid = layout.reserve(sizeof(int));
  at.rows_by_token_bytes = cuda::rows_by_token_workspace_bytes(max_tokens_, config_.vocab, config_.d_model);
  at.rows_by_token = layout.reserve(at.rows_by_token_bytes);
  at.bytes = layout.bytes();
  return at;
}

void TransformerCuda::point_into(char* bytes, const BufferOffsets& at) {
  const auto floats = [bytes](size_t offset) { return reinterpret_cast<float*>(bytes + offset); };
  if (precision_ == Precision::kBf16) weights_bf16_ = reinterpret_cast<bf16*>(bytes + at.weights_bf16);
  encoded_ = bytes + at.encoded;
  for (const BufferOffsets::Block& o : at.blocks) {
    blocks_.push_back(BlockActs{bytes + o.ln1, bytes + o.qkv, bytes + o.atty, bytes + o.res_attn, bytes + o.ln2,
                                bytes + o.fch, bytes + o.fch_gelu, bytes + o.res_out, floats(o.ln1_mean),
                                floats(o.ln1_rstd), floats(o.ln2_mean), floats(o.ln2_rstd), floats(o.att)});
  }
  lnf_out_ = bytes + at.lnf_out;
  lnf_mean_ = floats(at.lnf_mean);
  lnf_rstd_ = floats(at.lnf_rstd);
  if (!config_.causal()) {
    pooled_ = bytes + at.pooled;
    dpooled_ = bytes + at.dpooled;
  } else {
    lm_targets_ = reinterpret_cast<int32_t*>(bytes + at.lm_targets);
  }
  logits_ = bytes + at.logits;
  dresid_ = bytes + at.dresid;
  dsmall_ = bytes + at.dsmall;
  dbig_ = bytes + at.dbig;
  scratch_ = floats(at.scratch);
  losses_ = floats(at.losses);
  mean_loss_ = floats(at.mean_loss);
  num_valid_ = reinterpret_cast<int*>(bytes + at.num_valid);
  rows_by_token_workspace_ = bytes + at.rows_by_token;
  rows_by_token_workspace_bytes_ = at.rows_by_token_bytes;
}

void TransformerCuda::forward(const int32_t* tokens, const int32_t* lengths, const int32_t* targets, int B, int S,
                              float loss_scale, const int32_t* positions) {
  const bool classify = !config_.causal();
  if (B < 0) throw std::invalid_argument("TransformerCuda::forward: negative batch size " + std::to_string(B));
  if (B > 0 && (S < 1 || S > max_seq_ || int64_t{B} * S > max_tokens_))
    throw std::invalid_argument("TransformerCuda::forward: " + std::to_string(B) + " rows of " + std::to_string(S) +
                                " tokens exceed the capacity (rows of at most " + std::to_string(max_seq_) + ", " +
                                std::to_string(max_tokens_) + " tokens in all)");
  if (B > 0 && classify && !targets)
    throw std::invalid_argument("TransformerCuda::forward: the classifier needs targets");
  if (positions && (classify || attention_ != AttentionKind::kFused))
    throw std::invalid_argument("TransformerCuda::forward: packed rows need the causal LM and the fused attention");
  NvtxRange range("TransformerCuda forward");
  batch_ = B;
  seq_ = B > 0 ? S : 0;
  tokens_ = tokens;
  lengths_ = lengths;
  positions_ = positions;
  targets_ = classify ? targets : lm_targets_;
  if (precision_ == Precision::kBf16)
    forward_layers<bf16>(loss_scale);
  else
    forward_layers<float>(loss_scale);
  loss_host_->enqueue(mean_loss_, stream_);
}

template <typename T>
void TransformerCuda::forward_layers(float loss_scale) {
  const bool classify = !config_.causal();
  const int B = batch_, S = seq_, C = config_.d_model, H = config_.mlp_hidden, K = config_.head_outputs();
  const int BT = B * S;
  if constexpr (std::is_same_v<T, bf16>) {
    // The whole flat buffer (weights and biases for the GEMMs, wte for the tied LM head; wpe and LayerNorm's
    // parameters, read in fp32, stay unused), after a change of the master weights that did not rewrite the copy too
    // (the initial upload, a checkpoint; AdamW writes it, params_for_update).
    if (master_weights_changed()) cuda::f32_to_bf16(weights_bf16_, flat_params_, flat_size_, stream_);
  }
  T* x = as<T>(encoded_);
  cuda::embedding_forward<T>(x, tokens_, lengths_, positions_, params_[0].data,
                             wpe_ >= 0 ? params_[wpe_].data : nullptr, B, S, C, stream_);
  // For backward's dwte, here rather than there: backward closes with the embedding's gradient, whose all-reduce is
  // the step's last, and the sort is off that path.
  rows_by_token_ = cuda::sort_rows_by_token(rows_by_token_workspace_, rows_by_token_workspace_bytes_, tokens_, lengths_,
                                            B, S, config_.vocab, C, stream_);
  for (int l = 0; l < config_.layers; ++l) {
    NvtxRange range(nvtx_forward_[l].c_str());
    const BlockActs& a = blocks_[l];
    const auto p = [&](int k) { return params_[block_param(l, k)].data; };  // fp32: LayerNorm parameters
    const auto w = [&](int k) { return operand<T>(block_param(l, k)); };    // as the GEMMs read them, biases too
    T *qkv = as<T>(a.qkv), *atty = as<T>(a.atty), *res_attn = as<T>(a.res_attn), *res_out = as<T>(a.res_out);
    cuda::layernorm_forward<T>(as<T>(a.ln1), a.ln1_mean, a.ln1_rstd, x, p(kLn1W), p(kLn1B), BT, C, stream_);
    cuda::matmul_forward<T>(gemm_, qkv, as<T>(a.ln1), w(kQkvW), w(kQkvB), BT, C, 3 * C, stream_);
    attention_forward<T>(a);
    // Each branch's last GEMM adds the residual stream in its epilogue.
    cuda::matmul_residual_forward<T>(gemm_, res_attn, atty, w(kProjW), w(kProjB), x, BT, C, C, stream_);
    cuda::layernorm_forward<T>(as<T>(a.ln2), a.ln2_mean, a.ln2_rstd, res_attn, p(kLn2W), p(kLn2B), BT, C, stream_);
    cuda::matmul_bias_gelu_forward<T>(gemm_, as<T>(a.fch_gelu), as<T>(a.fch), as<T>(a.ln2), w(kFcW), w(kFcB), BT, C, H,
                                      stream_);
    cuda::matmul_residual_forward<T>(gemm_, res_out, as<T>(a.fch_gelu), w(kFcprojW), w(kFcprojB), res_attn, BT, H, C,
                                     stream_);
    x = res_out;
  }
  NvtxRange range("head forward");
  T* lnf_out = as<T>(lnf_out_);
  cuda::layernorm_forward<T>(lnf_out, lnf_mean_, lnf_rstd_, x, params_[lnf_].data, params_[lnf_ + 1].data, BT, C,
                             stream_);
  const T* features = lnf_out;
  int rows = BT;
  if (classify) {
    cuda::mean_pool_forward<T>(as<T>(pooled_), lnf_out, lengths_, B, S, C, stream_);
    features = as<T>(pooled_);
    rows = B;
  } else {
    cuda::next_token_targets(lm_targets_, tokens_, lengths_, positions_, B, S, stream_);
  }
  T* logits = as<T>(logits_);
  cuda::matmul_forward<T>(gemm_, logits, features, operand<T>(head_),
                          config_.tied_head() ? nullptr : operand<T>(head_ + 1), rows, C, K, stream_);
  // The loss and the gradient of loss_scale x the mean loss in one pass, over the logits: backward needs only that.
  cuda::softmax_cross_entropy_fused<T>(logits, losses_, mean_loss_, num_valid_, logits, targets_, rows, K, loss_scale,
                                       stream_);
}

// The unfused attention kernels are fp32-only: in bf16 mode q, k, v go through fp32 copies behind the workspace, and
// the output comes back rounded to bf16. The fused ones read and write the bf16 activations in place.
template <typename T>
void TransformerCuda::attention_forward(const BlockActs& a) {
  const int B = batch_, S = seq_, C = config_.d_model, NH = config_.heads;
  T* const out = as<T>(a.atty);
  const T* const qkv = as<T>(a.qkv);
  float* const att = a.att;
  if constexpr (std::is_same_v<T, bf16>) {
    if (attention_ == AttentionKind::kFused)
      return cuda::flash_attention_forward(out, att, qkv, lengths_, positions_, B, S, C, NH, config_.causal(), stream_);
    if (attention_ == AttentionKind::kCudnn)
      return cudnn_->forward(out, att, qkv, lengths_, B, S, C, NH, config_.causal(), stream_);
  }
  if constexpr (std::is_same_v<T, float>) {
    cuda::attention_forward(gemm_, out, att, scratch_, qkv, lengths_, B, S, C, NH, config_.causal(), stream_);
  } else {
    const int64_t BTC = int64_t{B} * S * C;
    float* qkv32 = scratch_ + cuda::attention_forward_workspace_floats(B, S, C, NH);  // kForwardFp32Copies of BTC
    float* out32 = qkv32 + 3 * BTC;
    cuda::bf16_to_f32(qkv32, qkv, 3 * BTC, stream_);
    cuda::attention_forward(gemm_, out32, att, scratch_, qkv32, lengths_, B, S, C, NH, config_.causal(), stream_);
    cuda::f32_to_bf16(out, out32, BTC, stream_);
  }
}

template <typename T>
void TransformerCuda::attention_backward(T* dqkv, const T* dout, const BlockActs& a) {
  const int B = batch_, S = seq_, C = config_.d_model, NH = config_.heads;
  const T* const qkv = as<T>(a.qkv);
  const float* const att = a.att;
  if constexpr (std::is_same_v<T, bf16>) {
    if (attention_ == AttentionKind::kFused)
      return cuda::flash_attention_backward(dqkv, scratch_, dout, qkv, as<T>(a.atty), att, lengths_, positions_, B, S,
                                            C, NH, config_.causal(), stream_, deterministic_);
    if (attention_ == AttentionKind::kCudnn)
      return cudnn_->backward(dqkv, dout, qkv, as<T>(a.atty), att, lengths_, B, S, C, NH, config_.causal(), stream_);
  }
  if constexpr (std::is_same_v<T, float>) {
    cuda::attention_backward(gemm_, dqkv, scratch_, dout, qkv, att, lengths_, B, S, C, NH, config_.causal(), stream_);
  } else {
    const int64_t BTC = int64_t{B} * S * C;
    float* dout32 = scratch_ + cuda::attention_backward_workspace_floats(B, S, C, NH);  // kBackwardFp32Copies of BTC
    float* qkv32 = dout32 + BTC;
    float* dqkv32 = qkv32 + 3 * BTC;
    cuda::bf16_to_f32(dout32, dout, BTC, stream_);
    cuda::bf16_to_f32(qkv32, qkv, 3 * BTC, stream_);
    cuda::attention_backward(gemm_, dqkv32, scratch_, dout32, qkv32, att, lengths_, B, S, C, NH, config_.causal(),
                             stream_);
    cuda::f32_to_bf16(dqkv, dqkv32, 3 * BTC, stream_);
  }
}

float TransformerCuda::loss() const { return loss_host_->wait(); }

void TransformerCuda::backward(const GradReadyHook& on_ready) {
  if (batch_ < 0) throw std::logic_error("TransformerCuda::backward: no forward since the last backward");
  NvtxRange range("TransformerCuda backward");
  if (precision_ == Precision::kBf16)
    backward_layers<bf16>(on_ready);
  else
    backward_layers<float>(on_ready);
  batch_ = -1;
}

template <typename T>
void TransformerCuda::backward_layers(const GradReadyHook& on_ready) {
  const bool classify = !config_.causal();
  const int B = batch_, S = seq_, C = config_.d_model, H = config_.mlp_hidden, K = config_.head_outputs();
  const int BT = B * S;
  PieceAnnouncer announce = cuda_model::device_piece_announcer(pieces_, piece_events_, stream_, on_ready);
  T *dresid = as<T>(dresid_), *dsmall = as<T>(dsmall_), *dbig = as<T>(dbig_);
  const T* dlogits = as<T>(logits_);  // forward's fused cross-entropy left the gradient of the scaled loss here
  // discard_grad(): each gradient's first write below goes over it (GEMMs with beta 0, bias and LayerNorm sums
  // written), and the embeddings' scatter targets are zeroed first, so no pass zeroes the whole buffer.
  const bool accumulate = !take_discard();

  // A Linear layer out = inp W^T + b: the bias gradient (our kernel: faster on an H200 than cuBLASLt's BGRADB
  // epilogue, docs/GPU.md), then the weight's, block by block, each announced as soon as it is done. Then the input
  // gradient, which backward needs next but the communication does not; through the GELU that made inp when pre_gelu is
  // given (the MLP's second Linear). bias_summed: the LayerNorm backward that wrote dout summed the bias gradient
  // already (below).
  const auto linear_backward = [&](int w, T* dinp, const T* dout, const T* inp, int N, int in, int out,
                                   const T* pre_gelu = nullptr, bool bias_summed = false) {
    if (!bias_summed) cuda::bias_backward<T>(gemm_, params_[w + 1].grad, dout, N, out, stream_, accumulate);
    announce.all_of(w + 1);
    while (const GradPiece* g = announce.next_of(w)) {
      const int first = static_cast<int>(g->first_row), count = static_cast<int>(g->numel / in);
      cuda::matmul_backward_weight<T>(gemm_, params_[w].grad, dout, inp, N, in, out, first, first + count, stream_,
                                      accumulate);
      announce.ready(w);
    }
    if (pre_gelu)
      cuda::matmul_backward_input_dgelu<T>(gemm_, dinp, dout, operand<T>(w), pre_gelu, N, in, out, stream_);
    else
      cuda::matmul_backward_input<T>(gemm_, dinp, dout, operand<T>(w), N, in, out, stream_);
  };
  // dresid is the residual stream's gradient: every LayerNorm on it adds its branch's share (dinp accumulates). What it
  // holds then is also the output gradient of the Linear backward meets next (fcproj after lnf and ln1, proj after
  // ln2), whose bias gradient, its column sums, the LayerNorm's backward adds up in the same pass: next_bias, that
  // bias's index (-1: none, below the first block).
  const auto layernorm_backward = [&](int w, const T* dout, const T* inp, const float* mean, const float* rstd,
                                      int next_bias) {
    cuda::layernorm_backward<T>(dresid, params_[w].grad, params_[w + 1].grad, scratch_, dout, inp, params_[w].data,
                                mean, rstd, BT, C, stream_, accumulate,
                                next_bias >= 0 ? params_[next_bias].grad : nullptr);
    announce.all_of(w + 1);
    announce.all_of(w);
  };

  {
    NvtxRange range("head backward");
    if (classify) {
      linear_backward(head_, as<T>(dpooled_), dlogits, as<T>(pooled_), B, C, K);
      cuda::mean_pool_backward<T>(dsmall, as<T>(dpooled_), lengths_, B, S, C, stream_);
    } else {
      // The tied head: its weight gradient is wte's first share (written over it where discarded); the embedding
      // backward adds the rest and announces wte.
      cuda::matmul_backward_weight<T>(gemm_, params_[head_].grad, dlogits, as<T>(lnf_out_), BT, C, K, 0, K, stream_,
                                      accumulate);
      cuda::matmul_backward_input<T>(gemm_, dsmall, dlogits, operand<T>(head_), BT, C, K, stream_);
    }
    cudaCheck(cudaMemsetAsync(dresid, 0, sizeof(T) * BT * C, stream_));
    const T* x_final = config_.layers > 0 ? as<T>(blocks_.back().res_out) : as<T>(encoded_);
    layernorm_backward(lnf_, dsmall, x_final, lnf_mean_, lnf_rstd_,
                       config_.layers > 0 ? block_param(config_.layers - 1, kFcprojB) : -1);
  }
  for (int l = config_.layers - 1; l >= 0; --l) {
    NvtxRange range(nvtx_backward_[l].c_str());
    const BlockActs& a = blocks_[l];
    const T* x_in = l > 0 ? as<T>(blocks_[l - 1].res_out) : as<T>(encoded_);
    const auto id = [&](int k) { return block_param(l, k); };
    // dresid = dL/d res_out: through the MLP branch ...
    linear_backward(id(kFcprojW), dbig, dresid, as<T>(a.fch_gelu), BT, H, C, as<T>(a.fch), /*bias_summed=*/true);
    linear_backward(id(kFcW), dsmall, dbig, as<T>(a.ln2), BT, C, H);
    layernorm_backward(id(kLn2W), dsmall, as<T>(a.res_attn), a.ln2_mean, a.ln2_rstd, id(kProjB));
    // ... now dL/d res_attn: through the attention branch.
    linear_backward(id(kProjW), dsmall, dresid, as<T>(a.atty), BT, C, C, nullptr, /*bias_summed=*/true);
    attention_backward<T>(dbig, dsmall, a);
    linear_backward(id(kQkvW), dsmall, dbig, as<T>(a.ln1), BT, C, 3 * C);
    layernorm_backward(id(kLn1W), dsmall, x_in, a.ln1_mean, a.ln1_rstd, l > 0 ? block_param(l - 1, kFcprojB) : -1);
  }
  // The embeddings are final only now (and wte is the largest tensor): the communication's last bucket. Their
  // scatter adds to the batch's rows only: a discarded gradient is zeroed first (wte's not where the tied head wrote
  // it).
  if (!accumulate)
    for (const int e : {config_.tied_head() ? -1 : 0, wpe_})
      if (e >= 0) cudaCheck(cudaMemsetAsync(params_[e].grad, 0, params_[e].numel * sizeof(float), stream_));
  cuda::embedding_backward<T>(params_[0].grad, wpe_ >= 0 ? params_[wpe_].grad : nullptr, dresid, rows_by_token_,
                              lengths_, positions_, B, S, C, stream_);
  if (wpe_ >= 0) announce.all_of(wpe_);
  announce.all_of(0);
  if (!announce.done()) throw std::logic_error("TransformerCuda: not every gradient piece was announced");
}

}  // namespace ddplab
