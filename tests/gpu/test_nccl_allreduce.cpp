// NcclAllreduce under mpirun (tests/mpi/mpi_test_main.cpp): exact sums and averages, ordering against the compute
// stream, overlap with it, and the per-call timing events.
//
// Inputs are small integers, so every sum is exact in fp32 whatever order NCCL reduces in, and results are compared
// bit for bit (after nccl-tests). Without a device the GPU tests skip with the reason on every rank; with fewer GPUs
// than ranks on the node they skip too (NCCL refuses two ranks on one GPU). NcclHost.* never skips: ctest runs it
// on its own (test_nccl_allreduce_host_npN), so the constructor's refusal paths are checked on every machine.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/nccl_allreduce.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/elementwise.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/mpi/mpi_test_util.h"

namespace {

using ddplab::cuda::NcclAllreduce;

using ddplab::gpu_test::kGuard;               // trailing elements NCCL must not touch
constexpr uint32_t kPoisonBits = 0xFFFFFFFF;  // a NaN, and what cudaMemset(0xFF) writes

using ddplab::gpu_test::device_count;
using ddplab::ranks_on_this_node;
using ddplab::world_rank;

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

using ddplab::gpu_test::allreduce_expected_sum;
using ddplab::gpu_test::allreduce_input;
using ddplab::gpu_test::BitwiseEqual;
using ddplab::gpu_test::random_vector;

std::string CaughtMessage(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// ---- host side: runs, and must pass, on every machine -------------------------------------------------------------

TEST(NcclHost, AvailabilityGivesAReasonOrNothing) {
  const std::string reason = NcclAllreduce::availability();
  if (world_rank() == 0) std::cout << "NcclAllreduce::availability(): " << (reason.empty() ? "usable" : reason) << "\n";
  EXPECT_EQ(reason.empty(), device_count() > 0) << reason;
}

// Every rank gets the same verdict: all construct, or all throw with a message that says why (a rank that threw
// alone would leave the others hanging in NCCL's bootstrap, and this test would time out instead of finishing).
TEST(NcclHost, ConstructorRefusesOnEveryRankOrSucceeds) {
  const std::string reason = NcclAllreduce::availability();
  const int devices = device_count(), local = ranks_on_this_node();
  const std::string msg = CaughtMessage([] { NcclAllreduce comm(MPI_COMM_WORLD); });
  if (!reason.empty()) {
    EXPECT_NE(msg.find(reason), std::string::npos) << msg;
  } else if (local > devices) {
    // The rank whose GPU is taken says so; the others say another rank failed.
    EXPECT_TRUE(msg.find("Duplicate GPU detected") != std::string::npos ||
                msg.find("another rank") != std::string::npos)
        << msg;
    if (msg.find("Duplicate GPU") != std::string::npos) {
      EXPECT_NE(msg.find("at most one rank per GPU"), std::string::npos) << msg;
    }
  } else {
    EXPECT_EQ(msg, "(nothing thrown)");
  }
  if (world_rank() == 0) std::cout << "constructor: " << msg << "\n";
}

// ---- on the device --------------------------------------------------------------------------------------------

class NcclAllreduceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_reason_ = NcclAllreduce::availability();
    if (skip_reason_.empty() && ranks_on_this_node() > device_count())
      skip_reason_ = "needs " + std::to_string(ranks_on_this_node()) + " GPUs: NCCL refuses two ranks on one GPU (" +
                     std::to_string(device_count()) + " here)";
    if (!skip_reason_.empty()) return;
    try {
      comm_ = std::make_unique<NcclAllreduce>(MPI_COMM_WORLD);
    } catch (const std::exception& e) {
      init_error_ = e.what();
    }
  }
  static void TearDownTestSuite() { comm_.reset(); }

  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    if (!comm_) GTEST_FAIL() << "NcclAllreduce construction failed: " << init_error_;
    cudaCheck(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    comm_->begin_step();
  }
  void TearDown() override {
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
  }

