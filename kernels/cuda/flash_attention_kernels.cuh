// The fused attention's kernels and their launch sequence (flash_attention.h has the contract, docs/GPU.md the why);
// flash_attention.cu has the launchers. Included by exactly one translation unit per program: flash_attention.cu
// under nvcc, or the CPU emulation of tests/emu (g++, tests/emu/cuda_emulation.h included first), which runs this very
// source on host threads. Hence everything here is in an unnamed namespace, and nothing below needs nvcc but the
// kernels' bodies' intrinsics, which the emulation provides.
//
// Per head, with Q, K, V, O, dO [S, hs] row-major views into qkv / out / dout (row stride 3C or C), scale = 1/sqrt(hs):
//   forward   S = scale Q K^T (masked)   P = softmax_rows(S)   O = P V   lse_i = log sum_j exp(S_ij)
//   backward  P_ij = exp(S_ij - lse_i)   dV = P^T dO   dP = dO V^T   D_i = rowsum(dO_i * O_i)
//             dS = scale P * (dP - D)    dQ = dS K     dK = dS^T Q
// (D_i = rowsum(P_i * dP_i), the softmax backward's dot product, rewritten through O = P V so that backward never
// needs a whole row of P at once.) Exponentials are taken base 2, with log2(e) folded into the scale, which is what
// the special function unit computes (ptx::exp2_approx); the lse is stored in natural log, as the CPU reference would
// compute it.
//
// Tensor cores through mma.sync m16n8k16 (kernels/cuda/mma.cuh): bf16 operands, fp32 accumulators whose element
// layout the PTX ISA documents, so the per-row steps (masking, the online softmax, the rescaling of O, P and dS) work
// on the accumulator registers where the products left them, and a product's result becomes the next product's left
// operand without leaving registers. Tiles reach shared memory by cp.async (the next one while the current one is
// used) and the tensor cores by ldmatrix; their rows are padded by 16 bytes, which keeps ldmatrix free of bank
// conflicts. Only the backward's dS crosses between warps through shared memory (dQ sums over every warp's keys).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"  // kBlockSize, grid_size, global_index, grid_stride
#include "kernels/cuda/mma.cuh"

namespace ddplab::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;  // per CTA, both directions
constexpr int kThreads = kWarps * 32;
constexpr int kFrag = 16;                // rows of an A fragment: a warp's queries (forward) or keys (backward)
constexpr int kBlockQ = kWarps * kFrag;  // queries per block of the backward: 16 per warp
constexpr int kBlockK = kWarps * kFrag;  // keys per block: forward, one key tile; backward, 16 per warp
constexpr int kPadBf16 = 8;              // row padding of bf16 tiles (elements): 16 bytes, for ldmatrix's banks
using ptx::kLog2e;
// The causal mask makes the key range of a query block end at the block's last query. The backward's blocks are square,
// so that the first query block a key block sees is its own, and the diagonal block the only partly masked one.
static_assert(kBlockQ == kBlockK, "the backward's causal block skipping assumes square blocks");

constexpr size_t align128(size_t bytes) { return (bytes + 127) / 128 * 128; }

// The 64-key blocks of S keys: the deterministic backward keeps a dQ share per block of S; a sequence of len valid
// keys has key_blocks(len) blocks that run.
__host__ __device__ constexpr int key_blocks(int S) { return (S + kBlockK - 1) / kBlockK; }

// The forward's query fragments per warp, by default: two at hs <= 64, so that each K or V fragment read by ldmatrix
// feeds two mma.sync and a warp has two independent accumulator chains; the 32 rows' S, O and Q then take ~240
// registers at hs 64 (2 CTAs per SM). At hs 128, O and Q alone would take 192: one fragment. One at hs <= 64 is the
// launchers' other choice (flash_forward_launches), for the benchmark to set the two side by side.
constexpr int max_forward_frags(int hs) { return hs <= 64 ? 2 : 1; }
template <int HS>
constexpr int kForwardFrags = max_forward_frags(HS);
template <int F>
constexpr int kForwardBlockQ = kWarps * F * kFrag;  // queries per forward CTA: 128 at two fragments, 64 at one

// Shared memory of the forward CTA, byte offsets: the query block [kForwardBlockQ][HS], then two stages of the key
// and value tiles [64][HS] (the next tile's copies land in one while the warps compute on the other), bf16 with rows
// padded by 16 bytes, so that the 8 rows one ldmatrix reads fall in 8 different 16-byte bank groups.
template <int HS, int F>
struct ForwardSmem {
  static constexpr int kLd = HS + kPadBf16;
  static constexpr size_t kTile = sizeof(bf16) * kBlockK * kLd;
  static constexpr size_t kQ = 0;
  // stage s: K at kStages + 2 s kTile, V after it
  static constexpr size_t kStages = kQ + align128(sizeof(bf16) * kForwardBlockQ<F> * kLd);
  static constexpr size_t kBytes = kStages + 4 * kTile;
  static_assert(kTile % 128 == 0, "every tile starts on a 128-byte boundary");
};

// Shared memory of the backward CTA, byte offsets: the CTA's K and V tiles; two stages (the next query block's copies
// land in one while the warps compute on the other) of the query block's Q and dO tiles, its lse (times log2 e) and D,
// and, packed, its queries' first keys; dS^T [kBlockK][kBlockQ] bf16, through which the dQ product gathers every warp's
// keys. bf16 rows are padded by 16 bytes, as the forward's.
template <int HS>
struct BackwardSmem {
  static constexpr int kLd = HS + kPadBf16, kLdDs = kBlockQ + kPadBf16;
  static constexpr size_t kTile = sizeof(bf16) * kBlockK * kLd;
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + kTile;
  static constexpr size_t kStage = 2 * kTile + align128(3 * sizeof(float) * kBlockQ);  // Q, dO, lse, D, first keys
  static constexpr size_t kStages = kV + kTile;
  static constexpr size_t kDs = kStages + 2 * kStage;
  static constexpr size_t kBytes = kDs + align128(sizeof(bf16) * kBlockK * kLdDs);
  static_assert(kTile % 128 == 0 && kBlockQ == kBlockK, "every tile starts on a 128-byte boundary; Q tiles are K's size");
};

