// cuDNN's fused scaled-dot-product attention (its FlashAttention-style kernels, picked by cuDNN's heuristics) behind
// the contract of flash_attention.h, so the model can run either: the expert upper bound that our own kernels are
// measured against (docs/GPU.md, "Fused attention").
//   qkv [B, S, 3C] bf16 read in place through strides (Q, K, V as [B, NH, S, hs] views); out [B, S, C] bf16 written in
//   place; lse [B, NH, S] fp32 is cuDNN's softmax statistics (the row log-sum-exp of the scaled scores, natural log)
//   on valid rows, unspecified on padded ones, and only the backward reads it.
//   Valid keys of query t: j < len[b], and j <= t when causal (cuDNN's padding mask with per-sequence lengths, and
//   its top-left causal mask). Padded rows of out and dqkv are written as exact zeros, as flash_attention.h's are.
//
// Built where CMake found cuDNN's header and its frontend's C++ headers (the nvidia-cudnn-frontend wheel; CMakeLists
// says how). libcudnn itself is loaded on first use, so a build with it still runs where the library is missing:
// cudnn_attention_available() then says why, and --attention cudnn refuses with that line.
//
// Graphs (one per direction and problem: B, S, C, NH, causal, padded) are built on first use and cached. A build takes
// tens of milliseconds, so a run with few distinct shapes pays it in its first steps only; one whose batches take
// their longest row's length (--lengths other than fixed) meets a new S in many steps, and each pays a build there.
// CudnnShapes::kDynamic builds every (B, S) of one structure as cuDNN's dynamic-shape graphs sharing one kernel cache,
// so that a new shape plans again without compiling again; a structure cuDNN refuses so is built static instead
// (build_stats says how many). Not thread-safe: one object per stream.
//
// The forward is deterministic. The backward by default is not promised to be (cuDNN may add dQ with atomics); an
// object made with deterministic_backward asks cuDNN for its deterministic algorithm, which on Hopper writes dS to a
// workspace of B * NH * S^2 bf16 and computes dQ from it as a GEMM (more memory traffic, the same bits every call).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ddplab::cuda {

// Whether this build has the cuDNN path and its library loads on this machine, with a device cuDNN's attention
// supports (compute capability 8.0 or later). On false, `why` (if given) gets one line naming the missing piece.
bool cudnn_attention_available(std::string* why = nullptr);

// The head sizes cuDNN's fused attention takes (a multiple of 8 up to 128: what its backward supports on every
// architecture it runs on).
constexpr bool cudnn_attention_supports_head_size(int hs) { return hs > 0 && hs <= 128 && hs % 8 == 0; }

enum class CudnnShapes {
  kStatic,   // a graph specialised for each (B, S), its kernels compiled for it
  kDynamic,  // dynamic-shape graphs, one kernel cache per structure (C, NH, causal, padded, direction)
};

// What building graphs has cost so far.
struct CudnnBuildStats {
  CudnnShapes shapes = CudnnShapes::kStatic;
  int64_t graphs = 0;           // distinct problems built (one per direction and shape)
  int64_t built_static = 0;     // of them, asked dynamic and built static (cuDNN refused the dynamic graph)
  double build_ms = 0;          // host time in the builds and the workspace's growth
  int64_t workspace_bytes = 0;  // the workspace held: the largest a graph asked for
  // "24 graphs (static shapes) built in 1.42 s, workspace 0.0 MiB": what a run's summary prints.
  std::string describe() const;
};

class CudnnAttention {
 public:
  // Touches nothing: the handle, library and graphs come on first use.
  explicit CudnnAttention(bool deterministic_backward = false, CudnnShapes shapes = CudnnShapes::kStatic);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // out [B, S, C] and lse [B, NH, S] OVERWRITTEN. lengths: int32 [B] on the device, each in [0, S]; null: every
  // sequence is S. S = 1 is refused: cuDNN takes no single-token problems. Throws std::invalid_argument on bad sizes or pointers, std::runtime_error where cuDNN is
  // unavailable or refuses the problem (with cuDNN's message).
  void forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const int32_t* lengths, int B, int S, int C,
               int NH, bool causal, cudaStream_t stream);

  // dqkv [B, S, 3C] OVERWRITTEN (0 on padded rows), from dout [B, S, C] and the forward's qkv, out and lse (same
  // lengths and causal).
  void backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                const float* lse, const int32_t* lengths, int B, int S, int C, int NH, bool causal,
                cudaStream_t stream);

  CudnnBuildStats build_stats() const;

  struct Impl;  // cudnn_attention.cpp only

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddplab::cuda
