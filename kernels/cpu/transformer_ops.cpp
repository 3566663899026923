#include "kernels/cpu/transformer_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/cpu/softmax_row.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/layernorm.h"
#include "kernels/mean_pool.h"

namespace ddplab::cpu {
namespace {

// Valid length of sequence b; null lengths means unpadded.
inline int length_of(const int32_t* lengths, int b, int S) { return lengths ? std::clamp(lengths[b], 0, S) : S; }

template <typename T>
void zero(T* p, int64_t n) {
  if (n > 0) std::memset(p, 0, sizeof(T) * n);
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const int32_t* lengths, const T* wte, const T* wpe, int B, int S,
                       int C, const int32_t* positions) {
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    for (int t = 0; t < L; ++t) {
      const int64_t row = static_cast<int64_t>(b) * S + t;
      T* o = out + row * C;
      const T* e = wte + static_cast<int64_t>(tokens[row]) * C;
      if (wpe) {
        const T* p = wpe + static_cast<int64_t>(positions ? positions[row] : t) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
      } else {
        std::memcpy(o, e, sizeof(T) * C);
      }
    }
    zero(out + (static_cast<int64_t>(b) * S + L) * C, static_cast<int64_t>(S - L) * C);
  }
}

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, const int32_t* lengths, int B, int S,
                        int C, const int32_t* positions) {
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    for (int t = 0; t < L; ++t) {
      const int64_t row = static_cast<int64_t>(b) * S + t;
      const T* d = dout + row * C;
      T* e = dwte + static_cast<int64_t>(tokens[row]) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) e[c] += d[c];
      if (dwpe) {
        T* p = dwpe + static_cast<int64_t>(positions ? positions[row] : t) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) p[c] += d[c];
      }
    }
  }
}

void embedding_backward_wte_in_pieces(float* dwte, const float* dout, const int32_t* tokens, const int32_t* lengths,
                                      int B, int S, int C, int piece_rows) {
  std::map<int32_t, std::vector<int64_t>> rows_of;  // each token's valid rows, in row order
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < length_of(lengths, b, S); ++t)
      rows_of[tokens[int64_t{b} * S + t]].push_back(int64_t{b} * S + t);
  std::vector<float> piece(C);
  for (const auto& [token, rows] : rows_of) {
    float* e = dwte + int64_t{token} * C;
    for (size_t first = 0; first < rows.size(); first += piece_rows) {
      float* sum = first == 0 ? e : piece.data();
      if (first > 0) std::fill(piece.begin(), piece.end(), 0.0f);
      for (size_t k = first; k < std::min(rows.size(), first + piece_rows); ++k)
        for (int c = 0; c < C; ++c) sum[c] += dout[rows[k] * C + c];
      if (first > 0)
        for (int c = 0; c < C; ++c) e[c] += piece[c];
    }
  }
}

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<int64_t>(n) * C;
    T* o = out + static_cast<int64_t>(n) * C;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; ++c) sum += x[c];
    const T m = sum / C;
    T var = 0;  // two passes: no cancellation when |mean| >> std
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    const T s = T(1) / std::sqrt(var / C + T(kLayerNormEps));
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

// With xhat = (x - mean) rstd and g = weight * dout (llm.c's formulation):
//   dx = rstd (g - mean(g) - xhat mean(g xhat))
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                        const T* rstd, int N, int C, bool accumulate) {
  if (!accumulate) {  // 2C elements, nothing next to the rows' pass; the same sums as a zeroed buffer, bit for bit
    std::fill(dweight, dweight + C, T(0));
    std::fill(dbias, dbias + C, T(0));
  }
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<int64_t>(n) * C;
    const T* d = dout + static_cast<int64_t>(n) * C;
    T* dx = dinp + static_cast<int64_t>(n) * C;
    const T m = mean[n], s = rstd[n];
    T g_mean = 0, g_xhat_mean = 0;
#pragma omp simd reduction(+ : g_mean, g_xhat_mean)
    for (int c = 0; c < C; ++c) {
      const T g = weight[c] * d[c];
      g_mean += g;
      g_xhat_mean += g * (x[c] - m) * s;
    }
    g_mean /= C;
    g_xhat_mean /= C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const T xhat = (x[c] - m) * s;
      dbias[c] += d[c];
      dweight[c] += xhat * d[c];
      dx[c] += s * (weight[c] * d[c] - g_mean - xhat * g_xhat_mean);
    }
  }
}

