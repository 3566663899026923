// The emulation's own checks (tests/emu/cuda_emulation.h), each failing for its own reason: a barrier some threads
// never reach, threads at different barriers, a warp's lanes at different collective steps, a write past the launch's
// shared memory; and what it makes visible: a missing __syncthreads reads the shared memory's poison in one of the two
// orders a grid's CTAs run in, whichever thread depends on which; a cp.async tile read before its wait reads it too;
// sm_90's float4 atomicAdd adds each element, and refuses a misaligned or shared address.
#include "tests/emu/cuda_emulation.h"

namespace {
DDPLAB_EMU_SHARED_MEMORY(smem)
}  // namespace

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "tests/emu/emu_test_util.h"

namespace {

using ddplab::emu::emulate_launch;

// __syncthreads in the threads below `split`, or in those from `split` on.
__global__ void partial_syncthreads_kernel(int split, bool below) {
  if ((static_cast<int>(threadIdx.x) < split) == below) __syncthreads();
}

__global__ void syncthreads_or_syncwarp_kernel() {
  if (threadIdx.x % 2 == 0)
    __syncthreads();
  else
    __syncwarp();
}

__global__ void syncwarp_or_shuffle_kernel(float* out) {
  if (threadIdx.x < 16)
    __syncwarp();
  else
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// Thread t writes t to its shared slot, then reads slot t + offset (when there is one), with or without a barrier
// between.
__global__ void read_other_slot_kernel(float* out, int offset, bool barrier) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* const slots = reinterpret_cast<float*>(smem);
  const int n = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x), other = t + offset;
  slots[t] = static_cast<float>(t);
  if (barrier) __syncthreads();
  out[blockIdx.x * n + t] = other >= 0 && other < n ? slots[other] : static_cast<float>(other);
}

__global__ void write_shared_byte_kernel(int at) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (threadIdx.x == 0) smem[at] = 0;
}

// Each thread adds (t, t + 1, t + 2, t + 3) to the 4 floats at `sum` + `offset` (in shared memory when `shared`) with
// sm_90's float4 atomicAdd.
__global__ void float4_atomic_kernel(float* sum, int offset, bool shared) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* const base = shared ? reinterpret_cast<float*>(smem) : sum;
  const float t = static_cast<float>(threadIdx.x);
  atomicAdd(reinterpret_cast<float4*>(base + offset), make_float4(t, t + 1, t + 2, t + 3));
}

// Each thread copies its 4 floats of `in` to shared memory with cp.async and reads them back, after waiting for the
// copy or before.
__global__ void cp_async_kernel(float* out, const float* in, bool wait) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* const slot = reinterpret_cast<float*>(smem) + 4 * threadIdx.x;
  ddplab::emu::cp_async_16(slot, in + 4 * threadIdx.x, true);
  ddplab::emu::cp_async_commit();
  if (wait) ddplab::emu::cp_async_wait(0);
  for (int i = 0; i < 4; ++i) out[4 * threadIdx.x + i] = slot[i];
}

TEST(EmulationDeathTest, BarrierNotReachedByEveryThreadFails) {
  // CTA 0 runs the lower warp first: it waits at the barrier when the upper one returns...
  EXPECT_DEATH(emulate_launch(dim3(1), dim3(64), 0, partial_syncthreads_kernel, 32, true),
               "__syncthreads: 32 of 64 threads wait at it while 1 returned from the kernel .CTA 0,0,0.: a barrier "
               "not reached by every thread");
  // ... or it returned when the upper one arrives.
  EXPECT_DEATH(emulate_launch(dim3(1), dim3(64), 0, partial_syncthreads_kernel, 32, false),
               "__syncthreads: 1 of 64 threads wait at it while 32 returned from the kernel .CTA 0,0,0.: a barrier "
               "not reached by every thread");
}

TEST(EmulationDeathTest, ThreadsAtDifferentBarriersFail) {
  EXPECT_DEATH(emulate_launch(dim3(1), dim3(64), 0, syncthreads_or_syncwarp_kernel),
               "no thread can go on .CTA 0,0,0.: __syncthreads holds 32 of 64, warp 0's __syncwarp holds 16 of 32, "
               "warp 1's __syncwarp holds 16 of 32: threads wait at different barriers");
}

TEST(EmulationDeathTest, LanesAtDifferentCollectiveStepsFail) {
  std::vector<float> out(32);
  EXPECT_DEATH(emulate_launch(dim3(1), dim3(32), 0, syncwarp_or_shuffle_kernel, out.data()),
               "__syncwarp and __shfl_xor_sync at once in warp 0 .CTA 0,0,0.: a warp's lanes at different collective "
               "steps");
}

