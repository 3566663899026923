// Precision conversion and gradient checks on the device.
//
// fp32 <-> bf16 is bit for bit the CPU wire format's conversion (kernels/float16.h: f32_to_bf16 rounds to nearest even,
// NaN stays a quiet NaN with its sign and top payload bits; bf16_to_f32 is exact), so a buffer converted on the GPU
// and one converted on the host carry the same 16-bit words. (CUDA's __float2bfloat16_rn rounds the same way but
// returns a canonical NaN, hence our own integer version.) Buffers typed uint16_t, as the wire's, may be passed
// with reinterpret_cast: __nv_bfloat16 is 16 bits with no padding.
//
// Asynchronous; a negative n throws std::invalid_argument, a failed launch std::runtime_error. n == 0 launches
// nothing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// dst[i] = bf16(src[i]), round to nearest even
void f32_to_bf16(__nv_bfloat16* dst, const float* src, int64_t n, cudaStream_t stream);
// dst[i] = float(src[i]), exact
void bf16_to_f32(float* dst, const __nv_bfloat16* src, int64_t n, cudaStream_t stream);

// x[i] *= s, and *flag = 1 if any scaled value is not finite (inf or NaN; a non-finite input stays non-finite for
// any s). *flag is only ever SET, never cleared: zero it before the first buffer, then several buffers (or bucket
// views) can share one flag and the host reads it once. Used for gradient unscaling (s = 1 / loss_scale) and
// averaging (s = 1 / world) with the overflow check of mixed precision fused into the same pass.
void scale_and_check_finite(float* x, float s, int64_t n, int* flag, cudaStream_t stream);

}  // namespace ddplab::cuda
