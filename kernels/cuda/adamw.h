// AdamW on the device, fp32: the CUDA twin of cpu::adamw_update, same semantics and argument order plus the
// stream. Decoupled weight decay, bias correction with step t counting from 1; params, m and v are updated in
// place. Asynchronous; throws std::runtime_error if the launch fails. n == 0 launches nothing.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddplab::cuda {

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int t, cudaStream_t stream);

}  // namespace ddplab::cuda
