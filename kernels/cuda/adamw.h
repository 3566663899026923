// AdamW on the device, fp32: the CUDA twin of cpu::adamw_update, same semantics and argument order plus the
// bf16 copy and the stream. Decoupled weight decay, bias correction with step t counting from 1; params, m and v are
// updated in place. Asynchronous; throws std::runtime_error if the launch fails. n == 0 launches nothing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

// params_bf16 (may be null): also written, params_bf16[i] = bf16(params[i]) after the update, rounded as convert.h's
// f32_to_bf16 (bit for bit), in the same pass. A bf16 model's GEMMs read such a copy of the weights; writing it here
// costs 2 bytes per parameter on top of the update's 28, where a separate conversion would read the 4-byte masters
// again (6 bytes and a launch).
// skip_if_set (may be null): a device flag read by the kernel; non-zero leaves everything as it was (a bucket whose
// reduced gradients are not finite, scale_and_check_finite's flag, in the update bucket by bucket).
void adamw_update(float* params, __nv_bfloat16* params_bf16, const float* grads, float* m, float* v, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t, cudaStream_t stream,
                  const int* skip_if_set = nullptr);

}  // namespace ddplab::cuda
