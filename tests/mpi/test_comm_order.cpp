// Ranks that run their all-reduces in different orders (tags) are refused with a message naming the operation,
// the tags and the peer, instead of mixing buffers or hanging.
//
// Only cases where every rank detects the mismatch can run inside one test process (a rank that does not detect
// it would wait on one that threw; in ddplab the program's edge then calls MPI_Abort, which is not testable
// here): with --comm mpi every rank always detects; with the ring, every rank detects when every rank's
// predecessor runs another tag (tag = rank below), and with recursive doubling when n is a power of two.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddplab {
namespace {


// Runs one all-reduce that must throw std::runtime_error; returns its message ("" if it did not throw).
std::string message_of(Communicator& comm, size_t count, int tag) {
  std::vector<float> data(count, 1.0f);
  try {
    comm.allreduce_sum(data.data(), count, tag);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

std::string expected(int rank, int tag, int peer, int peer_tag) {
  return "rank " + std::to_string(rank) + ": all-reduce order mismatch: this rank runs tag " + std::to_string(tag) +
         ", rank " + std::to_string(peer) + " sent tag " + std::to_string(peer_tag);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// 1M floats takes the ring (recursive doubling is for <= 64 KiB), 1000 floats recursive doubling.
TEST(OrderCheck, RingRefusesWhenEveryPredecessorRunsAnotherTag) {
  const int r = world_rank(), n = world_size();
  if (n == 1) GTEST_SKIP() << "needs two ranks";
  const int prev = (r - 1 + n) % n;
  // With every rank on one host the large buffer takes the direct all-reduce, whose arrivals carry the tag (it reads
  // its predecessor's first); direct off, the ring's messages carry it.
  for (const bool direct : {true, false}) {
    for (size_t count : {size_t{1} << 20, size_t{1000}}) {
      if (count == 1000 && (n & (n - 1)) != 0) continue;  // recursive doubling folds ranks in when n is not 2^k
      CommOptions options;
      options.direct = direct;
      Communicator comm(MPI_COMM_WORLD, options);
      const std::string what = message_of(comm, count, /*tag=*/r);
      // The ring hears first from its predecessor; recursive doubling from rank ^ 1.
      const int peer = count > 1000 ? prev : (r ^ 1);
      EXPECT_TRUE(starts_with(what, expected(r, r, peer, peer)))
          << "count " << count << (comm.direct() ? ", direct: " : ": ") << what;
      // After the failure, the communicator refuses to run (messages of the failed call may still be in flight).
      EXPECT_TRUE(starts_with(message_of(comm, count, 0), "rank " + std::to_string(r) + ": Communicator unusable"));
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
}

// Hier runs its rings over groups (within a node, across nodes) of their own numbering: the message still names
// the peer by its world rank, the rank a user sees. 2 emulated nodes of 2: each rank hears first from its node's
// other rank.
TEST(OrderCheck, HierNamesThePeerByItsWorldRank) {
  const int r = world_rank(), n = world_size();
  if (n != 4) GTEST_SKIP() << "2 nodes of 2 ranks";
  CommOptions options;
  options.impl = AllreduceImpl::kHier;
  options.ranks_per_node = 2;
  Communicator comm(MPI_COMM_WORLD, options);
  const std::string what = message_of(comm, size_t{1} << 20, /*tag=*/r);
  EXPECT_TRUE(starts_with(what, expected(r, r, r ^ 1, r ^ 1))) << what;
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(OrderCheck, TwoRanksRunningTwoBucketsInOppositeOrdersBothThrow) {
  const int r = world_rank(), n = world_size();
  if (n != 2) GTEST_SKIP() << "the two-rank case";
  Communicator comm(MPI_COMM_WORLD, AllreduceImpl::kRing);
  const int first = r == 0 ? 2 : 3;  // rank 0 launches bucket 2 first, rank 1 bucket 3
  const std::string what = message_of(comm, 1 << 18, first);
  EXPECT_TRUE(starts_with(what, expected(r, first, 1 - r, r == 0 ? 3 : 2))) << what;
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(OrderCheck, MpiRefusesOnEveryRankWhenOneRankRunsAnotherTag) {
  const int r = world_rank(), n = world_size();
  if (n == 1) GTEST_SKIP() << "needs two ranks";
  Communicator comm(MPI_COMM_WORLD, AllreduceImpl::kMpi);
  const int tag = r == 0 ? 1 : 2;
  const std::string what = message_of(comm, 1000, tag);
  // The peer named is the lowest rank holding the other tag.
  EXPECT_TRUE(starts_with(what, expected(r, tag, r == 0 ? 1 : 0, r == 0 ? 2 : 1))) << what;
}

TEST(OrderCheck, MpiRefusesOnEveryRankWhenSizesDiffer) {
  const int r = world_rank(), n = world_size();
  if (n == 1) GTEST_SKIP() << "needs two ranks";
  Communicator comm(MPI_COMM_WORLD, AllreduceImpl::kMpi);
  const size_t count = r == n - 1 ? 1001 : 1000;
  const std::string what = message_of(comm, count, 7);
  const std::string want = "rank " + std::to_string(r) + ": all-reduce size mismatch on tag 7: this rank has " +
                           std::to_string(count) + " elements, rank " + std::to_string(r == n - 1 ? 0 : n - 1) +
                           " has " + std::to_string(r == n - 1 ? 1000 : 1001);
  EXPECT_EQ(what, want);
}

// The same tags in the same order on every rank pass, for every implementation (the check must not misfire).
TEST(OrderCheck, MatchingTagsInTheSameOrderPass) {
  const int n = world_size();
  for (AllreduceImpl impl : {AllreduceImpl::kRing, AllreduceImpl::kMpi}) {
    Communicator comm(MPI_COMM_WORLD, impl);
    for (int tag : {0, 5, 3, 32767})
      for (size_t count : {size_t{10}, size_t{100'000}}) {
        std::vector<float> data(count, 1.0f);
        EXPECT_NO_THROW(comm.allreduce_sum(data.data(), count, tag));
        EXPECT_EQ(data[count - 1], static_cast<float>(n)) << to_string(impl) << " tag " << tag;
      }
  }
}

TEST(OrderCheck, TagsOutsideMpisRangeAreRefusedLocally) {
  Communicator comm(MPI_COMM_WORLD, AllreduceImpl::kRing);
  std::vector<float> data(10, 1.0f);
  EXPECT_THROW(comm.allreduce_sum(data.data(), data.size(), -1), std::invalid_argument);
  EXPECT_THROW(comm.allreduce_sum(data.data(), data.size(), Communicator::kMaxTag + 1), std::invalid_argument);
}

}  // namespace
}  // namespace ddplab
