#include "kernels/cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/adamw_rule.h"
#include "kernels/cpu/softmax_row.h"
#include "kernels/cpu/vector_math.h"

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

constexpr double kGeluA = -2 * 0.7978845608028654;  // -2 sqrt(2/pi)
constexpr double kGeluB = 0.044715 * kGeluA;

}  // namespace

bool sixteen_lanes_available() {
#ifdef DDPLAB_AVX512_KERNELS
  return __builtin_cpu_supports("avx512f");  // libgcc checks that the OS saves the zmm registers too
#else
  return false;
#endif
}

namespace {
std::atomic<int>& float_lanes_in_use() {  // decided on first use, whatever the order of static initialisation
  static std::atomic<int> lanes{sixteen_lanes_available() ? 16 : 8};
  return lanes;
}
}  // namespace

int float_lanes() { return float_lanes_in_use().load(std::memory_order_relaxed); }

void set_float_lanes(int lanes) {
  if (lanes != 8 && !(lanes == 16 && sixteen_lanes_available()))
    throw std::invalid_argument("set_float_lanes: " + std::to_string(lanes) + " lanes (8, or 16 with AVX-512)");
  float_lanes_in_use().store(lanes, std::memory_order_relaxed);
}

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, int B, int C, int OC) {
  if (B == 0 || OC == 0) return;
  gemm(CblasNoTrans, CblasTrans, B, OC, C, T(1), inp, C, weight, C, T(0), out, OC);
}

template <typename T>
void matmul_backward_input(T* dinp, const T* dout, const T* weight, int B, int C, int OC) {
  if (B == 0 || C == 0) return;
  gemm(CblasNoTrans, CblasNoTrans, B, C, OC, T(1), dout, OC, weight, C, T(0), dinp, C);
}

template <typename T>
void matmul_backward_weight(T* dweight, const T* dout, const T* inp, int B, int C, int OC, int row_begin,
                            int row_end, bool accumulate) {
  const int rows = row_end - row_begin;
  if (rows <= 0) return;
  T* block = dweight + static_cast<int64_t>(row_begin) * C;
  if (B == 0) {  // an empty sum: nothing to add, or zeros to write
    if (!accumulate) std::fill(block, block + static_cast<int64_t>(rows) * C, T(0));
    return;
  }
  // Rows [row_begin, row_end) of dweight are contiguous; their dout columns are a strided block (ld = OC).
  gemm(CblasTrans, CblasNoTrans, rows, C, B, T(1), dout + row_begin, OC, inp, C, accumulate ? T(1) : T(0), block, C);
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int B, int C, int OC) {
  if (dinp) matmul_backward_input(dinp, dout, weight, B, C, OC);
  matmul_backward_weight(dweight, dout, inp, B, C, OC, 0, OC);
}

template <typename T>
void bias_forward(T* out, const T* bias, int B, int OC) {
  for (int b = 0; b < B; ++b) {
    T* row = out + static_cast<int64_t>(b) * OC;
    for (int o = 0; o < OC; ++o) row[o] += bias[o];
  }
}

template <typename T>
void bias_backward(T* dbias, const T* dout, int B, int OC, bool accumulate) {
  if (!accumulate) std::fill(dbias, dbias + OC, T(0));  // OC elements: nothing next to the rows' pass
  for (int b = 0; b < B; ++b) {
    const T* row = dout + static_cast<int64_t>(b) * OC;
    for (int o = 0; o < OC; ++o) dbias[o] += row[o];
  }
}

// GELU's tanh form rewritten with 0.5 (1 + tanh(u)) = sigmoid(2u), so one exp does the work of tanh:
//   gelu(x)  = x s,                             s = 1 / (1 + exp(-2u)),  -2u = x (a + b x^2)
//   gelu'(x) = s + 2 x s (1 - s) du/dx  =  s (1 - x (1 - s) (a + 3 b x^2))
// with a = -2 sqrt(2/pi), b = 0.044715 a. V is a scalar or a vector of T (FloatLanes<W>::V): the same operations lane
// for lane, so an element's result does not depend on whether it falls in the vector body or the tail.
template <typename T, typename V>
inline V gelu_exp(V x, V x2) {  // exp(-2u)
  return exp_fast(x * (x2 * T(kGeluB) + T(kGeluA)));
}
// Past |x| = 10 gelu is x or 0, and gelu' 1 or 0, to float precision, but not in these formulas: exp_fast's clamp
// keeps s at ~1e-38, and x or x^3 times that grows without bound (gelu(-1e35) came out -1e-3; gelu' -inf from
// x ~ -1.3e13, NaN from ~2e19). So they are cut there, lane for lane as in the scalar tail (a NaN stays NaN).
inline constexpr double kGeluDerivativeEdge = 10.0;
template <typename T, typename V>
inline V gelu_value(V x) {
  const V y = x / (T(1) + gelu_exp<T>(x, x * x));
  return x < -(V{} + T(kGeluDerivativeEdge)) ? V{} : y;
}
template <typename T, typename V>
inline V gelu_derivative(V x) {
  const V edge = V{} + T(kGeluDerivativeEdge);
  x = edge < x ? edge : x;
  x = -edge > x ? -edge : x;
  const V x2 = x * x;
  const V s = T(1) / (T(1) + gelu_exp<T>(x, x2));
  return s * (T(1) - x * (T(1) - s) * (x2 * T(3 * kGeluB) + T(kGeluA)));
}

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_value<T>(inp[i]);
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dinp[i] = dout[i] * gelu_derivative<T>(inp[i]);
}

