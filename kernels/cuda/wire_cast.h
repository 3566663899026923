// fp32 gradients to and from a 16-bit wire on the GPU (--comm-dtype bf16 | fp16 with --device cuda): the staging
// casts around NCCL's 16-bit all-reduce and the conversions of our ring's 16-bit links (comm/ring_device.h). The
// rounding is kernels/float16.h's (round to nearest even; NaN stays NaN; fp16 overflows to inf, keeps subnormals), so
// every rank that casts the same reduced words back gets the same fp32 bits, and a GPU wire rounds as the CPU one.
//
// Asynchronous on `stream`; a negative n throws std::invalid_argument, a failed launch std::runtime_error. n == 0
// launches nothing.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/float16.h"

namespace ddplab::cuda {

// dst[i] = to16(src[i])
void wire_encode(float16::Format f, uint16_t* dst, const float* src, int64_t n, cudaStream_t stream);
// dst[i] = to32(src[i]), exact
void wire_decode(float16::Format f, float* dst, const uint16_t* src, int64_t n, cudaStream_t stream);
// io[i] = to16(own[i] + to32(io[i])): one reduce-scatter hop, the sum in fp32, rounded once
void wire_add_encode(float16::Format f, uint16_t* io, const float* own, int64_t n, cudaStream_t stream);

}  // namespace ddplab::cuda
