// The embedding launchers (kernels: embedding_kernels.cuh; contracts: embedding.h).
#include <algorithm>
#include <climits>
#include <cub/device/device_radix_sort.cuh>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

using embedding::embedding_backward_long_runs_kernel;
using embedding::embedding_backward_wpe_kernel;
using embedding::embedding_backward_wte_kernel;
using embedding::embedding_forward_kernel;
using embedding::kBlock;
using embedding::kVec;
using embedding::kWarps;
using embedding::token_keys_kernel;

void check_sizes(const char* what, int B, int S, int C) {
  if (B < 0 || S < 0 || C <= 0)
    throw std::invalid_argument(std::string(what) + ": need B >= 0, S >= 0 and C > 0, got B=" + std::to_string(B) +
                                " S=" + std::to_string(S) + " C=" + std::to_string(C));
}

// The sort's keys hold a token or the padding's key, vocab: the radix sort looks at only the bits that can be set.
int key_bits(int vocab) {
  int bits = 1;
  while ((int64_t{1} << bits) <= vocab) ++bits;
  return bits;
}

constexpr size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bytes of each of the workspace's four arrays for `rows` rows: keys and rows, twice each (CUB's double buffer: the
// sort ends in one of the two). The long runs' sums follow them, then CUB's temporary storage.
size_t array_bytes(int64_t rows) { return aligned(static_cast<size_t>(rows) * sizeof(uint32_t)); }
// A later piece of a run starts at most once in any kEmbeddingPieceRows sorted positions: a row of sums for each.
size_t run_sums_bytes(int64_t rows, int width) {
  return aligned(static_cast<size_t>((rows + kEmbeddingPieceRows - 1) / kEmbeddingPieceRows) * width * sizeof(float));
}

void check_rows_and_vocab(const char* what, int64_t rows, int vocab) {
  if (rows < 0 || rows > INT_MAX || vocab <= 0 || vocab == INT_MAX)
    throw std::invalid_argument(std::string(what) + ": need 0 <= rows <= INT_MAX and 0 < vocab < INT_MAX, got rows=" +
                                std::to_string(rows) + " vocab=" + std::to_string(vocab));
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const int32_t* lengths, const int32_t* positions,
                       const float* wte, const float* wpe, int B, int S, int C, cudaStream_t stream) {
  check_sizes("embedding_forward", B, S, C);
  const int64_t rows = int64_t{B} * S;
  if (rows == 0) return;
  const unsigned grid = detail::grid_size(rows, kWarps);
  constexpr int V = kVec<T>;
  if (C % V == 0 && detail::all_aligned(16, out) && detail::all_aligned(V * 4, wte, wpe))
    embedding_forward_kernel<T, V><<<grid, kBlock, 0, stream>>>(out, tokens, lengths, positions, wte, wpe, B, S, C);
  else
    embedding_forward_kernel<T, 1><<<grid, kBlock, 0, stream>>>(out, tokens, lengths, positions, wte, wpe, B, S, C);
  cudaCheck(cudaGetLastError());
}

size_t rows_by_token_workspace_bytes(int64_t max_rows, int vocab, int width) {
  check_rows_and_vocab("rows_by_token_workspace_bytes", max_rows, vocab);
  check_sizes("rows_by_token_workspace_bytes", 0, 0, width);
  size_t temporary = 0;  // CUB's, asked of it once here rather than at every sort
  cub::DoubleBuffer<uint32_t> keys;
  cub::DoubleBuffer<int32_t> values;
  cudaCheck(cub::DeviceRadixSort::SortPairs(nullptr, temporary, keys, values, static_cast<int>(max_rows), 0,
                                            key_bits(vocab)));
  return 4 * array_bytes(max_rows) + run_sums_bytes(max_rows, width) + aligned(temporary);
}