TEST(EmulationDeathTest, SharedWritePastTheLaunchFails) {
#ifdef DDPLAB_EMU_ASAN
  const char* const message = "AddressSanitizer: use-after-poison";
#else
  const char* const message = "a kernel wrote shared-memory byte 64, past its 64 bytes";
#endif
  EXPECT_DEATH(emulate_launch(dim3(1), dim3(32), 64, write_shared_byte_kernel, 64), message);
  emulate_launch(dim3(1), dim3(32), 64, write_shared_byte_kernel, 63);
}

TEST(Emulation, Float4AtomicAddsEachElement) {
  ddplab::emu_test::DeviceLikeVector<float> sum(8, 1.0f);
  emulate_launch(dim3(2), dim3(64), 0, float4_atomic_kernel, sum.data(), 4, false);
  // 2 CTAs of threads 0..63 (their t summing to 2016): element i gains 2 x (2016 + 64 i).
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(sum[i], 1.0f) << "element " << i;
    EXPECT_EQ(sum[4 + i], 1.0f + 2 * (2016.0f + 64 * i)) << "element " << 4 + i;
  }
}

TEST(EmulationDeathTest, Float4AtomicOnAMisalignedOrSharedAddressFails) {
  ddplab::emu_test::DeviceLikeVector<float> sum(8, 0.0f);
  EXPECT_DEATH(emulate_launch(dim3(1), dim3(32), 0, float4_atomic_kernel, sum.data(), 2, false),
               "atomicAdd.float4.*.: 0x[0-9a-f]+ is not 16-byte aligned");
  EXPECT_DEATH(emulate_launch(dim3(1), dim3(32), 16, float4_atomic_kernel, sum.data(), 0, true),
               "atomicAdd.float4.*.: 0x[0-9a-f]+ is a shared-memory address");
}

// Per CTA of a grid of 2 (ascending, then descending): whether a thread read the poison.
std::array<bool, 2> reads_poison(int offset, bool barrier) {
  constexpr int kThreads = 64;
  std::vector<float> out(2 * kThreads);
  emulate_launch(dim3(2), dim3(kThreads), kThreads * sizeof(float), read_other_slot_kernel, out.data(), offset,
                 barrier);
  std::array<bool, 2> poisoned{};
  for (int c = 0; c < 2; ++c)
    for (int t = 0; t < kThreads; ++t) {
      const float got = out[c * kThreads + t];
      if (std::isnan(got))
        poisoned[c] = true;
      else
        EXPECT_EQ(got, static_cast<float>(t + offset)) << "CTA " << c << ", thread " << t;
    }
  return poisoned;
}

TEST(Emulation, MissingSyncthreadsReadsThePoisonInOneOrder) {
  // A read of a higher-numbered thread's write, in the warp or in another one, comes first in CTA 0; of a lower one's,
  // in CTA 1.
  for (const int offset : {1, 31, 32, 63}) {
    EXPECT_EQ(reads_poison(offset, false), (std::array<bool, 2>{true, false})) << "offset " << offset;
    EXPECT_EQ(reads_poison(-offset, false), (std::array<bool, 2>{false, true})) << "offset " << -offset;
    EXPECT_EQ(reads_poison(offset, true), (std::array<bool, 2>{false, false})) << "offset " << offset;
    EXPECT_EQ(reads_poison(-offset, true), (std::array<bool, 2>{false, false})) << "offset " << -offset;
  }
}

TEST(Emulation, CpAsyncReadBeforeItsWaitReadsThePoison) {
  constexpr int kThreads = 32;
  const ddplab::emu_test::DeviceLikeVector<float> in = [] {
    ddplab::emu_test::DeviceLikeVector<float> v(4 * kThreads);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
    return v;
  }();
  const auto run = [&](bool wait) {
    std::vector<float> out(in.size());
    emulate_launch(dim3(1), dim3(kThreads), in.size() * sizeof(float), cp_async_kernel, out.data(), in.data(), wait);
    return out;
  };
  for (const float x : run(false)) EXPECT_TRUE(std::isnan(x)) << x;
  EXPECT_EQ(run(true), std::vector<float>(in.begin(), in.end()));
  const ddplab::emu::CpAsyncLandingScope at_issue(ddplab::emu::CpAsyncLanding::kAtIssue);
  EXPECT_EQ(run(false), std::vector<float>(in.begin(), in.end()));
}

}  // namespace
