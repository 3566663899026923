// The LayerNorm kernels and their launch sequences (layernorm.h has the contracts). Included by exactly one translation
// unit per program: layernorm.cu under nvcc, or the CPU emulation of tests/emu (g++, cuda_emulation.h included first),
// which runs this very source on host threads. Hence everything here is in an unnamed namespace.
//
// Both directions are memory-bound: forward reads a row and writes it once, backward reads dout, inp and dinp and
// writes dinp. A warp owns a row (forward, and the row reductions of backward), so its reductions are shuffles
// with no block barrier, and each lane moves 16 bytes per access (Pack) when the row and the pointers allow it.
// The second and third passes over a row hit L1: 8 rows of 768 fp32 per block are 24 KiB.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"  // grid_size

namespace ddplab::cuda {
namespace {
namespace layernorm {

using detail::load_pack;
using detail::Pack;
using detail::store_pack;
using detail::to_float;

constexpr float kEps = 1e-5f;  // as the CPU reference's kLayerNormEps
constexpr int kBlock = 256;    // 8 warps: 8 rows per block in flight
constexpr int kWarps = kBlock / 32;
// Backward: at most this many blocks, each summing its rows' parameter gradients into one partial. A constant, not
// a multiple of the SM count, so the summation order (and so the bits) is the same on every device. 512 blocks of
// 8 warps keep ~4 blocks on each of an H100's 132 SMs.
constexpr int kBwdMaxBlocks = 512;

// 16-byte accesses when every row and every pointer allows them (rows start at multiples of C elements).
template <typename T>
constexpr int kVec = 16 / sizeof(T);

inline int backward_blocks(int N) {
  return static_cast<int>(std::min<int64_t>((int64_t{N} + kWarps - 1) / kWarps, kBwdMaxBlocks));
}

// Phase 2 of the backward (below) walks a tile's columns in groups of V, and its rows in `subsets` interleaved sets,
// so that a row of few groups still occupies the block: bf16 rows of 768 are 96 groups of 8, which left 160 of the
// 256 threads idle with one set; two sets put 192 to work. At least one set; one when the groups outnumber the threads.
__host__ __device__ inline int backward_row_subsets(int C, int V) {
  const int subsets = kBlock / ((C + V - 1) / V);
  return subsets > 1 ? subsets : 1;
}

// The backward's dynamic shared memory: the subsets' dweight / dbias accumulators [subsets][2C], then the tile's row
// statistics [kWarps][4].
inline size_t backward_smem_bytes(int C, int V) {
  return sizeof(float) * (size_t{2} * C * backward_row_subsets(C, V) + kWarps * 4);
}

// ---- kernels ----------------------------------------------------------------------------------------------------

template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const float* weight, const float* bias,
                             int N, int C) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; row < N; row += int64_t{gridDim.x} * kWarps) {
    const T* x = inp + row * C;
    float sum = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
      const Pack<T, V> p = load_pack<V>(x + c);
#pragma unroll
      for (int k = 0; k < V; ++k) sum += to_float(p.v[k]);
    }
    const float m = detail::warp_sum(sum) / C;
    float var = 0.0f;  // second pass over the row (L1): no cancellation when |mean| >> std
    for (int c = lane * V; c < C; c += 32 * V) {
      const Pack<T, V> p = load_pack<V>(x + c);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float d = to_float(p.v[k]) - m;
        var += d * d;
      }
    }
    const float s = 1.0f / sqrtf(detail::warp_sum(var) / C + kEps);  // IEEE sqrt and division, as the CPU
    T* o = out + row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
      const Pack<T, V> p = load_pack<V>(x + c);
      const Pack<float, V> w = load_pack<V>(weight + c), b = load_pack<V>(bias + c);
      Pack<T, V> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = detail::from_float<T>((to_float(p.v[k]) - m) * s * w.v[k] + b.v[k]);
      store_pack<V>(o + c, r);
    }
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = s;
    }
  }
}