// ---- Attention for small heads --------------------------------------------------------------------------------
// hs is small (12 in the tiny preset): as GEMMs, Q Kᵀ and P V are K = 12 or N = 12, where OpenBLAS spends its time
// packing and in edge kernels. Instead, per (sequence, head): pack K, V (and Q) once into cache-resident buffers,
// then walk blocks of kMR queries. Each block's scores are an outer-product register tile (kMR rows x 2 vectors of
// keys, reduction over hs), softmax runs on that L1-resident row block, and P V is a second register tile (3 rows x
// 3 vectors holding the head columns of two keys, reduction over key pairs: tile_pair_rows). Causal blocks stop at
// their last query's key, so the upper triangle costs nothing beyond the diagonal tiles. The backward is the same
// two tiles (dP = dO Vᵀ, dQ = dZ K) per query block, then dK = dZᵀ Q and dV = Pᵀ dO per block of 2W keys.
//
// The tiles use GCC/Clang vector extensions (256-bit: 8 floats or 4 doubles); with -march=x86-64-v3 each
// accumulator is one ymm register and the inner loops are one broadcast and a few FMAs per row.

namespace {

// sum_j a[j] b[j] over j < n, in four vector accumulators: one accumulator (what `omp simd reduction` gives) is a
// chain of dependent FMAs, 4 cycles per vector.
template <typename T>
T dot(const T* a, const T* b, int n) {
  using V = typename Simd<T>::V;
  constexpr int W = Simd<T>::W;
  V acc[4] = {};
  int j = 0;
  for (; j + 4 * W <= n; j += 4 * W) {
    for (int u = 0; u < 4; ++u) acc[u] += vload(a + j + u * W) * vload(b + j + u * W);
  }
  for (; j + W <= n; j += W) acc[0] += vload(a + j) * vload(b + j);
  const V v = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  T sum = 0;
  for (int i = 0; i < W; ++i) sum += v[i];
  for (; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

constexpr int kMR = 6;  // rows per register tile: kMR x 2 accumulators + 2 loads + 1 broadcast <= 16 registers

inline int round_up(int n, int m) { return (n + m - 1) / m * m; }

// Calls f(s0, n) for every sequence [s0, s0 + n) among the L valid positions of a row: [0, L) without positions,
// otherwise a new sequence at every position 0 (a packed row).
template <typename F>
void for_each_sequence(const int32_t* row_positions, int L, F f) {
  int s0 = 0;
  for (int t = 1; t <= L; ++t) {
    if (t == L || (row_positions && row_positions[t] == 0)) {
      f(s0, t - s0);
      s0 = t;
    }
  }
}

// Per-thread scratch that only grows (forward and backward of one head at a time).
template <typename T>
T* scratch_buffer(int which, int64_t n) {
  thread_local std::vector<T> buf[6];
  if (static_cast<int64_t>(buf[which].size()) < n) buf[which].resize(n);
  return buf[which].data();
}

// Transposed, panelled copy of rows [0, L) x columns [0, k) of src (row stride ld): panel p holds keys
// [p*2W, (p+1)*2W) as k rows of 2W contiguous values (zero beyond L), so a score tile streams one panel.
template <typename T>
void pack_panels(T* dst, const T* src, int64_t ld, int L, int k) {
  constexpr int NR = 2 * Simd<T>::W;
  for (int j0 = 0; j0 < L; j0 += NR) {
    T* panel = dst + static_cast<int64_t>(j0) * k;
    const int n = std::min(NR, L - j0);
    for (int i = 0; i < k; ++i) {
      for (int jj = 0; jj < n; ++jj) panel[i * NR + jj] = src[(j0 + jj) * ld + i];
      for (int jj = n; jj < NR; ++jj) panel[i * NR + jj] = T(0);
    }
  }
}

// Rows [0, L) x columns [0, k) of src (row stride ld) into dst [rows][kp], scaled; zero beyond k and for rows
// [L, rows).
template <typename T>
void pack_rows(T* dst, int kp, const T* src, int64_t ld, int L, int rows, int k, T scale) {
  for (int t = 0; t < rows; ++t) {
    T* d = dst + static_cast<int64_t>(t) * kp;
    const T* x = src + t * ld;
    const int n = t < L ? k : 0;
    for (int i = 0; i < n; ++i) d[i] = x[i] * scale;
    for (int i = n; i < kp; ++i) d[i] = T(0);
  }
}

// s[r, j] = sum_i a[r, i] bt[i, j] for r < kMR and j < ncols rounded up to 2W (a: kMR rows of stride lda;
// bt: panels from pack_panels with k rows; s: row stride lds, at least ncols rounded up).
// att does not fit in cache at the lengths that matter (B 16, S 256: 16 MB), and its rows are a new miss at every
// query block: with pf set, each panel also prefetches the lines of columns [j, j + 2W) of rows pf[0, pf_rows)
// (row stride ldp), which the caller reads or writes after the tile, so the misses overlap the FMAs.
template <typename T>
void tile_scores(T* s, int lds, const T* a, int lda, const T* bt, int k, int ncols, const T* pf = nullptr,
                 int64_t ldp = 0, int pf_rows = 0) {
  using V = typename Simd<T>::V;
  constexpr int W = Simd<T>::W, NR = 2 * W;
  for (int j = 0; j < ncols; j += NR) {
    for (int r = 0; r < pf_rows; ++r) __builtin_prefetch(pf + r * ldp + j, 1);
    const T* panel = bt + static_cast<int64_t>(j) * k;
    V acc[kMR][2] = {};
    for (int i = 0; i < k; ++i) {
      const V b0 = vload(panel + i * NR), b1 = vload(panel + i * NR + W);
      for (int r = 0; r < kMR; ++r) {
        const T x = a[r * lda + i];
        acc[r][0] += x * b0;
        acc[r][1] += x * b1;
      }
    }
    for (int r = 0; r < kMR; ++r) {
      vstore(s + r * lds + j, acc[r][0]);
      vstore(s + r * lds + j + W, acc[r][1]);
    }
  }
}

// Keys in pairs for tile_pair_rows: row m of dst interleaves keys 2m and 2m+1 of src (rows [0, L) x columns [0, k),
// row stride ld): lane 2c + e holds src[2m + e, c]; zero for c >= k and for a key >= L; kq lanes per row.
template <typename T>
void pack_pairs(T* dst, int kq, const T* src, int64_t ld, int L, int k) {
  for (int m = 0; m < (L + 1) / 2; ++m) {
    T* d = dst + static_cast<int64_t>(m) * kq;
    for (int e = 0; e < 2; ++e) {
      const int j = 2 * m + e;
      for (int c = 0; c < k; ++c) d[2 * c + e] = j < L ? src[j * ld + c] : T(0);
    }
    for (int i = 2 * k; i < kq; ++i) d[i] = T(0);
  }
}

// Lanes of pack_pairs for k columns: 2k rounded up to whole vectors.
template <typename T>
int pair_lanes(int k) {
  return round_up(2 * k, Simd<T>::W);
}

// {w[0], w[1], w[0], w[1], ...}: one pair's weights in the lanes of pack_pairs (one 64-bit broadcast for float).
inline Simd<float>::V pair_weights(const float* w) {
  double d;
  std::memcpy(&d, w, sizeof d);
  return reinterpret_cast<Simd<float>::V>(Simd<double>::V{d, d, d, d});
}
inline Simd<double>::V pair_weights(const double* w) { return Simd<double>::V{w[0], w[1], w[0], w[1]}; }

// out[r, c0 + i] = sum_{j < n} p[r*rs + j] x[j, c0 + i] for r < R, i < NV*W/2 and c0 + i < k: the weighted sum of
// the rows of x, given as key pairs (pack_pairs, kq lanes per pair). Two keys share a vector, so a head of 12 is
// three vectors per key pair where one key per vector would take two vectors (16 lanes) for 12 values; the lanes
// hold (column, key parity) and the two parities are added at the end. Reads p[r*rs + j] for j < n only.
template <typename T, int R, int NV>
void tile_pair_rows(T* out, int64_t ldo, int c0, int k, const T* p, int64_t rs, const T* x, int kq, int n) {
  using V = typename Simd<T>::V;
  constexpr int W = Simd<T>::W;
  V acc[R][NV] = {};
  const auto step = [&](const T* xr, const T* w, int64_t ws) {
    V b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(xr + 2 * c0 + v * W);
    for (int r = 0; r < R; ++r) {
      const V wr = pair_weights(w + r * ws);
      for (int v = 0; v < NV; ++v) acc[r][v] += wr * b[v];
    }
  };
  for (int m = 0; m < n / 2; ++m) step(x + static_cast<int64_t>(m) * kq, p + 2 * m, rs);
  if (n % 2) {  // the last key alone: its partner's weight is 0
    T w[R][2];
    for (int r = 0; r < R; ++r) w[r][0] = p[r * rs + n - 1], w[r][1] = T(0);
    step(x + static_cast<int64_t>(n / 2) * kq, w[0], 2);
  }
  const int ni = std::min(NV * W / 2, k - c0);
  for (int r = 0; r < R; ++r) {
    T tmp[NV * W];
    for (int v = 0; v < NV; ++v) vstore(tmp + v * W, acc[r][v]);
    for (int i = 0; i < ni; ++i) out[r * ldo + c0 + i] = tmp[2 * i] + tmp[2 * i + 1];
  }
}

// tile_pair_rows over rows [0, rows) and all k columns, in tiles of up to 3 rows x 3 vectors (9 accumulators,
// 3 loads and the weights in 16 registers).
template <typename T>
void weighted_rows(int rows, T* out, int64_t ldo, int k, const T* p, int64_t rs, const T* x, int n) {
  using Tile = void (*)(T*, int64_t, int, int, const T*, int64_t, const T*, int, int);
  static constexpr Tile kTiles[3][3] = {{tile_pair_rows<T, 1, 1>, tile_pair_rows<T, 1, 2>, tile_pair_rows<T, 1, 3>},
                                        {tile_pair_rows<T, 2, 1>, tile_pair_rows<T, 2, 2>, tile_pair_rows<T, 2, 3>},
                                        {tile_pair_rows<T, 3, 1>, tile_pair_rows<T, 3, 2>, tile_pair_rows<T, 3, 3>}};
  constexpr int W = Simd<T>::W;
  const int kq = pair_lanes<T>(k);
  for (int r0 = 0; r0 < rows; r0 += 3) {
    const int nr = std::min(3, rows - r0);
    for (int c0 = 0; 2 * c0 < kq; c0 += 3 * W / 2) {
      const int nv = std::min(3, (kq - 2 * c0) / W);
      kTiles[nr - 1][nv - 1](out + r0 * ldo, ldo, c0, k, p + r0 * rs, rs, x, kq, n);
    }
  }
}

// out[j0 + jj, i] = sum_{t in [t0, t1)} a[t, i] bm[t, j0 + jj] for i < k, jj < nj <= 2W: a weighted sum over
// queries t for 2W keys at once, as kMR x 2-vector tiles with rows = head dimensions (dK = dZᵀ Q, dV = Pᵀ dO).
// Vectorised over keys, so a head of 12 is exactly two tiles. a: row stride lda, zero-padded to a multiple of
// kMR columns; bm: row stride ldb, pointing at column j0, 2W readable values in every row of [t0, t1).
template <typename T>
void tile_key_sums(T* out, int64_t ldo, int k, const T* a, int lda, const T* bm, int64_t ldb, int j0, int nj, int t0,
                   int t1) {
  using V = typename Simd<T>::V;
  constexpr int W = Simd<T>::W, NR = 2 * W;
  for (int i0 = 0; i0 < k; i0 += kMR) {
    V acc[kMR][2] = {};
    for (int t = t0; t < t1; ++t) {
      const T* brow = bm + t * ldb;
      const V b0 = vload(brow), b1 = vload(brow + W);
      const T* arow = a + static_cast<int64_t>(t) * lda + i0;
      for (int r = 0; r < kMR; ++r) {
        acc[r][0] += arow[r] * b0;
        acc[r][1] += arow[r] * b1;
      }
    }
    const int ni = std::min(kMR, k - i0);
    T tmp[kMR][NR];
    for (int r = 0; r < kMR; ++r) {
      vstore(tmp[r], acc[r][0]);
      vstore(tmp[r] + W, acc[r][1]);
    }
    for (int jj = 0; jj < nj; ++jj) {
      for (int r = 0; r < ni; ++r) out[(j0 + jj) * ldo + i0 + r] = tmp[r][jj];
    }
  }
}

}  // namespace

// Forward per (row, head, sequence), blocks of kMR queries: scores tile -> softmax per row (scale folded into the
// packed Q; max, then exp and sum in one pass, then normalise into att) -> P V tile reading the att rows just
// written. Only valid queries and keys are computed; causal blocks stop at their last query. The sequences of a
// packed row are independent problems on the diagonal blocks of the row's att, which is zero elsewhere.
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, const int32_t* lengths, int B, int S, int C, int NH, bool causal,
                       const int32_t* positions) {
  constexpr int NR = 2 * Simd<T>::W;
  const int hs = C / NH, C3 = 3 * C, kq = pair_lanes<T>(hs);
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int Sp = round_up(S, NR), Sq = round_up(S, kMR);
  T* qs = scratch_buffer<T>(0, static_cast<int64_t>(Sq) * hs);     // scaled Q, kMR-padded rows
  T* kt = scratch_buffer<T>(1, static_cast<int64_t>(Sp) * hs);     // K in panels
  T* vp = scratch_buffer<T>(2, static_cast<int64_t>(S + 1) / 2 * kq);  // V in key pairs
  T* sc = scratch_buffer<T>(3, static_cast<int64_t>(kMR) * Sp);    // one block's scores
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    const T* qkv_b = qkv + static_cast<int64_t>(b) * S * C3;
    T* out_b = out + static_cast<int64_t>(b) * S * C;
    const int32_t* pos_b = positions ? positions + static_cast<int64_t>(b) * S : nullptr;
    for (int h = 0; h < NH; ++h) {
      T* att_bh = att + (static_cast<int64_t>(b) * NH + h) * S * S;
      for_each_sequence(pos_b, L, [&](int s0, int len) {
        T* a = att_bh + static_cast<int64_t>(s0) * S + s0;  // the sequence's diagonal block (row stride S)
        const T* q = qkv_b + static_cast<int64_t>(s0) * C3 + h * hs;
        pack_rows(qs, hs, q, C3, len, round_up(len, kMR), hs, scale);
        pack_panels(kt, q + C, C3, len, hs);
        pack_pairs(vp, kq, q + 2 * C, C3, len, hs);
        for (int t0 = 0; t0 < len; t0 += kMR) {
          const int rows = std::min(kMR, len - t0);
          const int nmax = causal ? t0 + rows : len;  // keys [0, nmax) cover every row of the block
          tile_scores(sc, Sp, qs + static_cast<int64_t>(t0) * hs, hs, kt, hs, nmax, a + static_cast<int64_t>(t0) * S, S,
                      rows);
          for (int r = 0; r < rows; ++r) {
            const int t = t0 + r, n = causal ? t + 1 : len;  // keys [0, n) are valid
            T* s = sc + r * Sp;
            T* row = a + static_cast<int64_t>(t) * S;
            T zmax = s[0];
#pragma omp simd reduction(max : zmax)
            for (int j = 0; j < n; ++j) zmax = s[j] > zmax ? s[j] : zmax;
            const T sum = exp_shifted(s, s, n, zmax);
            const T inv = T(1) / sum;  // sum >= 1: the max term is exp(0)
#pragma omp simd
            for (int j = 0; j < n; ++j) row[j] = s[j] * inv;
            zero(row - s0, s0);  // earlier sequences of the row
            zero(row + n, S - s0 - n);
          }
          weighted_rows(rows, out_b + static_cast<int64_t>(s0 + t0) * C + h * hs, C, hs,
                        a + static_cast<int64_t>(t0) * S, S, vp, nmax);
        }
      });
      zero(att_bh + static_cast<int64_t>(L) * S, static_cast<int64_t>(S - L) * S);
    }
    zero(out_b + static_cast<int64_t>(L) * C, static_cast<int64_t>(S - L) * C);
  }
}

