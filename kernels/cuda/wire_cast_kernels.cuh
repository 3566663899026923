// The 16-bit wire's conversions on the device (launchers and contracts: wire_cast.h). Plain grid-stride loops over
// comm/wire.h's scalar rounding, which nvcc compiles for the device: the GPU's words are the CPU wire's by
// construction. Included by wire_cast.cu and, compiled by g++, by tests/emu/test_wire_cast_emu.cpp.
#pragma once
#include <cstdint>

#include "comm/wire.h"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda::wire_cast {

using detail::global_index;
using detail::grid_stride;

template <wire::Format F>
__global__ void encode_kernel(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) dst[i] = wire::to_wire(F, src[i]);
}

template <wire::Format F>
__global__ void decode_kernel(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) dst[i] = wire::from_wire(F, src[i]);
}

template <wire::Format F>
__global__ void add_encode_kernel(uint16_t* io, const float* own, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride())
    io[i] = wire::to_wire(F, own[i] + wire::from_wire(F, io[i]));
}

}  // namespace ddplab::cuda::wire_cast
