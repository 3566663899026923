// The 16-bit wire's conversions on the device (launchers and contracts: wire_cast.h). Elementwise loops over
// kernels/float16.h's scalar rounding, which nvcc compiles for the device: the GPU's words are the CPU wire's by
// construction. V elements per access (for_each_pack, launch.cuh): 4, one 16-byte load of fp32 and one 8-byte access
// of words, where the pointers allow it, else 1 (an element at a time, 2-byte accesses, moved 55-63% of the copy
// bandwidth on an H200). Included by wire_cast.cu and, compiled by g++, by tests/emu/test_wire_cast_emu.cpp.
#pragma once
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/float16.h"

namespace ddplab::cuda::wire_cast {

template <float16::Format F>
struct ToWire {
  __device__ uint16_t operator()(float x) const { return float16::from_f32(F, x); }
};
template <float16::Format F>
struct FromWire {
  __device__ float operator()(uint16_t h) const { return float16::to_f32(F, h); }
};

template <float16::Format F, int V>
__global__ void encode_kernel(uint16_t* dst, const float* src, int64_t n) {
  detail::map_elements<V>(dst, src, n, ToWire<F>{});
}

template <float16::Format F, int V>
__global__ void decode_kernel(float* dst, const uint16_t* src, int64_t n) {
  detail::map_elements<V>(dst, src, n, FromWire<F>{});
}

// A reduce-scatter hop: io = from_f32(own + to_f32(io)), as the CPU ring's reduce_encode.
template <float16::Format F, int V>
__global__ void add_encode_kernel(uint16_t* io, const float* own, int64_t n) {
  detail::for_each_pack<V>(
      n,
      [=](int64_t i) {
        const detail::Pack<uint16_t, V> words = detail::load_pack<V>(io + i);
        const detail::Pack<float, V> mine = detail::load_pack<V>(own + i);
        detail::Pack<uint16_t, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = float16::from_f32(F, mine.v[k] + float16::to_f32(F, words.v[k]));
        detail::store_pack(io + i, out);
      },
      [=](int64_t i) { io[i] = float16::from_f32(F, own[i] + float16::to_f32(F, io[i])); });
}

}  // namespace ddplab::cuda::wire_cast
