#include "kernels/cpu/transformer_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/vector_math.h"

namespace ddplab::cpu {
namespace {

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

constexpr double kLayerNormEps = 1e-5;

// Valid length of sequence b; null lengths means unpadded.
inline int length_of(const int32_t* lengths, int b, int S) { return lengths ? std::clamp(lengths[b], 0, S) : S; }

template <typename T>
void zero(T* p, int64_t n) {
  if (n > 0) std::memset(p, 0, sizeof(T) * n);
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const int32_t* lengths, const T* wte, const T* wpe, int B, int S,
                       int C) {
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    for (int t = 0; t < L; ++t) {
      const int64_t row = static_cast<int64_t>(b) * S + t;
      T* o = out + row * C;
      const T* e = wte + static_cast<int64_t>(tokens[row]) * C;
      if (wpe) {
        const T* p = wpe + static_cast<int64_t>(t) * C;
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
                        int C) {
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    for (int t = 0; t < L; ++t) {
      const int64_t row = static_cast<int64_t>(b) * S + t;
      const T* d = dout + row * C;
      T* e = dwte + static_cast<int64_t>(tokens[row]) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) e[c] += d[c];
      if (dwpe) {
        T* p = dwpe + static_cast<int64_t>(t) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) p[c] += d[c];
      }
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
                        const T* rstd, int N, int C) {
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

// Per (sequence, head): one GEMM for the scores and one for the weighted sum, restricted to the L x L block of valid
// queries and keys, so padding costs no attention FLOPs. With a causal mask the upper triangle is computed and then
// discarded (2x the needed scores; simple and still GEMM-bound at these sizes).
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, const int32_t* lengths, int B, int S, int C, int NH, bool causal) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    const T* qkv_b = qkv + static_cast<int64_t>(b) * S * C3;
    T* out_b = out + static_cast<int64_t>(b) * S * C;
    for (int h = 0; h < NH; ++h) {
      T* a = att + (static_cast<int64_t>(b) * NH + h) * S * S;
      const T* q = qkv_b + h * hs;
      if (L > 0) gemm(CblasNoTrans, CblasTrans, L, L, hs, scale, q, C3, q + C, C3, T(0), a, S);
      for (int t = 0; t < L; ++t) {
        T* row = a + static_cast<int64_t>(t) * S;
        const int n = causal ? t + 1 : L;  // keys [0, n) are valid
        T zmax = row[0];
#pragma omp simd reduction(max : zmax)
        for (int j = 0; j < n; ++j) zmax = row[j] > zmax ? row[j] : zmax;
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n; ++j) sum += (row[j] = exp_fast(row[j] - zmax));
        const T inv = T(1) / sum;  // sum >= 1: the max term is exp(0)
#pragma omp simd
        for (int j = 0; j < n; ++j) row[j] *= inv;
        zero(row + n, S - n);
      }
      zero(a + static_cast<int64_t>(L) * S, static_cast<int64_t>(S - L) * S);
      if (L > 0) gemm(CblasNoTrans, CblasNoTrans, L, hs, L, T(1), a, S, q + 2 * C, C3, T(0), out_b + h * hs, C);
    }
    zero(out_b + static_cast<int64_t>(L) * C, static_cast<int64_t>(S - L) * C);
  }
}

