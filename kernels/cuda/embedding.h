// Token + position embedding on the device: the CUDA twin of cpu::embedding_forward / embedding_backward
// (kernels/cpu/transformer_ops.h), same padding rule: rows t >= lengths[b] are 0 and their tokens are never read
// (lengths null: every sequence is S long), and the same packed rows: positions (int32 [B, S] in device memory, or
// null: position t) gives each valid token's position within its own sequence, as the CPU's. Tokens of valid rows must
// lie in [0, V) of wte [V, C]; wpe is [>= S, C].
//
// Precision: out and dout are T = float or __nv_bfloat16; the tables and their gradients are fp32.
// Asynchronous; bad sizes throw std::invalid_argument, a failed launch std::runtime_error. B*S == 0 launches nothing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[p,:] for t < len[b], p = positions[b,t] or t (no wpe term when wpe is null);
// 0 for padded t.
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const int32_t* lengths, const int32_t* positions,
                       const float* wte, const float* wpe, int B, int S, int C, cudaStream_t stream);

// The batch's valid rows grouped by token, each token's rows in row order: a stable radix sort of the tokens (CUB's),
// padded rows keyed `vocab` and sorted last. What makes dwte deterministic: embedding_backward sums each token's rows
// in this order, without atomics. Points into the workspace it was made in.
struct RowsByToken {
  const uint32_t* tokens = nullptr;  // [rows] ascending; padded rows hold vocab
  const int32_t* rows = nullptr;     // [rows] the (b * S + t) row each came from
  float* run_sums = nullptr;         // [ceil(rows / kEmbeddingPieceRows), width]: embedding_backward's long runs' sums
  int64_t count = 0;                 // B * S
  int vocab = 0, width = 0;          // width: C, the embedding's
};

// embedding_backward sums each token's run of sorted rows in pieces of this many rows, a warp each: a common token's
// run is then not one warp's serial walk. A run of up to this many rows is summed in the CPU's order.
inline constexpr int kEmbeddingPieceRows = 64;

// Device bytes sort_rows_by_token needs for up to max_rows rows (B * S) of a vocab-token table of `width` columns:
// the keys and rows before and after the sort, the long runs' sums, and CUB's temporary storage.
size_t rows_by_token_workspace_bytes(int64_t max_rows, int vocab, int width);

// Enqueues the sort of tokens [B, S] (valid rows' tokens in [0, vocab), padding as embedding_forward's) on stream, into
// workspace (256-byte aligned, at least rows_by_token_workspace_bytes(B * S, vocab, width): std::invalid_argument where
// it cannot hold the arrays, std::runtime_error from CUB where not its storage). The result is valid once the stream
// reaches it, until the workspace is written again. Host work per call: launches only, no size query.
RowsByToken sort_rows_by_token(void* workspace, size_t workspace_bytes, const int32_t* tokens, const int32_t* lengths,
                               int B, int S, int vocab, int width, cudaStream_t stream);

// dwte[token,:] += dout[b,t,:] over rows_by_token's rows, and dwpe[p,:] += dout[b,t,:] for t < len[b], p =
// positions[b,t] or t (dwpe may be null); ACCUMULATES. Both deterministic. dwpe: one thread per (p, c) over the rows in
// (b, t) order, bitwise the CPU's for fp32 dout (packed, each thread walks the rows' positions from p on). dwte: each
// token's run of rows in pieces of kEmbeddingPieceRows, a warp each adding its piece's rows in row order, the first
// piece onto dwte, later ones from zero and then onto dwte in run order (cpu::embedding_backward_wte_in_pieces):
// bitwise the CPU's for fp32 dout where no token has more rows than a piece. rows_by_token must be this batch's (B * S
// rows of a table of its vocab rows and C columns).
template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const RowsByToken& rows_by_token,
                        const int32_t* lengths, const int32_t* positions, int B, int S, int C, cudaStream_t stream);

}  // namespace ddplab::cuda
