// Bucket assignment (ddp/buckets.h): ready order, caps, the two ends' caps, contiguity in the flat buffer.
#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp/reducer.h"
#include "model/mlp.h"

namespace ddplab {
namespace {

// Pieces given in ready order lie back to back: offsets are the running sum.
std::vector<int64_t> adjacent_offsets(const std::vector<int64_t>& numel) {
  std::vector<int64_t> offset(numel.size());
  std::exclusive_scan(numel.begin(), numel.end(), offset.begin(), int64_t{0});
  return offset;
}

// Caps in bytes with the first bucket cut as the others (--first-bucket-mb auto).
BucketCaps caps(double bucket_bytes, double last_bytes) { return {bucket_bytes, BucketCaps::kAsTheOthers, last_bytes}; }

// A model's gradient pieces in ready order: their sizes and offsets in the flat buffer.
std::pair<std::vector<int64_t>, std::vector<int64_t>> pieces_of(const Mlp<float>& mlp) {
  std::vector<int64_t> numel, offset;
  for (const GradPiece& g : mlp.grad_pieces()) {
    numel.push_back(g.numel);
    offset.push_back(g.offset);
  }
  return {numel, offset};
}

struct Span {
  int first, last;
};

void expect_buckets(const std::vector<Bucket>& got, const std::vector<Span>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(got[b].first_piece, want[b].first) << "bucket " << b;
    EXPECT_EQ(got[b].last_piece, want[b].last) << "bucket " << b;
  }
}

TEST(AssignBuckets, HandWorkedCase) {
  // Sizes in floats, in ready order; caps in bytes. Closing bucket (48 B = 12 floats), from the end: 10 fits,
  // 10+3 does not. The rest from the start with 40 B = 10 floats: 5+2 (+7 would be 14) | 7+3.
  const std::vector<int64_t> numel{5, 2, 7, 3, 10};
  const auto buckets = assign_buckets(numel, adjacent_offsets(numel), caps(40, 48));
  expect_buckets(buckets, {{0, 1}, {2, 3}, {4, 4}});
  EXPECT_EQ(buckets[0].offset, 0);
  EXPECT_EQ(buckets[0].count, 7);
  EXPECT_EQ(buckets[1].offset, 7);
  EXPECT_EQ(buckets[1].count, 10);
  EXPECT_EQ(buckets[2].offset, 17);
  EXPECT_EQ(buckets[2].count, 10);
}

TEST(AssignBuckets, DefaultMlpWithDefaultCaps) {
  // Ready order fc2.bias, fc2.weight, fc1.bias, fc1.weight, fc0.bias, fc0.weight. fc0.weight (4 MiB) alone
  // exceeds the 1 MiB closing cap, so it closes backward by itself; the rest (12.2 MB) fits one 25 MiB bucket.
  Mlp<float> mlp(MlpConfig{}, 1);
  const auto [numel, offset] = pieces_of(mlp);
  expect_buckets(assign_buckets(numel, offset, caps(25.0 * 1048576, 1.0 * 1048576)), {{0, 4}, {5, 5}});
}

// The first bucket's own cap: the hand-worked case above with the first bucket capped at 12 B (3 floats): 5 alone
// (a piece past a cap gets a bucket of its own), then 2+7 | 3 at 40 B, then the closing 10.
TEST(AssignBuckets, TheFirstBucketHasItsOwnCap) {
  const std::vector<int64_t> numel{5, 2, 7, 3, 10};
  expect_buckets(assign_buckets(numel, adjacent_offsets(numel), BucketCaps{40, 12, 48}),
                 {{0, 0}, {1, 2}, {3, 3}, {4, 4}});
  // A first cap wider than the others: 5+2+7+3 = 17 floats fit 68 B, the closing bucket as before.
  expect_buckets(assign_buckets(numel, adjacent_offsets(numel), BucketCaps{40, 68, 48}), {{0, 3}, {4, 4}});
}

// PyTorch DDP's layout on the default MLP: its first bucket takes fc2.bias, then fc2.weight (4 MB), which reaches
// the 1 MiB cap and closes it; the rest, 8.4 MB, never reaches 25 MiB: one bucket, the last with no cap of its own.
// The same caps within (ddplab's rule) leave fc2.bias alone. (ddplab's default layout: {0, 4}, {5, 5}, above.)
TEST(AssignBuckets, PyTorchsLayoutClosesABucketOnThePieceThatReachesItsCap) {
  Mlp<float> mlp(MlpConfig{}, 1);
  const auto [numel, offset] = pieces_of(mlp);
  expect_buckets(assign_buckets(numel, offset, BucketCaps::mib(25, 1, BucketCaps::kAsTheOthers, BucketRule::kReach)),
                 {{0, 1}, {2, 5}});
  expect_buckets(assign_buckets(numel, offset, BucketCaps::mib(25, 1, BucketCaps::kAsTheOthers)), {{0, 0}, {1, 5}});
}

// Reach by hand, caps in bytes, sizes in floats {5, 2, 7, 3, 10}: the last bucket from the end until it reaches 48 B
// (10 floats = 40 B, then 3 more: 52 B reached); then 5 (20 B) takes 2 (28 B: 40 B not reached) and 7 (56 B), then
// the rest. A cap of 0 closes every bucket on its first piece.
TEST(AssignBuckets, ReachTakesThePieceThatReachesTheCap) {
  const std::vector<int64_t> numel{5, 2, 7, 3, 10};
  const BucketCaps reach{40, BucketCaps::kAsTheOthers, 48, BucketRule::kReach};
  expect_buckets(assign_buckets(numel, adjacent_offsets(numel), reach), {{0, 2}, {3, 4}});
  const BucketCaps zero{0, 0, 0, BucketRule::kReach};
  expect_buckets(assign_buckets(numel, adjacent_offsets(numel), zero), {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}});
}