// The grid of the tensor-core kernels: a CTA per (block of `rows` queries or keys, head, sequence), the block
// varying slowest. The hardware dispatches CTAs in the order of their linear index (x fastest), and causal CTAs differ
// in length up to S / rows times: ordered this way, every head's longest CTAs start first and the shortest fill the
// tail (longest first). With the block varying fastest, each head ran its CTAs from longest to shortest, the last
// heads' longest CTAs started late and ran on while other SMs idled: ncu counted the SMs idle on 22% of the forward's
// cycles on an H200, most of it this tail by bench/gpu/flash_schedule_model.py, which models both orders.
// (head, sequence) share x, head fastest (the same linear order as x = head, y = sequence), so that B is not bound by
// y's limit of 65535: a classifier's batch of short sequences may hold more.
inline dim3 cta_grid(int B, int S, int NH, int rows) {
  return dim3(static_cast<unsigned>(int64_t{NH} * B), 1, static_cast<unsigned>((S + rows - 1) / rows));
}

using detail::length_of;

// The first key query t may see: its own sequence's first token where the row is packed (positions [S] of the
// query's row, each token's position within its sequence: t - positions[t]), else the row's first. Packed rows keep
// their sequences in order, so it never decreases along the row.
__host__ __device__ inline int first_key(const int32_t* row_positions, int t) {
  return row_positions ? t - row_positions[t] : 0;
}

// ---- any architecture: the backward's first and last kernels ------------------------------------------------------

// D_i = rowsum(dO_i * O_i) in fp32 for every (b, t, h) row (0 on padded rows, whose dO and O are not read), and the
// row's fp32 dQ accumulator zeroed where the backward adds into it (dq_acc null: it writes its key blocks' shares
// instead). A group of HS / 8 lanes per row, each lane 8 elements: one 16-byte load of dO and of O and two of the
// accumulator's stores a lane (a lane per element moved 2 bytes an access; the rows are 16-byte aligned, which
// flash_attention.cu checks).
constexpr int kDotPerLane = 8;
template <int HS>
constexpr int kDotRowsPerBlock = detail::kBlockSize / (HS / kDotPerLane);

template <int HS>
__global__ void __launch_bounds__(detail::kBlockSize)
    flash_attention_backward_dot_kernel(float* dsum, float* dq_acc, const bf16* dout, const bf16* out,
                                        const int32_t* lengths, int S, int C, int NH, int64_t rows) {
  constexpr int kGroup = HS / kDotPerLane, kRowsPerWarp = 32 / kGroup;
  static_assert(HS % kDotPerLane == 0 && 32 % kGroup == 0, "a row's lanes tile the warp");
  const int lane = threadIdx.x % kGroup;  // within the row's group: groups of 4, 8 or 16 lanes tile each warp
  constexpr int64_t kRowsPerBlock = kDotRowsPerBlock<HS>;
  // The loop runs while the warp's first row is a row, so that its shuffles always see all 32 lanes.
  for (int64_t warp_first = blockIdx.x * kRowsPerBlock + threadIdx.x / 32 * kRowsPerWarp; warp_first < rows;
       warp_first += gridDim.x * kRowsPerBlock) {
    const int64_t r = warp_first + threadIdx.x % 32 / kGroup;
    const bool in_rows = r < rows;  // the warp's last rows may lie past the end
    const int h = static_cast<int>(r % NH);
    const int64_t bt = r / NH;  // b * S + t
    const int t = static_cast<int>(bt % S), b = static_cast<int>(bt / S);
    const int64_t at = bt * C + int64_t{h} * HS + lane * kDotPerLane;
    float dot = 0.0f;
    if (in_rows && t < length_of(lengths, b, S)) {
      const detail::Pack<bf16, kDotPerLane> d = detail::load_pack<kDotPerLane>(dout + at),
                                            o = detail::load_pack<kDotPerLane>(out + at);
#pragma unroll
      for (int k = 0; k < kDotPerLane; ++k) dot += __bfloat162float(d.v[k]) * __bfloat162float(o.v[k]);
    }
    if (dq_acc && in_rows) {
      const detail::Pack<float, 4> zero{};
      detail::store_pack(dq_acc + at, zero);
      detail::store_pack(dq_acc + at + 4, zero);
    }
#pragma unroll
    for (int step = kGroup / 2; step > 0; step >>= 1) dot += __shfl_xor_sync(detail::kFullMask, dot, step);
    if (lane == 0 && in_rows) dsum[(int64_t{b} * NH + h) * S + t] = dot;
  }
}

