// Our ring on GPU buffers (comm/ring_cuda.h) under mpirun, for each link (nccl, ipc, host): exact sums in place and
// out of place, bit-for-bit equality with the host ring of the same chunking (the same summation order), agreement
// with NCCL's all-reduce, and the asynchronous path the CUDA reducer uses (ordered after compute, epilogue, events).
//
// Registered at np 1, 2 and 4: on a one-GPU machine np 4 puts four ranks on one GPU, which the ipc and host links
// must handle; the nccl link then skips (NCCL refuses two ranks on one GPU). Without a device every GPU test skips
// with the reason; RingCudaHost.* never skips and runs on its own in ctest (test_ring_cuda_host_npN).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/nccl_allreduce.h"
#include "comm/recursive_doubling.h"
#include "comm/ring_allreduce.h"
#include "comm/ring_cuda.h"
#include "comm/transport.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/elementwise.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/mpi/mpi_test_util.h"

namespace {

using ddplab::ranks_on_this_node;
using ddplab::world_rank;
using ddplab::world_size;
using ddplab::cuda::CudaRingConfig;
using ddplab::cuda::RingAllreduceCuda;
using ddplab::cuda::RingLinkKind;
using ddplab::gpu_test::allreduce_expected_sum;
using ddplab::gpu_test::allreduce_inputs;
using ddplab::gpu_test::BitwiseEqual;
using ddplab::gpu_test::DeviceArray;
using ddplab::gpu_test::device_count;
using ddplab::gpu_test::random_vector;

// 64 KiB chunks: a 1M-float buffer takes several rounds at every world size, so round boundaries are exercised.
constexpr size_t kChunkBytes = size_t{64} << 10;

std::string link_label(RingLinkKind kind) { return ddplab::to_string(kind); }

// ---- host side: runs, and must pass, on every machine -------------------------------------------------------------

TEST(RingCudaHost, LinkNamesRoundTripAndUnknownNamesListTheChoices) {
  for (RingLinkKind k : {RingLinkKind::kAuto, RingLinkKind::kNccl, RingLinkKind::kIpc, RingLinkKind::kHost})
    EXPECT_EQ(ddplab::parse_choice<RingLinkKind>(ddplab::to_string(k), "--ring-link"), k);
  try {
    ddplab::parse_choice<ddplab::RingLinkKind>("shm", "--ring-link");
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("auto, nccl, ipc or host"), std::string::npos) << e.what();
  }
}

// Where a GPU engine applies the mean's scale (comm/stream_allreduce.h): before the sum on fp16, after it (in the
// epilogue) on bf16 and fp32; a scale left with no epilogue to apply it is refused, a scale of 1 needs none.
TEST(RingCudaHost, TheScaleGoesBeforeTheSumOnFp16AndAfterItOtherwise) {
  using ddplab::cuda::split_scale;
  using ddplab::float16::Format;
  const auto before_after = [](std::optional<Format> wire, float scale, bool epilogue) {
    const ddplab::cuda::ScaleAroundSum s = split_scale(wire, scale, epilogue);
    return std::pair(s.before, s.after);
  };
  EXPECT_EQ(before_after(Format::kFp16, 0.25f, true), std::pair(0.25f, 1.0f));
  EXPECT_EQ(before_after(Format::kFp16, 0.25f, false), std::pair(0.25f, 1.0f));
  EXPECT_EQ(before_after(Format::kBf16, 0.25f, true), std::pair(1.0f, 0.25f));
  EXPECT_EQ(before_after(std::nullopt, 0.25f, true), std::pair(1.0f, 0.25f));
  EXPECT_EQ(before_after(std::nullopt, 1.0f, false), std::pair(1.0f, 1.0f));
  EXPECT_THROW(split_scale(std::nullopt, 0.25f, false), std::invalid_argument);
  EXPECT_THROW(split_scale(Format::kBf16, 0.25f, false), std::invalid_argument);
}