TEST(AssignBuckets, ZeroCapGivesOneBucketPerPiece) {
  const std::vector<int64_t> numel{4, 1, 6, 2};
  expect_buckets(assign_buckets(numel, adjacent_offsets(numel), caps(0, 0)), {{0, 0}, {1, 1}, {2, 2}, {3, 3}});
}

TEST(AssignBuckets, HugeCapsGiveOneBucket) {
  const std::vector<int64_t> numel{4, 1, 6, 2};
  const auto buckets = assign_buckets(numel, adjacent_offsets(numel), caps(1e18, 1e18));
  expect_buckets(buckets, {{0, 3}});
  EXPECT_EQ(buckets[0].count, 13);
}

TEST(AssignBuckets, CoverEveryElementOnceForManyCaps) {
  const std::vector<int64_t> numel{1000, 10, 1, 250000, 7, 3000, 12, 99999};
  const auto offset = adjacent_offsets(numel);
  const int64_t total = std::accumulate(numel.begin(), numel.end(), int64_t{0});
  for (double cap : {0.0, 4.0, 100.0, 4096.0, 1e5, 1e6, 1e9}) {
    for (double first : {BucketCaps::kAsTheOthers, 0.0, 4.0, 1e4, 1e9}) {
      for (double last : {BucketCaps::kAsTheOthers, 0.0, 4.0, 1e4, 1e9}) {
        for (BucketRule rule : {BucketRule::kWithin, BucketRule::kReach}) {
          const auto buckets = assign_buckets(numel, offset, BucketCaps{cap, first, last, rule});
          int64_t at = 0;
          int next = 0;
          for (const Bucket& b : buckets) {
            EXPECT_EQ(b.offset, at);  // back to back in the flat buffer, in bucket order
            EXPECT_EQ(b.first_piece, next);
            EXPECT_LE(b.first_piece, b.last_piece);
            // The last bucket with a cap of its own is cut first: where one bucket is both ends, its cap holds.
            const bool own_last = &b == &buckets.back() && last != BucketCaps::kAsTheOthers;
            const bool own_first = &b == &buckets.front() && !own_last && first != BucketCaps::kAsTheOthers;
            const double cap_of_b = own_last ? last : own_first ? first : cap;
            // Within: a bucket of several pieces fits its cap. Reach: without the piece that closed it (the last
            // one; for the closing bucket, cut backwards, the first), it had not reached its cap.
            if (b.num_pieces() > 1) {
              const int64_t closer = own_last ? numel[b.first_piece] : numel[b.last_piece];
              if (rule == BucketRule::kWithin)
                EXPECT_LE(b.count * 4.0, cap_of_b) << "cap " << cap << " first " << first << " last " << last;
              else
                EXPECT_LT((b.count - closer) * 4.0, cap_of_b)
                    << "cap " << cap << " first " << first << " last " << last;
            }
            at += b.count;
            next = b.last_piece + 1;
          }
          EXPECT_EQ(at, total);
          EXPECT_EQ(next, static_cast<int>(numel.size()));
        }
      }
    }
  }
}

TEST(AssignBuckets, SlicedWeightsMakeSmallerBuckets) {
  // With 1 MiB row blocks, the default MLP's 4 MiB weights become 4 pieces each, and 1 MiB caps give buckets
  // no larger than a block (plus a bias).
  Mlp<float> mlp(MlpConfig{}, 1);
  mlp.set_grad_piece_elements(262144);
  const auto [numel, offset] = pieces_of(mlp);
  EXPECT_EQ(numel.size(), 3u + 12u);
  for (const Bucket& b : assign_buckets(numel, offset, caps(1048576, 1048576))) EXPECT_LE(b.count * 4, 1048576);
}

