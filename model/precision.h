// The numeric precision of a GPU training step (--precision). What is fp32 and what is bf16 in each: docs/GPU.md.
#pragma once
#include "runtime/choices.h"

namespace ddplab {

enum class Precision {
  kFp32,  // fp32 everywhere, GEMMs on fp32 FMA
  kTf32,  // fp32 storage, GEMM inputs rounded to TF32 on the tensor cores, fp32 accumulation
  kBf16,  // bf16 activations and GEMM operands (bf16 copies of the fp32 master weights), fp32 accumulation;
          // parameters, gradients and optimizer state stay fp32
};

constexpr std::array<Named<Precision>, 3> choice_names(Precision) {
  return {{{Precision::kFp32, "fp32"}, {Precision::kTf32, "tf32"}, {Precision::kBf16, "bf16"}}};
}

}  // namespace ddplab