// dqkv's q part = the fp32 dQ rounded to bf16, 0 on padded rows (not read); 4 elements per thread and step. dq_acc
// holds dQ itself (share_stride 0: the backward added every key block's share into it), or each key block's share of
// it, share_stride floats apart (the deterministic backward): summed here in key-block order, over the blocks that
// visited t's query block, which are the shares the backward wrote: from block 0 (packed: the block of the first key
// of that query block's first query) to the last that query t sees (its own when causal, the last valid one
// otherwise).
__global__ void __launch_bounds__(detail::kBlockSize)
    flash_attention_dq_kernel(bf16* dqkv, const float* dq_acc, const int32_t* lengths, const int32_t* positions, int S,
                              int C, bool causal, int64_t share_stride, int64_t n4) {
  for (int64_t i = detail::global_index(); i < n4; i += detail::grid_stride()) {
    const int64_t e = i * 4, row = e / C;  // row = b * S + t; C % 4 == 0, so the 4 stay in the row
    const int c = static_cast<int>(e % C), t = static_cast<int>(row % S), b = static_cast<int>(row / S);
    const int len = length_of(lengths, b, S);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < len) {
      const int row_first =
          share_stride == 0 || !positions ? 0 : first_key(positions + int64_t{b} * S, t / kBlockQ * kBlockQ) / kBlockK;
      v = *reinterpret_cast<const float4*>(dq_acc + row_first * share_stride + e);
      const int seen = share_stride == 0 ? 1 : causal ? t / kBlockK + 1 : key_blocks(len);
      for (int k = row_first + 1; k < seen; ++k) {
        const float4 w = *reinterpret_cast<const float4*>(dq_acc + k * share_stride + e);
        v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
      }
    }
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(dqkv + row * 3 * C + c);
    dst[0] = __floats2bfloat162_rn(v.x, v.y);
    dst[1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

// ---- the tensor-core kernels: sm_80 and later (bf16 mma.sync) ------------------------------------------------------

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

constexpr int kVec = 8;  // bf16 per 16-byte global access
constexpr float kLn2 = 0.6931471805599453f;

// Rows [row0, row1) of one head's HS columns (row stride ld) set to 0; the whole CTA takes part.
template <int HS>
__device__ __forceinline__ void zero_rows(bf16* dst, int64_t ld, int row0, int row1) {
  constexpr int kPerRow = HS / kVec;
  for (int c = threadIdx.x; c < (row1 - row0) * kPerRow; c += kThreads)
    *reinterpret_cast<uint4*>(dst + (row0 + c / kPerRow) * ld + (c % kPerRow) * kVec) = make_uint4(0, 0, 0, 0);
}

// ---- mma.sync building blocks (kernels/cuda/mma.cuh has the fragment layouts) --------------------------------------

// Rows [row0, row0 + ROWS) of one head's HS columns of a bf16 matrix with row stride ld (elements) into the shared
// tile dst [ROWS][HS + kPadBf16] by cp.async, 16 bytes per copy; rows >= valid_rows are zero-filled without reading
// the source (padding may hold anything: a masked key must still multiply its 0 weight by a finite value). The whole
// CTA takes part; the copies land at the cp_async_wait that covers the group the caller commits them in.
// A thread copies the same 16 columns of every kRowStep-th row, so its addresses are a base and a fixed step: the
// loop unrolls to a compare, an add and a copy per 16 bytes (a loop over the tile's copies in thread order cost ~30
// instructions each, a third of the forward's loop).
template <int ROWS, int HS>
__device__ __forceinline__ void load_tile_async(bf16* dst, const bf16* src, int64_t ld, int row0, int valid_rows) {
  constexpr int kPerRow = HS / kVec, kRowStep = kThreads / kPerRow, kLd = HS + kPadBf16;
  static_assert(kThreads % kPerRow == 0 && ROWS % kRowStep == 0, "every thread copies whole steps of rows");
  const int r = threadIdx.x / kPerRow, col = threadIdx.x % kPerRow * kVec;
  bf16* const dst_r = dst + r * kLd + col;
  const bf16* const src_r = src + (row0 + r) * ld + col;
#pragma unroll
  for (int i = 0; i < ROWS / kRowStep; ++i) {
    const bool valid = row0 + r + i * kRowStep < valid_rows;
    ptx::cp_async_16(dst_r + i * kRowStep * kLd, valid ? src_r + i * kRowStep * ld : src, valid);
  }
}

// The lane's row address for ldmatrix_x4 of a 16x16 block at (row0, col0) of a row-major bf16 tile (row stride ld),
// the four 8x8 matrices ordered (rows lo, cols lo), (rows hi, cols lo), (rows lo, cols hi), (rows hi, cols hi).
// Without .trans: the A fragment of the block (rows are m, cols k). With .trans, for a tile stored [k][n]: registers
// 0-1 the B fragment of cols col0..col0+7, 2-3 of col0+8..col0+15.
__device__ __forceinline__ const bf16* fragment_rows_lo_first(const bf16* tile, int ld, int row0, int col0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8;
  return tile + (row0 + lane % 8 + 8 * (matrix % 2)) * ld + col0 + 8 * (matrix / 2);
}

// The same block with the matrices ordered (rows lo, cols lo), (rows lo, cols hi), (rows hi, cols lo), (rows hi, cols
// hi): without .trans, for a tile stored [n][k] (the right operand of A B^T), registers 0-1 the B fragment of n rows
// row0..row0+7 over k cols col0..col0+15, 2-3 of rows row0+8..row0+15.
__device__ __forceinline__ const bf16* fragment_cols_lo_first(const bf16* tile, int ld, int row0, int col0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8;
  return tile + (row0 + lane % 8 + 8 * (matrix / 2)) * ld + col0 + 8 * (matrix % 2);
}

// acc[f][n] += A_f B^T for F fragments of the warp's rows (16 each): a[f][k] the A fragments of A_f [16][KD] (KD = 16
// per k step), B^T's right operand the rows [N][KD] of a bf16 tile (row stride ld) from row b_row0, each of its
// fragments read once for all F. Forward's S = Q K^T; backward's S^T = K Q^T, dP^T = V dO^T (F = 1: pass &acc, &a).
template <int F, int N, int KD>
__device__ __forceinline__ void warp_product_transposed(float (*acc)[N / 8][4], const uint32_t (*a)[KD / 16][4],
                                                        const bf16* b_tile, int ld, int b_row0) {
#pragma unroll
  for (int k = 0; k < KD / 16; ++k)
#pragma unroll
    for (int n = 0; n < N / 16; ++n) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, fragment_cols_lo_first(b_tile, ld, b_row0 + n * 16, k * 16));
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int f = 0; f < F; ++f) {
        ptx::mma_bf16_16816(acc[f][2 * n], a[f][k], b_lo);
        ptx::mma_bf16_16816(acc[f][2 * n + 1], a[f][k], b_hi);
      }
    }
}

// acc[f][n] += A_f B for F fragments of the warp's rows: a[f][k] the A fragments of A_f [16][K], B the rows [K][N]
// (from b_row0) of a bf16 tile stored row-major (row stride ld), read transposed into B fragments, once for all F.
// Forward's O += P V; backward's dV += P^T dO, dK += dS^T Q, dQ = dS K (F = 1).
template <int F, int N, int K>
__device__ __forceinline__ void warp_product(float (*acc)[N / 8][4], const uint32_t (*a)[K / 16][4],
                                             const bf16* b_tile, int ld, int b_row0) {
#pragma unroll
  for (int k = 0; k < K / 16; ++k)
#pragma unroll
    for (int n = 0; n < N / 16; ++n) {
      uint32_t b[4];
      ptx::ldmatrix_x4_trans(b, fragment_rows_lo_first(b_tile, ld, b_row0 + k * 16, n * 16));
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int f = 0; f < F; ++f) {
        ptx::mma_bf16_16816(acc[f][2 * n], a[f][k], b_lo);
        ptx::mma_bf16_16816(acc[f][2 * n + 1], a[f][k], b_hi);
      }
    }
}

// The A fragments of the warp's 16 rows [16][K] of a bf16 tile (row stride ld) from row row0.
template <int K>
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[K / 16][4], const bf16* tile, int ld, int row0) {
#pragma unroll
  for (int k = 0; k < K / 16; ++k) ptx::ldmatrix_x4(a[k], fragment_rows_lo_first(tile, ld, row0, k * 16));
}

