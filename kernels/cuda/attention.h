// Masked multi-head self-attention on the device: the CUDA twin of cpu::attention_forward / attention_backward
// (kernels/cpu/transformer_ops.h), same layouts and masks:
//   qkv [B, S, 3C] (q | k | v, each C = NH heads of hs = C / NH), out [B, S, C], att [B, NH, S, S];
//   valid keys of query t: j < len[b], and j <= t when causal; padded query rows (t >= len[b]) output 0 and have an
//   all-zero att row; masked entries of att are exactly 0; padded rows of qkv and dout are never read.
//
// The simple version, correctness first: heads are split into [B, NH, S, hs] copies (padded rows zeroed), scores
// and products are cuBLAS strided-batched GEMMs over the B*NH heads, and a warp-per-row kernel does the masked
// softmax (forward) and its backward. The full S x S score matrix is computed and the causal upper triangle
// discarded, so this costs O(S^2) memory (att is saved for backward, as on the CPU) and twice the causal FLOPs.
//
// Precision: fp32 data; the GEMMs use the context's math (GemmMath::kTf32: TF32 tensor cores), softmax is fp32.
// Asynchronous; bad sizes throw std::invalid_argument, failures std::runtime_error. B*S == 0 launches nothing.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/gemm.h"

namespace ddplab::cuda {

// Floats of workspace each direction needs: forward 4*B*S*C (q, k, v and the output, split by head); backward
// 7*B*S*C + B*NH*S*S (q, k, v, dout, dq, dk, dv split by head, and dP / dZ).
int64_t attention_forward_workspace_floats(int B, int S, int C, int NH);
int64_t attention_backward_workspace_floats(int B, int S, int C, int NH);

// out and att OVERWRITTEN. lengths: int32 [B] in device memory, each clamped to [0, S]; null: every sequence is S.
void attention_forward(GemmContext& ctx, float* out, float* att, float* workspace, const float* qkv,
                       const int32_t* lengths, int B, int S, int C, int NH, bool causal, cudaStream_t stream);

// dqkv [B, S, 3C] OVERWRITTEN (0 on padded rows), from dout [B, S, C] and the forward's qkv and att.
void attention_backward(GemmContext& ctx, float* dqkv, float* workspace, const float* dout, const float* qkv,
                        const float* att, const int32_t* lengths, int B, int S, int C, int NH, bool causal,
                        cudaStream_t stream);

}  // namespace ddplab::cuda
