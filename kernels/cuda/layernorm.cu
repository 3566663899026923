// LayerNorm kernels first, launchers last (see layernorm.h for the contracts).
//
// Both directions are memory-bound: forward reads a row and writes it once, backward reads dout, inp and dinp and
// writes dinp. A warp owns a row (forward, and the row reductions of backward), so its reductions are shuffles
// with no block barrier, and each lane moves 16 bytes per access (Pack) when the row and the pointers allow it.
// The second and third passes over a row hit L1: 8 rows of 768 fp32 per block are 24 KiB.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/layernorm.h"

namespace ddplab::cuda {
namespace {

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
//   2. the block walks the columns, thread-parallel (coalesced across the row), and for each of its columns runs
//      down the tile's rows in order: dinp += ..., and dweight / dbias terms into the block's accumulator.
// Phase 2 re-reads the rows phase 1 just read (L1/L2). The accumulator (2C floats of shared memory) is split by
// column between the threads — each element has exactly one owner, which adds to it in row order — so there are no
// atomics and the partial is the same on every run. The block writes it to partial[blockIdx.x] at the end.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    layernorm_backward_kernel(T* dinp, float* partial, const T* dout, const T* inp, const float* weight,
                              const float* mean, const float* rstd, int N, int C) {
  extern __shared__ float acc[];      // [0, C): dweight, [C, 2C): dbias
  __shared__ float stats[kWarps][4];  // per row of the tile: mean, rstd, mean(g), mean(g xhat)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int c = threadIdx.x * V; c < C; c += kBlock * V) {  // the owner zeroes its own elements: no barrier needed
#pragma unroll
    for (int k = 0; k < V; ++k) acc[c + k] = acc[C + c + k] = 0.0f;
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
    for (int c = threadIdx.x * V; c < C; c += kBlock * V) {
      const Pack<float, V> w = load_pack<V>(weight + c);
      float dw[V], db[V];
#pragma unroll
      for (int k = 0; k < V; ++k) dw[k] = acc[c + k], db[k] = acc[C + c + k];
      for (int r = 0; r < rows; ++r) {
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
      for (int k = 0; k < V; ++k) acc[c + k] = dw[k], acc[C + c + k] = db[k];
    }
    __syncthreads();  // stats is rewritten by the next tile
  }
  float* out = partial + int64_t{blockIdx.x} * 2 * C;
  for (int c = threadIdx.x * V; c < C; c += kBlock * V) {  // the owners read their own elements: no barrier needed
#pragma unroll
    for (int k = 0; k < V; ++k) out[c + k] = acc[c + k], out[C + c + k] = acc[C + c + k];
  }
}

// dweight[c] += sum_b partial[b][c], dbias[c] += sum_b partial[b][C + c], for 32 of the 2C columns per block.
// Warp g sums blocks g, g + 8, ... (coalesced: a warp reads 32 consecutive floats of one partial), then warp 0 adds
// the 8 sums in order: a fixed order, and 8x the parallelism of one thread per column.
__global__ void __launch_bounds__(kBlock)
    layernorm_backward_reduce_kernel(float* dweight, float* dbias, const float* partial, int blocks, int C) {
  __shared__ float sums[kWarps][32];
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

void check_sizes(const char* what, int N, int C) {
  if (N < 0 || C <= 0)
    throw std::invalid_argument(std::string(what) + ": need N >= 0 and C > 0, got N=" + std::to_string(N) +
                                " C=" + std::to_string(C));
}

int backward_blocks(int N) {
  return static_cast<int>(std::min<int64_t>((int64_t{N} + kWarps - 1) / kWarps, kBwdMaxBlocks));
}

// 16-byte accesses when every row and every pointer allows them (rows start at multiples of C elements).
template <typename T>
constexpr int kVec = 16 / sizeof(T);

}  // namespace

// ---- launchers --------------------------------------------------------------------------------------------------

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const float* weight, const float* bias, int N,
                       int C, cudaStream_t stream) {
  check_sizes("layernorm_forward", N, C);
  if (N == 0) return;
  const unsigned grid = detail::grid_size(N, kWarps);
  constexpr int V = kVec<T>;
  if (C % V == 0 && detail::all_aligned(16, out, inp) && detail::all_aligned(V * 4, weight, bias))
    layernorm_forward_kernel<T, V><<<grid, kBlock, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  else
    layernorm_forward_kernel<T, 1><<<grid, kBlock, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  cudaCheck(cudaGetLastError());
}

int64_t layernorm_backward_scratch_floats(int N, int C) {
  check_sizes("layernorm_backward_scratch_floats", N, C);
  return int64_t{backward_blocks(N)} * 2 * C;
}

template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, float* scratch, const T* dout, const T* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  check_sizes("layernorm_backward", N, C);
  if (N == 0) return;
  if (scratch == nullptr) throw std::invalid_argument("layernorm_backward: scratch is null");
  const int blocks = backward_blocks(N);
  const size_t smem = size_t{2} * C * sizeof(float);
  constexpr int V = kVec<T>;
  const bool vec = C % V == 0 && detail::all_aligned(16, dinp, dout, inp) && detail::all_aligned(V * 4, weight);
  const auto kernel = vec ? layernorm_backward_kernel<T, V> : layernorm_backward_kernel<T, 1>;
  if (smem > 48 * 1024)  // beyond the default dynamic shared memory: opt in (fails cleanly past the device's limit)
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<blocks, kBlock, smem, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C);
  cudaCheck(cudaGetLastError());
  layernorm_backward_reduce_kernel<<<(2 * C + 31) / 32, kBlock, 0, stream>>>(dweight, dbias, scratch, blocks, C);
  cudaCheck(cudaGetLastError());
}

#define DDPLAB_INSTANTIATE(T)                                                                                     \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const float*, const float*, int, int,          \
                                     cudaStream_t);                                                               \
  template void layernorm_backward<T>(T*, float*, float*, float*, const T*, const T*, const float*, const float*, \
                                      const float*, int, int, cudaStream_t);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(__nv_bfloat16)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cuda
