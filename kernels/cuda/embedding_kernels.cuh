// The embedding kernels (launchers and contracts: embedding.h). Forward is a warp per (b, t) row: the row's token and
// length are read once, by every lane (a broadcast), and the lanes stride over the C columns with 16-byte accesses
// when the row and the tables allow. dwte is summed from the rows sorted by token, a warp per piece of a token's run.
// Included by embedding.cu and, compiled by g++, by tests/emu/test_embedding_emu.cpp.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda::embedding {

using detail::load_pack;
using detail::Pack;
using detail::to_float;

constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;

using detail::length_of;

template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    embedding_forward_kernel(T* out, const int32_t* tokens, const int32_t* lengths, const int32_t* positions,
                             const float* wte, const float* wpe, int B, int S, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t{B} * S;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; row < rows; row += int64_t{gridDim.x} * kWarps) {
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    T* o = out + row * C;
    if (t >= length_of(lengths, b, S)) {  // padding: zeros, and the token is not read
      Pack<T, V> zero;
#pragma unroll
      for (int k = 0; k < V; ++k) zero.v[k] = detail::from_float<T>(0.0f);
      for (int c = lane * V; c < C; c += 32 * V) detail::store_pack<V>(o + c, zero);
      continue;
    }
    const float* e = wte + int64_t{tokens[row]} * C;
    const float* p = wpe ? wpe + int64_t{positions ? positions[row] : t} * C : nullptr;
    for (int c = lane * V; c < C; c += 32 * V) {
      const Pack<float, V> ev = load_pack<V>(e + c);
      Pack<float, V> pv{};
      if (p) pv = load_pack<V>(p + c);
      Pack<T, V> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = detail::from_float<T>(ev.v[k] + pv.v[k]);
      detail::store_pack<V>(o + c, r);
    }
  }
}

// The batch's rows as sort keys: a valid row's token, a padded row `padded` (past every token, so that a stable sort
// puts the padding last and keeps each token's rows in row order), and the row itself as the sort's value. A token
// out of [0, padded) breaks the contract; it is keyed as padding, so that every key stays within the bits the sort
// looks at and the runs stay whole.
__global__ void __launch_bounds__(kBlock) token_keys_kernel(uint32_t* keys, int32_t* rows, const int32_t* tokens,
                                                            const int32_t* lengths, int B, int S, uint32_t padded) {
  const int64_t n = int64_t{B} * S;
  for (int64_t row = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; row < n; row += int64_t{gridDim.x} * blockDim.x) {
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    const uint32_t token = t < length_of(lengths, b, S) ? static_cast<uint32_t>(tokens[row]) : padded;
    keys[row] = token < padded ? token : padded;
    rows[row] = static_cast<int32_t>(row);
  }
}

// Rows of a token whose dout loads are in flight at once: a warp adds its rows kRowsInFlight at a time.
constexpr int kRowsInFlight = 8;

// Which piece of its token's run sorted position p begins: runs are cut into pieces of `piece_rows` rows from their
// first, and a warp sums each piece. -1 where p begins none. A run of up to piece_rows rows is one piece. keys[p] is
// `token`; the loop looks back a piece at a time, so it costs the run's length over piece_rows loads at most (cached:
// the keys are 4 bytes a row).
__device__ __forceinline__ int64_t run_piece(const uint32_t* keys, int64_t p, uint32_t token, int piece_rows) {
  for (int64_t s = p, piece = 0;; s -= piece_rows, ++piece) {
    if (s == 0 || keys[s - 1] != token) return piece;                // s is the run's first row
    if (s < piece_rows || keys[s - piece_rows] != token) return -1;  // it starts less than a piece before s
  }
}

// The backward's work items: a warp per (sorted position, 32 * V columns), f(position, this lane's first column), which
// may lie past C (the lane then has nothing to do).
template <int V, typename F>
__device__ __forceinline__ void for_each_position_and_columns(int64_t n, int C, F&& f) {
  const int lane = threadIdx.x % 32;
  const int slices = (C + 32 * V - 1) / (32 * V);
  const int64_t work = n * slices;
  for (int64_t w = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; w < work; w += int64_t{gridDim.x} * kWarps)
    f(w / slices, static_cast<int>(w % slices) * 32 * V + lane * V);
}