TEST(AssignBuckets, RefusesPiecesOutOfOrderOrOverlapping) {
  const std::vector<int64_t> numel{4, 4, 4};
  const std::vector<int64_t> shuffled{0, 8, 4};  // pieces 1 and 2 swapped in memory
  EXPECT_THROW(assign_buckets(numel, shuffled, caps(1e9, 0)), std::invalid_argument);
  const std::vector<int64_t> overlapping{0, 3, 8};
  EXPECT_THROW(assign_buckets(numel, overlapping, caps(1e9, 0)), std::invalid_argument);
  EXPECT_THROW(assign_buckets(numel, adjacent_offsets(numel), caps(-1, 0)), std::invalid_argument);
}

// Alignment gaps between pieces (model/parameters.h) belong to the bucket that spans them and count against its cap.
TEST(AssignBuckets, BucketsSpanTheGapsBetweenTheirPieces) {
  const std::vector<int64_t> numel{5, 3, 6};
  const std::vector<int64_t> gapped{0, 16, 32};
  const auto together = assign_buckets(numel, gapped, caps(1e9, 0));
  ASSERT_EQ(together.size(), 2u);  // the closing bucket holds the last piece alone (cap 0)
  EXPECT_EQ(together[0].offset, 0);
  EXPECT_EQ(together[0].count, 19);  // [0, 16 + 3): both pieces and the gap between them
  EXPECT_EQ(together[1].offset, 32);
  EXPECT_EQ(together[1].count, 6);
  // A cap of 18 floats holds 5 + 3 back to back but not the 19-float span.
  const auto apart = assign_buckets(numel, gapped, caps(18 * sizeof(float), 0));
  ASSERT_EQ(apart.size(), 3u);
  EXPECT_EQ(apart[0].count, 5);
}

// The countdown both reducers launch by: buckets complete in any order but launch in index order, each once; a
// piece marked twice and a step whose pieces were not all marked are errors naming the reducer; a new step starts
// over.
TEST(BucketCountdown, LaunchesInIndexOrderWhateverOrderTheyComplete) {
  const std::vector<Bucket> buckets = {{0, 1, 0, 2}, {2, 2, 2, 1}, {3, 4, 3, 2}};  // pieces 0-1 | 2 | 3-4
  BucketCountdown countdown(buckets, "TestReducer");
  EXPECT_EQ(countdown.bucket_of(3), 2);
  EXPECT_TRUE(countdown.mark_ready(2));  // bucket 1 complete before bucket 0: it waits
  EXPECT_EQ(countdown.next_to_launch(), -1);
  EXPECT_FALSE(countdown.mark_ready(0));
  EXPECT_THROW(countdown.require_all_ready(), std::logic_error);
  EXPECT_TRUE(countdown.mark_ready(1));
  EXPECT_EQ(countdown.next_to_launch(), 0);
  EXPECT_EQ(countdown.next_to_launch(), 1);
  EXPECT_EQ(countdown.next_to_launch(), -1);  // bucket 2 still has pieces pending
  try {
    countdown.mark_ready(2);
    ADD_FAILURE() << "a piece marked twice was taken";
  } catch (const std::logic_error& e) {
    EXPECT_EQ(std::string(e.what()), "TestReducer: gradient piece 2 marked ready twice");
  }
  try {
    countdown.require_all_ready();
    ADD_FAILURE() << "bucket 2 was incomplete";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("bucket 2 (gradient pieces 3..4)"), std::string::npos) << e.what();
  }
  countdown.mark_ready(4);
  EXPECT_TRUE(countdown.mark_ready(3));
  EXPECT_NO_THROW(countdown.require_all_ready());
  EXPECT_EQ(countdown.next_to_launch(), 2);
  EXPECT_EQ(countdown.next_to_launch(), -1);
  countdown.restart();
  EXPECT_EQ(countdown.next_to_launch(), -1);
  EXPECT_FALSE(countdown.mark_ready(0));  // marked again in the new step
  // Twice within a bucket of two pieces: refused, not taken for its other piece, so the bucket does not complete
  // while piece 1 may still be written.
  try {
    countdown.mark_ready(0);
    ADD_FAILURE() << "piece 0 marked twice completed bucket 0";
  } catch (const std::logic_error& e) {
    EXPECT_EQ(std::string(e.what()), "TestReducer: gradient piece 0 marked ready twice");
  }
  EXPECT_EQ(countdown.next_to_launch(), -1);
}

}  // namespace
}  // namespace ddplab
