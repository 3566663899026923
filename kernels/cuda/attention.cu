// The unfused attention's launchers (see attention.h for the contracts and the scheme; the kernels are in
// attention_kernels.cuh, which the CPU emulation runs too).
//
// Per head (batch index i = b * NH + h), with Q, K, V, dO, dQ, dK, dV [S, hs] and att, dP, dZ [S, S] row-major:
//   forward   att = softmax_masked(Q K^T / sqrt(hs))      out = att V
//   backward  dV = att^T dO    dP = dO V^T    dZ = att * (dP - rowsum(att * dP)) / sqrt(hs)    dQ = dZ K    dK = dZ^T Q
// as the CPU reference's comments state. The scale is applied as the GEMM's alpha (the CPU folds it into Q first:
// the two differ by rounding only).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

using attention::kBlock;
using attention::kWarps;

void check_sizes(const char* what, int B, int S, int C, int NH) {
  if (B < 0 || S < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    throw std::invalid_argument(std::string(what) +
                                ": need B, S >= 0 and C > 0 divisible by NH > 0, got B=" + std::to_string(B) +
                                " S=" + std::to_string(S) + " C=" + std::to_string(C) + " NH=" + std::to_string(NH));
}

void split_heads(float* out, const float* in, const int32_t* lengths, int B, int S, int C, int NH, int P,
                 cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(int64_t{B} * S, detail::kMaxGridSize));
  attention::split_heads_kernel<<<grid, kBlock, 0, stream>>>(out, in, lengths, B, S, C, NH, P);
  cudaCheck(cudaGetLastError());
}

void merge_heads(float* out, const float* in, const int32_t* lengths, int B, int S, int C, int NH, int P,
                 cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(int64_t{B} * S, detail::kMaxGridSize));
  attention::merge_heads_kernel<<<grid, kBlock, 0, stream>>>(out, in, lengths, B, S, C, NH, P);
  cudaCheck(cudaGetLastError());
}

}  // namespace

int64_t attention_forward_workspace_floats(int B, int S, int C, int NH) {
  check_sizes("attention_forward_workspace_floats", B, S, C, NH);
  return 4 * int64_t{B} * S * C;
}

int64_t attention_backward_workspace_floats(int B, int S, int C, int NH) {
  check_sizes("attention_backward_workspace_floats", B, S, C, NH);
  return 7 * int64_t{B} * S * C + int64_t{B} * NH * S * S;
}

void attention_forward(GemmContext& ctx, float* out, float* att, float* workspace, const float* qkv,
                       const int32_t* lengths, int B, int S, int C, int NH, bool causal, cudaStream_t stream) {
  check_sizes("attention_forward", B, S, C, NH);
  if (int64_t{B} * S == 0) return;
  if (workspace == nullptr) throw std::invalid_argument("attention_forward: workspace is null");
  const int hs = C / NH, batch = B * NH;
  const int64_t X = int64_t{B} * S * C, head = int64_t{S} * hs, scores = int64_t{S} * S;
  float *q = workspace, *k = q + X, *v = k + X, *y = v + X;
  split_heads(q, qkv, lengths, B, S, C, NH, 3, stream);
  gemm_strided_batched(ctx, false, true, S, S, hs, 1.0f / std::sqrt(static_cast<float>(hs)), q, hs, head, k, hs, head,
                       0.0f, att, S, scores, batch, stream);  // att = Q K^T / sqrt(hs)
  const int64_t rows = int64_t{batch} * S;
  attention::softmax_forward_kernel<<<detail::grid_size(rows, kWarps), kBlock, 0, stream>>>(att, lengths, NH, S, rows,
                                                                                            causal);
  cudaCheck(cudaGetLastError());
  gemm_strided_batched(ctx, false, false, S, hs, S, 1.0f, att, S, scores, v, hs, head, 0.0f, y, hs, head, batch,
                       stream);  // Y = att V
  merge_heads(out, y, lengths, B, S, C, NH, 1, stream);
}

void attention_backward(GemmContext& ctx, float* dqkv, float* workspace, const float* dout, const float* qkv,
                        const float* att, const int32_t* lengths, int B, int S, int C, int NH, bool causal,
                        cudaStream_t stream) {
  check_sizes("attention_backward", B, S, C, NH);
  if (int64_t{B} * S == 0) return;
  if (workspace == nullptr) throw std::invalid_argument("attention_backward: workspace is null");
  const int hs = C / NH, batch = B * NH;
  const int64_t X = int64_t{B} * S * C, head = int64_t{S} * hs, scores = int64_t{S} * S;
  float *q = workspace, *k = q + X, *v = k + X, *dy = v + X;
  float *dq = dy + X, *dk = dq + X, *dv = dk + X, *dz = dv + X;  // dq | dk | dv: the merge's three parts
  split_heads(q, qkv, lengths, B, S, C, NH, 3, stream);
  split_heads(dy, dout, lengths, B, S, C, NH, 1, stream);
  gemm_strided_batched(ctx, true, false, S, hs, S, 1.0f, att, S, scores, dy, hs, head, 0.0f, dv, hs, head, batch,
                       stream);  // dV = att^T dO
  gemm_strided_batched(ctx, false, true, S, S, hs, 1.0f, dy, hs, head, v, hs, head, 0.0f, dz, S, scores, batch,
                       stream);  // dP = dO V^T
  const int64_t rows = int64_t{batch} * S;
  attention::softmax_backward_kernel<<<detail::grid_size(rows, kWarps), kBlock, 0, stream>>>(
      dz, att, lengths, NH, S, rows, causal, 1.0f / std::sqrt(static_cast<float>(hs)));
  cudaCheck(cudaGetLastError());
  gemm_strided_batched(ctx, false, false, S, hs, S, 1.0f, dz, S, scores, k, hs, head, 0.0f, dq, hs, head, batch,
                       stream);  // dQ = dZ K
  gemm_strided_batched(ctx, true, false, S, hs, S, 1.0f, dz, S, scores, q, hs, head, 0.0f, dk, hs, head, batch,
                       stream);  // dK = dZ^T Q
  merge_heads(dqkv, dq, lengths, B, S, C, NH, 3, stream);
}

}  // namespace ddplab::cuda