// Every rank gets the same verdict: without a device all throw, naming the reason; with one, the host link builds,
// unless the ranks would share a GPU that takes one process at a time: then all throw, naming its compute mode.
TEST(RingCudaHost, ConstructorRefusesOnEveryRankWithoutADeviceOrSucceeds) {
  std::string msg = "(nothing thrown)";
  try {
    RingAllreduceCuda ring(MPI_COMM_WORLD, CudaRingConfig{RingLinkKind::kHost, kChunkBytes});
  } catch (const std::exception& e) {
    msg = e.what();
  }
  if (world_rank() == 0) std::cout << "constructor: " << msg << "\n";
  if (device_count() == 0) {
    EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
  } else if (!ddplab::gpu_test::gpu_sharing_refused(ranks_on_this_node()).empty()) {
    EXPECT_NE(msg.find("compute mode"), std::string::npos) << msg;
  } else {
    EXPECT_EQ(msg, "(nothing thrown)");
  }
}

// ---- on the device --------------------------------------------------------------------------------------------

class RingCudaTest : public ::testing::TestWithParam<RingLinkKind> {
 protected:
  void SetUp() override {
    // Every rank of the (one-node) job sees the same device count, so all skip or none does.
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device: " << ddplab::gpu_test::cuda_info().reason;
    if (GetParam() == RingLinkKind::kNccl && ranks_on_this_node() > device_count())
      GTEST_SKIP() << "the nccl link needs " << ranks_on_this_node() << " GPUs (NCCL refuses two ranks on one GPU; "
                   << device_count() << " here)";
    if (const std::string refused = ddplab::gpu_test::gpu_sharing_refused(ranks_on_this_node()); !refused.empty())
      GTEST_SKIP() << refused;
    ring_ = std::make_unique<RingAllreduceCuda>(MPI_COMM_WORLD, CudaRingConfig{GetParam(), kChunkBytes});
    cudaCheck(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    ring_->begin_step();
  }
  void TearDown() override {
    ring_.reset();
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
  }

  std::unique_ptr<RingAllreduceCuda> ring_;
  // The tests' DeviceArrays upload and download on it: a download sees the ring's result only if the ring's work
  // was ordered before it.
  cudaStream_t compute_ = nullptr;
};

TEST_P(RingCudaTest, ExactSumsInPlaceAndOutOfPlace) {
  const int n_ranks = world_size(), rank = world_rank();
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, (size_t{1} << 20) + 3}) {
    SCOPED_TRACE("count " + std::to_string(n));
    const std::vector<float> inputs = allreduce_inputs(n, rank);
    DeviceArray data(inputs, compute_);
    ring_->allreduce_sum(data.get(), data.get(), n);
    EXPECT_TRUE(BitwiseEqual(data.download(), allreduce_expected_sum(n, n_ranks))) << "in place";

    DeviceArray in(inputs, compute_), out(std::vector<float>(n, -1.0f), compute_);
    ring_->allreduce_sum(in.get(), out.get(), n);
    EXPECT_TRUE(BitwiseEqual(out.download(), allreduce_expected_sum(n, n_ranks))) << "out of place";
    EXPECT_TRUE(BitwiseEqual(in.download(), inputs)) << "the input was written";
  }
}

// What the GPU ring must equal bit for bit, computed in place by the host: the host ring, which shares its schedule
// (with the same chunking every element is summed in the same order), or the host's recursive doubling where the
// GPU ring doubles (at two ranks, and where ranks share a GPU: comm/ring_device.h). The add kernel is one fp32 add,
// like the host loop.
void host_allreduce(std::vector<float>& data, std::optional<ddplab::float16::Format> wire, bool doubling) {
  ddplab::MpiTransport transport(MPI_COMM_WORLD);
  ddplab::RingScratch scratch;
  ddplab::RingOptions options;
  options.slice_elems = kChunkBytes / sizeof(float);
  options.slices_per_chunk = 1;
  options.wire16 = wire.has_value();
  if (wire) options.format = *wire;
  if (doubling) return ddplab::recursive_doubling_allreduce_sum(data.data(), data.size(), transport, scratch, options);
  ddplab::ring_allreduce_sum(data.data(), data.size(), transport, scratch, options);
}