// One block walks tiles of kWarps rows (tile = blockIdx.x, += gridDim.x). Per tile:
//   1. warp w reduces row w of the tile: mean(g) and mean(g xhat), g = weight * dout (dx's two row constants);
//   2. the block walks the columns, thread-parallel (coalesced across the row): thread t owns V columns of group
//      t % G (G groups; with one subset, groups t, t + kBlock, ...) and walks the tile's rows of its subset t / G in
//      order: dinp += ..., and dweight / dbias terms into its subset's accumulator.
// Phase 2 re-reads the rows phase 1 just read (L1/L2). Each accumulator element (shared memory) has exactly one owner,
// which adds to it in row order, and at the end the block adds its subsets' accumulators in subset order into
// partial[blockIdx.x]: no atomics, and the partial is the same on every run.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    layernorm_backward_kernel(T* dinp, float* partial, const T* dout, const T* inp, const float* weight,
                              const float* mean, const float* rstd, int N, int C) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int subsets = backward_row_subsets(C, V), groups = (C + V - 1) / V;
  float* const acc = reinterpret_cast<float*>(smem);  // [subsets][2C]: dweight, then dbias
  // Per row of the tile: mean, rstd, mean(g), mean(g xhat).
  float(*const stats)[4] = reinterpret_cast<float(*)[4]>(acc + int64_t{2} * C * subsets);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // This thread's share of phase 2: its subset (idle past the last), first column and column stride.
  const int subset = subsets == 1 ? 0 : static_cast<int>(threadIdx.x) / groups;
  const int col0 = (subsets == 1 ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % groups) * V;
  const int col_step = subsets == 1 ? kBlock * V : C;  // with several subsets, one group per thread
  float* const dw_acc = acc + int64_t{2} * C * subset;
  float* const db_acc = dw_acc + C;
  if (subset < subsets)
    for (int c = col0; c < C; c += col_step) {  // the owner zeroes its own elements: no barrier needed
#pragma unroll
      for (int k = 0; k < V; ++k) dw_acc[c + k] = db_acc[c + k] = 0.0f;
    }
  for (int64_t row0 = int64_t{blockIdx.x} * kWarps; row0 < N; row0 += int64_t{gridDim.x} * kWarps) {
    const int64_t row = row0 + warp;
    if (row < N) {
      const T* x = inp + row * C;
      const T* d = dout + row * C;
      const float m = mean[row], s = rstd[row];
      float g_sum = 0.0f, gx_sum = 0.0f;
      for (int c = lane * V; c < C; c += 32 * V) {
        const Pack<T, V> xp = load_pack<V>(x + c), dp = load_pack<V>(d + c);
        const Pack<float, V> w = load_pack<V>(weight + c);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float g = w.v[k] * to_float(dp.v[k]);
          g_sum += g;
          gx_sum += g * (to_float(xp.v[k]) - m) * s;
        }
      }
      g_sum = detail::warp_sum(g_sum);
      gx_sum = detail::warp_sum(gx_sum);
      if (lane == 0) {
        stats[warp][0] = m;
        stats[warp][1] = s;
        stats[warp][2] = g_sum / C;
        stats[warp][3] = gx_sum / C;
      }
    }
    __syncthreads();
    const int rows = static_cast<int>(min(int64_t{kWarps}, N - row0));
    if (subset < subsets)
      for (int c = col0; c < C; c += col_step) {
        const Pack<float, V> w = load_pack<V>(weight + c);
        float dw[V], db[V];
#pragma unroll
        for (int k = 0; k < V; ++k) dw[k] = dw_acc[c + k], db[k] = db_acc[c + k];
        for (int r = subset; r < rows; r += subsets) {
          const int64_t off = (row0 + r) * C + c;
          const float m = stats[r][0], s = stats[r][1], g_mean = stats[r][2], gx_mean = stats[r][3];
          const Pack<T, V> xp = load_pack<V>(inp + off), dp = load_pack<V>(dout + off);
          Pack<T, V> dx = load_pack<V>(dinp + off);
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float xhat = (to_float(xp.v[k]) - m) * s, dk = to_float(dp.v[k]);
            dx.v[k] = detail::from_float<T>(to_float(dx.v[k]) + s * (w.v[k] * dk - g_mean - xhat * gx_mean));
            dw[k] += xhat * dk;
            db[k] += dk;
          }
          store_pack<V>(dinp + off, dx);
        }
