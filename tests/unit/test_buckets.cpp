// Bucket assignment (comm/reducer.h): reverse registration order, caps, the closing bucket, contiguity.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "comm/reducer.h"
#include "model/mlp.h"

namespace ddplab {
namespace {

// Offsets of the reverse layout model/mlp.h uses: the last parameter at offset 0.
std::vector<int64_t> reverse_offsets(const std::vector<int64_t>& numel) {
  std::vector<int64_t> offset(numel.size());
  int64_t at = 0;
  for (int p = static_cast<int>(numel.size()) - 1; p >= 0; --p) {
    offset[p] = at;
    at += numel[p];
  }
  return offset;
}

struct Span {
  int first, last;
};

void expect_buckets(const std::vector<Bucket>& got, const std::vector<Span>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(got[b].first_param, want[b].first) << "bucket " << b;
    EXPECT_EQ(got[b].last_param, want[b].last) << "bucket " << b;
  }
}

TEST(AssignBuckets, HandWorkedCase) {
  // Sizes in floats; caps in bytes. Closing bucket (cap 48 B = 12 floats): p0 (10) fits, p0+p1 (13) does not.
  // The rest from p4 down with cap 40 B = 10 floats: p4+p3 = 7 (+p2 would be 14) | p2+p1 = 10.
  const std::vector<int64_t> numel{10, 3, 7, 2, 5};
  const auto buckets = assign_buckets(numel, reverse_offsets(numel), 40, 48);
  expect_buckets(buckets, {{3, 4}, {1, 2}, {0, 0}});
  EXPECT_EQ(buckets[0].offset, 0);
  EXPECT_EQ(buckets[0].count, 7);
  EXPECT_EQ(buckets[1].offset, 7);
  EXPECT_EQ(buckets[1].count, 10);
  EXPECT_EQ(buckets[2].offset, 17);
  EXPECT_EQ(buckets[2].count, 10);
}

TEST(AssignBuckets, DefaultMlpWithDefaultCaps) {
  // fc0.weight (4 MiB) alone exceeds the 1 MiB closing cap, so it closes backward by itself; everything else
  // (12.2 MB) fits one 25 MiB bucket.
  Mlp<float> mlp(MlpConfig{}, 1);
  std::vector<int64_t> numel, offset;
  for (const auto& p : mlp.parameters()) {
    numel.push_back(p.numel);
    offset.push_back(p.offset);
  }
  expect_buckets(assign_buckets(numel, offset, 25.0 * 1048576, 1.0 * 1048576), {{1, 5}, {0, 0}});
}

TEST(AssignBuckets, ZeroCapGivesOneBucketPerParameterInBackwardOrder) {
  const std::vector<int64_t> numel{4, 1, 6, 2};
  expect_buckets(assign_buckets(numel, reverse_offsets(numel), 0, 0), {{3, 3}, {2, 2}, {1, 1}, {0, 0}});
}

TEST(AssignBuckets, HugeCapsGiveOneBucket) {
  const std::vector<int64_t> numel{4, 1, 6, 2};
  const auto buckets = assign_buckets(numel, reverse_offsets(numel), 1e18, 1e18);
  expect_buckets(buckets, {{0, 3}});
  EXPECT_EQ(buckets[0].count, 13);
}

TEST(AssignBuckets, CoverEveryElementOnceForManyCaps) {
  const std::vector<int64_t> numel{1000, 10, 1, 250000, 7, 3000, 12, 99999};
  const auto offset = reverse_offsets(numel);
  const int64_t total = std::accumulate(numel.begin(), numel.end(), int64_t{0});
  for (double cap : {0.0, 4.0, 100.0, 4096.0, 1e5, 1e6, 1e9}) {
    for (double first : {0.0, 4.0, 1e4, 1e9}) {
      const auto buckets = assign_buckets(numel, offset, cap, first);
      int64_t at = 0;
      int next_last = static_cast<int>(numel.size()) - 1;
      for (const Bucket& b : buckets) {
        EXPECT_EQ(b.offset, at);  // back to back in the flat buffer, in bucket order
        EXPECT_EQ(b.last_param, next_last);
        EXPECT_LE(b.first_param, b.last_param);
        if (b.num_params() > 1 && &b != &buckets.back()) EXPECT_LE(b.count * 4.0, cap);
        at += b.count;
        next_last = b.first_param - 1;
      }
      EXPECT_EQ(at, total);
      EXPECT_EQ(next_last, -1);
      if (buckets.back().num_params() > 1) EXPECT_LE(buckets.back().count * 4.0, first);
    }
  }
}

TEST(AssignBuckets, RefusesANonContiguousLayout) {
  const std::vector<int64_t> numel{4, 4, 4};
  const std::vector<int64_t> forward_offsets{0, 4, 8};  // registration order: buckets would not be slices
  EXPECT_THROW(assign_buckets(numel, forward_offsets, 1e9, 0), std::invalid_argument);
  EXPECT_THROW(assign_buckets(numel, reverse_offsets(numel), -1, 0), std::invalid_argument);
}

}  // namespace
}  // namespace ddplab
