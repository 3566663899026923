#include "kernels/cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace ddplab::cpu {
namespace {

// One call site per precision so the templates stay free of BLAS details.
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;

}  // namespace

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, int B, int C, int OC) {
  if (B == 0 || OC == 0) return;
  gemm(CblasNoTrans, CblasTrans, B, OC, C, T(1), inp, C, weight, C, T(0), out, OC);
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int B, int C, int OC) {
  if (B == 0) return;
  if (dinp) gemm(CblasNoTrans, CblasNoTrans, B, C, OC, T(1), dout, OC, weight, C, T(0), dinp, C);
  gemm(CblasTrans, CblasNoTrans, OC, C, B, T(1), dout, OC, inp, C, T(1), dweight, C);
}

template <typename T>
void bias_forward(T* out, const T* bias, int B, int OC) {
  for (int b = 0; b < B; ++b) {
    T* row = out + static_cast<int64_t>(b) * OC;
    for (int o = 0; o < OC; ++o) row[o] += bias[o];
  }
}

template <typename T>
void bias_backward(T* dbias, const T* dout, int B, int OC) {
  for (int b = 0; b < B; ++b) {
    const T* row = dout + static_cast<int64_t>(b) * OC;
    for (int o = 0; o < OC; ++o) dbias[o] += row[o];
  }
}

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + std::tanh(T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x)));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
    const T th = std::tanh(u);
    const T sech2 = T(1) - th * th;
    const T du_dx = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
    dinp[i] = dout[i] * (T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * du_dx);
  }
}

template <typename T>
T softmax_cross_entropy_forward(T* probs, T* losses, const T* logits, const int32_t* targets, int B, int V) {
  T total = 0;
  for (int b = 0; b < B; ++b) {
    const T* z = logits + static_cast<int64_t>(b) * V;
    T* p = probs + static_cast<int64_t>(b) * V;
    const T zmax = *std::max_element(z, z + V);  // subtract the max: exp never overflows
    T sum = 0;
    for (int v = 0; v < V; ++v) sum += (p[v] = std::exp(z[v] - zmax));
    const T inv = T(1) / sum;
    for (int v = 0; v < V; ++v) p[v] *= inv;
    // log-sum-exp form keeps the loss finite even when probs[target] underflows to 0
    losses[b] = std::log(sum) - (z[targets[b]] - zmax);
    total += losses[b];
  }
  return B > 0 ? total / B : T(0);
}

template <typename T>
void softmax_cross_entropy_backward(T* dlogits, const T* probs, const int32_t* targets, int B, int V) {
  const T inv_b = T(1) / T(B);
  for (int b = 0; b < B; ++b) {
    const T* p = probs + static_cast<int64_t>(b) * V;
    T* d = dlogits + static_cast<int64_t>(b) * V;
    for (int v = 0; v < V; ++v) d[v] = p[v] * inv_b;
    d[targets[b]] -= inv_b;
  }
}

template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  for (int64_t i = 0; i < n; ++i) {
    const T g = grads[i];
    m[i] = T(beta1) * m[i] + T(1 - beta1) * g;
    v[i] = T(beta2) * v[i] + T(1 - beta2) * g * g;
    const T m_hat = m[i] / T(bc1);
    const T v_hat = v[i] / T(bc2);
    params[i] -= T(lr) * (m_hat / (std::sqrt(v_hat) + T(eps)) + T(weight_decay) * params[i]);
  }
}

template <typename T>
void sgd_update(T* params, const T* grads, T* momentum_buf, int64_t n, float lr, float momentum, float weight_decay) {
  for (int64_t i = 0; i < n; ++i) {
    T g = grads[i] + T(weight_decay) * params[i];
    if (momentum != 0.0f) g = momentum_buf[i] = T(momentum) * momentum_buf[i] + g;
    params[i] -= T(lr) * g;
  }
}

template <typename T>
void scale(T* y, T alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

#define DDPLAB_INSTANTIATE(T)                                                                                    \
  template void matmul_forward<T>(T*, const T*, const T*, int, int, int);                                       \
  template void matmul_backward<T>(T*, T*, const T*, const T*, const T*, int, int, int);                        \
  template void bias_forward<T>(T*, const T*, int, int);                                                         \
  template void bias_backward<T>(T*, const T*, int, int);                                                        \
  template void gelu_forward<T>(T*, const T*, int64_t);                                                          \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);                                               \
  template T softmax_cross_entropy_forward<T>(T*, T*, const T*, const int32_t*, int, int);                       \
  template void softmax_cross_entropy_backward<T>(T*, const T*, const int32_t*, int, int);                       \
  template void adamw_update<T>(T*, const T*, T*, T*, int64_t, float, float, float, float, float, int);          \
  template void sgd_update<T>(T*, const T*, T*, int64_t, float, float, float);                                   \
  template void scale<T>(T*, T, int64_t);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(double)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cpu