// An accumulator [16][K] (K / 8 D fragments) rounded to bf16 as the A fragments of the next product: D fragments 2k
// and 2k + 1 are exactly A fragment k's halves (mma.cuh).
template <int K>
__device__ __forceinline__ void accumulator_to_a_fragments(uint32_t (&a)[K / 16][4], const float (&acc)[K / 8][4]) {
#pragma unroll
  for (int k = 0; k < K / 16; ++k) {
    a[k][0] = ptx::pack_bf16x2(acc[2 * k][0], acc[2 * k][1]);
    a[k][1] = ptx::pack_bf16x2(acc[2 * k][2], acc[2 * k][3]);
    a[k][2] = ptx::pack_bf16x2(acc[2 * k + 1][0], acc[2 * k + 1][1]);
    a[k][3] = ptx::pack_bf16x2(acc[2 * k + 1][2], acc[2 * k + 1][3]);
  }
}

template <int N>
__device__ __forceinline__ void zero_accumulator(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
}

// The max and the sum over the 4 lanes of a quad, which hold one row's columns of a D fragment between them.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(detail::kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(detail::kFullMask, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(detail::kFullMask, x, 1);
  return x + __shfl_xor_sync(detail::kFullMask, x, 2);
}

// ---- forward --------------------------------------------------------------------------------------------------------

// A CTA per (query block, head h, sequence b): 4 warps, each owning F fragments of 16 query rows (kForwardFrags<HS> by
// default), share each key/value tile; each K and V fragment a warp reads feeds its F fragments' products. A lane
// holds, as the mma fragments lay them out, two rows of each fragment (g = lane / 4 and g + 8 of its 16) and, of each
// 8-column tile of S and O, the columns 2q, 2q + 1 (q = lane % 4): the row statistics are per lane, reduced over the
// quad. At hs 64, F = 2: ~240 registers, so 2 CTAs (8 warps) per SM, each warp with two independent chains of products.
template <int HS, int F>
__global__ void __launch_bounds__(kThreads)
    flash_attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* lengths,
                                   const int32_t* positions, int S, int C, int NH, bool causal, float scale_log2) {
  using L = ForwardSmem<HS, F>;
  constexpr int kLd = L::kLd, kRows = F * kFrag, kBlock = kForwardBlockQ<F>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* const q_s = reinterpret_cast<bf16*>(smem + L::kQ);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Causal: the last query blocks see the most keys, so they come first (cta_grid).
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int q0 = (gridDim.z - 1 - blockIdx.z) * kBlock;
  const int len = length_of(lengths, b, S);
  const int64_t ld = 3 * int64_t{C};
  const bf16* const q_g = qkv + int64_t{b} * S * ld + h * HS;
  const bf16* const k_g = q_g + C;
  const bf16* const v_g = q_g + 2 * C;
  bf16* const out_g = out + int64_t{b} * S * C + h * HS;
  float* const lse_g = lse + (int64_t{b} * NH + h) * S;
  const int32_t* const pos_g = positions ? positions + int64_t{b} * S : nullptr;

  // A block of padded queries: output 0 and lse -inf, nothing read.
  if (q0 >= len) {
    zero_rows<HS>(out_g, C, q0, min(q0 + kBlock, S));
    for (int t = q0 + threadIdx.x; t < min(q0 + kBlock, S); t += kThreads) lse_g[t] = -INFINITY;
    return;
  }

  // The lane's rows (two per fragment) and their valid keys (j < keys; packed, also j >= the row's first_key). Keys
  // in [warp_last_first, warp_full_keys) are valid for every row of the warp, so a tile within them needs no mask;
  // keys from warp_keys on, and below warp_first, are masked for every row of the warp, so the warp skips such a tile
  // (causal: the diagonal's second tile for the block's first half of rows; packed: the tiles before its rows'
  // sequences).
  const int warp_row0 = q0 + warp * kRows;
  int row[F][2], keys[F][2];
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row[f][r] = warp_row0 + f * kFrag + lane / 4 + 8 * r;
      keys[f][r] = row[f][r] >= len ? 0 : (causal ? row[f][r] + 1 : len);
    }
  const int warp_full_keys = warp_row0 + kRows > len ? 0 : (causal ? warp_row0 + 1 : len);
  const int warp_keys = warp_row0 >= len ? 0 : (causal ? min(len, warp_row0 + kRows) : len);
  const int warp_first = warp_row0 >= len ? 0 : first_key(pos_g, warp_row0);
  const int warp_last_first = warp_row0 >= len ? 0 : first_key(pos_g, min(len, warp_row0 + kRows) - 1);

  // Keys past the block's last query are masked for every row when causal, and keys before its first query's first
  // key for every row when packed: those tiles are skipped.
  const int kv_end = causal ? min(len, q0 + kBlock) : len;
  const int tiles = (kv_end + kBlockK - 1) / kBlockK, first_tile = first_key(pos_g, q0) / kBlockK;
  const auto k_stage = [&](int tile) { return reinterpret_cast<bf16*>(smem + L::kStages + (tile % 2) * 2 * L::kTile); };
  const auto v_stage = [&](int tile) { return k_stage(tile) + L::kTile / sizeof(bf16); };

  load_tile_async<kBlock, HS>(q_s, q_g, ld, q0, len);
  load_tile_async<kBlockK, HS>(k_stage(first_tile), k_g, ld, first_tile * kBlockK, len);
  load_tile_async<kBlockK, HS>(v_stage(first_tile), v_g, ld, first_tile * kBlockK, len);
  ptx::cp_async_commit();

  uint32_t q_frag[F][HS / kFrag][4];  // the warp's query rows, for every key tile
  float o[F][HS / 8][4];              // O, unnormalised
#pragma unroll
  for (int f = 0; f < F; ++f) zero_accumulator(o[f]);
  // Per row: the running max m of the scores in log2 units (the quad's), and the lane's share of the running sum l of
  // exp2(score - m) (summed over the quad at the end).
  float m[F][2], l[F][2];
