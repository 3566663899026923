// The numeric precision of a GPU training step (--precision). What is fp32 and what is bf16 in each: docs/GPU.md.
#pragma once
#include <stdexcept>
#include <string>

namespace ddplab {

enum class Precision {
  kFp32,  // fp32 everywhere, GEMMs on fp32 FMA
  kTf32,  // fp32 storage, GEMM inputs rounded to TF32 on the tensor cores, fp32 accumulation
  kBf16,  // bf16 activations and GEMM operands (bf16 copies of the fp32 master weights), fp32 accumulation;
          // parameters, gradients and optimizer state stay fp32
};

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

inline Precision parse_precision(const std::string& name) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16})
    if (name == precision_name(p)) return p;
  throw std::invalid_argument("unknown precision '" + name + "' (expected fp32, tf32 or bf16)");
}

}  // namespace ddplab
