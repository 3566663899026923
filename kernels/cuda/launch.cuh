// Grid arithmetic and the elementwise loop shared by the launchers (nvcc; and g++ under tests/emu, without
// launch_packed). Kernels use grid-stride loops over
// int64 indices, so the grid is capped and any n >= 0 is covered, including n beyond 2^31.
#pragma once
#include <cuda_runtime_api.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#ifdef __CUDACC__
#include "kernels/cuda/check.cuh"  // cudaCheck, for launch_on
#endif

namespace ddplab::cuda::detail {

constexpr int kBlockSize = 256;
// Enough blocks to fill an H100/H200 many times over (132 SMs x 8 resident blocks of 256); more only adds tails.
constexpr int64_t kMaxGridSize = 65535;

// Blocks for n items, items_per_block each: threads for a thread per item (the default), or rows per block where a
// warp owns a row (LayerNorm, the softmaxes, the embedding); capped, the kernels' loops stride over the rest.
inline unsigned grid_size(int64_t n, int items_per_block = kBlockSize) {
  return static_cast<unsigned>(std::min<int64_t>((n + items_per_block - 1) / items_per_block, kMaxGridSize));
}

__device__ inline int64_t global_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// An elementwise loop over n elements, V at a time: pack(i) handles elements [i, i + V) with one 16-byte access per
// array (load_pack, common.cuh), one(i) element i, for the n % V left over. With V == 1 it is the plain grid-stride
// loop over one(i). The launchers take V = 4 where every float pointer is 16-byte aligned (all_aligned) and V = 1
// otherwise. Why: on an H200 the float4 kernels moved 95-99% of the copy bandwidth and the same arithmetic one
// float at a time 70-78%.
template <int V, typename PackBody, typename OneBody>
__device__ inline void for_each_pack(int64_t n, PackBody pack, OneBody one) {
  if constexpr (V == 1) {
    for (int64_t i = global_index(); i < n; i += grid_stride()) one(i);
  } else {
    const int64_t packs = n / V;
    for (int64_t g = global_index(); g < packs; g += grid_stride()) pack(g * V);
    const int64_t tail = packs * V + global_index();
    if (tail < n) one(tail);
  }
}

// out[i] = op(in[i]) for n elements (in == out allowed), V per access: the body of the elementwise map kernels, each
// a named __global__ of its own so that ncu and the kernel rankings tell them apart. op is a functor with a
// __device__ operator() (host lambdas cannot reach a kernel without --extended-lambda).
template <int V, typename In, typename Out, typename Op>
__device__ inline void map_elements(Out* out, const In* in, int64_t n, Op op) {
  for_each_pack<V>(
      n,
      [=](int64_t i) {
        const Pack<In, V> x = load_pack<V>(in + i);
        Pack<Out, V> y;
#pragma unroll
        for (int k = 0; k < V; ++k) y.v[k] = op(x.v[k]);
        store_pack(out + i, y);
      },
      [=](int64_t i) { out[i] = op(in[i]); });
}

// out[i] = op(a[i], b[i]) for n elements (out may be a or b), V per access: map_elements with two inputs.
template <int V, typename A, typename B, typename Out, typename Op>
__device__ inline void zip_elements(Out* out, const A* a, const B* b, int64_t n, Op op) {
  for_each_pack<V>(
      n,
      [=](int64_t i) {
        const Pack<A, V> x = load_pack<V>(a + i);
        const Pack<B, V> y = load_pack<V>(b + i);
        Pack<Out, V> z;
#pragma unroll
        for (int k = 0; k < V; ++k) z.v[k] = op(x.v[k], y.v[k]);
        store_pack(out + i, z);
      },
      [=](int64_t i) { out[i] = op(a[i], b[i]); });
}

// Whether out and in both take map_elements' packs of 4.
template <typename In, typename Out>
inline bool map_packs_fit(const Out* out, const In* in) {
  return all_aligned(alignof(Pack<Out, 4>), out) && all_aligned(alignof(Pack<In, 4>), in);
}

// A kernel's name as a person reads it, from its symbol: demangled, without its return type, scopes and parameters
// ("layernorm_backward_kernel<float, 4, true>"); the symbol itself where it does not demangle.
inline std::string readable_kernel_name(const char* symbol) {
  if (std::strncmp(symbol, "_Z", 2) != 0) return symbol;  // not a C++ symbol ("i" would demangle as a type: "int")
  int status = 0;
  char* demangled = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : symbol;
  std::free(demangled);
  if (status != 0) return name;
  // The parameters: from the '(' that closes with the last ')' (scopes hold parentheses: "(anonymous namespace)").
  if (!name.empty() && name.back() == ')') {
    size_t open = name.size();
    for (int depth = 0; open-- > 0;) {
      depth += name[open] == ')' ? 1 : name[open] == '(' ? -1 : 0;
      if (depth == 0) break;
    }
    if (open != std::string::npos) name.erase(open);
  }
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);      // the return type
  const size_t scope = name.rfind("::", name.find('<'));  // the last scope before the template's arguments
  return scope == std::string::npos ? name : name.substr(scope + 2);
}