#pragma unroll
  for (int f = 0; f < F; ++f) m[f][0] = m[f][1] = -INFINITY, l[f][0] = l[f][1] = 0.0f;

  for (int tile = first_tile; tile < tiles; ++tile) {
    const int j0 = tile * kBlockK;
    ptx::cp_async_wait<0>();
    __syncthreads();  // this tile's copies (every thread's) landed; every warp is done with the previous tile's stage
    if (tile + 1 < tiles) {
      load_tile_async<kBlockK, HS>(k_stage(tile + 1), k_g, ld, j0 + kBlockK, len);
      load_tile_async<kBlockK, HS>(v_stage(tile + 1), v_g, ld, j0 + kBlockK, len);
    }
    ptx::cp_async_commit();
    if (tile == first_tile)
#pragma unroll
      for (int f = 0; f < F; ++f) load_a_fragments<HS>(q_frag[f], q_s, kLd, warp * kRows + f * kFrag);
    // Every score of the warp's rows masked: nothing to add (the barrier is above).
    if (j0 >= warp_keys || j0 + kBlockK <= warp_first) continue;

    // S = Q K^T for the warp's rows x the tile's 64 keys, in registers.
    float s[F][kBlockK / 8][4];
#pragma unroll
    for (int f = 0; f < F; ++f) zero_accumulator(s[f]);
    warp_product_transposed<F, kBlockK, HS>(s, q_frag, k_stage(tile), kLd, 0);

    // Masked keys (j >= keys: padding, the causal future; packed, j below the row's first key: other sequences)
    // become -inf, so that their p is exactly 0 (2^-inf). Only the tiles that reach past the warp's first query's keys,
    // or start before its last query's first key, hold any: the others skip the compares. A row's first key is read
    // here, not kept in registers through the loop: only a packed row's boundary tiles ask for it.
    if (j0 + kBlockK > warp_full_keys || j0 < warp_last_first) {
#pragma unroll
      for (int f = 0; f < F; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int first = row[f][r] < len ? first_key(pos_g, row[f][r]) : 0;
#pragma unroll
          for (int n = 0; n < kBlockK / 8; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int j = j0 + n * 8 + 2 * (lane % 4) + c;
              if (j >= keys[f][r] || j < first) s[f][n][2 * r + c] = -INFINITY;
            }
        }
    }

    // The online softmax update, per row, in log2 units: the scores' new max over the quad (scaled after the max, which
    // the positive scale leaves in place), the old sums and O rescaled to it, then p = 2^(s scale - m) in one fused
    // multiply-add and one exponential per score.
#pragma unroll
    for (int f = 0; f < F; ++f)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < kBlockK / 8; ++n) tile_max = fmaxf(tile_max, fmaxf(s[f][n][2 * r], s[f][n][2 * r + 1]));
        const float m_new = fmaxf(m[f][r], quad_max(tile_max) * scale_log2);
        // A row with no valid key yet (a padded query) keeps m = -inf; taking 0 as the base then keeps exp2 away from
        // -inf - -inf = NaN, and every p of the row is 0 anyway.
        const float base = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = ptx::exp2_approx(m[f][r] - base);  // rescales the old sums to the new max (0 while -inf)
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < kBlockK / 8; ++n) {
          s[f][n][2 * r] = ptx::exp2_approx(fmaf(s[f][n][2 * r], scale_log2, -base));
          s[f][n][2 * r + 1] = ptx::exp2_approx(fmaf(s[f][n][2 * r + 1], scale_log2, -base));
          sum += s[f][n][2 * r] + s[f][n][2 * r + 1];
        }
        l[f][r] = l[f][r] * alpha + sum;
        m[f][r] = m_new;
#pragma unroll
        for (int n = 0; n < HS / 8; ++n) {
          o[f][n][2 * r] *= alpha;
          o[f][n][2 * r + 1] *= alpha;
        }
      }

    // O += P V, P rounded to bf16 straight from the score registers.
    uint32_t p_frag[F][kBlockK / kFrag][4];
#pragma unroll
    for (int f = 0; f < F; ++f) accumulator_to_a_fragments<kBlockK>(p_frag[f], s[f]);
    warp_product<F, HS, kBlockK>(o, p_frag, v_stage(tile), kLd, 0);
  }

  // out = O / l and lse = ln(2^m l) = (m + log2 l) ln 2 on valid rows; padded rows get exact zeros and -inf. l is
  // about 1 or more on a valid row: its max term contributed 2^(a rounding error of the max).
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float row_sum = quad_sum(l[f][r]);
      if (row[f][r] >= S) continue;
      const bool valid = row[f][r] < len;
      const float inv = valid ? 1.0f / row_sum : 0.0f;
      uint32_t* const dst = reinterpret_cast<uint32_t*>(out_g + int64_t{row[f][r]} * C + 2 * (lane % 4));
#pragma unroll
      for (int n = 0; n < HS / 8; ++n)
        dst[n * 4] = valid ? ptx::pack_bf16x2(o[f][n][2 * r] * inv, o[f][n][2 * r + 1] * inv) : 0u;
      if (lane % 4 == 0) lse_g[row[f][r]] = valid ? (m[f][r] + log2f(row_sum)) * kLn2 : -INFINITY;
    }
}

// ---- backward -------------------------------------------------------------------------------------------------------

// Adds 4 floats to global memory (16-byte aligned): one 16-byte atomic where the hardware has it (sm_90, and the CPU
// emulation, which stands for it and checks the address), else four.
__device__ __forceinline__ void atomic_add4(float* dst, float x, float y, float z, float w) {
#if __CUDA_ARCH__ >= 900 || defined(DDPLAB_CUDA_EMULATION)
  atomicAdd(reinterpret_cast<float4*>(dst), make_float4(x, y, z, w));
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
  atomicAdd(dst + 2, z);
  atomicAdd(dst + 3, w);
#endif
}

