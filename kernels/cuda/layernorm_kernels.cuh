// The LayerNorm kernels and their launch sequences (layernorm.h has the contracts). Included by exactly one translation
// unit per program: layernorm.cu under nvcc, or the CPU emulation of tests/emu (g++, cuda_emulation.h included first),
// which runs this very source on host threads. Hence everything here is in an unnamed namespace.
//
// Both directions are memory-bound: forward reads a row and writes it once, backward reads dout, inp and dinp and
// writes dinp. A warp owns a row in both, so its reductions are shuffles with no block barrier; each lane moves 16
// bytes per access (Pack) when the row and the pointers allow it, and keeps its first kHeldPacks packs of each row in
// registers (HeldRow): a row of up to 1024 bf16 or 512 fp32 is read from memory once, all of its loads issued before
// its first reduction. Wider rows read their remaining columns again (L1).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"  // grid_size
#include "kernels/layernorm.h"

namespace ddplab::cuda {
namespace {
namespace layernorm {

using detail::load_pack;
using detail::Pack;
using detail::store_pack;
using detail::to_float;

constexpr int kBlock = 256;    // the forward's 8 warps, and the backward's most
constexpr int kWarps = kBlock / 32;
// Packs of each row a lane holds in registers: 4 x 16 bytes per tensor (the backward holds three tensors' worth, 48
// registers). The scalar path holds 4 elements.
constexpr int kHeldPacks = 4;

// 16-byte accesses when every row and every pointer allows them (rows start at multiples of C elements).
template <typename T>
constexpr int kVec = 16 / sizeof(T);

// A lane's packs of a row: pack i starts at column (i * 32 + lane) * V. f(i, c) is called for each in order, with i
// the held pack's index for the first kHeldPacks and kHeldPacks for the rest (which HeldRow::at reads again).
template <int V, typename F>
__device__ __forceinline__ void for_each_lane_pack(int C, int lane, F&& f) {
#pragma unroll
  for (int i = 0; i < kHeldPacks; ++i) {
    const int c = (i * 32 + lane) * V;
    if (c < C) f(i, c);
  }
  for (int c = (kHeldPacks * 32 + lane) * V; c < C; c += 32 * V) f(kHeldPacks, c);
}

// One tensor's row as a lane sees it: its held packs loaded once (all of them issued together), the rest on demand.
template <typename T, int V>
struct HeldRow {
  const T* row;
#ifdef __CUDA_ARCH__
  Pack<T, V> held[kHeldPacks];  // not zeroed: zeros past the row's end made bf16's backward spill
#else
  Pack<T, V> held[kHeldPacks] = {};  // g++ (the CPU emulation) cannot see that packs past the row's end go unread
#endif

