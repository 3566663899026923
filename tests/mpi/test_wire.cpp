// 16-bit wire formats: conversions (scalar reference vs the vector paths, rounding, special values) and the
// error of all-reduces with a bf16/fp16 wire against the exact sum, with every rank bitwise identical.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "comm/wire.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddplab {
namespace {

using float16::Format;

// Every 16-bit word: decode is exact (the fp32 has the same value), and encode(decode(h)) == h for non-NaN.
TEST(Wire, EveryWordRoundTrips) {
  std::vector<uint16_t> all(65536), back(65536);
  for (int h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  for (Format f : {Format::kBf16, Format::kFp16}) {
    std::vector<float> dec(65536);
    wire::decode(f, dec.data(), all.data(), all.size());  // vector path (8 at a time) for fp16
    wire::encode(f, back.data(), dec.data(), dec.size());
    size_t wrong = 0;
    for (int h = 0; h < 65536; ++h) {
      const float scalar = float16::to_f32(f, all[h]);
      const bool nan = std::isnan(scalar);
      if (nan != std::isnan(dec[h]) || (!nan && (scalar != dec[h] || back[h] != all[h]))) ++wrong;
      if (nan && !std::isnan(float16::to_f32(f, back[h]))) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << (f == Format::kBf16 ? "bf16" : "fp16");
  }
  EXPECT_EQ(float16::fp16_to_f32_scalar(0x3c00), 1.0f);
  EXPECT_EQ(float16::fp16_to_f32_scalar(0x7bff), 65504.0f);
  EXPECT_EQ(float16::fp16_to_f32_scalar(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(float16::bf16_to_f32(0x3f80), 1.0f);
}

// Round to nearest, ties to even, overflow to inf, underflow through subnormals — scalar and vector paths agree.
TEST(Wire, EncodeRoundsToNearestEvenOnBothPaths) {
  std::vector<float> x = {1.0f + std::ldexp(1.0f, -8),      // bf16 tie: 1 + half an ulp -> 1 (even)
                          1.0f + 3 * std::ldexp(1.0f, -8),  // tie -> up to the even neighbour
                          1.0f + std::ldexp(1.0f, -11),     // fp16 tie -> 1
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          1e30f,
                          -1e30f,
                          std::ldexp(1.0f, -25),
                          std::ldexp(1.5f, -25),
                          std::ldexp(1.0f, -24),
                          3e-8f,
                          0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          1e-40f};
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits;
  while (x.size() < 100'000) {
    const uint32_t u = bits(gen);
    float f;
    std::memcpy(&f, &u, sizeof f);
    if (!std::isnan(f)) x.push_back(f);
  }
  for (Format f : {Format::kBf16, Format::kFp16}) {
    std::vector<uint16_t> vec(x.size());
    wire::encode(f, vec.data(), x.data(), x.size());
    size_t wrong = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t s = float16::from_f32(f, x[i]);
      // Reference: the nearest representable value, ties to the even word, from double arithmetic.
      const double v = x[i];
      const float lo = float16::to_f32(f, s);
      bool ok = s == vec[i];
      if (std::isfinite(lo)) {
        // no other word is closer: neighbours one word up and down
        for (int d : {-1, 1}) {
          const uint16_t nb = static_cast<uint16_t>(s + d);
          const float other = float16::to_f32(f, nb);
          if (std::isnan(other) || (s & 0x7fff) == 0) continue;
          const double dl = std::fabs(v - lo), dn = std::fabs(v - other);
          if (dn < dl || (dn == dl && (s & 1))) ok = false;
        }
      } else {  // inf: the value is beyond the largest finite word plus half an ulp
        ok = ok && std::fabs(v) >= (f == Format::kBf16 ? 3.3961776e38 : 65520.0);
      }
      wrong += !ok;
    }
    EXPECT_EQ(wrong, 0u) << (f == Format::kBf16 ? "bf16" : "fp16");
  }
  EXPECT_EQ(float16::f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float16::f32_to_fp16_scalar(65520.0f), 0x7c00);
  EXPECT_EQ(float16::f32_to_fp16_scalar(65519.0f), 0x7bff);
  EXPECT_EQ(float16::f32_to_fp16_scalar(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(float16::f32_to_fp16_scalar(std::ldexp(1.5f, -25)), 0x0001);
}

// All-reduce with a 16-bit wire on positive inputs: each addend and each partial sum is rounded once on its way
// (at most n roundings along any element's path, ring or recursive doubling), so the result is within n * u of
// the exact sum (u = 2^-8 for bf16, 2^-11 for fp16; first order, plus fp32's own error). Every rank holds the
// same bits. The hierarchical all-reduce too, over emulated nodes of 2 ranks (of 1 at 2 and 3 ranks): its paths
// round within the node and across nodes, still at most n times.
struct Case {
  WireDtype wire;
  size_t count;
  AllreduceImpl impl = AllreduceImpl::kRing;
};
class WireAllreduce : public testing::TestWithParam<Case> {};

TEST_P(WireAllreduce, WithinTheErrorBoundAndBitwiseEqualAcrossRanks) {
  const int r = world_rank(), n = world_size();
  const auto [dtype, count, impl] = GetParam();
  if (impl == AllreduceImpl::kHier && n == 1) GTEST_SKIP() << "hier needs two nodes";
  CommOptions options{impl, dtype, LinkModel{}};
  if (impl == AllreduceImpl::kHier) options.ranks_per_node = n % 2 == 0 && n > 2 ? 2 : 1;
  Communicator comm(MPI_COMM_WORLD, options);
  std::mt19937 gen(100 + r);
  std::uniform_real_distribution<float> dist(0.01f, 100.0f);
  std::vector<float> x(count), exact_f(count);
  for (float& v : x) v = dist(gen);
  std::vector<double> exact(count);
  for (size_t i = 0; i < count; ++i) exact[i] = x[i];
  MPI_Allreduce(MPI_IN_PLACE, exact.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  comm.allreduce_sum(x.data(), count, 0);
  if (n == 1) return;  // nothing travels: the input is the result
  const double u = dtype == WireDtype::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  double worst = 0;
  for (size_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(x[i] - exact[i]) / exact[i]);
  if (r == 0)
    std::printf("[ wire     ] %s n=%d count %zu: worst relative error %.3g = %.2f u\n", to_string(dtype), n, count,
                worst, worst / u);
  EXPECT_LE(worst, n * u * 1.001) << "worst relative error " << worst << ", bound n*u = " << n * u;
  EXPECT_GT(worst, 0.0) << "a 16-bit wire that rounds nothing?";
  // bitwise equal across ranks
  std::vector<uint32_t> lo(count), hi(count);
  std::memcpy(lo.data(), x.data(), count * 4);
  hi = lo;
  MPI_Allreduce(MPI_IN_PLACE, lo.data(), static_cast<int>(count), MPI_UINT32_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, hi.data(), static_cast<int>(count), MPI_UINT32_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi) << "ranks disagree";
  // the result is a value of the wire format (every rank keeps the rounded sum)
  size_t off_grid = 0;
  for (float v : x) {
    const Format f = *wire_format(dtype);
    off_grid += float16::to_f32(f, float16::from_f32(f, v)) != v;
  }
  EXPECT_EQ(off_grid, 0u);
}

// 1000 elements take recursive doubling, 300k the sliced ring.
INSTANTIATE_TEST_SUITE_P(Wires, WireAllreduce,
                         testing::Values(Case{WireDtype::kBf16, 1000}, Case{WireDtype::kBf16, 300'000},
                                         Case{WireDtype::kFp16, 1000}, Case{WireDtype::kFp16, 300'000},
                                         Case{WireDtype::kBf16, 300'000, AllreduceImpl::kHier},
                                         Case{WireDtype::kFp16, 300'000, AllreduceImpl::kHier}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return std::string(to_string(info.param.wire)) + "_" + std::to_string(info.param.count) +
                                  (info.param.impl == AllreduceImpl::kHier ? "_hier" : "");
                         });

// The gradients' mean over an fp16 wire, of values whose sum passes fp16's 65504 while each rank's share does not:
// every rank scales its own before the sum, so the mean is finite and within the wire's error of the exact one.
// Recursive doubling (1000) and the ring (300k).
TEST(Wire, Fp16MeanOfLargeGradientsDoesNotOverflow) {
  const int n = world_size();
  if (n == 1) GTEST_SKIP() << "one rank: nothing travels";
  for (const size_t count : {size_t{1000}, size_t{300'000}}) {
    Communicator comm(MPI_COMM_WORLD, CommOptions{AllreduceImpl::kRing, WireDtype::kFp16, LinkModel{}});
    std::vector<float> g(count, 40000.0f);  // exact in fp16; n of them sum past 65504
    const bool finite = comm.allreduce_gradients(g.data(), count, 1.0f / static_cast<float>(n), 0);
    EXPECT_TRUE(finite) << count << " elements: the mean of 40000s reported non-finite";
    double worst = 0;
    for (float v : g) worst = std::max(worst, std::fabs(v - 40000.0) / 40000.0);
    EXPECT_LE(worst, (n + 1) * std::ldexp(1.0, -11)) << count << " elements: " << g[0];
  }
}

TEST(Wire, MpiRefusesA16BitWire) {
  EXPECT_THROW(Communicator(MPI_COMM_WORLD, CommOptions{AllreduceImpl::kMpi, WireDtype::kBf16, LinkModel{}}),
               std::invalid_argument);
  EXPECT_EQ(parse_choice<WireDtype>("bf16", "--comm-dtype"), WireDtype::kBf16);
  EXPECT_EQ(parse_choice<WireDtype>("fp16", "--comm-dtype"), WireDtype::kFp16);
  EXPECT_EQ(parse_choice<WireDtype>("fp32", "--comm-dtype"), WireDtype::kFp32);
  EXPECT_THROW(parse_choice<WireDtype>("int8", "--comm-dtype"), std::invalid_argument);
}

}  // namespace
}  // namespace ddplab
