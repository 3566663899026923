// Multi-rank tests of the hierarchical all-reduce (comm/hier_allreduce.h) over emulated node splits: exact sums,
// agreement with MPI_Allreduce, bitwise equality on every rank, the bytes each group carries, and the refusal of
// nodes of unequal size, and a failure within a node that leaves nothing writing into the caller's buffer. ctest runs
// it with mpirun -np 1..4 (at np 4: 1x4, 2x2, 4x1, interleaved 2x2, 3+1).
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/mman.h>

#include <atomic>
#include <cfloat>
#include <cmath>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
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

// One of hier's groups as the test below sees it: before each send and receive it calls `before` with the call's
// kind and its number (from 1), and it counts the calls still inside the transport.
class ObservedTransport final : public Transport {
 public:
  enum Call { kSend, kRecv };
  ObservedTransport(std::unique_ptr<Transport> inner, std::function<void(Call, int nth)> before)
      : inner_(std::move(inner)), before_(std::move(before)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void send(int peer, const void* buf, size_t bytes, int tag) override {
    Inside in(inside_);
    before_(kSend, ++sends_);
    inner_->send(peer, buf, bytes, tag);
  }
  void recv(int peer, void* buf, size_t bytes, int tag) override {
    Inside in(inside_);
    before_(kRecv, ++recvs_);
    inner_->recv(peer, buf, bytes, tag);
  }
  void recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) override {
    Inside in(inside_);
    before_(kRecv, ++recvs_);
    inner_->recv_consume(peer, bytes, tag, staging, consume);
  }
  void wait_sends(size_t keep_last) override {
    Inside in(inside_);
    inner_->wait_sends(keep_last);
  }
  bool progress() override {
    Inside in(inside_);
    return inner_->progress();
  }
  int inside() const { return inside_.load(); }

 private:
  struct Inside {
    explicit Inside(std::atomic<int>& n) : n(n) { ++n; }
    ~Inside() { --n; }
    std::atomic<int>& n;
  };
  std::unique_ptr<Transport> inner_;
  std::function<void(Call, int)> before_;
  int sends_ = 0, recvs_ = 0;
  std::atomic<int> inside_{0};
};

class HierFailureTest : public testing::TestWithParam<NodeSplit> {};

// The ranks of each node disagree on the count (64 and 48 elements: one round alike, then 32 and 16), so the node's
// reduce-scatter of round 1 throws on every rank while round 0's shard crosses the nodes on the cross-node thread,
// inside its all-gather: a receive into the caller's buffer is posted there. The first node's crossing waits for
// its peer's message, which the other node sends only once the first node has taken the buffer's pages away (as the
// trainer's unwinding unmaps its gradients). So a receive still posted into the buffer, or a thread still working on
// it, after allreduce_sum threw, faults; and the other node's crossing is still inside allreduce_sum, waiting for
// that message, when its own node's phase throws.
TEST_P(HierFailureTest, AFailureWithinANodeLeavesNothingWritingIntoTheBufferOnceItThrows) {
  const int rank = world_rank(), n = world_size();
  std::vector<int> mine, others;  // the ranks of this node and of the other, in order
  for (int r = 0; r < n; ++r) (GetParam().node(r, n) == GetParam().node(rank, n) ? mine : others).push_back(r);
  if (mine.size() != 2 || others.size() != 2) GTEST_SKIP() << "two nodes of two ranks";
  const bool first_node = mine[0] == 0;
  const int local = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  const int peer = others[local];  // across the nodes, in the cross-node group
  MPI_Comm gate;                   // the other node's crossing waits on it for the first node's buffer to go
  MPI_Comm_dup(MPI_COMM_WORLD, &gate);
  constexpr int kBufferGone = 0, kReturned = 1;

  std::atomic<bool> crossing_in_all_gather{false};
  ObservedTransport* cross = nullptr;
  const auto observe = [&](std::unique_ptr<Transport> t, const Topology& group) -> std::unique_ptr<Transport> {
    const bool across = group.nodes() > 1;
    auto observed = std::make_unique<ObservedTransport>(std::move(t), [&, across](ObservedTransport::Call c, int nth) {
      // Across the nodes (a ring of two): send, receive and reduce, send the sum, receive the peer's sum.
      if (across && first_node && c == ObservedTransport::kRecv && nth == 2) crossing_in_all_gather = true;
      if (across && !first_node && c == ObservedTransport::kSend && nth == 2)
        MPI_Recv(nullptr, 0, MPI_BYTE, peer, kBufferGone, gate, MPI_STATUS_IGNORE);
      // Within the node, round 1 starts with a send: only once the crossing of round 0 receives into the buffer.
      if (!across && first_node && c == ObservedTransport::kSend && nth == 2)
        while (!crossing_in_all_gather) std::this_thread::yield();
    });
    if (across) cross = observed.get();
    return observed;
  };
  HierAllreduce hier(MPI_COMM_WORLD, GetParam().node(rank, n), observe);
  ASSERT_EQ(hier.local_size(), 2);
  ASSERT_NE(cross, nullptr);

  const size_t bytes = 4096, count = local == 0 ? 64 : 48;
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  float* data = static_cast<float*>(memory);
  std::fill(data, data + count, 1.0f);
  RingOptions o;
  o.slice_elems = 16;  // rounds of 32 elements
  o.slices_per_chunk = 1;
  std::string error;
  try {
    hier.allreduce_sum(data, data, count, o);
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("expected"), std::string::npos) << "the node's size mismatch, got: " << error;
  EXPECT_EQ(cross->inside(), 0) << "the cross-node all-reduce is still inside its transport";
  // The pages go, but their addresses stay reserved: a late write faults rather than land in a later mapping.
  ASSERT_EQ(mprotect(memory, bytes, PROT_NONE), 0);
  if (first_node) {
    MPI_Send(nullptr, 0, MPI_BYTE, peer, kBufferGone, gate);
    // The peer's crossing sends its sum before its allreduce_sum returns, and messages between a pair keep their
    // order: by this message's arrival, a receive left posted into the buffer has met the sum.
    MPI_Recv(nullptr, 0, MPI_BYTE, peer, kReturned, gate, MPI_STATUS_IGNORE);
  } else {
    MPI_Send(nullptr, 0, MPI_BYTE, peer, kReturned, gate);
  }
  MPI_Comm_free(&gate);
  MPI_Barrier(MPI_COMM_WORLD);
  munmap(memory, bytes);
}

INSTANTIATE_TEST_SUITE_P(Splits, HierFailureTest, testing::ValuesIn(kNodeSplits),
                         [](const testing::TestParamInfo<NodeSplit>& info) { return std::string(info.param.name); });

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