RowsByToken sort_rows_by_token(void* workspace, size_t workspace_bytes, const int32_t* tokens, const int32_t* lengths,
                               int B, int S, int vocab, int width, cudaStream_t stream) {
  check_sizes("sort_rows_by_token", B, S, width);
  const int64_t n = int64_t{B} * S;
  check_rows_and_vocab("sort_rows_by_token", n, vocab);
  RowsByToken sorted;
  sorted.count = n;
  sorted.vocab = vocab;
  sorted.width = width;
  if (n == 0) return sorted;
  const size_t array = array_bytes(n), sums = run_sums_bytes(n, width);
  if (workspace_bytes < 4 * array + sums || !detail::all_aligned(256, workspace))
    throw std::invalid_argument(
        "sort_rows_by_token: the workspace must be 256-byte aligned and hold " + std::to_string(4 * array + sums) +
        " bytes of arrays for " + std::to_string(n) + " rows of width " + std::to_string(width) +
        " and CUB's storage (rows_by_token_workspace_bytes), got " + std::to_string(workspace_bytes));
  char* at = static_cast<char*>(workspace);
  const auto take = [&at, array]() {
    void* p = at;
    at += array;
    return p;
  };
  cub::DoubleBuffer<uint32_t> keys(static_cast<uint32_t*>(take()), static_cast<uint32_t*>(take()));
  cub::DoubleBuffer<int32_t> rows(static_cast<int32_t*>(take()), static_cast<int32_t*>(take()));
  sorted.run_sums = reinterpret_cast<float*>(at);
  at += sums;
  token_keys_kernel<<<detail::grid_size(n), kBlock, 0, stream>>>(keys.Current(), rows.Current(), tokens, lengths, B, S,
                                                                 static_cast<uint32_t>(vocab));
  cudaCheck(cudaGetLastError());
  // Stable (an LSD radix sort): each token's rows stay in row order, the order the CPU adds them in. CUB is handed
  // the rest of the workspace and checks it holds its storage (cudaErrorInvalidValue where it does not).
  size_t temporary = workspace_bytes - 4 * array - sums;
  cudaCheck(
      cub::DeviceRadixSort::SortPairs(at, temporary, keys, rows, static_cast<int>(n), 0, key_bits(vocab), stream));
  sorted.tokens = keys.Current();
  sorted.rows = rows.Current();
  return sorted;
}

template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const RowsByToken& rows_by_token,
                        const int32_t* lengths, const int32_t* positions, int B, int S, int C, cudaStream_t stream) {
  check_sizes("embedding_backward", B, S, C);
  const int64_t rows = int64_t{B} * S;
  if (rows_by_token.count != rows || (rows > 0 && rows_by_token.width != C))
    throw std::invalid_argument("embedding_backward: rows_by_token holds " + std::to_string(rows_by_token.count) +
                                " rows of width " + std::to_string(rows_by_token.width) + ", the batch " +
                                std::to_string(rows) + " of " + std::to_string(C));
  if (rows == 0) return;
  constexpr int V = kVec<T>;
  const bool vec = C % V == 0 && detail::all_aligned(16, dout) && detail::all_aligned(V * 4, dwte, dwpe);
  const int v = vec ? V : 1;
  const int64_t warps = rows * ((C + 32 * v - 1) / (32 * v));  // a warp per (sorted row, 32 * v columns)
  const unsigned grid = detail::grid_size(warps, kWarps);
  const auto padded = static_cast<uint32_t>(rows_by_token.vocab);
  const RowsByToken& r = rows_by_token;
  const auto pieces_then_long_runs = [&](auto v) {  // v: the pack width, as a std::integral_constant
    embedding_backward_wte_kernel<T, v()>
        <<<grid, kBlock, 0, stream>>>(dwte, r.run_sums, dout, r.tokens, r.rows, rows, C, padded, kEmbeddingPieceRows);
    cudaCheck(cudaGetLastError());
    embedding_backward_long_runs_kernel<v()>
        <<<grid, kBlock, 0, stream>>>(dwte, r.run_sums, r.tokens, rows, C, padded, kEmbeddingPieceRows);
    cudaCheck(cudaGetLastError());
  };
  if (vec)
    pieces_then_long_runs(std::integral_constant<int, V>{});
  else
    pieces_then_long_runs(std::integral_constant<int, 1>{});
  if (dwpe != nullptr) {
    const dim3 wpe_grid(static_cast<unsigned>((C / v + kBlock - 1) / kBlock),
                        static_cast<unsigned>(std::min(S, 65535)));
    if (vec)
      embedding_backward_wpe_kernel<T, V><<<wpe_grid, kBlock, 0, stream>>>(dwpe, dout, lengths, positions, B, S, C);
    else
      embedding_backward_wpe_kernel<T, 1><<<wpe_grid, kBlock, 0, stream>>>(dwpe, dout, lengths, positions, B, S, C);
    cudaCheck(cudaGetLastError());
  }
}

#define DDPLAB_INSTANTIATE(T)                                                                                        \
  template void embedding_forward<T>(T*, const int32_t*, const int32_t*, const int32_t*, const float*, const float*, \
                                     int, int, int, cudaStream_t);                                                   \
  template void embedding_backward<T>(float*, float*, const T*, const RowsByToken&, const int32_t*, const int32_t*,  \
                                      int, int, int, cudaStream_t);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(__nv_bfloat16)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cuda