// Two sizes: at 2 ranks the large one doubles and the small one (a tie) goes round the ring; at 4 ranks sharing the
// GPU the small one (two chunks at most) doubles and the large one goes round the ring.
TEST_P(RingCudaTest, RandomInputsMatchTheHostBitForBit) {
  for (size_t n : {(size_t{1} << 20) + 5, size_t{20005}}) {
    SCOPED_TRACE("count " + std::to_string(n) + (ring_->doubles(n) ? ", recursive doubling" : ", the ring"));
    const std::vector<float> inputs = random_vector(static_cast<int64_t>(n), -1.0f, 1.0f, 4242u + world_rank());
    DeviceArray data(inputs, compute_);
    ring_->allreduce_sum(data.get(), data.get(), n);

    std::vector<float> want = inputs;
    host_allreduce(want, std::nullopt, ring_->doubles(n));
    EXPECT_TRUE(BitwiseEqual(data.download(), want));
  }
}

// Against NCCL's all-reduce on the same random inputs: equal within the rounding of a different summation order
// (n_ranks - 1 additions of values in [-1, 1]: a few ulp of n_ranks). NCCL needs a GPU per rank.
TEST_P(RingCudaTest, AgreesWithNcclWithinRounding) {
  if (ranks_on_this_node() > device_count()) GTEST_SKIP() << "NCCL needs a GPU per rank";
  const size_t n = size_t{1} << 20;
  const std::vector<float> inputs = random_vector(static_cast<int64_t>(n), -1.0f, 1.0f, 777u + world_rank());
  DeviceArray ours(inputs, compute_);
  ring_->allreduce_sum(ours.get(), ours.get(), n);
  const std::vector<float> got = ours.download();
  ring_.reset();  // one engine at a time on the device

  ddplab::cuda::NcclAllreduce nccl(MPI_COMM_WORLD);
  nccl.begin_step();
  DeviceArray theirs(inputs, compute_);
  nccl.allreduce_async(theirs.get(), n, /*average=*/false, compute_);
  nccl.wait(compute_);
  const std::vector<float> want = theirs.download();
  const float tol = 4 * world_size() * 1.2e-7f;
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
}

// The 16-bit wires: our ring's words are the host's on that wire bit for bit (host_allreduce, comm/wire.h's
// rounding on both sides), and the decoded sum stays within the rounding the wire explains of the exact sum: each of
// the ring's n - 1 hops rounds a partial sum once, so |error| <= n u sum_r |x_r| with u = 2^-8 (bf16) or 2^-11
// (fp16); recursive doubling rounds every operand and then each of its log2 n sums, (log2 n + 1) u sum_r |x_r| to
// first order (+ 0.05 u for the products of roundings). Two sizes, so that each algorithm runs at 2 and at 4 ranks
// sharing the GPU (as in RandomInputsMatchTheHostBitForBit). No ASSERT inside the loop: a rank that left the test
// early would pair its next collectives with the others' and hang them.
TEST_P(RingCudaTest, SixteenBitWiresMatchTheHostAndStayWithinTheirRounding) {
  const int ranks = world_size();
  ring_.reset();  // one engine at a time on the device
  for (ddplab::float16::Format f : {ddplab::float16::Format::kBf16, ddplab::float16::Format::kFp16}) {
    CudaRingConfig config{GetParam(), kChunkBytes};
    config.wire = f;
    RingAllreduceCuda ring(MPI_COMM_WORLD, config);
    for (size_t n : {(size_t{1} << 20) + 5, size_t{20005}}) {
      SCOPED_TRACE(std::string(f == ddplab::float16::Format::kBf16 ? "bf16" : "fp16") + ", count " + std::to_string(n) +
                   (ring.doubles(n) ? ", recursive doubling" : ", the ring"));
      std::vector<std::vector<float>> all(ranks);
      for (int r = 0; r < ranks; ++r) all[r] = random_vector(static_cast<int64_t>(n), -1.0f, 1.0f, 99u + r);
      DeviceArray data(all[world_rank()], compute_);
      ring.allreduce_sum(data.get(), data.get(), n);
      const std::vector<float> got = data.download();

      std::vector<float> want = all[world_rank()];
      host_allreduce(want, f, ring.doubles(n));
      EXPECT_TRUE(BitwiseEqual(got, want));

      const double u = f == ddplab::float16::Format::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      const double roundings = ring.doubles(n) ? (std::log2(ranks) + 1.05) * u : ranks * u;
      size_t beyond = 0, first = n;
      for (size_t i = 0; i < n; ++i) {
        double exact = 0, magnitude = 0;
        for (int r = 0; r < ranks; ++r) exact += all[r][i], magnitude += std::fabs(all[r][i]);
        if (std::fabs(got[i] - exact) > roundings * magnitude) first = std::min(first, i), ++beyond;
      }
      EXPECT_EQ(beyond, 0u) << "elements beyond the wire's rounding, the first at " << first;
    }
  }
}

