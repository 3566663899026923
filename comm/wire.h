// 16-bit wire formats for fp32 buffers (kernels/float16.h's bf16 and fp16 words) and the fused loops the ring runs
// on them.
//
// Bitwise determinism: every function is a pure elementwise map, so two ranks that convert the same fp32 bits get
// the same 16-bit word. The scalar and vector paths (x86 F16C when compiled with -mf16c, part of x86-64-v3) give
// identical results; tests/mpi/test_wire.cpp checks both against each other on all 2^16 words and edge cases.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/float16.h"

namespace ddplab::wire {

// dst[i] = to16(src[i])
void encode(float16::Format f, uint16_t* dst, const float* src, size_t n);
// dst[i] = to32(src[i])
void decode(float16::Format f, float* dst, const uint16_t* src, size_t n);
// acc[i] += to32(in[i]); out[i] = to16(acc[i])           (a reduce-scatter hop: fp32 sum, 16 bits onward)
void reduce_encode(float16::Format f, float* acc, uint16_t* out, const uint16_t* in, size_t n);
// out[i] = to16(acc[i] + to32(in[i])); acc[i] = to32(out[i])   (the final hop: the owner keeps the rounded value)
void reduce_round(float16::Format f, float* acc, uint16_t* out, const uint16_t* in, size_t n);
// io[i] = to16(own[i] + to32(io[i]))   (the device ring's hop on host memory: the incoming words become the sum sent
// on; the GPU's add_encode kernel, kernels/cuda/wire_cast.h, is its twin)
void add_encode(float16::Format f, uint16_t* io, const float* own, size_t n);

// Whether a mean over this wire scales each rank's values before the sum rather than the sum at the end. fp16 ends
// at 65504: a sum of n ranks' values would overflow where they pass 65504 / n, so each rank scales its own first
// (exact for a power-of-two n), as PyTorch's fp16 compression hook divides first. bf16 has fp32's range and keeps
// the scale for the end, where it is fused with the finiteness check. The host Communicator and the GPU engines
// (comm/stream_allreduce.h) both ask here.
inline bool scales_before_sum(float16::Format f) { return f == float16::Format::kFp16; }

}  // namespace ddplab::wire
