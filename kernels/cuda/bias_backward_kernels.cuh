// The bias gradient's kernels and their launch sequence (gemm.h's bias_backward has the contract). Included by exactly
// one translation unit per program: gemm.cu under nvcc, or the CPU emulation of tests/emu (g++, cuda_emulation.h
// included first), which runs this very source on host threads. Hence everything here is in an unnamed namespace.
//
// dbias[o] += sum_b dout[b, o] (or =, where the gradient is discarded) is a column reduction of a tall matrix (8192
// rows of 768 columns in gpt2-small): one block per 32 columns, as before, gave the 768-wide layers 24 blocks on 132
// SMs (1.28 ms for the step's 49 bias gradients on an H200, against ~0.4 ms to read dout once). So the rows are split
// too:
//   pass 1  block (x, y) sums the columns of tile x over row block y: lane l of every warp owns V adjacent columns
//           (16-byte loads: 8 bf16 or 4 floats), warp w takes rows w, w + 8, ... of the row block, and the 8 warps'
//           sums are added in warp order through shared memory; the block writes its partial row, or, when there is
//           only one row block, adds it to dbias (or writes it there) directly;
//   pass 2  one thread per column adds the row blocks' partials in row-block order, to dbias or over it.
// Deterministic: the grid depends on B, OC, V and the partials' capacity only (not on the device), and every sum runs
// in a fixed order, so two runs give the same bits (the replicas' contract).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"  // kBlockSize, grid_size, global_index, grid_stride

