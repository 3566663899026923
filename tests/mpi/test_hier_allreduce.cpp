// Multi-rank tests of the hierarchical all-reduce (comm/hier_allreduce.h) over emulated node splits: exact sums,
// agreement with MPI_Allreduce, bitwise equality on every rank, the bytes each group carries, and the refusal of
// nodes of unequal size. ctest runs it with mpirun -np 1..4 (at np 4: 1x4, 2x2, 4x1, interleaved 2x2, 3+1).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cfloat>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "comm/hier_allreduce.h"
#include "tests/mpi/allreduce_check.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/node_splits.h"

namespace ddplab {
namespace {

// The reference's view of a split: the sizes of its nodes.
std::vector<int> node_sizes(const NodeSplit& split, int n) {
  std::map<int, int> sizes;
  for (int r = 0; r < n; ++r) ++sizes[split.node(r, n)];
  std::vector<int> v;
  for (const auto& [node, size] : sizes) v.push_back(size);
  return v;
}
bool equal_nodes(const std::vector<int>& sizes) {
  for (int s : sizes)
    if (s != sizes[0]) return false;
  return true;
}

struct Wire {
  const char* name;
  RingOptions options;
};
RingOptions sliced(bool wire16) {
  RingOptions o;
  o.slice_elems = 256;  // several rounds at the larger counts
  o.slices_per_chunk = 4;
  o.wire16 = wire16;
  return o;
}
const Wire kWires[] = {{"whole", RingOptions{}}, {"sliced", sliced(false)}, {"sliced_bf16", sliced(true)}};
void PrintTo(const Wire& w, std::ostream* os) { *os << w.name; }

// Empty, fewer than the ranks, primes, several rounds, one count not a multiple of anything.
const size_t kCounts[] = {0, 1, 3, 7, 1000, 4099, 1'000'003};

class HierTest : public testing::TestWithParam<std::tuple<NodeSplit, Wire>> {
 protected:
  const NodeSplit& split() const { return std::get<0>(GetParam()); }
  const RingOptions& options() const { return std::get<1>(GetParam()).options; }
  int node() const { return split().node(rank_, n_); }
  bool equal() const { return equal_nodes(node_sizes(split(), n_)); }
  // Sliced into 1024-element chunks a million elements are ~1000 rounds of small messages (minutes on a busy 2-core
  // host, where each message waits for its receiver to get a CPU); 100'003 is still dozens of rounds, the last short.
  std::vector<size_t> counts() const {
    std::vector<size_t> c(std::begin(kCounts), std::end(kCounts));
    if (options().slice_elems > 0) c.back() = 100'003;
    return c;
  }
  const int rank_ = world_rank(), n_ = world_size();
};

// Small integers stay exact in fp32 and in bf16 (every partial sum is below 256), so every order gives these bits.
TEST_P(HierTest, ExactInputsGiveExactSumsOnEveryRank) {
  if (!equal()) GTEST_SKIP() << "nodes of unequal size are refused (UnequalNodesAreRefused)";
  HierAllreduce hier(MPI_COMM_WORLD, node());
  for (size_t count : counts()) {
    std::vector<float> data = exact_inputs(rank_, count), want(count);
    for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n_, i);
    hier.allreduce_sum(data.data(), data.data(), count, options());
    EXPECT_EQ(bitwise_mismatch(data, want), "") << "count " << count;
  }
}

TEST_P(HierTest, OutOfPlaceLeavesTheInputAndWritesTheSum) {
  if (!equal()) GTEST_SKIP() << "nodes of unequal size are refused (UnequalNodesAreRefused)";
  HierAllreduce hier(MPI_COMM_WORLD, node());
  for (size_t count : counts()) {
    const std::vector<float> in = exact_inputs(rank_, count);
    std::vector<float> copy = in, out(count, -1.0f), want(count);
    for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n_, i);
    hier.allreduce_sum(in.data(), out.data(), count, options());
    EXPECT_EQ(bitwise_mismatch(out, want), "") << "count " << count;
    EXPECT_EQ(bitwise_mismatch(in, copy), "") << "count " << count << ": the input changed";
  }
}

