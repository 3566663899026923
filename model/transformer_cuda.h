// The transformer of model/transformer.h on one GPU, forward and backward through the kernels/cuda launchers, built
// as MlpCuda (model/mlp_cuda.h) is: for a trainer that drives it on a compute stream and reduces gradient pieces on
// a communication stream while backward runs.
//
// Shared with Transformer<float>: the config, the parameter registration (names, shapes), the flat parameter and
// gradient layout in REVERSE registration order, the gradient pieces (head, lnf, blocks last to first, the
// embeddings last), and the initial values, bit for bit: the constructor builds the CPU model with the same seed
// and uploads its parameters. Checkpoints and bucket layouts carry over. Parameter::data and ::grad point to DEVICE
// memory here. Both heads (kClassify, kCausalLM) and variable lengths; packed rows (positions: kCausalLM with kFused
// attention, whose kernels keep each sequence's queries to its own keys).
//
// Asynchronous: every call enqueues on the stream given at construction and returns; only loss() waits (for the
// last forward's loss and nothing else). backward() records an event per gradient piece right after that piece's
// last kernel and then calls the hook, so the hook can make a communication stream wait on piece_ready_event(k).
//
// Precision (model/precision.h; the table in docs/GPU.md): parameters, gradients and the loss are fp32 in every
// mode. fp32 and tf32 keep fp32 activations and differ in the GEMMs' math; bf16 runs the Linear layers' GEMMs on
// bf16 activations and bf16 copies of the weights and biases (converted from the fp32 masters by the first forward
// after they changed: once per optimizer step), and the residual stream and its gradient in bf16.
//
// Attention (model/attention_kind.h, --attention): kUnfused (the default) is fp32 in every mode (kernels/cuda/
// attention.h; bf16 mode converts q, k, v to fp32 and the output back) with TF32 GEMMs in tf32 and bf16 modes, and
// keeps att [B, heads, S, S] per layer for backward. kFused (bf16 only; heads of 32, 64 or 128) runs
// kernels/cuda/flash_attention.h on the bf16 qkv in place and keeps only the row log-sum-exp [B, heads, S]; kCudnn
// (bf16 only; heads a multiple of 8 up to 128) runs cuDNN's through kernels/cuda/cudnn_attention.h, the same way.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "model/attention_kind.h"
#include "model/cuda_common.h"
#include "model/precision.h"
#include "model/transformer.h"

namespace ddplab {

class TransformerCuda : public cuda_model::DeviceParameters {
 public:
  // Device buffers for batches of B rows of S tokens with B * S <= max_tokens and S <= max_seq (<= config.max_len),
  // allocated once: a step allocates nothing. The unfused attention keeps B * heads * S^2 floats per layer, bounded
  // by heads * max_tokens * max_seq; the fused one B * heads * S (the lse). A bad config or capacity, or the fused
  // attention outside bf16 or with an unsupported head size, throws std::invalid_argument before the device is
  // touched; a CUDA failure, std::runtime_error. deterministic (--deterministic on): the fused attentions' backwards
  // sum dQ in a fixed order (cuDNN's deterministic algorithm; ours from per-key-block shares) instead of by atomics.
  TransformerCuda(const TransformerConfig& config, uint64_t seed, Precision precision, int64_t max_tokens, int max_seq,
                  cudaStream_t stream, AttentionKind attention = AttentionKind::kUnfused, bool deterministic = false,
                  cuda::CudnnShapes cudnn_shapes = cuda::CudnnShapes::kStatic);
  TransformerCuda(const TransformerCuda&) = delete;
  TransformerCuda& operator=(const TransformerCuda&) = delete;

  const TransformerConfig& config() const { return config_; }
  Precision precision() const { return precision_; }
  AttentionKind attention() const { return attention_; }
  // What building cuDNN's attention graphs has cost (kCudnn; else nullopt).
  std::optional<cuda::CudnnBuildStats> cudnn_build_stats() const;
  // The GEMMs' context: how they pick cuBLASLt's algorithms (set_timed_algos), what they planned.
  cuda::GemmContext& gemm() { return gemm_; }
  const cuda::GemmContext& gemm() const { return gemm_; }
  int64_t max_tokens() const { return max_tokens_; }
  int max_seq() const { return max_seq_; }
  // parameters(), the flat buffers, grad_pieces() and their events, zero_grad(), discard_grad(), stream():
  // DeviceParameters.