// With P = att, dO = dout of one head:  dV = Pᵀ dO,  dP = dO Vᵀ,  dZ = P * (dP - rowsum(P * dP)) / sqrt(hs),
// dQ = dZ K,  dK = dZᵀ Q. Masked entries of P are 0, so their dZ is 0 without a separate mask.
// Per (row, head, sequence): pass 1, blocks of kMR queries: dP tile, then dZ per row into a per-thread buffer (rows
// padded to whole vectors), then the dQ tile. Pass 2, blocks of 2W keys: dK and dV as key-vectorised tiles over the
// queries that see them (t >= the block's first key when causal; the zeros above the diagonal come from dZ and att).
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, const int32_t* lengths, int B,
                        int S, int C, int NH, bool causal, const int32_t* positions) {
  constexpr int NR = 2 * Simd<T>::W;
  const int hs = C / NH, C3 = 3 * C, kq = pair_lanes<T>(hs);
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int Sp = round_up(S, NR), Sq = round_up(S, kMR);
  const int hs6 = round_up(hs, kMR), ldz = Sp;
  T* dop = scratch_buffer<T>(0, static_cast<int64_t>(Sq) * hs6);  // dO rows, kMR-padded rows and columns
  T* vt = scratch_buffer<T>(1, static_cast<int64_t>(Sp) * hs);    // V in panels
  T* kp = scratch_buffer<T>(2, std::max<int64_t>((S + 1) / 2 * kq, S * hs6));  // K in key pairs, then Q rows
  T* sc = scratch_buffer<T>(3, static_cast<int64_t>(kMR) * Sp);   // one block's dP
  T* dzb = scratch_buffer<T>(4, static_cast<int64_t>(S) * ldz);   // dZ, rows padded to whole vectors
  T* ptail = scratch_buffer<T>(5, static_cast<int64_t>(S) * NR);  // att's last key columns when S % 2W != 0
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    const T* qkv_b = qkv + static_cast<int64_t>(b) * S * C3;
    const T* dout_b = dout + static_cast<int64_t>(b) * S * C;
    T* dqkv_b = dqkv + static_cast<int64_t>(b) * S * C3;
    const int32_t* pos_b = positions ? positions + static_cast<int64_t>(b) * S : nullptr;
    zero(dqkv_b + static_cast<int64_t>(L) * C3, static_cast<int64_t>(S - L) * C3);
    for (int h = 0; h < NH; ++h) {
      const T* att_bh = att + (static_cast<int64_t>(b) * NH + h) * S * S;
      for_each_sequence(pos_b, L, [&](int s0, int len) {
        const T* a = att_bh + static_cast<int64_t>(s0) * S + s0;  // the sequence's diagonal block (row stride S)
        const T* q = qkv_b + static_cast<int64_t>(s0) * C3 + h * hs;
        T* dq = dqkv_b + static_cast<int64_t>(s0) * C3 + h * hs;
        pack_rows(dop, hs6, dout_b + static_cast<int64_t>(s0) * C + h * hs, C, len, round_up(len, kMR), hs, T(1));
        pack_panels(vt, q + 2 * C, C3, len, hs);
        pack_pairs(kp, kq, q + C, C3, len, hs);
        for (int t0 = 0; t0 < len; t0 += kMR) {
          const int rows = std::min(kMR, len - t0);
          const int nmax = causal ? t0 + rows : len;
          tile_scores(sc, Sp, dop + static_cast<int64_t>(t0) * hs6, hs6, vt, hs, nmax, a + static_cast<int64_t>(t0) * S,
                      S, rows);  // dP
          for (int r = 0; r < rows; ++r) {
            const int t = t0 + r, n = causal ? t + 1 : len;
            const T* p = a + static_cast<int64_t>(t) * S;
            const T* d = sc + r * Sp;
            T* dz = dzb + static_cast<int64_t>(t) * ldz;
            const T pd = dot(p, d, n);
#pragma omp simd
            for (int j = 0; j < n; ++j) dz[j] = scale * p[j] * (d[j] - pd);
            // Zeros up to the block's last key (the dQ tile) and to the end of the vector (the dK tiles).
            zero(dz + n, std::max(nmax, round_up(n, NR)) - n);
          }
          weighted_rows(rows, dq + static_cast<int64_t>(t0) * C3, C3, hs, dzb + static_cast<int64_t>(t0) * ldz, ldz,
                        kp, nmax);  // dQ
        }
        pack_rows(kp, hs6, q, C3, len, len, hs, T(1));  // Q
        for (int j0 = 0; j0 < len; j0 += NR) {
          const int nj = std::min(NR, len - j0), first = causal ? j0 : 0;
          tile_key_sums(dq + C, C3, hs, kp, hs6, dzb + j0, ldz, j0, nj, first, len);  // dK
          if (s0 + j0 + NR <= S) {  // att columns beyond the sequence are 0 in its rows, and inside att
            tile_key_sums(dq + 2 * C, C3, hs, dop, hs6, a + j0, S, j0, nj, first, len);  // dV
          } else {  // the last columns of att rows: copy, so the vector loads stay inside att
            for (int t = first; t < len; ++t) {
              for (int jj = 0; jj < NR; ++jj)
                ptail[t * NR + jj] = jj < nj ? a[static_cast<int64_t>(t) * S + j0 + jj] : T(0);
            }
            tile_key_sums(dq + 2 * C, C3, hs, dop, hs6, ptail, NR, j0, nj, first, len);
          }
        }
      });
    }
  }
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void mean_pool_forward(T* out, const T* inp, const int32_t* lengths, int B, int S, int C) {
  std::vector<T> part(static_cast<size_t>(C));
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    T* o = out + static_cast<int64_t>(b) * C;
    zero(o, C);
    for (int p = 0; p < mean_pool::kParts; ++p) {  // in the GPU's order (kernels/mean_pool.h)
      zero(part.data(), C);
      for (int t = mean_pool::part_begin(L, p); t < mean_pool::part_begin(L, p + 1); ++t) {
        const T* x = inp + (static_cast<int64_t>(b) * S + t) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) part[c] += x[c];
      }
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] += part[c];
    }
    const T inv = L > 0 ? T(1) / T(L) : T(0);
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] *= inv;
  }
}

