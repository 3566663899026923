// Which attention the CUDA transformer runs (--attention). Plain C++ (no CUDA headers), so the command line can
// check the option where CUDA is not built. What each does: docs/GPU.md, "Fused attention".
#pragma once
#include "runtime/choices.h"

namespace ddplab {

enum class AttentionKind {
  kUnfused,  // kernels/cuda/attention.h: fp32 data, cuBLAS batched GEMMs over S x S, att [B, NH, S, S] kept
  kFused,    // kernels/cuda/flash_attention.h: bf16, flash-attention-2 style, only the row log-sum-exp kept
  kCudnn,    // kernels/cuda/cudnn_attention.h: cuDNN's fused attention, same contract; the library's upper bound
};

constexpr std::array<Named<AttentionKind>, 3> choice_names(AttentionKind) {
  return {{{AttentionKind::kUnfused, "unfused"}, {AttentionKind::kFused, "fused"}, {AttentionKind::kCudnn, "cudnn"}}};
}

// The head sizes (d_model / heads) the fused kernels have an instantiation for: the same list as
// cuda::flash_attention_supports_head_size (kernels/cuda/flash_attention.h), which a host test keeps in step.
inline bool fused_attention_supports_head_size(int head_size) {
  return head_size == 32 || head_size == 64 || head_size == 128;
}
inline const char* fused_attention_head_sizes() { return "32, 64 or 128"; }

// The head sizes cuDNN's fused attention takes: cuda::cudnn_attention_supports_head_size's rule.
inline bool cudnn_attention_supports_head_size(int head_size) {
  return head_size > 0 && head_size <= 128 && head_size % 8 == 0;
}

// --attention auto: the fastest attention that can run, by what was measured on an H200 (docs/BENCHMARKS.md):
// cuDNN's where its library loads (bf16 on the GPU, a head size it takes), else our fused kernels (bf16 on the GPU, a
// head size they have), else the unfused ones. --deterministic on changes none of it: each runs deterministically then.
inline AttentionKind auto_attention(bool bf16_on_gpu, int head_size, bool cudnn_available) {
  if (bf16_on_gpu && cudnn_available && cudnn_attention_supports_head_size(head_size)) return AttentionKind::kCudnn;
  return bf16_on_gpu && fused_attention_supports_head_size(head_size) ? AttentionKind::kFused
                                                                      : AttentionKind::kUnfused;
}

}  // namespace ddplab