#ifdef __CUDACC__  // <<<>>> is nvcc's: the CPU emulation (tests/emu) includes the rest of this file with g++
// Launches packed (a kernel's V = 4 instantiation of for_each_pack) where `aligned`, else scalar (its V = 1 one), over
// n elements: one thread per pack or per element, grid_size capping the grid. The caller checks the launch.
template <typename... Params, typename... Args>
void launch_packed(bool aligned, int64_t n, cudaStream_t stream, void (*packed)(Params...), void (*scalar)(Params...),
                   Args... args) {
  if (aligned)
    packed<<<grid_size(n / 4 + 1), kBlockSize, 0, stream>>>(args...);
  else
    scalar<<<grid_size(n), kBlockSize, 0, stream>>>(args...);
}

// A kernel's name as the runtime gives it (cudaFuncGetName), or "a kernel" where it does not.
inline std::string kernel_name(const void* kernel) {
  const char* symbol = nullptr;
  if (cudaFuncGetName(&symbol, kernel) != cudaSuccess || symbol == nullptr) {
    cudaGetLastError();
    return "a kernel";
  }
  return readable_kernel_name(symbol);
}

// The `launch` of a kernel header's launch sequence (the *_kernels.cuh that the CPU emulation runs too): one kernel on
// `stream`, launch(kernel, grid, block, dynamic_smem_bytes, args...). More than 48 KB of dynamic shared memory must be
// asked for, per kernel and device: cheap enough per launch. Where the device refuses it, past its limit (sizes a
// kernel is not shaped for: LayerNorm backward's rows past ~14K columns on a Hopper, ~19K without dinp's column sums),
// it throws std::invalid_argument with the sizes, not CUDA's bare "invalid argument": the limit is read then, not on
// every launch. A failed launch throws. The CPU emulation hands the same sequences its own. max_shared: the SM's
// unified L1 and shared memory split with all the shared memory it can have (the carveout is a hint the driver
// otherwise sizes for one block), for kernels past 48 KB whose blocks are sized to share an SM two at a time through
// shared memory, not L1.
inline auto launch_on(cudaStream_t stream, bool max_shared = false) {
  return [stream, max_shared](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
    if (smem > 48 * 1024) {
      const cudaError_t asked =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (asked != cudaSuccess) {
        cudaGetLastError();  // not left for the next check to find
        int device = 0, limit = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        if (smem > static_cast<size_t>(limit))
          throw std::invalid_argument(
              kernel_name(reinterpret_cast<const void*>(kernel)) + "'s block needs " + std::to_string(smem) +
              " bytes of shared memory at these sizes, more than this GPU's " + std::to_string(limit));
        cudaCheck(asked);
      }
      if (max_shared)
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    }
    kernel<<<grid, block, smem, stream>>>(args...);
    cudaCheck(cudaGetLastError());
  };
}
#endif

}  // namespace ddplab::cuda::detail
