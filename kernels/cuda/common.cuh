// Device helpers shared by the kernel families (nvcc only): fp32/bf16 element access, 16-byte packed loads, warp
// and block reductions, and the launch-time alignment test that picks a vectorised or a scalar instantiation.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

namespace ddplab::cuda::detail {

constexpr unsigned kFullMask = 0xffffffffu;

// Sequence b's length, clamped to [0, S] as the CPU reference clamps it (transformer_ops.cpp); S when there are no
// lengths (every sequence full).
__device__ __forceinline__ int length_of(const int32_t* lengths, int b, int S) {
  return lengths ? min(max(lengths[b], 0), S) : S;
}

// Every kernel computes in fp32; T is only the storage type of activations (float or __nv_bfloat16).
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// N consecutive elements moved as one access: 16 bytes for 4 floats or 8 bf16 (one LDG.128/STG.128 per thread),
// 32 bytes (two accesses) for the fp32 parameters read beside 8 bf16 activations.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <int N, typename T>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <int N, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

// GELU, tanh approximation, as cpu::gelu_forward: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The CPU computes the
// same function as a sigmoid of one exp (kernels/cpu/ops.cpp): the two agree to rounding, not bit for bit.
constexpr float kSqrt2OverPi = static_cast<float>(0.7978845608028654);
constexpr float kGeluCubic = static_cast<float>(0.044715);
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}

// Online softmax: (m, s) is the running max and sum of exp(x - m) over what a thread has seen, so one pass over a
// row gives both. While everything seen is -inf, nothing is added (exp(-inf - -inf) would be NaN); a NaN x lands in
// the else branch and poisons s (exp(NaN) even while m is -inf), so it shows in the result: a thread's share of the
// row's sum is s * exp(m - row max), or s itself (0, or NaN) where m is still -inf.
__device__ __forceinline__ void online_softmax_update(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;  // m == -inf: s == 0, and 0 * 0 + 1 (s NaN stays NaN)
    m = x;
  } else if (m != -INFINITY || isnan(x)) {
    s += expf(x - m);
  }
}

// Reductions over a warp and over a block with a binary op (Sum or Max below), every thread getting the result. Sum
// also adds doubles (the gradients' norm).
struct Sum {
  static constexpr float kIdentity = 0.0f;
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  static constexpr float kIdentity = -INFINITY;
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op, typename T>
__device__ __forceinline__ T warp_reduce(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = Op{}(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) { return warp_reduce<Sum>(x); }
__device__ __forceinline__ float warp_max(float x) { return warp_reduce<Max>(x); }

// Over the block (blockDim.x a multiple of 32, at most 1024). The order is fixed by the launch shape, so the result
// is reproducible. `shared` holds 32 values; the trailing barrier lets the caller reuse it at once.
template <typename Op, typename T>
__device__ __forceinline__ T block_reduce(T x, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_reduce<Op>(x);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : static_cast<T>(Op::kIdentity);
  x = warp_reduce<Op>(x);
  __syncthreads();
  return x;
}
__device__ __forceinline__ float block_sum(float x, float* shared) { return block_reduce<Sum>(x, shared); }
__device__ __forceinline__ float block_max(float x, float* shared) { return block_reduce<Max>(x, shared); }

// Host side: whether every pointer is aligned to `bytes` (null pointers count as aligned: unused operands).
template <typename... Ptrs>
inline bool all_aligned(int bytes, const Ptrs*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % bytes == 0) && ...);
}

}  // namespace ddplab::cuda::detail
