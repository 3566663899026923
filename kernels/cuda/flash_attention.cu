// The fused attention's launchers: argument checks, then the launch sequence of flash_attention_kernels.cuh (the
// kernels, and the grid, block and shared memory of each launch) run with <<<>>> on the caller's stream. See
// flash_attention.h for the contract, docs/GPU.md for the why.
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

// ---- launchers ------------------------------------------------------------------------------------------------------

void require_aligned(const char* what, const char* name, const void* p) {
  if (p == nullptr || !detail::all_aligned(16, p))
    throw std::invalid_argument(std::string(what) + ": " + name + " must be a non-null, 16-byte aligned pointer");
}

// bf16 mma.sync, ldmatrix and cp.async need compute capability 8.0; an older device would trap inside the kernel
// instead. Asked once per thread and device, not on every call: the models call this twice per layer and step.
void require_bf16_tensor_cores(const char* what) {
  thread_local int checked_device = -1;
  int device = 0, major = 0, minor = 0;
  cudaCheck(cudaGetDevice(&device));
  if (device == checked_device) return;
  cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major < 8)
    throw std::runtime_error(std::string(what) + ": needs bf16 tensor cores (compute capability 8.0 or later); GPU " +
                             std::to_string(device) + " is " + std::to_string(major) + "." + std::to_string(minor));
  checked_device = device;
}

// The kernels find a packed query's keys from its sequence's first token to itself: the causal form only (the
// causal LM is the one model that packs rows).
void require_causal_if_packed(const char* what, const int32_t* positions, bool causal) {
  if (positions != nullptr && !causal)
    throw std::invalid_argument(std::string(what) + ": packed rows (positions) need causal attention");
}

}  // namespace

void flash_attention_check_sizes(const char* what, int B, int S, int C, int NH) {
  const std::string sizes = " (B=" + std::to_string(B) + " S=" + std::to_string(S) + " C=" + std::to_string(C) +
                            " NH=" + std::to_string(NH) + ")";
  if (B < 0 || S < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    throw std::invalid_argument(std::string(what) + ": need B, S >= 0 and C > 0 divisible by NH > 0" + sizes);
  if (!flash_attention_supports_head_size(C / NH))
    throw std::invalid_argument(std::string(what) + ": head size C/NH = " + std::to_string(C / NH) +
                                " has no fused kernel (supported: 32, 64, 128)" + sizes);
  if (int64_t{B} * NH > std::numeric_limits<int>::max() || (S + kBlockQ - 1) / kBlockQ > 65535)
    throw std::invalid_argument(std::string(what) + ": B x NH must be at most 2^31 - 1 and S / " +
                                std::to_string(kBlockQ) + " at most 65535 (a grid dimension each)" + sizes);
}

int64_t flash_attention_backward_workspace_floats(int B, int S, int C, int NH, bool deterministic) {
  flash_attention_check_sizes("flash_attention_backward_workspace_floats", B, S, C, NH);
  return (deterministic ? key_blocks(S) : 1) * int64_t{B} * S * C + int64_t{B} * NH * S;
}

void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, const int32_t* lengths, const int32_t* positions,
                             int B, int S, int C, int NH, bool causal, cudaStream_t stream, int query_fragments) {
  const char* what = "flash_attention_forward";
  flash_attention_check_sizes(what, B, S, C, NH);
  require_causal_if_packed(what, positions, causal);
  if (query_fragments < 0 || query_fragments > max_forward_frags(C / NH))
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(query_fragments) +
                                " query fragments per warp at head size " + std::to_string(C / NH) + " (0 for the "
                                "default, else 1 to " + std::to_string(max_forward_frags(C / NH)) + ")");
  if (int64_t{B} * S == 0) return;
  require_aligned(what, "out", out);
  require_aligned(what, "qkv", qkv);
  if (lse == nullptr) throw std::invalid_argument(std::string(what) + ": lse is null");
  require_bf16_tensor_cores(what);
  flash_forward_launches(detail::launch_on(stream), out, lse, qkv, lengths, positions, B, S, C, NH, causal,
                         query_fragments);
}

void flash_attention_backward(bf16* dqkv, float* workspace, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, const int32_t* lengths, const int32_t* positions, int B, int S, int C,
                              int NH, bool causal, cudaStream_t stream, bool deterministic) {
  const char* what = "flash_attention_backward";
  flash_attention_check_sizes(what, B, S, C, NH);
  require_causal_if_packed(what, positions, causal);
  if (int64_t{B} * S == 0) return;
  require_aligned(what, "dqkv", dqkv);
  require_aligned(what, "workspace", workspace);
  require_aligned(what, "dout", dout);
  require_aligned(what, "qkv", qkv);
  require_aligned(what, "out", out);
  if (lse == nullptr) throw std::invalid_argument(std::string(what) + ": lse is null");
  require_bf16_tensor_cores(what);
  flash_backward_launches(detail::launch_on(stream), dqkv, workspace, dout, qkv, out, lse, lengths, positions, B, S, C,
                          NH, causal, deterministic);
}

}  // namespace ddplab::cuda