// A CTA per (key block, head h, sequence b): 4 warps, each owning 16 keys of the block. A lane holds two keys
// (g = lane / 4 and g + 8 of its warp's 16) as the rows of S^T, P^T, dP^T, dS^T (columns: the query block's queries)
// and of its dK and dV accumulators, which stay in registers over every query block. dQ, whose sum runs over the keys
// of all 4 warps, goes through shared memory: each warp stores its dS^T rows, then computes dQ = dS K for 16 of the
// block's queries and adds it into the fp32 accumulator in global memory, 16 bytes per atomic; or, kShares
// (deterministic), stores it as this key block's share, dq_acc + blockIdx.z * share_stride, which
// flash_attention_dq_kernel sums in key-block order. At hs <= 64, 3 CTAs per SM: ptxas then fits 168 registers (228
// unbounded, 2 CTAs) at the cost of one 4-byte spill, and 12 warps per SM hide more latency than 8 (6% faster on an
// H200: docs/BENCHMARKS.md). At hs 128 the dK and dV accumulators alone take 128 registers.
template <int HS, bool kShares>
__global__ void __launch_bounds__(kThreads, HS <= 64 ? 3 : 2)
    flash_attention_backward_kernel(bf16* dqkv, float* dq_acc, int64_t share_stride, const bf16* dout, const bf16* qkv,
                                    const float* lse, const float* dsum, const int32_t* lengths,
                                    const int32_t* positions, int S, int C, int NH, bool causal, float scale,
                                    float scale_log2) {
  using L = BackwardSmem<HS>;
  constexpr int kLd = L::kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* const k_s = reinterpret_cast<bf16*>(smem + L::kK);
  bf16* const v_s = reinterpret_cast<bf16*>(smem + L::kV);
  bf16* const ds_s = reinterpret_cast<bf16*>(smem + L::kDs);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Causal: the first key blocks see the most queries, so they come first (cta_grid).
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int j0 = blockIdx.z * kBlockK;
  const int len = length_of(lengths, b, S);
  const int64_t ld = 3 * int64_t{C};
  const bf16* const q_g = qkv + int64_t{b} * S * ld + h * HS;
  const bf16* const k_g = q_g + C;
  const bf16* const v_g = q_g + 2 * C;
  const bf16* const do_g = dout + int64_t{b} * S * C + h * HS;
  bf16* const dk_g = dqkv + int64_t{b} * S * ld + C + h * HS;
  bf16* const dv_g = dk_g + C;
  float* const dq_g = dq_acc + (kShares ? blockIdx.z * share_stride : 0) + int64_t{b} * S * C + h * HS;
  const float* const lse_g = lse + (int64_t{b} * NH + h) * S;
  const float* const d_g = dsum + (int64_t{b} * NH + h) * S;

  // A block of padded keys: dK = dV = 0, nothing read.
  if (j0 >= len) {
    zero_rows<HS>(dk_g, ld, j0, min(j0 + kBlockK, S));
    zero_rows<HS>(dv_g, ld, j0, min(j0 + kBlockK, S));
    return;
  }

  // Query blocks before the key block see none of its keys when causal: skipped. Packed (causal), neither do the
  // queries past the sequence of the block's last key: query_end is the first query whose first key lies past it,
  // found by bisection, as first_key never decreases along the row.
  const int32_t* const pos_g = positions ? positions + int64_t{b} * S : nullptr;
  const int i_first = causal ? j0 : 0;
  int query_end = len;
  if (pos_g) {
    const int last_key = min(len, j0 + kBlockK) - 1;
    for (int lo = last_key + 1; lo < query_end;) {
      const int mid = lo + (query_end - lo) / 2;
      if (first_key(pos_g, mid) > last_key)
        query_end = mid;
      else
        lo = mid + 1;
    }
  }
  const int blocks = (query_end - i_first + kBlockQ - 1) / kBlockQ;
  const auto q_stage = [&](int block) { return reinterpret_cast<bf16*>(smem + L::kStages + (block % 2) * L::kStage); };
  const auto do_stage = [&](int block) { return q_stage(block) + L::kTile / sizeof(bf16); };
  const auto lse_stage = [&](int block) {
    return reinterpret_cast<float*>(smem + L::kStages + (block % 2) * L::kStage + 2 * L::kTile);
  };
  const auto d_stage = [&](int block) { return lse_stage(block) + kBlockQ; };
  const auto first_key_stage = [&](int block) { return reinterpret_cast<int*>(lse_stage(block) + 2 * kBlockQ); };
  // A query block's tiles by cp.async into its stage. Its lse (times log2 e: the scores' units below) and D, 0 on
  // padded queries, by plain loads into registers, a query per thread of the first kBlockQ, and stored into the stage
  // a trip later: a store right after its load would hold the warp for the load's latency at every query block. All
  // of it visible after the barrier that follows the wait for the copies.
  static_assert(kThreads >= kBlockQ, "a thread per query of the block for its lse and D");
  const auto load_query_tiles = [&](int block) {
    const int i0 = i_first + block * kBlockQ;
    load_tile_async<kBlockQ, HS>(q_stage(block), q_g, ld, i0, len);
    load_tile_async<kBlockQ, HS>(do_stage(block), do_g, C, i0, len);
  };
  struct RowStats {
    float lse, d;
  };
  const auto read_row_stats = [&](int block) {
    const int t = i_first + block * kBlockQ + static_cast<int>(threadIdx.x);
    const bool valid = threadIdx.x < kBlockQ && t < len;
    return RowStats{valid ? lse_g[t] * kLog2e : 0.0f, valid ? d_g[t] : 0.0f};
  };
  const auto store_row_stats = [&](int block, RowStats stats) {
    if (threadIdx.x < kBlockQ) lse_stage(block)[threadIdx.x] = stats.lse, d_stage(block)[threadIdx.x] = stats.d;
  };
  // Packed, the block's queries' first keys, loaded and stored at once: only packed rows wait for these loads, and
  // none of it stays in registers through the loop (the row's positions are found again from the kernel's arguments
  // rather than kept in pos_g: holding that pointer through the loop made the deterministic hs-64 backward spill 20
  // bytes, not 8).
  const auto store_first_keys = [&](int block) {
    const int t = i_first + block * kBlockQ + static_cast<int>(threadIdx.x);
    if (positions && threadIdx.x < kBlockQ)
      first_key_stage(block)[threadIdx.x] = t < len ? first_key(positions + int64_t{blockIdx.x / NH} * S, t) : 0;
  };

  load_tile_async<kBlockK, HS>(k_s, k_g, ld, j0, len);
  load_tile_async<kBlockK, HS>(v_s, v_g, ld, j0, len);
  load_query_tiles(0);
  ptx::cp_async_commit();
  store_row_stats(0, read_row_stats(0));
  store_first_keys(0);

  float dk[HS / 8][4], dv[HS / 8][4];
  zero_accumulator(dk);
  zero_accumulator(dv);
  const int key_row0 = warp * kFrag;  // the warp's keys within the block
  const int key[2] = {j0 + key_row0 + lane / 4, j0 + key_row0 + lane / 4 + 8};

  for (int block = 0; block < blocks; ++block) {
    const int i0 = i_first + block * kBlockQ;
    ptx::cp_async_wait<0>();
    // This block's copies (every thread's) and its lse, D landed; every warp is done with the previous block's stage
    // and with dS^T's shared tile (read by the previous block's dQ).
    __syncthreads();
    RowStats next_stats{};
    if (block + 1 < blocks) {
      load_query_tiles(block + 1);
      next_stats = read_row_stats(block + 1);  // stored at the trip's end
    }
    ptx::cp_async_commit();
    const bf16* const q_s = q_stage(block);
    const bf16* const do_s = do_stage(block);
    const float* const lse_s = lse_stage(block);
    const float* const d_s = d_stage(block);
    const int* const first_s = first_key_stage(block);

    // S^T = K Q^T for the warp's 16 keys x the block's 64 queries, then P^T = exp2(scale log2(e) S^T - lse log2(e))
    // where (key j, query t) is valid, else exactly 0: a masked score's exponential (of whatever it was: the causal
    // future may overflow to inf) is overwritten, never summed. Only blocks on the diagonal or past a length hold any.
    float pt[kBlockQ / 8][4];
    {
      uint32_t k_frag[HS / kFrag][4];
      load_a_fragments<HS>(k_frag, k_s, kLd, key_row0);
      zero_accumulator(pt);
      warp_product_transposed<1, kBlockQ, HS>(&pt, &k_frag, q_s, kLd, 0);
    }
#pragma unroll
    for (int n = 0; n < kBlockQ / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        pt[n][i] = ptx::exp2_approx(fmaf(pt[n][i], scale_log2, -lse_s[n * 8 + 2 * (lane % 4) + i % 2]));
    // Packed, any block may hold keys of another sequence than some of its queries' (j below t's first key).
    if ((causal && i0 < j0 + kBlockK) || i0 + kBlockQ > len || j0 + kBlockK > len || positions) {
#pragma unroll
      for (int n = 0; n < kBlockQ / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = n * 8 + 2 * (lane % 4) + i % 2, t = i0 + col, j = key[i / 2];
          if (t >= len || j >= len || (causal && j > t) || (positions && j < first_s[col])) pt[n][i] = 0.0f;
        }
    }

    // dP^T = V dO^T.
    float dpt[kBlockQ / 8][4];
    {
      uint32_t v_frag[HS / kFrag][4];
      load_a_fragments<HS>(v_frag, v_s, kLd, key_row0);
      zero_accumulator(dpt);
      warp_product_transposed<1, kBlockQ, HS>(&dpt, &v_frag, do_s, kLd, 0);
    }

    // dV += P^T dO, P^T rounded to bf16 straight from its registers.
    uint32_t a_frag[kBlockQ / kFrag][4];
    accumulator_to_a_fragments<kBlockQ>(a_frag, pt);
    warp_product<1, HS, kBlockQ>(&dv, &a_frag, do_s, kLd, 0);

    // dS^T = scale P^T (dP^T - D), 0 wherever P is; rounded to bf16 for dK += dS^T Q and, through shared memory, dQ.
#pragma unroll
    for (int n = 0; n < kBlockQ / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) dpt[n][i] = scale * pt[n][i] * (dpt[n][i] - d_s[n * 8 + 2 * (lane % 4) + i % 2]);
    accumulator_to_a_fragments<kBlockQ>(a_frag, dpt);
    warp_product<1, HS, kBlockQ>(&dk, &a_frag, q_s, kLd, 0);
    {
      // The lane's A-fragment registers are its D-fragment elements: rows g, g + 8, columns 2q, 2q + 1 of each
      // 8-query tile, 4 bytes each (a row stride of 72 bf16 puts a quad's 8 rows on 8 different bank quadruples).
      const int row = key_row0 + lane / 4, col = 2 * (lane % 4);
#pragma unroll
      for (int k = 0; k < kBlockQ / kFrag; ++k) {
        uint32_t* const lo = reinterpret_cast<uint32_t*>(ds_s + row * L::kLdDs + k * kFrag + col);
        uint32_t* const hi = reinterpret_cast<uint32_t*>(ds_s + (row + 8) * L::kLdDs + k * kFrag + col);
        lo[0] = a_frag[k][0];
        hi[0] = a_frag[k][1];
        lo[4] = a_frag[k][2];  // 8 columns on
        hi[4] = a_frag[k][3];
      }
    }
    __syncthreads();  // every warp's dS^T rows are in shared memory

    // dQ = dS K for the warp's 16 queries of the block over the CTA's 64 keys: dS's A fragments read transposed out of
    // dS^T [key][query], K [key][dim] as the right operand; then added to the fp32 accumulator, valid rows only.
    {
      uint32_t ds_frag[kBlockK / kFrag][4];
#pragma unroll
      for (int k = 0; k < kBlockK / kFrag; ++k)
        ptx::ldmatrix_x4_trans(ds_frag[k], fragment_cols_lo_first(ds_s, L::kLdDs, k * kFrag, warp * kFrag));
      float dq[HS / 8][4];
      zero_accumulator(dq);
      warp_product<1, HS, kBlockK>(&dq, &ds_frag, k_s, kLd, 0);
      // Lanes 2p and 2p + 1 of a quad hold columns 4p..4p+3 of rows g and g + 8 between them: the even lane takes
      // row g, the odd one row g + 8, each giving its partner the two values of the other row, so that every atomic
      // (or store) moves 4 consecutive floats.
      const bool odd = lane % 2 == 1;
      const int t = i0 + warp * kFrag + lane / 4 + (odd ? 8 : 0);
      float* const dst = dq_g + int64_t{t} * C + 4 * (lane % 4 / 2);
#pragma unroll
      for (int n = 0; n < HS / 8; ++n) {
        const float give0 = odd ? dq[n][0] : dq[n][2], give1 = odd ? dq[n][1] : dq[n][3];
        const float got0 = __shfl_xor_sync(detail::kFullMask, give0, 1);
        const float got1 = __shfl_xor_sync(detail::kFullMask, give1, 1);
        if (t < len) {
          const float4 four =
              odd ? make_float4(got0, got1, dq[n][2], dq[n][3]) : make_float4(dq[n][0], dq[n][1], got0, got1);
          if constexpr (kShares)
            *reinterpret_cast<float4*>(dst + n * 8) = four;
          else
            atomic_add4(dst + n * 8, four.x, four.y, four.z, four.w);
        }
      }
    }
    // The next block's stage has had no reader since this trip's first barrier.
    if (block + 1 < blocks) store_row_stats(block + 1, next_stats), store_first_keys(block + 1);
  }

  // dK and dV out, rounded to bf16 from the registers; rows of padded keys in the block get exact zeros.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= S) continue;
    const bool valid = key[r] < len;
    uint32_t* const dk_row = reinterpret_cast<uint32_t*>(dk_g + int64_t{key[r]} * ld + 2 * (lane % 4));
    uint32_t* const dv_row = reinterpret_cast<uint32_t*>(dv_g + int64_t{key[r]} * ld + 2 * (lane % 4));
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      dk_row[n * 4] = valid ? ptx::pack_bf16x2(dk[n][2 * r], dk[n][2 * r + 1]) : 0u;
      dv_row[n * 4] = valid ? ptx::pack_bf16x2(dv[n][2 * r], dv[n][2 * r + 1]) : 0u;
    }
  }
}