// With P = att, dO = dout of one head:  dV = P^T dO,  dP = dO V^T,  dZ = P * (dP - rowsum(P * dP)) / sqrt(hs),
// dQ = dZ K,  dK = dZ^T Q. Masked entries of P are 0, so their dZ is 0 without a separate mask.
template <typename T>
void attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, const int32_t* lengths, int B,
                        int S, int C, int NH, bool causal) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    const T* qkv_b = qkv + static_cast<int64_t>(b) * S * C3;
    const T* dout_b = dout + static_cast<int64_t>(b) * S * C;
    T* dqkv_b = dqkv + static_cast<int64_t>(b) * S * C3;
    zero(dqkv_b + static_cast<int64_t>(L) * C3, static_cast<int64_t>(S - L) * C3);
    if (L == 0) continue;
    for (int h = 0; h < NH; ++h) {
      const T* a = att + (static_cast<int64_t>(b) * NH + h) * S * S;
      const T* q = qkv_b + h * hs;
      const T* dO = dout_b + h * hs;
      T* dq = dqkv_b + h * hs;
      gemm(CblasTrans, CblasNoTrans, L, hs, L, T(1), a, S, dO, C, T(0), dq + 2 * C, C3);       // dV
      gemm(CblasNoTrans, CblasTrans, L, L, hs, T(1), dO, C, q + 2 * C, C3, T(0), scratch, S);  // dP
      for (int t = 0; t < L; ++t) {
        const T* p = a + static_cast<int64_t>(t) * S;
        T* d = scratch + static_cast<int64_t>(t) * S;
        const int n = causal ? t + 1 : L;
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < n; ++j) dot += p[j] * d[j];
#pragma omp simd
        for (int j = 0; j < n; ++j) d[j] = scale * p[j] * (d[j] - dot);
        zero(d + n, L - n);  // the GEMMs below read the whole L x L block
      }
      gemm(CblasNoTrans, CblasNoTrans, L, hs, L, T(1), scratch, S, q + C, C3, T(0), dq, C3);  // dQ
      gemm(CblasTrans, CblasNoTrans, L, hs, L, T(1), scratch, S, q, C3, T(0), dq + C, C3);    // dK
    }
  }
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
T masked_cross_entropy_forward(T* probs, T* losses, const T* logits, const int32_t* targets, int N, int V,
                               int64_t* num_valid) {
  double total = 0;  // the sum of up to B*S row losses: accumulate wider than float
  int64_t count = 0;
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) {
      losses[n] = 0;
      continue;
    }
    const T* z = logits + static_cast<int64_t>(n) * V;
    T* p = probs + static_cast<int64_t>(n) * V;
    const T z_target = z[targets[n]];  // read before p (which may alias z) is written
    T zmax = z[0];
#pragma omp simd reduction(max : zmax)
    for (int v = 0; v < V; ++v) zmax = z[v] > zmax ? z[v] : zmax;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; ++v) sum += (p[v] = exp_fast(z[v] - zmax));
    const T inv = T(1) / sum;
#pragma omp simd
    for (int v = 0; v < V; ++v) p[v] *= inv;
    losses[n] = std::log(sum) - (z_target - zmax);
    total += losses[n];
    ++count;
  }
  if (num_valid) *num_valid = count;
  return count > 0 ? static_cast<T>(total / count) : T(0);
}

template <typename T>
void masked_cross_entropy_backward(T* dlogits, const T* probs, const int32_t* targets, int N, int V) {
  int64_t count = 0;
  for (int n = 0; n < N; ++n) count += targets[n] >= 0;
  const T inv = count > 0 ? T(1) / T(count) : T(0);
  for (int n = 0; n < N; ++n) {
    T* d = dlogits + static_cast<int64_t>(n) * V;
    if (targets[n] < 0) {
      zero(d, V);
      continue;
    }
    const T* p = probs + static_cast<int64_t>(n) * V;
#pragma omp simd
    for (int v = 0; v < V; ++v) d[v] = p[v] * inv;
    d[targets[n]] -= inv;
  }
}

template <typename T>
void mean_pool_forward(T* out, const T* inp, const int32_t* lengths, int B, int S, int C) {
  for (int b = 0; b < B; ++b) {
    const int L = length_of(lengths, b, S);
    T* o = out + static_cast<int64_t>(b) * C;
    zero(o, C);
    for (int t = 0; t < L; ++t) {
      const T* x = inp + (static_cast<int64_t>(b) * S + t) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] += x[c];
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

#define DDPLAB_INSTANTIATE(T)                                                                                          \
  template void embedding_forward<T>(T*, const int32_t*, const int32_t*, const T*, const T*, int, int, int);           \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, const int32_t*, int, int, int);                \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int);                              \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int, int);         \
  template void attention_forward<T>(T*, T*, const T*, const int32_t*, int, int, int, int, bool);                      \
  template void attention_backward<T>(T*, T*, const T*, const T*, const T*, const int32_t*, int, int, int, int, bool); \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);                                                  \
  template T masked_cross_entropy_forward<T>(T*, T*, const T*, const int32_t*, int, int, int64_t*);                    \
  template void masked_cross_entropy_backward<T>(T*, const T*, const int32_t*, int, int);                              \
  template void mean_pool_forward<T>(T*, const T*, const int32_t*, int, int, int);                                     \
  template void mean_pool_backward<T>(T*, const T*, const int32_t*, int, int, int);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(double)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cpu