  __device__ __forceinline__ HeldRow(const T* row_, int C, int lane) : row(row_) {
#pragma unroll
    for (int i = 0; i < kHeldPacks; ++i) {
      const int c = (i * 32 + lane) * V;
      if (c < C) held[i] = load_pack<V>(row + c);
    }
  }
  // The pack at column c, pack index i (as for_each_lane_pack passes them; i is a constant after unrolling, so
  // `held` stays in registers).
  __device__ __forceinline__ Pack<T, V> at(int i, int c) const {
    return i < kHeldPacks ? held[i] : load_pack<V>(row + c);
  }
  // From here on, nvcc treats the held registers as new values (no instruction is emitted): a later pass converts
  // them again instead of keeping an earlier pass's fp32 conversions alive across the row's reductions. For bf16 rows
  // that is twice the registers: the backward took 170 (one block an SM) instead of 126, the forward 80 instead of 64.
  __device__ __forceinline__ void recompute_from_here() {
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(Pack<T, V>) % 4 == 0) {  // all but bf16's scalar path (2-byte packs)
#pragma unroll
      for (int i = 0; i < kHeldPacks; ++i) {
        unsigned* words = reinterpret_cast<unsigned*>(&held[i]);
#pragma unroll
        for (int k = 0; k < int(sizeof(Pack<T, V>) / 4); ++k) asm volatile("" : "+r"(words[k]));
      }
    }
#endif
  }
};

// ---- the backward's shape -------------------------------------------------------------------------------------
//
// A warp sums its rows' dweight and dbias terms into its own accumulator in shared memory, C floats per sum; where
// asked, a third sum: the columns of dinp as written, which is the bias gradient of the Linear whose output the
// residual stream's gradient is too (the block's proj after ln2, the block below's fcproj after ln1 and lnf), so that
// no pass reads dinp again for it. At the end the block adds its warps' accumulators in warp order into its partial,
// and a second kernel adds the partials in block order. Every order depends on (N, C, sums) alone: the same bits on
// every run and every device.
constexpr int kMaxSums = 3;

// Shared memory per sum for the warps' accumulators up to which a block has all 8 warps (C <= 768); wider rows get
// fewer warps a block, so that no block asks for more than 48 KB (72 with the third sum) until rows pass 6144. Past
// that a block is one warp and asks for more; such rows are not what this kernel is shaped for: few warps an SM, and
// a partial of up to 3C floats for each of up to 2048 blocks.
constexpr int64_t kBwdAccBytesPerSum = 24 * 1024;
// At most this many warps in the grid: 256 blocks of 8 at C 768, two per SM of an H100's 132 in one wave, each
// warp walking N / 2048 rows (4 at gpt2-small's 8192).
constexpr int kBwdMaxWarps = 2048;

__host__ __device__ inline int backward_warps(int C) {
  const int64_t w = kBwdAccBytesPerSum / (C * int64_t{sizeof(float)});
  return static_cast<int>(w < 1 ? 1 : w > kWarps ? kWarps : w);
}

inline int backward_blocks(int N, int C) {
  const int warps = backward_warps(C);
  return static_cast<int>(std::min<int64_t>((int64_t{N} + warps - 1) / warps, kBwdMaxWarps / warps));
}

// The warps' accumulators, then the weight staged once a block (C floats).
inline size_t backward_smem_bytes(int C, int sums) {
  return sizeof(float) * size_t(C) * (size_t(sums) * backward_warps(C) + 1);
}

// Where column c's sum sits in a warp's accumulator (a permutation of [0, C), for dweight; dbias's lies C further,
// dinp's column sums 2C).
// A lane updates its pack's V sums as float4s; laid out plainly, bf16's packs of 8 would put consecutive lanes'
// float4s 32 bytes apart (two-way bank conflicts). Here the j-th float4 of every pack lies in one run: a warp's
// float4 accesses are consecutive. Needs C % V == 0, as the packed path does.
template <int V>
__host__ __device__ inline int acc_index(int C, int c) {
  if constexpr (V < 4) {
    return c;
  } else {
    return (c % V / 4 * (C / V) + c / V) * 4 + c % 4;
  }
}
// Its inverse: the column whose sum sits at place p.
template <int V>
__host__ __device__ inline int acc_column(int C, int p) {
  if constexpr (V < 4) {
    return p;
  } else {
    const int q = p / 4, packs = C / V;
    return q % packs * V + q / packs * 4 + p % 4;
  }
}

// ---- kernels ----------------------------------------------------------------------------------------------------

template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const float* weight, const float* bias,
                             int N, int C) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; row < N; row += int64_t{gridDim.x} * kWarps) {
    HeldRow<T, V> x(inp + row * C, C, lane);
    float sum = 0.0f;
    for_each_lane_pack<V>(C, lane, [&](int i, int c) {
      const Pack<T, V> p = x.at(i, c);
#pragma unroll
      for (int k = 0; k < V; ++k) sum += to_float(p.v[k]);
    });
    const float m = detail::warp_sum(sum) / C;
    x.recompute_from_here();
    float var = 0.0f;  // a second pass over the row: no cancellation when |mean| >> std
    for_each_lane_pack<V>(C, lane, [&](int i, int c) {
      const Pack<T, V> p = x.at(i, c);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float d = to_float(p.v[k]) - m;
        var += d * d;
      }
    });
    const float s =
        1.0f / sqrtf(detail::warp_sum(var) / C + float(kLayerNormEps));  // IEEE sqrt and division, as the CPU
    x.recompute_from_here();
    T* o = out + row * C;
    for_each_lane_pack<V>(C, lane, [&](int i, int c) {
      const Pack<T, V> p = x.at(i, c);
      const Pack<float, V> w = load_pack<V>(weight + c), b = load_pack<V>(bias + c);
      Pack<T, V> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = detail::from_float<T>((to_float(p.v[k]) - m) * s * w.v[k] + b.v[k]);
      store_pack<V>(o + c, r);
    });
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = s;
    }
  }
}