// dwte from the rows sorted by token (keys ascending, rows in row order within a key): a warp per (sorted position,
// 32 * V columns); the warp at the first position of a piece of a token's run (run_piece) adds the piece's rows in row
// order: the first piece to the token's row of dwte, starting from its value; a later piece into its own row of
// `run_sums` (indexed by its position / piece_rows: at most one later piece starts within any piece_rows positions),
// from zero, which embedding_backward_long_runs_kernel then adds to dwte in run order. So a run of up to piece_rows
// rows is summed by one thread in the CPU's order, bitwise the CPU's for fp32 dout; a longer one in a fixed order
// (cpu::embedding_backward_wte_in_pieces). Deterministic, no atomics. Why pieces: a warp's walk is a chain of
// dependent loads, and text's most common token fills ~5-9% of a batch's rows: a walk of 720 of gpt2-small's 8192
// rows held the kernel at 82 us on an H200 against 28 with every token distinct. The other warps return at once.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    embedding_backward_wte_kernel(float* dwte, float* run_sums, const T* dout, const uint32_t* keys,
                                  const int32_t* rows, int64_t n, int C, uint32_t padded, int piece_rows) {
  for_each_position_and_columns<V>(n, C, [&](int64_t first, int c) {
    const uint32_t token = keys[first];
    if (token >= padded) return;
    const int64_t piece = run_piece(keys, first, token, piece_rows);
    if (piece < 0 || c >= C) return;
    float* const out = piece == 0 ? dwte + int64_t{token} * C + c : run_sums + first / piece_rows * C + c;
    Pack<float, V> acc = piece == 0 ? load_pack<V>(out) : Pack<float, V>{};
    const int64_t end = first + piece_rows < n ? first + piece_rows : n;
    for (int64_t at = first;; at += kRowsInFlight) {
      bool same[kRowsInFlight];
      int32_t row[kRowsInFlight];
#pragma unroll
      for (int k = 0; k < kRowsInFlight; ++k) {  // the keys and the rows loaded together: one trip, then dout's
        const int64_t i = at + k < end ? at + k : end - 1;
        same[k] = at + k < end && keys[i] == token;
        row[k] = rows[i];
      }
      Pack<T, V> d[kRowsInFlight] = {};
#pragma unroll
      for (int k = 0; k < kRowsInFlight; ++k)
        if (same[k]) d[k] = load_pack<V>(dout + int64_t{row[k]} * C + c);
#pragma unroll
      for (int k = 0; k < kRowsInFlight; ++k)
        if (same[k]) {
#pragma unroll
          for (int j = 0; j < V; ++j) acc.v[j] += to_float(d[k].v[j]);
        }
      if (!same[kRowsInFlight - 1]) break;  // sorted: the piece ended in this group
    }
    detail::store_pack<V>(out, acc);
  });
}

// The runs longer than a piece: a warp per (sorted position, 32 * V columns) as above, the one at a long run's first
// position adding its later pieces' sums (run_sums) to the token's row of dwte, in run order. After
// embedding_backward_wte_kernel, on the same stream.
template <int V>
__global__ void __launch_bounds__(kBlock)
    embedding_backward_long_runs_kernel(float* dwte, const float* run_sums, const uint32_t* keys, int64_t n, int C,
                                        uint32_t padded, int piece_rows) {
  for_each_position_and_columns<V>(n, C, [&](int64_t first, int c) {
    const uint32_t token = keys[first];
    if (token >= padded || (first > 0 && keys[first - 1] == token)) return;    // padding, or not a run's first row
    if (first + piece_rows >= n || keys[first + piece_rows] != token) return;  // one piece: already in dwte
    if (c >= C) return;
    float* const e = dwte + int64_t{token} * C + c;
    Pack<float, V> acc = load_pack<V>(e);
    for (int64_t at = first + piece_rows; at < n && keys[at] == token; at += piece_rows) {
      const Pack<float, V> part = load_pack<V>(run_sums + at / piece_rows * C + c);
#pragma unroll
      for (int j = 0; j < V; ++j) acc.v[j] += part.v[j];
    }
    detail::store_pack<V>(e, acc);
  });
}

// One thread per (position p, V columns): threads of a block cover consecutive columns of one position (coalesced
// for each row), blockIdx.y walks positions. Each element is summed by exactly one thread, over the rows holding
// position p in (b, t) order from its current value — the CPU reference's order, so fp32 results are bitwise equal to
// it. A row holds p at t = p alone, or, packed, at every t >= p whose positions[b, t] is p (one per sequence longer
// than p): a warp reads the row's positions from p on 32 at a time, a lane each, and adds the rows whose lanes found
// p in t's order (__ballot_sync's bits), so the longest walk, p = 0's over the batch, is B x S / 32 steps, not B x S.
// Every lane of a warp with a column takes part in the ballots, its lanes past C included.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    embedding_backward_wpe_kernel(float* dwpe, const T* dout, const int32_t* lengths, const int32_t* positions, int B,
                                  int S, int C) {
  const int lane = threadIdx.x % 32;
  const int first_of_warp = (blockIdx.x * blockDim.x + threadIdx.x - lane) * V;
  if (first_of_warp >= C) return;  // the whole warp: no column
  const int c = first_of_warp + lane * V;
  const bool has_columns = c < C;
  for (int p = blockIdx.y; p < S; p += gridDim.y) {
    Pack<float, V> acc{};
    if (has_columns) acc = load_pack<V>(dwpe + int64_t{p} * C + c);
    const auto add_row = [&](int64_t row) {
      if (!has_columns) return;
      const Pack<T, V> dv = load_pack<V>(dout + row * C + c);
#pragma unroll
      for (int k = 0; k < V; ++k) acc.v[k] += to_float(dv.v[k]);
    };
    for (int b = 0; b < B; ++b) {
      const int len = length_of(lengths, b, S);
      const int64_t row0 = int64_t{b} * S;
      if (!positions) {
        if (p < len) add_row(row0 + p);
        continue;
      }
      for (int t0 = p; t0 < len; t0 += 32) {
        const int t = t0 + lane;
        for (unsigned holding = __ballot_sync(detail::kFullMask, t < len && positions[row0 + t] == p); holding != 0;
             holding &= holding - 1)
          add_row(row0 + t0 + __ffs(static_cast<int>(holding)) - 1);
      }
    }
    if (has_columns) detail::store_pack<V>(dwpe + int64_t{p} * C + c, acc);
  }
}

template <typename T>
constexpr int kVec = 16 / sizeof(T);  // elements of T per 16-byte access

}  // namespace ddplab::cuda::embedding
