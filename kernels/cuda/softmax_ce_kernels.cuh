// The fused softmax cross-entropy's kernels and their launch sequence (softmax_ce.h has the contract). Included by
// exactly one translation unit per program: softmax_ce.cu under nvcc, or the CPU emulation of tests/emu (g++,
// cuda_emulation.h included first), which runs this very source on host threads. Hence everything here is in an
// unnamed namespace.
//
// Three launches: count the valid rows (the gradient divides by their number, so it must be known before any row
// is written), the fused row kernel, and the mean loss. In the row kernel a row is a block's at a time (blocks walk
// the rows): the vocabulary can be 50k wide, and a block's threads stride over it coalesced, P elements (16 bytes)
// per access where V and the pointers allow it, else one (rows of an odd V are not 16-byte aligned). Pass 1 keeps a
// running (max, sum of exp) per thread, an online softmax, so the row is read once for both; pass 2 re-reads it to
// write dlogits. On an H200 the scalar version moved 33-45% of the copy bandwidth: one 2- or 4-byte load per element
// and a branch per element kept it bound on issue, not on memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"    // kMaxGridSize
#include "kernels/cuda/mma.cuh"       // exp2_approx
#include "kernels/cuda/softmax_ce.h"  // CrossEntropyRows

namespace ddplab::cuda {
namespace {
namespace softmax_ce {

using detail::to_float;
using ptx::exp2_approx;
// e^(x - max) as 2^((x - max) log2 e) by the special function unit (ptx::exp2_approx): 3 instructions an exponential
// instead of expf's ~8. Two passes of expf's held the staged kernel to 70% of a copy's bandwidth on an H200, its
// instructions rather than its bytes the bound (the streamed kernel's third trip over the logits hid them). x - max
// first, not one FMA of x log2 e - max log2 e: then the row's largest terms are exact (the max's is 1, so a one-logit
// row's loss is 0, not the FMA's ~1e-7), and the error, ~6e-8 |x - max|, is largest where the term is smallest.
using ptx::kLog2e;

constexpr int kReduceBlock = 1024;  // one block for the count and the mean: N is at most a few 10^5 rows
constexpr int kMaxRowBlock = 1024;  // the streamed row kernel's widest block (row_block_size)
constexpr size_t kScratchBytes = 32 * sizeof(double);  // each kernel's per-warp partials, in dynamic shared memory

__global__ void __launch_bounds__(kReduceBlock)
    cross_entropy_count_valid_kernel(int* num_valid, const int32_t* targets, int N) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned* warp_counts = reinterpret_cast<unsigned*>(smem);  // [32]
  unsigned count = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) count += targets[n] >= 0;
  count = detail::warp_reduce<detail::Sum>(count);  // not __reduce_add_sync: that needs sm_80
  if (threadIdx.x % 32 == 0) warp_counts[threadIdx.x / 32] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned total = 0;
    for (int w = 0; w < kReduceBlock / 32; ++w) total += warp_counts[w];
    *num_valid = static_cast<int>(total);
  }
}

// The pieces both row kernels share. P = 1: one element per access; P = 16 / sizeof(T): one Pack, V % P == 0 and
// the rows 16-byte aligned.

// An ignored row (target < 0): loss 0, and a zero gradient where one is asked for.
template <typename T, int P>
__device__ __forceinline__ void ignore_row(T* d, float* loss, int packs) {
  if (threadIdx.x == 0) *loss = 0.0f;
  if (!d) return;
  detail::Pack<T, P> zeros;
#pragma unroll
  for (int k = 0; k < P; ++k) zeros.v[k] = detail::from_float<T>(0.0f);
  for (int i = threadIdx.x; i < packs; i += blockDim.x) detail::store_pack<P>(d + int64_t{i} * P, zeros);
}

// One pack into the thread's running (max m, sum of exp s against m): one rescale of the sum per pack, not per
// element, the pack's max first and then its exps against it.
template <typename T, int P>
__device__ __forceinline__ void add_pack(const detail::Pack<T, P>& x, float& m, float& s) {
  float pack_max = -INFINITY;
#pragma unroll
  for (int k = 0; k < P; ++k) pack_max = fmaxf(pack_max, to_float(x.v[k]));  // fmaxf drops a NaN: the sum keeps it
  const float m_new = fmaxf(m, pack_max);
  if (m_new == -INFINITY) {  // all -inf (or NaN) so far: nothing to add, as exp(-inf - -inf) would be NaN ...
#pragma unroll
    for (int k = 0; k < P; ++k)
      if (isnan(to_float(x.v[k]))) s = NAN;  // ... but a NaN, which fmaxf dropped: it must still reach the loss
    return;
  }
  s *= exp2_approx((m - m_new) * kLog2e);  // m == -inf: s == 0 (or NaN, kept), and 0 * 0
#pragma unroll
  for (int k = 0; k < P; ++k) s += exp2_approx((to_float(x.v[k]) - m_new) * kLog2e);
  m = m_new;
}