#pragma unroll
        for (int k = 0; k < V; ++k) dw_acc[c + k] = dw[k], db_acc[c + k] = db[k];
      }
    __syncthreads();  // stats is rewritten by the next tile
  }
  // The subsets' accumulators, added in subset order, once every owner's last write is done.
  __syncthreads();
  float* out = partial + int64_t{blockIdx.x} * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += kBlock) {
    float total = acc[c];
    for (int s = 1; s < subsets; ++s) total += acc[int64_t{2} * C * s + c];
    out[c] = total;
  }
}

// dweight[c] += sum_b partial[b][c], dbias[c] += sum_b partial[b][C + c], for 32 of the 2C columns per block.
// Warp g sums blocks g, g + 8, ... (coalesced: a warp reads 32 consecutive floats of one partial), then warp 0 adds
// the 8 sums in order: a fixed order, and 8x the parallelism of one thread per column. Dynamic shared memory:
// the warps' sums [kWarps][32].
__global__ void __launch_bounds__(kBlock)
    layernorm_backward_reduce_kernel(float* dweight, float* dbias, const float* partial, int blocks, int C) {
  extern __shared__ __align__(16) unsigned char smem[];
  float(*const sums)[32] = reinterpret_cast<float(*)[32]>(smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = blockIdx.x * 32 + lane;  // in [0, 2C)
  float s = 0.0f;
  if (col < 2 * C) {
    for (int b = warp; b < blocks; b += kWarps) s += partial[int64_t{b} * 2 * C + col];
  }
  sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && col < 2 * C) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sums[w][lane];
    if (col < C)
      dweight[col] += total;
    else
      dbias[col - C] += total;
  }
}

}  // namespace layernorm

// ---- the launch sequences, written once ----------------------------------------------------------------------------
//
// For layernorm.cu (whose `launch` runs <<<>>> on a stream) and the CPU emulation alike:
// launch(kernel, grid, block, dynamic_smem_bytes, args...). The caller has checked the sizes; N > 0.

template <typename Launch, typename T>
void layernorm_forward_launches(Launch&& launch, T* out, float* mean, float* rstd, const T* inp, const float* weight,
                                const float* bias, int N, int C) {
  using namespace layernorm;
  const dim3 grid(detail::grid_size(N, kWarps));
  constexpr int V = kVec<T>;
  if (C % V == 0 && detail::all_aligned(16, out, inp) && detail::all_aligned(V * 4, weight, bias))
    launch(layernorm_forward_kernel<T, V>, grid, dim3(kBlock), size_t{0}, out, mean, rstd, inp, weight, bias, N, C);
  else
    launch(layernorm_forward_kernel<T, 1>, grid, dim3(kBlock), size_t{0}, out, mean, rstd, inp, weight, bias, N, C);
}

// scratch: backward_blocks(N) * 2C floats, the blocks' partials.
template <typename Launch, typename T>
void layernorm_backward_launches(Launch&& launch, T* dinp, float* dweight, float* dbias, float* scratch, const T* dout,
                                 const T* inp, const float* weight, const float* mean, const float* rstd, int N,
                                 int C) {
  using namespace layernorm;
  const int blocks = backward_blocks(N);
  constexpr int V = kVec<T>;
  const bool vec = C % V == 0 && detail::all_aligned(16, dinp, dout, inp) && detail::all_aligned(V * 4, weight);
  if (vec)
    launch(layernorm_backward_kernel<T, V>, dim3(blocks), dim3(kBlock), backward_smem_bytes(C, V), dinp, scratch, dout,
           inp, weight, mean, rstd, N, C);
  else
    launch(layernorm_backward_kernel<T, 1>, dim3(blocks), dim3(kBlock), backward_smem_bytes(C, 1), dinp, scratch, dout,
           inp, weight, mean, rstd, N, C);
  launch(layernorm_backward_reduce_kernel, dim3((2 * C + 31) / 32), dim3(kBlock), sizeof(float) * kWarps * 32, dweight,
         dbias, static_cast<const float*>(scratch), blocks, C);
}

}  // namespace
}  // namespace ddplab::cuda
