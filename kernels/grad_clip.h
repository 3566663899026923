// Gradient clipping by the global L2 norm, as PyTorch's torch.nn.utils.clip_grad_norm_: every gradient is multiplied
// by min(1, max_norm / (norm + 1e-6)), where norm is that of all the reduced gradients together (llm.c has no 1e-6:
// at a norm equal to the cap it leaves the gradients as they are, where this scales them by 1 / (1 + 1e-6)). The
// factor is folded into the update (the optimizers' grad_scale), so clipping costs no pass of its own over the
// gradients beyond the norm's. One formula for the CPU and the GPU: plain scalar code nvcc also compiles for the
// device. Every replica computes the same norm bit for bit (each sums the same reduced gradients in an order fixed
// by their count alone), so every replica applies the same factor and the replicas stay identical.
#pragma once

#ifdef __CUDACC__
#define DDPLAB_GRAD_CLIP_HD __host__ __device__
#else
#define DDPLAB_GRAD_CLIP_HD
#endif

namespace ddplab {

// PyTorch's epsilon: a zero norm gives a finite factor (clamped to 1).
constexpr double kClipEpsilon = 1e-6;

// The factor the update multiplies the gradients by, given their global L2 norm and the cap (> 0). A NaN norm (the
// step's non-finite check stops or skips such a step before any update) gives 1.
DDPLAB_GRAD_CLIP_HD inline float clip_scale(double norm, float max_norm) {
  const double scale = max_norm / (norm + kClipEpsilon);
  return scale < 1.0 ? static_cast<float>(scale) : 1.0f;
}

}  // namespace ddplab