// The gradient of the pack whose first element is column `first`: (p - onehot) x weight.
template <typename T, int P>
__device__ __forceinline__ detail::Pack<T, P> gradient_pack(const detail::Pack<T, P>& x, int first, int target,
                                                            float row_max, float inv_sum, float weight) {
  detail::Pack<T, P> g;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const float p = exp2_approx((to_float(x.v[k]) - row_max) * kLog2e) * inv_sum;
    g.v[k] = detail::from_float<T>((p - (first + k == target ? 1.0f : 0.0f)) * weight);
  }
  return g;
}

// The block's (row max, sum of exp against it) from each thread's running pair, and the row's loss (log-sum-exp:
// finite when p underflows). Barriers: every thread of the block calls it.
__device__ __forceinline__ float2 finish_row(float m, float s, float z_target, float* loss, float* scratch) {
  const float row_max = detail::block_max(m, scratch);
  const float share = m == -INFINITY ? s : s * exp2_approx((m - row_max) * kLog2e);  // s: 0, or a NaN
  const float sum = detail::block_sum(share, scratch);
  if (threadIdx.x == 0) *loss = logf(sum) - (z_target - row_max);
  return make_float2(row_max, sum);
}

// The row kernel: a block per row at a time (blocks walk the rows), pass 1 the row's (max, sum of exp) and its loss,
// pass 2 dlogits.
// - Streamed (kStaged false): pass 2 reads the row again. Any row width.
// - Staged: pass 1 keeps the row in shared memory as it reads it, kLoadsInFlight packs a thread at a time, and pass 2
//   takes it from there, so the logits cross memory twice (read, dlogits written), not three times. The streamed
//   kernel at gpt2-small's shapes moved all three trips at the copy's rate (0.588 ms in bf16 on an H200: 98% of copy
//   for three trips, 66% for the two counted). Rows of at most the block's shared memory (staged_bytes).
// A thread's packs, and so its sums, are the same in both at the same block size; in the staged kernel a thread reads
// back in pass 2 only the packs it staged (pack i = thread + k x stride in both loops), so no barrier guards the stage
// from the next row's.
constexpr int kLoadsInFlight = 4;
template <typename T, int P, bool kStaged>
__global__ void __launch_bounds__(kMaxRowBlock)
    softmax_cross_entropy_fused_kernel(T* dlogits, float* losses, const T* logits, const int32_t* targets,
                                       const int* num_valid, int N, int V, float grad_scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* scratch = reinterpret_cast<float*>(smem);                                           // [32]
  detail::Pack<T, P>* staged = reinterpret_cast<detail::Pack<T, P>*>(smem + kScratchBytes);  // [V / P] if kStaged
  const int count = *num_valid;
  const float weight = count > 0 ? grad_scale / static_cast<float>(count) : 0.0f;  // of each valid row's gradient
  const int packs = V / P;
  const int stride = static_cast<int>(blockDim.x);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int target = targets[row];  // the same for the whole block: the branches below are block-uniform
    T* d = dlogits ? dlogits + row * V : nullptr;
    if (target < 0) {
      ignore_row<T, P>(d, losses + row, packs);
      continue;
    }
    const T* z = logits + row * V;
    // Read before any thread writes d (which may alias z): the reductions below are barriers.
    const float z_target = threadIdx.x == 0 ? (target < V ? to_float(z[target]) : NAN) : 0.0f;
    float m = -INFINITY, s = 0.0f;
    if constexpr (kStaged) {
      for (int base = static_cast<int>(threadIdx.x); base < packs; base += kLoadsInFlight * stride) {
        detail::Pack<T, P> x[kLoadsInFlight];
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u)
          if (base + u * stride < packs) x[u] = detail::load_pack<P>(z + int64_t{base + u * stride} * P);
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u)
          if (base + u * stride < packs) {
            staged[base + u * stride] = x[u];
            add_pack<T, P>(x[u], m, s);
          }
      }
    } else {
      for (int i = static_cast<int>(threadIdx.x); i < packs; i += stride)
        add_pack<T, P>(detail::load_pack<P>(z + int64_t{i} * P), m, s);
    }
    const float2 max_sum = finish_row(m, s, z_target, losses + row, scratch);  // barriers: the row staged, if so
    if (d) {
      const float inv_sum = 1.0f / max_sum.y;
      for (int i = static_cast<int>(threadIdx.x); i < packs; i += stride) {
        const detail::Pack<T, P> x = kStaged ? staged[i] : detail::load_pack<P>(z + int64_t{i} * P);
        detail::store_pack<P>(d + int64_t{i} * P, gradient_pack<T, P>(x, i * P, target, max_sum.x, inv_sum, weight));
      }
    }
  }
}

