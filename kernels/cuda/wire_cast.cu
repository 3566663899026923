// The wire casts' launchers (kernels: wire_cast_kernels.cuh; contracts: wire_cast.h).
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/wire_cast.h"
#include "kernels/cuda/wire_cast_kernels.cuh"

namespace ddplab::cuda {
namespace {

// One launch of the format's instance of a kernel over n elements.
template <typename... Params, typename... Args>
void launch(const char* what, wire::Format f, int64_t n, cudaStream_t stream, void (*bf16)(Params...),
            void (*fp16)(Params...), Args... args) {
  if (n < 0) throw std::invalid_argument(std::string(what) + ": negative n " + std::to_string(n));
  if (n == 0) return;
  (f == wire::Format::kBf16 ? bf16 : fp16)<<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(args..., n);
  cudaCheck(cudaGetLastError());
}

using wire::Format;

}  // namespace

void wire_encode(wire::Format f, uint16_t* dst, const float* src, int64_t n, cudaStream_t stream) {
  launch("wire_encode", f, n, stream, wire_cast::encode_kernel<Format::kBf16>, wire_cast::encode_kernel<Format::kFp16>,
         dst, src);
}

void wire_decode(wire::Format f, float* dst, const uint16_t* src, int64_t n, cudaStream_t stream) {
  launch("wire_decode", f, n, stream, wire_cast::decode_kernel<Format::kBf16>, wire_cast::decode_kernel<Format::kFp16>,
         dst, src);
}

void wire_add_encode(wire::Format f, uint16_t* io, const float* own, int64_t n, cudaStream_t stream) {
  launch("wire_add_encode", f, n, stream, wire_cast::add_encode_kernel<Format::kBf16>,
         wire_cast::add_encode_kernel<Format::kFp16>, io, own);
}

}  // namespace ddplab::cuda
