// The wire casts' launchers (kernels: wire_cast_kernels.cuh; contracts: wire_cast.h).
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/wire_cast.h"
#include "kernels/cuda/wire_cast_kernels.cuh"

namespace ddplab::cuda {
namespace {

// One launch of the format's instance of a kernel over n elements, 4 per access where `packs` (map_packs_fit).
template <typename... Params, typename... Args>
void launch(const char* what, float16::Format f, int64_t n, bool packs, cudaStream_t stream,
            void (*bf16_packed)(Params...), void (*bf16)(Params...), void (*fp16_packed)(Params...),
            void (*fp16)(Params...), Args... args) {
  if (n < 0) throw std::invalid_argument(std::string(what) + ": negative n " + std::to_string(n));
  if (n == 0) return;
  if (f == float16::Format::kBf16)
    detail::launch_packed(packs, n, stream, bf16_packed, bf16, args..., n);
  else
    detail::launch_packed(packs, n, stream, fp16_packed, fp16, args..., n);
  cudaCheck(cudaGetLastError());
}

using float16::Format;

}  // namespace

void wire_encode(float16::Format f, uint16_t* dst, const float* src, int64_t n, cudaStream_t stream) {
  using wire_cast::encode_kernel;
  launch("wire_encode", f, n, detail::map_packs_fit(dst, src), stream, encode_kernel<Format::kBf16, 4>,
         encode_kernel<Format::kBf16, 1>, encode_kernel<Format::kFp16, 4>, encode_kernel<Format::kFp16, 1>, dst, src);
}

void wire_decode(float16::Format f, float* dst, const uint16_t* src, int64_t n, cudaStream_t stream) {
  using wire_cast::decode_kernel;
  launch("wire_decode", f, n, detail::map_packs_fit(dst, src), stream, decode_kernel<Format::kBf16, 4>,
         decode_kernel<Format::kBf16, 1>, decode_kernel<Format::kFp16, 4>, decode_kernel<Format::kFp16, 1>, dst, src);
}

void wire_add_encode(float16::Format f, uint16_t* io, const float* own, int64_t n, cudaStream_t stream) {
  using wire_cast::add_encode_kernel;
  launch("wire_add_encode", f, n, detail::map_packs_fit(io, own), stream, add_encode_kernel<Format::kBf16, 4>,
         add_encode_kernel<Format::kBf16, 1>, add_encode_kernel<Format::kFp16, 4>, add_encode_kernel<Format::kFp16, 1>,
         io, own);
}

}  // namespace ddplab::cuda