// Float runs W lanes at a time with the vector exp_fast (the compiler's vectorisation of the scalar loop blends
// constant-folded copies of exp's clamps and ran at half the speed: vector_math.h), then one by one.
namespace {
template <int W>
void gelu_forward_lanes(float* out, const float* inp, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store_lanes<W>(out + i, gelu_value<float>(load_lanes<W>(inp + i)));
  for (; i < n; ++i) out[i] = gelu_value<float>(inp[i]);
}
template <int W>
void gelu_backward_lanes(float* dinp, const float* inp, const float* dout, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W)
    store_lanes<W>(dinp + i, load_lanes<W>(dout + i) * gelu_derivative<float>(load_lanes<W>(inp + i)));
  for (; i < n; ++i) dinp[i] = dout[i] * gelu_derivative<float>(inp[i]);
}
#ifdef DDPLAB_AVX512_KERNELS
[[DDPLAB_AVX512_TARGET]] void gelu_forward_16(float* out, const float* inp, int64_t n) {
  gelu_forward_lanes<16>(out, inp, n);
}
[[DDPLAB_AVX512_TARGET]] void gelu_backward_16(float* dinp, const float* inp, const float* dout, int64_t n) {
  gelu_backward_lanes<16>(dinp, inp, dout, n);
}
#endif
}  // namespace

template <>
void gelu_forward(float* out, const float* inp, int64_t n) {
#ifdef DDPLAB_AVX512_KERNELS
  if (float_lanes() == 16) return gelu_forward_16(out, inp, n);
#endif
  gelu_forward_lanes<8>(out, inp, n);
}
template <>
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#ifdef DDPLAB_AVX512_KERNELS
  if (float_lanes() == 16) return gelu_backward_16(dinp, inp, dout, n);
#endif
  gelu_backward_lanes<8>(dinp, inp, dout, n);
}

template <typename T>
T softmax_cross_entropy_forward(T* exps, T* row_sums, T* losses, const T* logits, const int32_t* targets, int N, int V,
                                int64_t* num_valid) {
  double total = 0;  // the sum of up to B*S row losses: accumulate wider than float
  int64_t count = 0;
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) {
      losses[n] = 0;
      continue;
    }
    const T* z = logits + static_cast<int64_t>(n) * V;
    const T z_target = z[targets[n]];  // read before exps (which may alias z) is written
    T zmax;
    row_sums[n] = exp_row(exps + static_cast<int64_t>(n) * V, z, V, &zmax);
    losses[n] = std::log(row_sums[n]) - (z_target - zmax);
    total += losses[n];
    ++count;
  }
  if (num_valid) *num_valid = count;
  return count > 0 ? static_cast<T>(total / count) : T(0);
}

template <typename T>
void softmax_cross_entropy_backward(T* dlogits, const T* exps, const T* row_sums, const int32_t* targets, int N, int V,
                                    T scale) {
  int64_t count = 0;
  for (int n = 0; n < N; ++n) count += targets[n] >= 0;
  const T inv = count > 0 ? scale / T(count) : T(0);
  for (int n = 0; n < N; ++n) {
    T* d = dlogits + static_cast<int64_t>(n) * V;
    if (targets[n] < 0) {
      std::fill(d, d + V, T(0));
      continue;
    }
    const T* e = exps + static_cast<int64_t>(n) * V;
    const T row_scale = inv / row_sums[n];  // the softmax's normalisation and the mean's in one factor
#pragma omp simd
    for (int v = 0; v < V; ++v) d[v] = e[v] * row_scale;
    d[targets[n]] -= inv;
  }
}

template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t, T grad_scale) {
  const AdamwRule<T> rule = adamw_rule<T>(lr, beta1, beta2, eps, weight_decay, t);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) rule.apply(params[i], grads[i] * grad_scale, m[i], v[i]);
}

template <typename T>
void sgd_update(T* params, const T* grads, T* momentum_buf, int64_t n, float lr, float momentum, float weight_decay,
                T grad_scale) {
  // Without a scale, the expression of before: the compiler may fuse g * s + wd * p into an FMA that rounds wd * p
  // first, which g + wd * p need not (its FMA rounds once), so a scale of 1 would change SGD's bits.
  const bool scaled = grad_scale != T(1);
  for (int64_t i = 0; i < n; ++i) {
    T g = (scaled ? grads[i] * grad_scale : grads[i]) + T(weight_decay) * params[i];
    if (momentum != 0.0f) g = momentum_buf[i] = T(momentum) * momentum_buf[i] + g;
    params[i] -= T(lr) * g;
  }
}