  // n floats with rank's inputs, plus a guard tail of poison.
  float* upload_inputs(size_t n) {
    float* d = nullptr;
    cudaCheck(cudaMalloc(&d, (n + kGuard) * sizeof(float)));
    cudaCheck(cudaMemsetAsync(d, 0xFF, (n + kGuard) * sizeof(float), compute_));
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = allreduce_input(i, comm_->rank());
    cudaCheck(cudaMemcpyAsync(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, compute_));
    cudaCheck(cudaStreamSynchronize(compute_));
    return d;
  }
  // Copies on the compute stream, so it sees the result only if wait() ordered it after the all-reduce.
  std::vector<float> download(const float* d, size_t n) {
    std::vector<float> all(n + kGuard);
    cudaCheck(cudaMemcpyAsync(all.data(), d, all.size() * sizeof(float), cudaMemcpyDeviceToHost, compute_));
    cudaCheck(cudaStreamSynchronize(compute_));
    for (size_t i = n; i < all.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &all[i], sizeof(bits));
      EXPECT_EQ(bits, kPoisonBits) << "written past the end: element " << i << " of " << n;
    }
    all.resize(n);
    return all;
  }

  static inline std::unique_ptr<NcclAllreduce> comm_;
  static inline std::string skip_reason_, init_error_;
  cudaStream_t compute_ = nullptr;
};

TEST_F(NcclAllreduceTest, ExactSumsAndAverages) {
  const int n_ranks = comm_->size();
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, (size_t{1} << 20) + 3}) {
    for (bool average : {false, true}) {
      SCOPED_TRACE("count " + std::to_string(n) + (average ? " average" : " sum"));
      float* d = n > 0 ? upload_inputs(n) : nullptr;
      comm_->allreduce_async(d, n, average, compute_, /*tag=*/static_cast<int>(n % 1000));
      comm_->wait(compute_);
      std::vector<float> want = allreduce_expected_sum(n, n_ranks);
      if (average)
        for (float& x : want) x /= static_cast<float>(n_ranks);
      if (n > 0) {
        const std::vector<float> got = download(d, n);
        // ncclAvg pre-multiplies by 1/size: exact for a power-of-two world, one rounding per term otherwise.
        if (!average || is_power_of_two(n_ranks)) {
          EXPECT_TRUE(BitwiseEqual(got, want));
        } else {
          for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::abs(want[i]))) << i;
        }
        cudaCheck(cudaFree(d));
      }
      comm_->synchronize();
      EXPECT_GE(comm_->last_elapsed_ms(), 0.0f);
    }
  }
}