#else  // an older architecture compiles stubs; the launchers refuse such a device before launching

template <int HS, int F>
__global__ void __launch_bounds__(kThreads) flash_attention_forward_kernel(bf16*, float*, const bf16*, const int32_t*,
                                                                           const int32_t*, int, int, int, bool, float) {
  __trap();
}
template <int HS, bool kShares>
__global__ void __launch_bounds__(kThreads)
    flash_attention_backward_kernel(bf16*, float*, int64_t, const bf16*, const bf16*, const float*, const float*,
                                    const int32_t*, const int32_t*, int, int, int, bool, float, float) {
  __trap();
}

#endif

// ---- the launch sequence, written once ------------------------------------------------------------------------------
//
// Which kernels run, in which order, on which grid, block and dynamic shared memory, with which arguments: shared by
// the launchers (flash_attention.cu, whose `launch` runs <<<>>> on a stream) and the CPU emulation (tests/emu, whose
// `launch` runs the kernel's threads on the host), so that the emulation tests the launch arithmetic too.
// launch(kernel, grid, block, dynamic_smem_bytes, args...). The caller has checked sizes and pointers; B * S > 0.

template <int HS, int F, typename Launch>
void run_forward(Launch&& launch, bf16* out, float* lse, const bf16* qkv, const int32_t* lengths,
                 const int32_t* positions, int B, int S, int C, int NH, bool causal) {
  const dim3 grid = cta_grid(B, S, NH, kForwardBlockQ<F>);
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(HS));
  launch(flash_attention_forward_kernel<HS, F>, grid, dim3(kThreads), ForwardSmem<HS, F>::kBytes, out, lse, qkv,
         lengths, positions, S, C, NH, causal, scale_log2);
}