template <typename T>
void scale(T* y, T alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

template <typename T>
bool all_finite(const T* x, int64_t n) {
  T poison = 0;
#pragma omp simd reduction(+ : poison)
  for (int64_t i = 0; i < n; ++i) poison += x[i] * T(0);
  return poison == T(0);
}

template <typename T>
bool scale_and_check_finite(T* y, T alpha, int64_t n) {
  if (alpha == T(1)) return all_finite(y, n);
  T poison = 0;
#pragma omp simd reduction(+ : poison)
  for (int64_t i = 0; i < n; ++i) poison += (y[i] *= alpha) * T(0);
  return poison == T(0);
}

double sum_of_squares(const float* x, int64_t n) {
  // 8 vectors of 4 doubles: enough independent adds to hide the adder's latency (docs/BENCHMARKS.md, "Gradient
  // clipping on the CPU": 8 lanes ran half as fast)
  constexpr int kLanes = 32;
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lanes[k] += static_cast<double>(x[i + k]) * x[i + k];
  double sum = 0;
  for (double lane : lanes) sum += lane;
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

namespace {

// The float pass behind all_finite and scale_and_check_finite: v = op(x[i]) for every element (16 at a time in two
// 8-lane vectors, then one by one; op is the same arithmetic on both), stored to out[i] when kStore, and whether every
// v is finite. A float is finite iff its bits without the sign are below Inf's: the largest of them, in two vector
// accumulators, costs an and + a max per 8 values, where a sum of v*0 waits on the adder's latency (about 3x slower
// while the data is in cache).
template <bool kStore, typename Op>
bool map_all_finite(const float* x, float* out, int64_t n, Op op) {
  using Bits8 = Simd<uint32_t>::V;
  constexpr uint32_t kNoSign = 0x7fffffff, kInfinity = 0x7f800000;
  Bits8 max0 = {}, max1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const Simd<float>::V a = op(vload(x + i)), b = op(vload(x + i + 8));
    if constexpr (kStore) {
      vstore(out + i, a);
      vstore(out + i + 8, b);
    }
    const Bits8 a_bits = reinterpret_cast<Bits8>(a) & kNoSign, b_bits = reinterpret_cast<Bits8>(b) & kNoSign;
    max0 = max0 > a_bits ? max0 : a_bits;
    max1 = max1 > b_bits ? max1 : b_bits;
  }
  uint32_t largest = 0;
  for (int lane = 0; lane < 8; ++lane) largest = std::max({largest, max0[lane], max1[lane]});
  for (; i < n; ++i) {
    const float v = op(x[i]);
    if constexpr (kStore) out[i] = v;
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    largest = std::max(largest, bits & kNoSign);
  }
  return largest < kInfinity;
}

}  // namespace

// Float, which checks every gradient of every step, in the vector pass above.
template <>
bool all_finite(const float* x, int64_t n) {
  return map_all_finite</*kStore=*/false>(x, nullptr, n, [](auto v) { return v; });
}
template <>
bool scale_and_check_finite(float* y, float alpha, int64_t n) {
  if (alpha == 1.0f) return all_finite(y, n);
  return map_all_finite</*kStore=*/true>(y, y, n, [alpha](auto v) { return v * alpha; });
}

#define DDPLAB_INSTANTIATE(T)                                                                              \
  template void matmul_forward<T>(T*, const T*, const T*, int, int, int);                                  \
  template void matmul_backward<T>(T*, T*, const T*, const T*, const T*, int, int, int);                   \
  template void matmul_backward_input<T>(T*, const T*, const T*, int, int, int);                           \
  template void matmul_backward_weight<T>(T*, const T*, const T*, int, int, int, int, int, bool);          \
  template void bias_forward<T>(T*, const T*, int, int);                                                   \
  template void bias_backward<T>(T*, const T*, int, int, bool);                                            \
  template void gelu_forward<T>(T*, const T*, int64_t);                                                    \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);                                         \
  template T softmax_cross_entropy_forward<T>(T*, T*, T*, const T*, const int32_t*, int, int, int64_t*);   \
  template void softmax_cross_entropy_backward<T>(T*, const T*, const T*, const int32_t*, int, int, T);    \
  template void adamw_update<T>(T*, const T*, T*, T*, int64_t, float, float, float, float, float, int, T); \
  template void sgd_update<T>(T*, const T*, T*, int64_t, float, float, float, T);                          \
  template void scale<T>(T*, T, int64_t);                                                                  \
  template bool all_finite<T>(const T*, int64_t);                                                          \
  template bool scale_and_check_finite<T>(T*, T, int64_t);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(double)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cpu