// Warp w of block b walks rows b * warps + w, += the grid's warps. Per row, with g = weight * dout and
// xhat = (inp - mean) * rstd: the warp reduces mean(g) and mean(g xhat) (dx's two row constants), then each lane, over
// its own packs, adds dx = rstd (g - mean(g) - xhat mean(g xhat)) into dinp and the row's xhat * dout and dout into
// the warp's accumulator (with sums == 3 also dinp's new values). A lane owns the same columns in every row, so it
// alone touches its accumulator elements. Dynamic shared memory: the warps' accumulators [warps][sums][C] (dweight,
// dbias, dinp's column sums), each in acc_index's order, then the weight [C] in the same order, staged once a block:
// read from global memory in every pass of every row, a lane's 8 fp32 weights (bf16's packs) were two 16-byte loads
// 32 bytes apart across the warp, half of each sector unused (ncu on an H200: a third of the kernel's L2 sectors
// excess); from shared memory in that order a warp's loads are consecutive float4s. Two blocks an SM (128
// registers; 102 or 150 KB of shared memory at C 768): 18 KB of loads in flight a block.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock, 2)
    layernorm_backward_kernel(T* dinp, float* partial, const T* dout, const T* inp, const float* weight,
                              const float* mean, const float* rstd, int N, int C, int sums) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int W = V < 4 ? V : 4;  // floats per accumulator access
  const int warps = static_cast<int>(blockDim.x) / 32, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* const acc = reinterpret_cast<float*>(smem);
  float* const dw_acc = acc + int64_t{sums} * C * warp;
  float* const db_acc = dw_acc + C;
  float* const dx_acc = sums > 2 ? db_acc + C : nullptr;
  float* const staged_weight = acc + int64_t{sums} * C * warps;
  for (int at = threadIdx.x; at < C; at += blockDim.x) staged_weight[at] = weight[acc_column<V>(C, at)];
  // The lane's V weights at column c, from the staged copy.
  const auto weight_pack = [&](int c) {
    Pack<float, V> w;
#pragma unroll
    for (int j = 0; j < V; j += W) {
      const Pack<float, W> part = load_pack<W>(staged_weight + acc_index<V>(C, c + j));
#pragma unroll
      for (int k = 0; k < W; ++k) w.v[j + k] = part.v[k];
    }
    return w;
  };
  for_each_lane_pack<V>(C, lane, [&](int, int c) {  // the owner zeroes its own elements: no barrier needed
#pragma unroll
    for (int j = 0; j < V; j += W)
      for (int k = 0; k < sums; ++k) store_pack<W>(dw_acc + int64_t{k} * C + acc_index<V>(C, c + j), Pack<float, W>{});
  });
  __syncthreads();  // the staged weight, which every warp reads
  for (int64_t row = int64_t{blockIdx.x} * warps + warp; row < N; row += int64_t{gridDim.x} * warps) {
    const float m = mean[row], s = rstd[row];
    HeldRow<T, V> x(inp + row * C, C, lane), d(dout + row * C, C, lane);
    const HeldRow<T, V> dx(dinp + row * C, C, lane);
    float g_sum = 0.0f, gx_sum = 0.0f;
    for_each_lane_pack<V>(C, lane, [&](int i, int c) {
      const Pack<T, V> xp = x.at(i, c), dp = d.at(i, c);
      const Pack<float, V> w = weight_pack(c);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float g = w.v[k] * to_float(dp.v[k]);
        g_sum += g;
        gx_sum += g * (to_float(xp.v[k]) - m) * s;
      }
    });
    const float g_mean = detail::warp_sum(g_sum) / C, gx_mean = detail::warp_sum(gx_sum) / C;
    x.recompute_from_here();
    d.recompute_from_here();
    for_each_lane_pack<V>(C, lane, [&](int i, int c) {
      const Pack<T, V> xp = x.at(i, c), dp = d.at(i, c);
      const Pack<float, V> w = weight_pack(c);
      Pack<T, V> out = dx.at(i, c);
#pragma unroll
      for (int j = 0; j < V; j += W) {
        Pack<float, W> dw = load_pack<W>(dw_acc + acc_index<V>(C, c + j));
        Pack<float, W> db = load_pack<W>(db_acc + acc_index<V>(C, c + j));
#pragma unroll
        for (int k = 0; k < W; ++k) {
          const float xhat = (to_float(xp.v[j + k]) - m) * s, dk = to_float(dp.v[j + k]);
          out.v[j + k] =
              detail::from_float<T>(to_float(out.v[j + k]) + s * (w.v[j + k] * dk - g_mean - xhat * gx_mean));
          dw.v[k] += xhat * dk;
          db.v[k] += dk;
        }
        store_pack<W>(dw_acc + acc_index<V>(C, c + j), dw);
        store_pack<W>(db_acc + acc_index<V>(C, c + j), db);
        if (dx_acc) {  // the values as stored (rounded to T), as a pass over dinp would read them
          Pack<float, W> dc = load_pack<W>(dx_acc + acc_index<V>(C, c + j));
#pragma unroll
          for (int k = 0; k < W; ++k) dc.v[k] += to_float(out.v[j + k]);
          store_pack<W>(dx_acc + acc_index<V>(C, c + j), dc);
        }
      }
      store_pack<V>(dinp + row * C + c, out);
    });
  }
  // The warps' accumulators, added in warp order, once every owner's last write is done. Walked in their layout's
  // order, consecutive threads on consecutive floats, and each total written to its column's place. Walked in column
  // order, bf16's layout put two lanes of a warp on each bank here (the rows' accesses are consecutive float4s); ncu
  // counted bank conflicts on 18% of the kernel's shared loads on an H200.
  __syncthreads();
  float* const out = partial + int64_t{blockIdx.x} * sums * C;
  for (int at = threadIdx.x; at < sums * C; at += blockDim.x) {
    float total = acc[at];
    for (int w = 1; w < warps; ++w) total += acc[int64_t{sums} * C * w + at];
    out[int64_t{at / C} * C + acc_column<V>(C, at % C)] = total;
  }
}

