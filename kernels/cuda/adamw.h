// The update on the device, fp32. AdamW: the CUDA twin of cpu::adamw_update, same semantics and argument order plus
// the bf16 copy and the stream. Decoupled weight decay, bias correction with step t counting from 1; params, m and v
// are updated in place. And the gradients' global L2 norm, by which gradient clipping scales the update
// (kernels/grad_clip.h). Asynchronous; throws std::runtime_error if a launch fails. n == 0 launches nothing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ddplab::cuda {

// The gradients' global L2 norm and the factor the update multiplies them by (grad_norm, below).
struct ClippedNorm {
  double norm;  // sqrt of the sum of squares, summed in double
  float scale;  // min(1, max_norm / (norm + 1e-6)); 1 without clipping (max_norm 0)
};

// params_bf16 (may be null): also written, params_bf16[i] = bf16(params[i]) after the update, rounded as convert.h's
// f32_to_bf16 (bit for bit), in the same pass. A bf16 model's GEMMs read such a copy of the weights; writing it here
// costs 2 bytes per parameter on top of the update's 28, where a separate conversion would read the 4-byte masters
// again (6 bytes and a launch).
// skip_if_set (may be null): a device flag read by the kernel; non-zero leaves everything as it was (a bucket whose
// reduced gradients are not finite, scale_and_check_finite's flag, in the update bucket by bucket).
// grad_scale (may be null): a device float, read by the kernel, that every gradient is multiplied by (grad_norm's
// clip factor, &ClippedNorm::scale), as cpu::adamw_update's grad_scale.
void adamw_update(float* params, __nv_bfloat16* params_bf16, const float* grads, float* m, float* v, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t, cudaStream_t stream,
                  const int* skip_if_set = nullptr, const float* grad_scale = nullptr);

// The L2 norm of x[0, n) and the clip factor min(1, max_norm / (norm + 1e-6)) (1 for max_norm 0) into *out: two
// kernels, summing the squares in double in an order fixed by n and x's 16-byte alignment alone (the packed or the
// scalar kernel), so the same gradients at the same address give the same bits on any GPU (n == 0: a norm of 0).
// workspace: grad_norm_workspace_bytes() of device memory, 8-byte aligned.
size_t grad_norm_workspace_bytes();
void grad_norm(const float* x, int64_t n, float max_norm, ClippedNorm* out, void* workspace, cudaStream_t stream);

}  // namespace ddplab::cuda