template <typename T>
void mean_pool_backward(T* dinp, const T* dout, const int32_t* lengths, int B, int S, int C) {
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    const T* d = dout + static_cast<int64_t>(b) * C;
    const T inv = L > 0 ? T(1) / T(L) : T(0);
    for (int t = 0; t < L; ++t) {
      T* dx = dinp + (static_cast<int64_t>(b) * S + t) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) dx[c] = d[c] * inv;
    }
    zero(dinp + (static_cast<int64_t>(b) * S + L) * C, static_cast<int64_t>(S - L) * C);
  }
}

void next_token_targets(int32_t* targets, const int32_t* tokens, const int32_t* lengths, int B, int S,
                        const int32_t* positions) {
  for (int b = 0; b < B; ++b) {
    const int64_t row = static_cast<int64_t>(b) * S;
    const int L = length_of(lengths, b, S);
    for (int t = 0; t < S; ++t) {
      const bool has_next = t + 1 < L && !(positions && positions[row + t + 1] == 0);
      targets[row + t] = has_next ? tokens[row + t + 1] : -1;
    }
  }
}

#define DDPLAB_INSTANTIATE(T)                                                                                         \
  template void embedding_forward<T>(T*, const int32_t*, const int32_t*, const T*, const T*, int, int, int,           \
                                     const int32_t*);                                                                 \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, const int32_t*, int, int, int,                \
                                      const int32_t*);                                                                \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int);                             \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int, int, bool);  \
  template void attention_forward<T>(T*, T*, const T*, const int32_t*, int, int, int, int, bool, const int32_t*);     \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const int32_t*, int, int, int, int, bool, \
                                      const int32_t*);                                                                \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);                                                 \
  template void mean_pool_forward<T>(T*, const T*, const int32_t*, int, int, int);                                    \
  template void mean_pool_backward<T>(T*, const T*, const int32_t*, int, int, int);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(double)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cpu