// The forward with `fragments` query fragments per warp (0: kForwardFrags<HS>), at most max_forward_frags(HS).
template <int HS, typename Launch>
void run_forward_fragments(Launch&& launch, int fragments, bf16* out, float* lse, const bf16* qkv,
                           const int32_t* lengths, const int32_t* positions, int B, int S, int C, int NH, bool causal) {
  if (fragments == 0) fragments = kForwardFrags<HS>;
  if constexpr (max_forward_frags(HS) >= 2)
    if (fragments == 2) return run_forward<HS, 2>(launch, out, lse, qkv, lengths, positions, B, S, C, NH, causal);
  return run_forward<HS, 1>(launch, out, lse, qkv, lengths, positions, B, S, C, NH, causal);
}

template <int HS, typename Launch>
void run_backward(Launch&& launch, bf16* dqkv, float* dq_acc, int64_t share_stride, const bf16* dout, const bf16* qkv,
                  const bf16* out, const float* lse, float* dsum, const int32_t* lengths, const int32_t* positions,
                  int B, int S, int C, int NH, bool causal) {
  const int64_t rows = int64_t{B} * S * NH;
  launch(flash_attention_backward_dot_kernel<HS>, dim3(detail::grid_size(rows, kDotRowsPerBlock<HS>)),
         dim3(detail::kBlockSize), size_t{0}, dsum, share_stride > 0 ? nullptr : dq_acc, dout, out, lengths, S, C, NH,
         rows);
  const dim3 grid = cta_grid(B, S, NH, kBlockK);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  if (share_stride > 0)
    return launch(flash_attention_backward_kernel<HS, true>, grid, dim3(kThreads), BackwardSmem<HS>::kBytes, dqkv,
                  dq_acc, share_stride, dout, qkv, lse, dsum, lengths, positions, S, C, NH, causal, scale,
                  scale * kLog2e);
  launch(flash_attention_backward_kernel<HS, false>, grid, dim3(kThreads), BackwardSmem<HS>::kBytes, dqkv, dq_acc,
         share_stride, dout, qkv, lse, dsum, lengths, positions, S, C, NH, causal, scale, scale * kLog2e);
}

// fragments: the query fragments per warp, 0 for kForwardFrags<HS>, else 1 to max_forward_frags(HS) (checked by the
// caller: flash_attention_forward).
template <typename Launch>
void flash_forward_launches(Launch&& launch, bf16* out, float* lse, const bf16* qkv, const int32_t* lengths,
                            const int32_t* positions, int B, int S, int C, int NH, bool causal, int fragments = 0) {
  switch (C / NH) {
    case 32:
      return run_forward_fragments<32>(launch, fragments, out, lse, qkv, lengths, positions, B, S, C, NH, causal);
    case 64:
      return run_forward_fragments<64>(launch, fragments, out, lse, qkv, lengths, positions, B, S, C, NH, causal);
    case 128:
      return run_forward_fragments<128>(launch, fragments, out, lse, qkv, lengths, positions, B, S, C, NH, causal);
  }
  throw std::logic_error("flash_attention_forward: head size passed the check without a kernel");
}

// workspace: flash_attention_backward_workspace_floats(B, S, C, NH, deterministic) floats: the dQ accumulator [B, S,
// C] (deterministic: a [B, S, C] share per key block, key_blocks(S) of them), then D [B, NH, S].
template <typename Launch>
void flash_backward_launches(Launch&& launch, bf16* dqkv, float* workspace, const bf16* dout, const bf16* qkv,
                             const bf16* out, const float* lse, const int32_t* lengths, const int32_t* positions, int B,
                             int S, int C, int NH, bool causal, bool deterministic = false) {
  const int64_t dq_floats = int64_t{B} * S * C;
  const int64_t share_stride = deterministic ? dq_floats : 0;
  float* const dq_acc = workspace;
  float* const dsum = workspace + (deterministic ? key_blocks(S) : 1) * dq_floats;  // [B, NH, S]
  switch (C / NH) {
    case 32:
      run_backward<32>(launch, dqkv, dq_acc, share_stride, dout, qkv, out, lse, dsum, lengths, positions, B, S, C, NH,
                       causal);
      break;
    case 64:
      run_backward<64>(launch, dqkv, dq_acc, share_stride, dout, qkv, out, lse, dsum, lengths, positions, B, S, C, NH,
                       causal);
      break;
    case 128:
      run_backward<128>(launch, dqkv, dq_acc, share_stride, dout, qkv, out, lse, dsum, lengths, positions, B, S, C, NH,
                        causal);
      break;
    default:
      throw std::logic_error("flash_attention_backward: head size passed the check without a kernel");
  }
  const int64_t n4 = dq_floats / 4;
  launch(flash_attention_dq_kernel, dim3(detail::grid_size(n4)), dim3(detail::kBlockSize), size_t{0}, dqkv, dq_acc,
         lengths, positions, S, C, causal, share_stride, n4);
}

}  // namespace
}  // namespace ddplab::cuda