// The reducer's call on a 16-bit wire, the mean (scale 1 / n, here halved so that one rank scales too): fp16 ends at
// 65504, so each rank scales its own values before the sum, and gradients near 40000 on every rank average to near
// 20000 where their sum would be inf;
// bf16 leaves the scale to the epilogue, where the reducer fuses it with the finiteness check. Either way the result
// is the host Communicator's bit for bit: the host ring on that wire, with the scale where comm/wire.h puts it. Two
// sizes, so that each algorithm runs (as in RandomInputsMatchTheHostBitForBit).
TEST_P(RingCudaTest, TheMeanOverAnFp16WireScalesEachRanksValuesBeforeTheSum) {
  const int ranks = world_size();
  const float mean = 0.5f / static_cast<float>(ranks);
  ring_.reset();  // one engine at a time on the device
  for (ddplab::float16::Format f : {ddplab::float16::Format::kBf16, ddplab::float16::Format::kFp16}) {
    const bool fp16 = f == ddplab::float16::Format::kFp16;
    CudaRingConfig config{GetParam(), kChunkBytes};
    config.wire = f;
    RingAllreduceCuda ring(MPI_COMM_WORLD, config);
    ring.begin_step();
    for (size_t n : {(size_t{1} << 20) + 5, size_t{20005}}) {
      SCOPED_TRACE(std::string(fp16 ? "fp16" : "bf16") + ", count " + std::to_string(n) +
                   (ring.doubles(n) ? ", recursive doubling" : ", the ring"));
      const std::vector<float> mine = random_vector(static_cast<int64_t>(n), 30000.0f, 50000.0f, 5u + world_rank());
      DeviceArray data(mine, compute_);
      float left = -1;  // what the engine left for the epilogue; written on its comm thread, read after wait()
      float* g = data.get();
      ring.allreduce_scaled_async(g, n, mean, compute_, /*tag=*/0, [&left, g, n](cudaStream_t comm_stream, float s) {
        left = s;
        ddplab::cuda::scale(g, s, static_cast<int64_t>(n), comm_stream);
      });
      ring.wait(compute_);
      const std::vector<float> got = data.download();
      ring.synchronize();
      ring.begin_step();

      std::vector<float> want = mine;
      if (fp16)
        for (float& x : want) x *= mean;
      host_allreduce(want, f, ring.doubles(n));
      if (!fp16)
        for (float& x : want) x *= mean;
      EXPECT_EQ(left, fp16 ? 1.0f : mean);
      EXPECT_TRUE(BitwiseEqual(got, want));
      EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); }));
    }
  }
}

// The reducer's path: queued behind compute, the epilogue on the comm stream after the sum, the compute stream held
// by wait(), the events ordered; several buckets in a row, of two sizes, so that the comm thread runs both algorithms
// one after the other at 2 and at 4 ranks sharing the GPU (see RandomInputsMatchTheHostBitForBit).
TEST_P(RingCudaTest, AsyncBucketsRunAfterComputeWithTheirEpilogue) {
  const int n_ranks = world_size(), rank = world_rank();
  constexpr int kBuckets = 4;
  const auto count_of = [](int bucket) { return bucket % 2 == 0 ? (size_t{1} << 18) + 7 : size_t{20005}; };
  std::vector<std::unique_ptr<DeviceArray>> grads;
  for (int b = 0; b < kBuckets; ++b)
    grads.push_back(std::make_unique<DeviceArray>(allreduce_inputs(count_of(b), rank + b), compute_));
  const cudaEvent_t origin = ring_->mark(compute_);
  std::vector<ddplab::cuda::AllreduceEvents> events;
  for (int b = 0; b < kBuckets; ++b) {
    const size_t n = count_of(b);
    float* g = grads[b]->get();
    ddplab::cuda::scale(g, 2.0f, static_cast<int64_t>(n), compute_);  // "backward" makes the gradients final
    events.push_back(ring_->allreduce_scaled_async(g, n, 0.5f, compute_, b, [g, n](cudaStream_t comm_stream, float s) {
      ddplab::cuda::scale(g, s, static_cast<int64_t>(n), comm_stream);
    }));
  }
  ring_->wait(compute_);
  for (int b = 0; b < kBuckets; ++b) {
    EXPECT_TRUE(BitwiseEqual(grads[b]->download(), allreduce_expected_sum(count_of(b), n_ranks, b)))
        << "bucket " << b << (ring_->doubles(count_of(b)) ? ", recursive doubling" : ", the ring");
  }
  ring_->synchronize();
  float previous_end = 0;
  for (int b = 0; b < kBuckets; ++b) {
    const float ready = ddplab::cuda::elapsed_ms(origin, events[b].ready);
    const float start = ddplab::cuda::elapsed_ms(origin, events[b].start);
    const float end = ddplab::cuda::elapsed_ms(origin, events[b].end);
    EXPECT_GE(start, ready) << "bucket " << b;
    EXPECT_GE(end, start) << "bucket " << b;
    EXPECT_GE(start, previous_end) << "buckets ran out of order";
    previous_end = end;
  }
}

