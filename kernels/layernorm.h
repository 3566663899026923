// LayerNorm's epsilon, PyTorch's default and GPT-2's: one constant for the CPU reference (kernels/cpu, in its
// precision T) and the CUDA kernels (kernels/cuda), whose float is the CPU's float.
#pragma once

namespace ddplab {

inline constexpr double kLayerNormEps = 1e-5;

}  // namespace ddplab
