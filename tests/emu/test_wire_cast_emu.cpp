// The 16-bit wire's cast kernels (kernels/cuda/wire_cast_kernels.cuh), their own source compiled by g++ and run by
// the emulation (cuda_emulation.h), against the CPU wire (comm/wire.h: encode, decode, reduce_encode): every 16-bit
// word, the fp32 values around each rounding boundary, the special values and random bits, through a grid smaller
// than the data so that the grid-stride loop and its tail run; each kernel packed (4 elements per access) and scalar.
// What it cannot tell: speed.
// clang-format off
#include "tests/emu/cuda_emulation.h"  // first: the device vocabulary the kernels are compiled with
#include "kernels/cuda/wire_cast_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "comm/wire.h"

namespace {

namespace float16 = ddplab::float16;
namespace wire = ddplab::wire;
namespace wc = ddplab::cuda::wire_cast;
using float16::Format;

const dim3 kGrid(3), kBlock(64);

const char* name(Format f) { return f == Format::kBf16 ? "bf16" : "fp16"; }

// Every word of the format decoded, each neighbour one fp32 ulp either side and the midpoint to the next word (the
// ties that round to even), the specials, and random fp32 bit patterns.
std::vector<float> boundary_values(Format f) {
  std::vector<float> v;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float x = float16::to_f32(f, static_cast<uint16_t>(h));
    const uint32_t u = float16::f32_bits(x);
    v.insert(v.end(), {x, float16::bits_f32(u + 1), float16::bits_f32(u - 1)});
    const float next = float16::to_f32(f, static_cast<uint16_t>(h + 1));
    v.push_back(x + (next - x) / 2);
  }
  constexpr float kInf = std::numeric_limits<float>::infinity();
  v.insert(v.end(), {0.f, -0.f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), float16::bits_f32(0x7f800001u),
                     float16::bits_f32(0xffc00123u), 65504.f, 65519.99f, 65520.f, 1e-8f, -3e-8f, 1e-45f});
  std::mt19937 gen(17);
  for (int i = 0; i < 100000; ++i) v.push_back(float16::bits_f32(gen()));
  return v;
}

// Each kernel as the launcher runs it: 4 elements per access (packed) or 1.
const char* name(bool packed) { return packed ? "packed" : "scalar"; }

// The format's and the access width's instance of a kernel, run over n elements (as wire_cast.cu's launch picks).
template <typename... Params, typename... Args>
void emulate(Format f, bool packed, void (*bf16_packed)(Params...), void (*bf16)(Params...),
             void (*fp16_packed)(Params...), void (*fp16)(Params...), Args... args) {
  const auto kernel = f == Format::kBf16 ? (packed ? bf16_packed : bf16) : (packed ? fp16_packed : fp16);
  ddplab::emu::emulate_launch(kGrid, kBlock, 0, kernel, args...);
}

std::vector<uint16_t> emulated_encode(Format f, bool packed, const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  emulate(f, packed, wc::encode_kernel<Format::kBf16, 4>, wc::encode_kernel<Format::kBf16, 1>,
          wc::encode_kernel<Format::kFp16, 4>, wc::encode_kernel<Format::kFp16, 1>, out.data(), x.data(),
          static_cast<int64_t>(x.size()));
  return out;
}

TEST(WireCastEmulated, EncodeRoundsAsTheCpuWire) {
  for (Format f : {Format::kBf16, Format::kFp16})
    for (bool packed : {true, false}) {
      SCOPED_TRACE(std::string(name(f)) + ", " + name(packed));
      const std::vector<float> x = boundary_values(f);
      std::vector<uint16_t> want(x.size());
      wire::encode(f, want.data(), x.data(), x.size());
      const std::vector<uint16_t> got = emulated_encode(f, packed, x);
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << "element " << i << " (fp32 bits 0x" << std::hex << float16::f32_bits(x[i]) << ")";
    }
}

// Every word, then one more (word 0 again): a count that is no multiple of the packs, so the tail runs.
TEST(WireCastEmulated, DecodeIsTheCpuWiresOnEveryWord) {
  std::vector<uint16_t> words(0x10001);
  for (uint32_t h = 0; h < words.size(); ++h) words[h] = static_cast<uint16_t>(h);
  const auto n = static_cast<int64_t>(words.size());
  for (Format f : {Format::kBf16, Format::kFp16})
    for (bool packed : {true, false}) {
      SCOPED_TRACE(std::string(name(f)) + ", " + name(packed));
      std::vector<float> want(words.size()), got(words.size(), -1.f);
      wire::decode(f, want.data(), words.data(), words.size());
      emulate(f, packed, wc::decode_kernel<Format::kBf16, 4>, wc::decode_kernel<Format::kBf16, 1>,
              wc::decode_kernel<Format::kFp16, 4>, wc::decode_kernel<Format::kFp16, 1>, got.data(), words.data(), n);
      for (size_t i = 0; i < words.size(); ++i)
        ASSERT_EQ(float16::f32_bits(got[i]), float16::f32_bits(want[i])) << "word 0x" << std::hex << i;
    }
}

// A reduce-scatter hop: the CPU ring's reduce_encode (acc += to32(in); out = to16(acc)) gives the words, and so does
// the host's own add_encode, which the device ring runs on host memory (with F16C's 8 at a time for fp16).
TEST(WireCastEmulated, AddEncodeIsTheCpuRingsHop) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  for (Format f : {Format::kBf16, Format::kFp16})
    for (bool packed : {true, false}) {
      SCOPED_TRACE(std::string(name(f)) + ", " + name(packed));
      for (size_t count : {size_t{0}, size_t{1}, size_t{191}, size_t{192}, size_t{50001}}) {
        std::vector<float> own(count), incoming(count);
        for (float& x : own) x = dist(gen);
        for (float& x : incoming) x = dist(gen);
        std::vector<uint16_t> in16(count), want(count);
        wire::encode(f, in16.data(), incoming.data(), count);
        std::vector<float> acc = own;
        wire::reduce_encode(f, acc.data(), want.data(), in16.data(), count);
        std::vector<uint16_t> got = in16;
        emulate(f, packed, wc::add_encode_kernel<Format::kBf16, 4>, wc::add_encode_kernel<Format::kBf16, 1>,
                wc::add_encode_kernel<Format::kFp16, 4>, wc::add_encode_kernel<Format::kFp16, 1>, got.data(),
                own.data(), static_cast<int64_t>(count));
        ASSERT_EQ(got, want) << count << " elements";
        std::vector<uint16_t> host = in16;
        wire::add_encode(f, host.data(), own.data(), count);
        ASSERT_EQ(host, want) << count << " elements, wire::add_encode";
      }
    }
}

}  // namespace
