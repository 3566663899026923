// allreduce_perf's check inputs (bench/allreduce_perf/harness.h): exact sums on every wire, and no period a misplaced
// chunk could hide in.
#include <gtest/gtest.h>

#include <cstddef>

#include "bench/allreduce_perf/harness.h"

namespace ddplab::perf {
namespace {

// Every value is a whole number in 1..range, so up to 256 ranks' sum is at most 256: exact in fp32, bf16 and fp16.
TEST(AllreduceInputs, SumsStayExactOnEveryWire) {
  for (int n : {1, 2, 3, 4, 8, 16, 17, 64, 255, 256}) {
    const Inputs inputs{n, 3};
    for (size_t i = 0; i < 4096; ++i) {
      EXPECT_LE(inputs.sum(i), 256.0f) << n << " ranks, element " << i;
      for (int r = 0; r < n && r < 4; ++r) EXPECT_GE(inputs.value(r, i), 1.0f);
    }
  }
}

// A ring that puts a chunk d elements off must be caught: for every displacement up to 64K elements, some element
// of a 64-element window reads another value d elements on. (The pattern before repeated every 16 elements.)
TEST(AllreduceInputs, NoDisplacedChunkReadsRight) {
  for (int n : {2, 4, 8}) {
    const Inputs inputs{n};
    for (size_t d = 1; d <= 65536; ++d) {
      bool caught = false;
      for (size_t i = 1000; i < 1064 && !caught; ++i) caught = inputs.value(0, i) != inputs.value(0, i + d);
      ASSERT_TRUE(caught) << n << " ranks: a chunk displaced by " << d << " elements reads right";
    }
  }
}

}  // namespace
}  // namespace ddplab::perf