TEST_P(HierTest, RandomInputsMatchMpiAllreduceAndAreBitwiseEqualAcrossRanks) {
  if (!equal()) GTEST_SKIP() << "nodes of unequal size are refused (UnequalNodesAreRefused)";
  HierAllreduce hier(MPI_COMM_WORLD, node());
  for (size_t count : counts()) {
    std::vector<float> data = random_inputs(rank_, count), ref = data, abs_sum(count);
    for (size_t i = 0; i < count; ++i) abs_sum[i] = std::fabs(data[i]);
    const int c = static_cast<int>(count);
    MPI_Allreduce(MPI_IN_PLACE, ref.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, abs_sum.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    hier.allreduce_sum(data.data(), data.data(), count, options());
    // fp32: two orders of n <= 4 terms differ by at most (n-1) eps sum|x|. bf16: every hop rounds to 8 bits.
    const float tolerance = options().wire16 ? 4 * 0x1p-8f : 4 * FLT_EPSILON;
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < count; ++i)
      if (!(std::fabs(data[i] - ref[i]) <= tolerance * abs_sum[i]) && wrong++ == 0) first = i;
    EXPECT_EQ(wrong, 0u) << "count " << count << ", first at " << first << ": got " << data[first]
                         << ", MPI_Allreduce " << ref[first];
    EXPECT_EQ(count_differing_across_ranks(data), 0u) << "count " << count << ": ranks disagree";
  }
}

// Each group's transport is wrapped: the sends keep their buffers until retired, nothing is left in flight, and
// the bytes are the formula of docs/COMM.md: per rank 2(L-1)/L S within the node and 2(M-1)/M S/L across nodes
// (L ranks per node, M nodes, S bytes; one round, a count every chunk divides).
TEST_P(HierTest, GroupsKeepTheSendContractAndCarryTheExpectedBytes) {
  if (!equal()) GTEST_SKIP() << "nodes of unequal size are refused (UnequalNodesAreRefused)";
  std::vector<ContractCheckingTransport*> groups;  // intra, then inter
  const auto count_group = [&](std::unique_ptr<Transport> t, const Topology&) -> std::unique_ptr<Transport> {
    auto checked = std::make_unique<ContractCheckingTransport>(std::move(t));
    groups.push_back(checked.get());
    return checked;
  };
  HierAllreduce hier(MPI_COMM_WORLD, node(), count_group);
  ASSERT_EQ(groups.size(), 2u);  // the same on every rank: no collective is skipped
  const size_t L = hier.local_size(), M = hier.nodes(), count = 12 * 1024;
  std::vector<float> data = exact_inputs(rank_, count), want(count);
  for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n_, i);
  RingOptions whole = options();
  whole.slice_elems = 0;
  hier.allreduce_sum(data.data(), data.data(), count, whole);
  EXPECT_EQ(bitwise_mismatch(data, want), "");
  const size_t bytes = count * (whole.wire16 ? 2 : 4);
  for (ContractCheckingTransport* g : groups) {
    EXPECT_EQ(g->modified(), 0u) << "a send buffer changed before it was retired";
    EXPECT_EQ(g->in_flight(), 0u) << "sends left in flight";
  }
  EXPECT_EQ(groups[0]->bytes_sent(), 2 * (L - 1) * (bytes / L)) << "within the node";
  EXPECT_EQ(groups[1]->bytes_sent(), 2 * (M - 1) * (bytes / L / M)) << "across nodes";
}

TEST_P(HierTest, UnequalNodesAreRefused) {
  if (equal()) GTEST_SKIP() << "every node has the same number of ranks";
  std::string sizes;
  for (int s : node_sizes(split(), n_)) sizes += (sizes.empty() ? "" : ", ") + std::to_string(s);
  try {
    HierAllreduce hier(MPI_COMM_WORLD, node());
    ADD_FAILURE() << "nodes of " << sizes << " ranks were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("have " + sizes + " ranks"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Splits, HierTest, testing::Combine(testing::ValuesIn(kNodeSplits), testing::ValuesIn(kWires)),
                         [](const testing::TestParamInfo<HierTest::ParamType>& info) {
                           return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param).name;
                         });

TEST(Topology, TheHostIsOneNodeAndEmulatedNodesAreConsecutiveRanks) {
  // Every rank of a ctest run is on this host: one node.
  const Topology host = detect_topology(MPI_COMM_WORLD, 0);
  EXPECT_EQ(host.nodes(), 1);
  EXPECT_EQ(host.node_of_rank, std::vector<int>(world_size(), 0));
  const int n = world_size();
  if (n % 2 == 0) {
    const Topology two = detect_topology(MPI_COMM_WORLD, 2);
    for (int r = 0; r < n; ++r) EXPECT_EQ(two.node_of_rank[r], r / 2);
    EXPECT_EQ(two.nodes(), n / 2);
  }
  if (n > 1 && n % 2 == 1) {
    EXPECT_THROW(detect_topology(MPI_COMM_WORLD, 2), std::invalid_argument);
  }
  EXPECT_EQ(topology_from_ids({7, 7, 3, 7}).node_of_rank, (std::vector<int>{0, 0, 1, 0}));
  EXPECT_EQ(topology_from_ids({0, 0, 0, 1}).describe(), "2 nodes of 3, 1 ranks");
}

}  // namespace
}  // namespace ddplab