// dweight[c] += sum_b partial[b][c], dbias[c] += sum_b partial[b][C + c], and with sums == 3 dcolumns[c] +=
// sum_b partial[b][2C + c] (or =, accumulate false), for 32 of the sums x C columns per block.
// Warp g sums blocks g, g + 8, ... (coalesced: a warp reads 32 consecutive floats of one partial), then warp 0 adds
// the 8 sums in order: a fixed order, and 8x the parallelism of one thread per column. Dynamic shared memory:
// the warps' sums [kWarps][32].
__global__ void __launch_bounds__(kBlock)
    layernorm_backward_reduce_kernel(float* dweight, float* dbias, float* dcolumns, const float* partial, int blocks,
                                     int C, int sums, bool accumulate) {
  extern __shared__ __align__(16) unsigned char smem[];
  float(*const warp_sums)[32] = reinterpret_cast<float(*)[32]>(smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = blockIdx.x * 32 + lane;  // in [0, sums C)
  float s = 0.0f;
  if (col < sums * C) {
    for (int b = warp; b < blocks; b += kWarps) s += partial[int64_t{b} * sums * C + col];
  }
  warp_sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && col < sums * C) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w][lane];
    float* const out = (col < C ? dweight : col < 2 * C ? dbias : dcolumns) + col % C;
    *out = accumulate ? *out + total : total;
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

// scratch: backward_blocks(N, C) * kMaxSums * C floats, the blocks' partials. dcolumns (may be null): the column sums
// of dinp as written. accumulate: dweight, dbias and dcolumns += the sums, else =.
template <typename Launch, typename T>
void layernorm_backward_launches(Launch&& launch, T* dinp, float* dweight, float* dbias, float* dcolumns,
                                 float* scratch, const T* dout, const T* inp, const float* weight, const float* mean,
                                 const float* rstd, int N, int C, bool accumulate) {
  using namespace layernorm;
  const int blocks = backward_blocks(N, C), sums = dcolumns ? 3 : 2;
  const dim3 block(32 * backward_warps(C));
  const size_t smem = backward_smem_bytes(C, sums);
  constexpr int V = kVec<T>;
  // The weight is read element by element into shared memory: its alignment does not matter.
  const bool vec = C % V == 0 && detail::all_aligned(16, dinp, dout, inp);
  if (vec)
    launch(layernorm_backward_kernel<T, V>, dim3(blocks), block, smem, dinp, scratch, dout, inp, weight, mean, rstd, N,
           C, sums);
  else
    launch(layernorm_backward_kernel<T, 1>, dim3(blocks), block, smem, dinp, scratch, dout, inp, weight, mean, rstd, N,
           C, sums);
  launch(layernorm_backward_reduce_kernel, dim3((sums * C + 31) / 32), dim3(kBlock), sizeof(float) * kWarps * 32,
         dweight, dbias, dcolumns, static_cast<const float*>(scratch), blocks, C, sums, accumulate);
}

}  // namespace
}  // namespace ddplab::cuda