// --comm-dtype bf16 | fp16 with NCCL: cast to the wire, ncclBfloat16 / ncclFloat16, cast back. Against the fp32
// wire on the same random inputs: NCCL rounds each input once and each of at most n - 1 partial sums once, so
// |bf16 - fp32| <= (n + 1) u sum_r |x_r| (u = 2^-8 for bf16, 2^-11 for fp16; the fp32 sum's own error is far
// below). Every rank decodes the same reduced words: the results agree bit for bit across ranks.
TEST_F(NcclAllreduceTest, SixteenBitWiresStayWithinTheirRoundingOfTheFp32Wire) {
  const size_t n = (size_t{1} << 20) + 3;
  const int ranks = comm_->size();
  std::vector<std::vector<float>> all(ranks);
  for (int r = 0; r < ranks; ++r) all[r] = random_vector(static_cast<int64_t>(n), -1.0f, 1.0f, 31u + r);
  float* d = upload_inputs(n);
  const auto put_inputs = [&] {  // on the compute stream, which the all-reduce is ordered after
    cudaCheck(cudaMemcpyAsync(d, all[comm_->rank()].data(), n * sizeof(float), cudaMemcpyHostToDevice, compute_));
    cudaCheck(cudaStreamSynchronize(compute_));
  };
  put_inputs();
  comm_->allreduce_async(d, n, /*average=*/false, compute_);
  comm_->wait(compute_);
  const std::vector<float> fp32 = download(d, n);
  for (ddplab::float16::Format f : {ddplab::float16::Format::kBf16, ddplab::float16::Format::kFp16}) {
    SCOPED_TRACE(f == ddplab::float16::Format::kBf16 ? "bf16" : "fp16");
    NcclAllreduce wire(MPI_COMM_WORLD, f);
    wire.begin_step();
    put_inputs();
    wire.allreduce_async(d, n, /*average=*/false, compute_);
    wire.wait(compute_);
    const std::vector<float> got = download(d, n);
    wire.synchronize();
    const double u = f == ddplab::float16::Format::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    for (size_t i = 0; i < n; ++i) {
      double magnitude = 0;
      for (int r = 0; r < ranks; ++r) magnitude += std::fabs(all[r][i]);
      ASSERT_LE(std::fabs(double{got[i]} - fp32[i]), (ranks + 1) * u * magnitude) << "element " << i;
    }
    std::vector<float> rank0 = got;
    MPI_Bcast(rank0.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
    EXPECT_TRUE(BitwiseEqual(got, rank0)) << "ranks disagree";
  }
  cudaCheck(cudaFree(d));
}

// The reducer's call over an fp16 wire, the mean (scale 1 / n, here halved so that one rank scales too): each rank's
// values are scaled before the sum (fp16 ends at 65504), so gradients near 40000 on every rank average to near 20000
// instead of inf, within the fp16 wire's rounding of the exact result; the epilogue is left nothing to scale.
TEST_F(NcclAllreduceTest, TheMeanOverAnFp16WireScalesEachRanksValuesBeforeTheSum) {
  const size_t n = (size_t{1} << 20) + 3;
  const int ranks = comm_->size();
  const float mean = 0.5f / static_cast<float>(ranks);
  std::vector<std::vector<float>> all(ranks);
  for (int r = 0; r < ranks; ++r) all[r] = random_vector(static_cast<int64_t>(n), 30000.0f, 50000.0f, 5u + r);
  float* d = upload_inputs(n);
  cudaCheck(cudaMemcpyAsync(d, all[comm_->rank()].data(), n * sizeof(float), cudaMemcpyHostToDevice, compute_));
  cudaCheck(cudaStreamSynchronize(compute_));
  NcclAllreduce wire(MPI_COMM_WORLD, ddplab::float16::Format::kFp16);
  wire.begin_step();
  float left = -1;
  wire.allreduce_scaled_async(d, n, mean, compute_, /*tag=*/0, [&left, d, n](cudaStream_t comm_stream, float s) {
    left = s;
    ddplab::cuda::scale(d, s, static_cast<int64_t>(n), comm_stream);
  });
  wire.wait(compute_);
  const std::vector<float> got = download(d, n);
  wire.synchronize();
  EXPECT_EQ(left, 1.0f);
  const double u = std::ldexp(1.0, -11);
  size_t beyond = 0;
  for (size_t i = 0; i < n; ++i) {
    double exact = 0;
    for (int r = 0; r < ranks; ++r) exact += all[r][i] * double{mean};
    if (!(std::fabs(double{got[i]} - exact) <= (ranks + 1) * u * exact)) ++beyond;  // inf and NaN count
  }
  EXPECT_EQ(beyond, 0u) << "elements not within the fp16 wire's rounding of the mean";
  cudaCheck(cudaFree(d));
}

// The all-reduce must start only after the compute stream made the gradients final, must not block the host, must
// run beside later compute, and wait() must hold the compute stream until it is done.
TEST_F(NcclAllreduceTest, OrderedAfterComputeOverlapsItAndWaitHoldsCompute) {
  const size_t n = size_t{1} << 22;       // 16 MiB of "gradients"
  const size_t busy_n = size_t{1} << 26;  // 256 MiB: each pass over it takes ~0.1 ms even on an H200
  const int passes = 30;
  float* grad = upload_inputs(n);
  float* busy = nullptr;
  cudaCheck(cudaMalloc(&busy, busy_n * sizeof(float)));
  cudaCheck(cudaMemsetAsync(busy, 0, busy_n * sizeof(float), compute_));
  cudaCheck(cudaStreamSynchronize(compute_));
  MPI_Barrier(MPI_COMM_WORLD);  // ranks in step, so the peer's lateness cannot pass for missing overlap

  // "Backward": ms of work, then the gradients become final (doubled) only at the very end.
  cudaEvent_t step_start = comm_->mark(compute_);
  for (int k = 0; k < passes; ++k) ddplab::cuda::scale(busy, 1.0f, static_cast<int64_t>(busy_n), compute_);
  ddplab::cuda::scale(grad, 2.0f, static_cast<int64_t>(n), compute_);
  const ddplab::cuda::AllreduceEvents ev = comm_->allreduce_async(grad, n, /*average=*/false, compute_, /*tag=*/7);
  // The host is back long before the queued compute reached the gradients: nothing blocked.
  EXPECT_EQ(cudaEventQuery(ev.ready), cudaErrorNotReady) << "allreduce_async waited for the compute stream";
  cudaGetLastError();
  // More compute that does not touch the bucket: the all-reduce should finish while this runs.
  for (int k = 0; k < passes; ++k) ddplab::cuda::scale(busy, 1.0f, static_cast<int64_t>(busy_n), compute_);
  cudaEvent_t compute_done = comm_->mark(compute_);
  // "Optimizer": must see the reduced sum, so it waits; halving brings the doubled inputs back to the plain sum.
  comm_->wait(compute_);
  ddplab::cuda::scale(grad, 0.5f, static_cast<int64_t>(n), compute_);
  EXPECT_TRUE(BitwiseEqual(download(grad, n), allreduce_expected_sum(n, comm_->size())));

  comm_->synchronize();
  const float ready = ddplab::cuda::elapsed_ms(step_start, ev.ready);
  const float start = ddplab::cuda::elapsed_ms(step_start, ev.start);
  const float end = ddplab::cuda::elapsed_ms(step_start, ev.end);
  const float compute_end = ddplab::cuda::elapsed_ms(step_start, compute_done);
  if (comm_->rank() == 0)
    std::cout << "ms from step start: gradients ready " << ready << ", comm start " << start << ", comm end " << end
              << ", later compute end " << compute_end << "\n";
  EXPECT_GE(start, ready);
  EXPECT_GE(end, start);
  EXPECT_LT(end, compute_end) << "the all-reduce did not finish while independent compute was still running";
  ASSERT_EQ(comm_->records().size(), 1u);
  EXPECT_EQ(comm_->records()[0].tag, 7);
  EXPECT_EQ(comm_->records()[0].count, n);
  cudaCheck(cudaFree(busy));
  cudaCheck(cudaFree(grad));
}

// Per-call events resolve to non-negative, ordered times after the step, and begin_step() recycles them (the
// second step hands out the same events: no creation per call).
TEST_F(NcclAllreduceTest, TimingEventsResolveAfterTheStepAndAreReused) {
  const size_t n = 1000;
  float* d = upload_inputs(n);
  std::vector<ddplab::cuda::AllreduceEvents> first;
  for (int step = 0; step < 2; ++step) {
    comm_->begin_step();
    cudaEvent_t origin = comm_->mark(compute_);
    std::vector<ddplab::cuda::AllreduceEvents> evs;
    for (int bucket = 0; bucket < 4; ++bucket) evs.push_back(comm_->allreduce_async(d, n, false, compute_, bucket));
    comm_->wait(compute_);
    comm_->synchronize();
    ASSERT_EQ(comm_->records().size(), 4u);
    float prev_end = 0;
    for (int bucket = 0; bucket < 4; ++bucket) {
      const auto& ev = comm_->records()[bucket].events;
      EXPECT_EQ(comm_->records()[bucket].tag, bucket);
      EXPECT_GE(ddplab::cuda::elapsed_ms(origin, ev.ready), 0.0f);
      EXPECT_GE(ddplab::cuda::elapsed_ms(ev.ready, ev.start), 0.0f);
      EXPECT_GE(ddplab::cuda::elapsed_ms(ev.start, ev.end), 0.0f);
      EXPECT_GE(ddplab::cuda::elapsed_ms(origin, ev.start), prev_end) << "buckets ran out of launch order";
      prev_end = ddplab::cuda::elapsed_ms(origin, ev.end);
    }
    if (step == 0) {
      first = evs;
    } else {
      for (int bucket = 0; bucket < 4; ++bucket) {
        EXPECT_EQ(evs[bucket].ready, first[bucket].ready);
        EXPECT_EQ(evs[bucket].end, first[bucket].end);
      }
    }
  }
  cudaCheck(cudaFree(d));
}

}  // namespace
