// Fused masked multi-head self-attention in bf16 (flash-attention-2 style): the same semantics as attention.h and the
// CPU reference cpu::attention_forward / attention_backward (kernels/cpu/transformer_ops.h), without the S x S matrix.
//   qkv [B, S, 3C] bf16 (q | k | v, each C = NH heads of hs = C / NH), read in place (no split-heads copies);
//   out [B, S, C] bf16, written in place (no merge pass); lse [B, NH, S] fp32, the row log-sum-exp of the scaled
//   scores, the only thing the forward saves for backward.
//   Valid keys of query t: j < len[b], and j <= t when causal; len[b] clamped to [0, S]; packed rows (positions, as
//   the CPU reference's: int32 [B, S] in device memory, each valid token's position within its own sequence, 0 where
//   one starts, else the previous plus 1; causal only), also j >= t - positions[b, t], the keys of t's own sequence.
//   Padded query rows
//   (t >= len[b]) output exactly 0 and have lse = -inf (the log of an empty sum); padded rows of qkv, dout and out are
//   never read; backward writes 0 into dqkv's padded rows. Scale 1 / sqrt(hs).
//
// The scheme (docs/GPU.md, "Fused attention"): forward, a CTA per (64-query block, head, sequence) walks the key
// blocks a causal mask leaves, keeping an online softmax (running max and sum per row) and the output in fp32;
// backward, a CTA per (64-key block, head, sequence) walks the query blocks that see it, recomputes P from Q, K and
// the lse, accumulates dK and dV in fp32 tensor-core fragments and adds its share of dQ into an fp32 workspace with
// atomics, after a first kernel computed D_i = rowsum(dO_i * O_i); a last kernel rounds dQ into dqkv. Deterministic
// (--deterministic on), each key block stores its share of dQ instead, and the last kernel sums the shares in
// key-block order. Fully masked blocks (the causal upper triangle, keys or queries beyond len, and in packed rows the
// blocks between sequences) are skipped, so causal attention costs half the FLOPs of the full square, and a packed
// row about the sum of its sequences' triangles. The products run on bf16 tensor cores (mma.sync m16n8k16, fp32
// accumulation, scores and probabilities kept in registers): sm_80 or later; the softmax and every accumulation are
// fp32.
//
// By default not deterministic: dQ sums the key blocks' shares in the order their atomics land (last-bit differences
// from run to run). Everything else is. The deterministic backward sums them in a fixed order, at the price of a
// workspace of ceil(S / 64) dQ shares (403 MB at gpt2-small's 8 x 1024 tokens, against 25 MB) and their memory
// traffic, about half of it written and read once (the causal triangle).
//
// Head sizes 32, 64 and 128 (a kernel instantiation each); another throws std::invalid_argument on the host before
// anything is touched, as do bad sizes, null or misaligned (16-byte) pointers. B*S == 0 launches nothing.
// Asynchronous on `stream`; a failed launch throws std::runtime_error (check.cuh).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// Whether the fused kernels have an instantiation for heads of hs dimensions.
constexpr bool flash_attention_supports_head_size(int hs) { return hs == 32 || hs == 64 || hs == 128; }

// Throws std::invalid_argument, naming `what` and the problem, unless B, S >= 0, C > 0 divisible by NH > 0, the head
// size C / NH is supported, B x NH is at most 2^31 - 1 and the blocks of S (64 rows each) at most 65535 (the grid's
// dimensions). Touches nothing.
void flash_attention_check_sizes(const char* what, int B, int S, int C, int NH);

// Floats of workspace the backward needs: B*S*C (dQ accumulated in fp32; deterministic: ceil(S / 64) such shares) +
// B*NH*S (D = rowsum(dO * O)).
int64_t flash_attention_backward_workspace_floats(int B, int S, int C, int NH, bool deterministic = false);

// out [B, S, C] and lse [B, NH, S] OVERWRITTEN. lengths: int32 [B] in device memory, each clamped to [0, S]; null:
// every sequence is S. positions: null (a sequence per row) or as above, with causal (else std::invalid_argument).
// qkv and out 16-byte aligned. query_fragments: 16-row query fragments per warp, 0 for the
// kernel's choice (two at head size <= 64, one at 128), or 1 or 2 (2 only at <= 64), for the benchmark to compare.
void flash_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const int32_t* lengths,
                             const int32_t* positions, int B, int S, int C, int NH, bool causal, cudaStream_t stream,
                             int query_fragments = 0);

// dqkv [B, S, 3C] OVERWRITTEN (0 on padded rows), from dout [B, S, C] and the forward's qkv, out and lse (same
// lengths, positions, causal). workspace: flash_attention_backward_workspace_floats(B, S, C, NH, deterministic) floats,
// overwritten. dqkv, dout, qkv, out and workspace 16-byte aligned. deterministic: the same bits on every call.
void flash_attention_backward(__nv_bfloat16* dqkv, float* workspace, const __nv_bfloat16* dout,
                              const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                              const int32_t* lengths, const int32_t* positions, int B, int S, int C, int NH,
                              bool causal, cudaStream_t stream, bool deterministic = false);

}  // namespace ddplab::cuda