// Mean over the valid rows, summed in double in a fixed order (the CPU reference accumulates in double too).
__global__ void __launch_bounds__(kReduceBlock)
    cross_entropy_mean_loss_kernel(float* mean_loss, const float* losses, const int* num_valid, int N) {
  extern __shared__ __align__(16) unsigned char smem[];
  double s = 0.0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) s += losses[n];  // ignored rows hold 0
  const double total = detail::block_reduce<detail::Sum>(s, reinterpret_cast<double*>(smem));
  if (threadIdx.x == 0) {
    const int count = *num_valid;
    *mean_loss = count > 0 ? static_cast<float>(total / count) : 0.0f;
  }
}

// Enough threads that each handles a few dozen accesses at most, few enough that a small row does not leave most
// of the block idle.
inline int row_block_size(int accesses) {
  return accesses <= 64 ? 32 : accesses <= 2048 ? 128 : accesses <= 16384 ? 256 : kMaxRowBlock;
}

// The staged kernel's threads for a row of `packs`: kLoadsInFlight packs a thread at a time, whole warps, at most
// 512 (2 blocks of gpt2-small's 100.6 KB bf16 rows an SM). Its shared memory: the scratch and the row.
constexpr int kStagedRowBlock = 512;
inline int staged_block_size(int packs) {
  const int threads = (packs + kLoadsInFlight - 1) / kLoadsInFlight;
  return std::min(kStagedRowBlock, std::max(32, (threads + 31) / 32 * 32));
}
inline size_t staged_bytes(int V, size_t element_bytes) {
  return kScratchBytes + static_cast<size_t>(V) * element_bytes;
}

// The three launches, through `launch(kernel, grid, block, smem_bytes, args...)`: detail::launch_on(stream) in
// softmax_ce.cu, the emulation's in tests/emu. A block per row, up to max_blocks (the grid's limit; the emulation
// sets fewer, so that blocks walk rows); `rows` picks the row kernel (staged only where the row fits max_block_smem,
// the device's shared memory a block, and takes 16-byte packs).
// Fewer blocks, to keep the rows of pass 2's re-read in L2 (half the L2's worth: 251 blocks of 1024 threads for
// gpt2-small's bf16 logits), made it slower on an H200: 0.712 ms against 0.588, fp32 1.289 against 1.157
// (bench/results/2026-11-29-h200-speed/kernels.log). Arguments checked by the caller.
template <typename Launch, typename T>
void softmax_cross_entropy_launches(Launch launch, T* dlogits, float* losses, float* mean_loss, int* num_valid,
                                    const T* logits, const int32_t* targets, int N, int V, float grad_scale,
                                    CrossEntropyRows rows, int64_t max_blocks, size_t max_block_smem) {
  // N == 0 still runs the two one-block kernels: they write the defined results (0 rows, mean 0).
  launch(cross_entropy_count_valid_kernel, dim3(1), dim3(kReduceBlock), kScratchBytes, num_valid, targets, N);
  if (N > 0) {
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(N, max_blocks)));
    constexpr int P = 16 / sizeof(T);
    const bool packed = V % P == 0 && detail::all_aligned(16, logits, dlogits);
    if (packed && rows == CrossEntropyRows::kStaged && staged_bytes(V, sizeof(T)) <= max_block_smem)
      launch(softmax_cross_entropy_fused_kernel<T, P, true>, grid, dim3(staged_block_size(V / P)),
             staged_bytes(V, sizeof(T)), dlogits, losses, logits, targets, static_cast<const int*>(num_valid), N, V,
             grad_scale);
    else if (packed)
      launch(softmax_cross_entropy_fused_kernel<T, P, false>, grid, dim3(row_block_size(V / P)), kScratchBytes, dlogits,
             losses, logits, targets, static_cast<const int*>(num_valid), N, V, grad_scale);
    else
      launch(softmax_cross_entropy_fused_kernel<T, 1, false>, grid, dim3(row_block_size(V)), kScratchBytes, dlogits,
             losses, logits, targets, static_cast<const int*>(num_valid), N, V, grad_scale);
  }
  if (mean_loss != nullptr)
    launch(cross_entropy_mean_loss_kernel, dim3(1), dim3(kReduceBlock), kScratchBytes, mean_loss,
           static_cast<const float*>(losses), static_cast<const int*>(num_valid), N);
}

}  // namespace softmax_ce
using softmax_ce::softmax_cross_entropy_launches;
}  // namespace
}  // namespace ddplab::cuda