  // Device memory, as Transformer::forward: tokens [B, S], lengths [B] in [1, S] (null: all S), targets: kClassify
  // [B] classes in [0, num_classes), kCausalLM ignored (may be null; the targets are the next tokens, made on the
  // device). 0 <= B, and for B > 0: 1 <= S <= max_seq, B * S <= max_tokens (else std::invalid_argument). Enqueues the
  // model, the fused softmax cross-entropy (which also writes the gradient of loss_scale x the mean loss for
  // backward: the weight of this batch in a larger loss, micro-batches and ranks of unequal loss counts, at no extra
  // pass) and an asynchronous copy of the mean loss to pinned host memory. The inputs are read by this forward's
  // kernels and, the tokens and lengths, by backward's: work that overwrites them must be ordered after backward.
  // Nothing is checked on the device (that would need a sync): a token outside [0, vocab) at a valid position reads
  // outside wte, a target >= num_classes makes the loss NaN. positions: packed rows, as Transformer::forward's (device
  // memory [B, S]; null: a sequence per row); kCausalLM with kFused attention only (else std::invalid_argument), read
  // by backward too.
  void forward(const int32_t* tokens, const int32_t* lengths, const int32_t* targets, int B, int S,
               float loss_scale = 1.0f, const int32_t* positions = nullptr);
  // The mean loss of the last forward, fp32 (0 for an empty batch), on the host: WAITS for that forward's loss copy
  // (not for later work on the stream). NaN before the first forward.
  float loss() const;

  // Backward of loss_scale x the last forward's mean loss (the scale given to forward). ACCUMULATES (+=) into the
  // fp32 gradients, or writes them over after discard_grad() (zero_grad() or discard_grad() first unless
  // accumulating). For each piece in grad_pieces() order:
  // enqueue its kernels, record piece_ready_event(k), call on_ready(k). Once per forward (a second call throws
  // std::logic_error): the gradient of the logits is consumed.
  void backward(const GradReadyHook& on_ready = nullptr);

 private:
  // Per block, what backward needs of its forward (T: float or __nv_bfloat16 by precision).
  struct BlockActs {
    void *ln1, *qkv, *atty, *res_attn, *ln2, *fch, *fch_gelu, *res_out;  // T
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    float* att;  // unfused: the probabilities [B, heads, S, S]; fused: the row log-sum-exp [B, heads, S]
  };
  // The one device allocation: where each buffer lies (transformer_cuda.cpp), how large attention's and LayerNorm
  // backward's scratch must be, and the members pointed into it.
  struct BufferOffsets;
  int64_t scratch_floats() const;
  BufferOffsets buffer_offsets() const;
  void point_into(char* bytes, const BufferOffsets& at);
  int block_param(int layer, int k) const { return block_base_ + transformer_block::kParams * layer + k; }
  template <typename T>
  void forward_layers(float loss_scale);
  template <typename T>
  void backward_layers(const GradReadyHook& on_ready);
  // Forward: a.atty from a.qkv, saving a.att. Backward: dqkv from dout and what the forward left in a.
  template <typename T>
  void attention_forward(const BlockActs& a);
  template <typename T>
  void attention_backward(T* dqkv, const T* dout, const BlockActs& a);

  TransformerConfig config_;
  Precision precision_;
  AttentionKind attention_;
  bool deterministic_;
  int64_t max_tokens_;
  int max_seq_;
  // Registration indices, as the CPU's (a weight's bias is +1). head_: the classifier's head.weight, or wte (0) where
  // tied.
  int wpe_ = -1, block_base_ = 0, lnf_ = 0, head_ = 0;
  std::vector<std::string> nvtx_forward_, nvtx_backward_;  // "h<l> forward" / "h<l> backward"
  cuda::GemmContext gemm_;
  std::unique_ptr<cuda::CudnnAttention> cudnn_;  // kCudnn only

  // One device allocation holds everything below; activations are float or __nv_bfloat16 by precision.
  cuda::DeviceMemory memory_;
  void* encoded_ = nullptr;                // [tokens, C] the embeddings' output
  std::vector<BlockActs> blocks_;
  void *lnf_out_ = nullptr, *pooled_ = nullptr, *logits_ = nullptr;  // logits: then their gradient
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  int32_t* lm_targets_ = nullptr;                                                      // kCausalLM: the next tokens
  void *dresid_ = nullptr, *dsmall_ = nullptr, *dbig_ = nullptr, *dpooled_ = nullptr;  // backward's gradients
  float* scratch_ = nullptr;  // attention's workspace (unfused bf16: and fp32 copies), LayerNorm backward's partials
  float* losses_ = nullptr;   // per row of logits
  float* mean_loss_ = nullptr;
  int* num_valid_ = nullptr;
  void* rows_by_token_workspace_ = nullptr;  // the batch's rows sorted by token, for a deterministic dwte
  size_t rows_by_token_workspace_bytes_ = 0;
  std::optional<cuda_model::LossReadback> loss_host_;  // made once the arguments are checked (it touches the device)

  // Set by forward for backward: the batch (-1: no backward pending) and its inputs.
  int batch_ = -1, seq_ = 0;
  const int32_t *tokens_ = nullptr, *lengths_ = nullptr, *targets_ = nullptr, *positions_ = nullptr;
  cuda::RowsByToken rows_by_token_;
};

}  // namespace ddplab