namespace ddplab::cuda {
namespace {

namespace bias_grad {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Blocks per launch, about: enough to fill 132 SMs several times (a block of 8 warps keeps a few loads in flight per
// warp), few enough that the partials stay small (at most kTargetBlocks x 32 V floats: 1 MiB).
constexpr int kTargetBlocks = 1024;
// Rows per row block, at least: 4 per warp, so that a block's loads outweigh its partial's write.
constexpr int kMinRows = 4 * kWarps;
constexpr int kRowUnroll = 4;  // loads in flight per warp

// How many row blocks, at most: pass 2 walks a column's partials one after another (ptxas keeps 16 loads in flight per
// thread), pass 1 a row block 32 rows at a time (8 warps x kRowUnroll loads), each round a trip to memory. sqrt(B / 2)
// row blocks balance the two walks: at gpt2-small's 8192 rows, 64 (4 rounds each). Filling the GPU with row blocks
// alone made pass 2 walk 256 partials at OC 768, 16 rounds: 13 us on an H200 for 12.6 MB (docs/BENCHMARKS.md).
inline int64_t balanced_row_blocks(int B) { return std::max<int64_t>(1, std::llround(std::sqrt(B / 2.0))); }

struct Grid {
  int v;             // columns per lane
  int col_blocks;    // tiles of 32 v columns
  int row_blocks;    // 1: pass 1 adds to dbias itself
  int rows_per_block;
  size_t smem_bytes;  // the warps' sums, [kWarps][32 v] floats
};

// partial_capacity: floats available for the partials (row_blocks x OC); packed: dout 16-byte aligned, OC a multiple
// of the pack.
inline Grid plan_grid(int B, int OC, int pack, bool packed, int64_t partial_capacity) {
  Grid g{};
  g.v = packed ? pack : 1;
  const int cols = 32 * g.v;
  g.col_blocks = (OC + cols - 1) / cols;
  int64_t rows = std::clamp<int64_t>(kTargetBlocks / g.col_blocks, 1,
                                     std::min<int64_t>((B + kMinRows - 1) / kMinRows, balanced_row_blocks(B)));
  if (rows > 1) rows = std::min<int64_t>(rows, partial_capacity / OC);
  rows = std::max<int64_t>(rows, 1);
  g.rows_per_block = static_cast<int>((B + rows - 1) / rows);
  g.row_blocks = (B + g.rows_per_block - 1) / g.rows_per_block;  // no empty row block
  g.smem_bytes = sizeof(float) * kWarps * cols;
  return g;
}

// Pass 1. out: dbias (direct: one row block; added to it, or written over it) or the partials [row_blocks, OC]
// (written).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bias_backward_partial_kernel(float* out, const T* dout, int B, int OC, int rows_per_block, bool direct,
                                 bool accumulate) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* const sums = reinterpret_cast<float*>(smem);  // [kWarps][32 V]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t col = int64_t{blockIdx.x} * 32 * V + lane * V;
  const int row_begin = blockIdx.y * rows_per_block, row_end = min(B, row_begin + rows_per_block);
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.0f;
  if (col < OC) {
    const T* p = dout + col;
    int row = row_begin + warp;
    // kRowUnroll rows per step, loaded before they are added, then the rest one by one; the sum per column is in row
    // order whatever the unrolling.
    for (; row + (kRowUnroll - 1) * kWarps < row_end; row += kRowUnroll * kWarps) {
      detail::Pack<T, V> x[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) x[u] = detail::load_pack<V>(p + int64_t{row + u * kWarps} * OC);
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += detail::to_float(x[u].v[k]);
    }
    for (; row < row_end; row += kWarps) {
      const detail::Pack<T, V> x = detail::load_pack<V>(p + int64_t{row} * OC);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += detail::to_float(x.v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) sums[warp * 32 * V + lane * V + k] = acc[k];
  __syncthreads();
  for (int c = threadIdx.x; c < 32 * V; c += kThreads) {
    const int64_t o = int64_t{blockIdx.x} * 32 * V + c;
    if (o >= OC) continue;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sums[w * 32 * V + c];
    if (!direct)
      out[int64_t{blockIdx.y} * OC + o] = total;
    else
      out[o] = accumulate ? out[o] + total : total;
  }
}

// Pass 2: dbias[o] += (or =) the sum over p of partial[p, o], in p order.
__global__ void bias_backward_reduce_kernel(float* dbias, const float* partial, int parts, int OC, bool accumulate) {
  for (int64_t o = detail::global_index(); o < OC; o += detail::grid_stride()) {
    float total = 0.0f;
    for (int p = 0; p < parts; ++p) total += partial[int64_t{p} * OC + o];
    dbias[o] = accumulate ? dbias[o] + total : total;
  }
}

}  // namespace bias_grad

// The launch sequence, for gemm.cu's launcher and the emulation alike: launch(kernel, grid, block, smem, args...).
// partial has room for partial_capacity floats. B > 0, OC > 0. accumulate: dbias += the sums, else dbias = them.
template <typename Launch, typename T>
void bias_backward_launches(Launch launch, float* dbias, float* partial, int64_t partial_capacity, const T* dout, int B,
                            int OC, bool accumulate) {
  using namespace bias_grad;
  constexpr int kPack = 16 / sizeof(T);
  const bool packed = OC % kPack == 0 && detail::all_aligned(16, dout);
  const Grid g = plan_grid(B, OC, kPack, packed, partial_capacity);
  const bool direct = g.row_blocks == 1;
  float* const out = direct ? dbias : partial;
  const dim3 grid(g.col_blocks, g.row_blocks);
  if (packed)
    launch(bias_backward_partial_kernel<T, kPack>, grid, dim3(kThreads), g.smem_bytes, out, dout, B, OC,
           g.rows_per_block, direct, accumulate);
  else
    launch(bias_backward_partial_kernel<T, 1>, grid, dim3(kThreads), g.smem_bytes, out, dout, B, OC, g.rows_per_block,
           direct, accumulate);
  if (!direct)
    launch(bias_backward_reduce_kernel, dim3(detail::grid_size(OC)), dim3(detail::kBlockSize), size_t{0}, dbias,
           static_cast<const float*>(partial), g.row_blocks, OC, accumulate);
}

}  // namespace
}  // namespace ddplab::cuda