// The link table: auto takes the first link that connects the whole ring (ipc, every rank on one node) and so names
// nothing it passed over (only the algorithm beside the ring); an explicit link that cannot connect is refused on
// every rank, with the reason.
TEST(RingCudaLinks, AutoTakesIpcOnOneNodeAndAnNcclRingOnASharedGpuSaysWhyNot) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device: " << ddplab::gpu_test::cuda_info().reason;
  if (const std::string refused = ddplab::gpu_test::gpu_sharing_refused(ranks_on_this_node()); !refused.empty())
    GTEST_SKIP() << refused;
  {
    RingAllreduceCuda ring(MPI_COMM_WORLD, CudaRingConfig{RingLinkKind::kAuto, kChunkBytes});
    // Recursive doubling for some buffers at two ranks, and where ranks share the GPU.
    const int n = world_size();
    const bool doubles = n == 2 || (n > 2 && ranks_on_this_node() > device_count());
    EXPECT_EQ(std::string(ring.name()), doubles ? "ring/ipc + recursive doubling" : "ring/ipc");
  }
  if (ranks_on_this_node() <= device_count()) return;  // a GPU per rank: the nccl link connects (RingCudaTest)
  std::string msg = "(nothing thrown)";
  try {
    RingAllreduceCuda ring(MPI_COMM_WORLD, CudaRingConfig{RingLinkKind::kNccl, kChunkBytes});
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("the nccl link cannot connect: ranks share a GPU"), std::string::npos) << msg;
}

// --link on the GPU ring: the same sums bit for bit (the emulation only delays each exchange; comm/ring_device.h),
// the engine's name says so, and ranks sharing the GPU keep to the ring beyond two ranks, as the emulated link
// times each exchange by its bytes.
TEST_P(RingCudaTest, AnEmulatedLinkKeepsTheSumsAndSaysSo) {
  const int n_ranks = world_size(), rank = world_rank();
  CudaRingConfig config{GetParam(), kChunkBytes};
  config.links = ddplab::parse_links("10gbe");
  ring_.reset();  // one engine at a time on the device
  RingAllreduceCuda ring(MPI_COMM_WORLD, config);
  const std::string name = ring.name();
  EXPECT_NE(name.find(" + link emulation"), std::string::npos) << name;
  EXPECT_EQ(name.find("recursive doubling") != std::string::npos, n_ranks == 2) << name;
  for (size_t n : {size_t{1000}, size_t{20005}}) {
    SCOPED_TRACE("count " + std::to_string(n));
    DeviceArray data(allreduce_inputs(n, rank), compute_);
    ring.allreduce_sum(data.get(), data.get(), n);
    EXPECT_TRUE(BitwiseEqual(data.download(), allreduce_expected_sum(n, n_ranks)));
  }
}

INSTANTIATE_TEST_SUITE_P(Links, RingCudaTest,
                         ::testing::Values(RingLinkKind::kNccl, RingLinkKind::kIpc, RingLinkKind::kHost),
                         [](const auto& info) { return link_label(info.param); });

}  // namespace
