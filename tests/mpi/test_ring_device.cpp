// The device ring (comm/ring_device.h) on host memory: the schedule, the primitives and the links' protocols are the
// code the GPU runs, with the CUDA stream replaced by a RingMemory that runs each queued operation only when the
// host synchronizes (so a missing wait in a link reads stale data and breaks the sums), and CUDA IPC's mapped
// neighbours' buffers replaced by an MPI shared-memory window. Both algorithms on the links: the ring and recursive
// doubling. References: exactly summable inputs, and the host's all-reduce of the same arithmetic bit for bit: the
// host ring with the same chunking (the same summation order), and the host's recursive doubling.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "comm/link_emulation.h"
#include "comm/recursive_doubling.h"
#include "comm/ring_allreduce.h"
#include "comm/ring_device.h"
#include "comm/transport.h"
#include "mpi_test_util.h"

namespace ddplab {
namespace {

// A stream stand-in: copies and adds wait in a queue until synchronize(), the way a GPU runs them "later". A GPU may
// also run them sooner, at any moment after they are queued: with a seed, each new operation runs the queue so far
// (in order) one time in three, so that a link that queues a write before the peer allows it, or relies on a read
// not having run yet, breaks the sums too.
class DeferredMemory final : public RingMemory {
 public:
  explicit DeferredMemory(unsigned early_seed = 0) : early_(early_seed), gen_(early_seed) {}
  void copy(void* dst, const void* src, size_t bytes) override {
    queue([=] { host_.copy(dst, src, bytes); });
  }
  void add(float* out, const float* a, const float* b, size_t count) override {
    queue([=] { host_.add(out, a, b, count); });
  }
  void encode(float16::Format f, uint16_t* dst, const float* src, size_t count) override {
    queue([=] { host_.encode(f, dst, src, count); });
  }
  void decode(float16::Format f, float* dst, const uint16_t* src, size_t count) override {
    queue([=] { host_.decode(f, dst, src, count); });
  }
  void add_encode(float16::Format f, uint16_t* io, const float* own, size_t count) override {
    queue([=] { host_.add_encode(f, io, own, count); });
  }
  void synchronize() override {
    for (auto& op : queue_) op();
    queue_.clear();
  }

 private:
  void queue(std::function<void()> op) {
    queue_.push_back(std::move(op));
    if (early_ != 0 && gen_() % 3 == 0) synchronize();
  }
  HostMemory host_;
  std::vector<std::function<void()>> queue_;
  unsigned early_;
  std::mt19937 gen_;
};

// The staging buffers of every rank of the node in one MPI shared-memory window: each rank gets its own and pointers
// to the others', as cudaIpcOpenMemHandle gives on the GPU.
class SharedStaging {
 public:
  explicit SharedStaging(size_t bytes) {
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_);
    int n = 1, r = 0;
    MPI_Comm_size(node_, &n);
    MPI_Comm_rank(node_, &r);
    if (n != world_size()) throw std::runtime_error("the peer-staging test needs every rank on one node");
    MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, MPI_INFO_NULL, node_, &mine_, &win_);
    for (int k = 0; k < n; ++k) {
      MPI_Aint size = 0;
      int disp = 1;
      void* base = nullptr;
      MPI_Win_shared_query(win_, k, &size, &disp, &base);
      all_.push_back(k == r ? nullptr : base);
    }
  }
  ~SharedStaging() {
    MPI_Win_free(&win_);
    MPI_Comm_free(&node_);
  }
  void* mine() const { return mine_; }
  const std::vector<void*>& peers() const { return all_; }

 private:
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  void* mine_ = nullptr;
  std::vector<void*> all_;  // every rank's, mine null
};

enum class LinkKind { kPeerStaging, kHostStaged };

// One link of either kind with its buffers, over a fresh MpiTransport.
struct LinkUnderTest {
  LinkUnderTest(LinkKind kind, RingMemory& memory, size_t max_floats) : tokens(MPI_COMM_WORLD) {
    const size_t bytes = max_floats * sizeof(float);
    if (kind == LinkKind::kPeerStaging) {
      shared = std::make_unique<SharedStaging>(bytes);
      link = std::make_unique<PeerStagingLink>(memory, tokens, shared->mine(), shared->peers(), bytes, /*tag=*/3);
    } else {
      host_send.resize(max_floats);
      host_recv.resize(max_floats);
      link = std::make_unique<HostStagedLink>(memory, tokens, host_send.data(), host_recv.data(), bytes, /*tag=*/3);
    }
  }
  MpiTransport tokens;
  std::unique_ptr<SharedStaging> shared;
  std::vector<float> host_send, host_recv;
  std::unique_ptr<RingLink> link;
};

enum class Algorithm { kRing, kDoubling };

struct Case {
  Algorithm algorithm;
  LinkKind kind;
  size_t count;
  size_t max_chunk;  // floats per link message: small values force many rounds
};

std::string case_name(const Case& c) {
  return std::string(c.algorithm == Algorithm::kRing ? "Ring" : "Doubling") +
         (c.kind == LinkKind::kPeerStaging ? "PeerStaging" : "HostStaged") + "_count" + std::to_string(c.count) +
         "_chunk" + std::to_string(c.max_chunk);
}

// The device all-reduce under test.
void device_allreduce(const Case& c, const float* in, float* out, RingLink& link, RingMemory& memory, float* staging,
                      const DeviceRingWire* wire = nullptr) {
  if (c.algorithm == Algorithm::kRing) return ring_allreduce_sum(in, out, c.count, link, memory, staging, wire);
  doubling_allreduce_sum(in, out, c.count, link, memory, staging, wire);
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

class RingDeviceTest : public testing::TestWithParam<Case> {};

// What the device all-reduce must equal bit for bit, computed in place by the host's own: the ring with the device
// ring's chunking, or recursive doubling (elementwise, so its chunking does not matter).
void host_reference(const Case& c, std::vector<float>& data, std::optional<float16::Format> wire) {
  MpiTransport transport(MPI_COMM_WORLD);
  RingScratch scratch;
  RingOptions options;
  options.slice_elems = c.max_chunk;
  options.slices_per_chunk = 1;
  options.wire16 = wire.has_value();
  if (wire) options.format = *wire;
  if (c.algorithm == Algorithm::kDoubling)
    return recursive_doubling_allreduce_sum(data.data(), data.size(), transport, scratch, options);
  ring_allreduce_sum(data.data(), data.size(), transport, scratch, options);
}

// Counts a link's exchanges: what an exchange costs where ranks share a GPU is a fixed time.
class CountingLink final : public RingLink {
 public:
  explicit CountingLink(RingLink& link) : link_(link) {}
  int rank() const override { return link_.rank(); }
  int size() const override { return link_.size(); }
  size_t max_bytes() const override { return link_.max_bytes(); }
  void send_recv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) override {
    ++exchanges;
    if (recv_bytes) ++receives;
    link_.send_recv(to, send, send_bytes, from, recv, recv_bytes);
  }
  const char* name() const override { return link_.name(); }
  int exchanges = 0, receives = 0;

 private:
  RingLink& link_;
};

std::vector<float> random_floats(size_t count, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST_P(RingDeviceTest, ExactInputsSumExactlyInPlace) {
  const Case c = GetParam();
  const int r = world_rank(), n = world_size();
  DeferredMemory memory;
  LinkUnderTest lut(c.kind, memory, c.max_chunk);
  std::vector<float> data(c.count), staging(device_ring_max_chunk(*lut.link));
  // Small integers: every partial sum is exact, whatever the order.
  for (size_t i = 0; i < c.count; ++i) data[i] = static_cast<float>((i % 97) + 100 * r);
  device_allreduce(c, data.data(), data.data(), *lut.link, memory, staging.data());
  memory.synchronize();
  for (size_t i = 0; i < c.count; ++i)
    ASSERT_EQ(data[i], static_cast<float>(n * (i % 97) + 100 * n * (n - 1) / 2)) << "element " << i;
}

// With the queue run only at synchronize(), and also at random moments before (DeferredMemory).
TEST_P(RingDeviceTest, RandomInputsMatchTheHostBitForBitOutOfPlace) {
  const Case c = GetParam();
  const int r = world_rank();
  for (const unsigned early_seed : {0u, 77u + r}) {
    SCOPED_TRACE(early_seed == 0 ? "queued work runs at synchronize()" : "queued work also runs at random moments");
    DeferredMemory memory(early_seed);
    LinkUnderTest lut(c.kind, memory, c.max_chunk);
    const std::vector<float> in = random_floats(c.count, 1234u + r);
    std::vector<float> out(c.count, -7.f), staging(device_ring_max_chunk(*lut.link));
    device_allreduce(c, in.data(), out.data(), *lut.link, memory, staging.data());
    memory.synchronize();
    EXPECT_EQ(in, random_floats(c.count, 1234u + r)) << "the input was written";

    std::vector<float> expected = in;
    host_reference(c, expected, std::nullopt);
    // The first difference, not an ASSERT: a rank that returned here would leave the others in the collectives of
    // the next loop.
    size_t i = 0;
    while (i < c.count && float16::f32_bits(out[i]) == float16::f32_bits(expected[i])) ++i;
    EXPECT_EQ(i, c.count) << "element " << i << " differs from the host's";
  }
}

// The 16-bit wire: the host's wire16 arithmetic, so the same chunking gives the same bits; in place, the owner
// keeps the rounded sum everyone else decodes (at two ranks, both compute it).
TEST_P(RingDeviceTest, SixteenBitWireMatchesTheHostBitForBit) {
  const Case c = GetParam();
  const int r = world_rank();
  for (float16::Format format : {float16::Format::kBf16, float16::Format::kFp16}) {
    DeferredMemory memory;
    LinkUnderTest lut(c.kind, memory, c.max_chunk);
    std::vector<uint16_t> a(device_ring_max_chunk(*lut.link)), b(a.size());
    const DeviceRingWire wire{format, {a.data(), b.data()}};
    std::vector<float> data = random_floats(c.count, 99u + r);
    device_allreduce(c, data.data(), data.data(), *lut.link, memory, nullptr, &wire);
    memory.synchronize();

    std::vector<float> expected = random_floats(c.count, 99u + r);
    host_reference(c, expected, format);
    // The first difference, not an ASSERT: a rank that returned here would leave the others in the collectives below.
    size_t i = 0;
    while (i < c.count && float16::f32_bits(data[i]) == float16::f32_bits(expected[i])) ++i;
    EXPECT_EQ(i, c.count) << (format == float16::Format::kBf16 ? "bf16" : "fp16") << ": element " << i
                          << " differs from the host's";
    // Every rank holds the same bits.
    std::vector<float> rank0 = data;
    MPI_Bcast(rank0.data(), static_cast<int>(c.count), MPI_FLOAT, 0, MPI_COMM_WORLD);
    EXPECT_EQ(rank0, data);
  }
}

TEST_P(RingDeviceTest, RepeatedCallsReuseTheLink) {
  const Case c = GetParam();
  const int n = world_size();
  DeferredMemory memory;
  LinkUnderTest lut(c.kind, memory, c.max_chunk);
  std::vector<float> data(c.count), staging(device_ring_max_chunk(*lut.link));
  for (int call = 1; call <= 3; ++call) {
    std::fill(data.begin(), data.end(), static_cast<float>(call));
    device_allreduce(c, data.data(), data.data(), *lut.link, memory, staging.data());
    memory.synchronize();
    EXPECT_EQ(std::count(data.begin(), data.end(), static_cast<float>(call * n)), static_cast<long>(c.count))
        << "call " << call;
  }
}

// Each rank's exchanges: the ring's 2(n-1) a round of n chunks; recursive doubling's log2 p a round of one chunk, +2
// on a rank that folds another in (p the largest power of two <= n), and 2 on the rank folded out. Either wire.
TEST_P(RingDeviceTest, ExchangesPerRound) {
  const Case c = GetParam();
  const int n = world_size(), r = world_rank();
  DeferredMemory memory;
  LinkUnderTest lut(c.kind, memory, c.max_chunk);
  CountingLink link(*lut.link);
  std::vector<float> data(c.count, 1.f), staging(c.max_chunk);
  std::vector<uint16_t> a(c.max_chunk), b(c.max_chunk);
  const DeviceRingWire wire{float16::Format::kBf16, {a.data(), b.data()}};
  int log2p = 0;
  while ((2 << log2p) <= n) ++log2p;
  const int extra = n - (1 << log2p);
  const size_t per_round = c.algorithm == Algorithm::kRing ? 2 * (n - 1)
                           : r >= 2 * extra                ? log2p
                           : r % 2 == 0                    ? 2
                                                           : log2p + 2;
  const size_t round = c.algorithm == Algorithm::kRing ? n * c.max_chunk : c.max_chunk;
  const size_t expected = n == 1 ? 0 : per_round * ((c.count + round - 1) / round);
  for (const DeviceRingWire* w : {static_cast<const DeviceRingWire*>(nullptr), &wire}) {
    link.exchanges = 0;
    device_allreduce(c, data.data(), data.data(), link, memory, staging.data(), w);
    memory.synchronize();
    EXPECT_EQ(static_cast<size_t>(link.exchanges), expected) << (w ? "bf16 wire" : "fp32");
  }
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kDoubling})
    for (LinkKind kind : {LinkKind::kPeerStaging, LinkKind::kHostStaged})
      for (auto [count, chunk] :
           {std::pair<size_t, size_t>{0, 16}, {1, 16}, {3, 16}, {1000, 4096}, {1000, 7}, {100003, 1024}})
        all.push_back({algorithm, kind, count, chunk});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Links, RingDeviceTest, testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

// --link on a device link: each exchange's data arrives no sooner than the emulated link delivers it, so a whole
// all-reduce takes at least its exchanges' chain of latencies and serialisations (a lower bound only: load only
// makes it longer), and the sums are the unemulated ones bit for bit. Both algorithms, on the ipc link's protocol.
TEST(RingDevice, AnEmulatedLinkDelaysEachExchangeAndKeepsTheBits) {
  const int n = world_size(), r = world_rank();
  if (n == 1) GTEST_SKIP() << "one rank exchanges nothing";
  constexpr double kLatencyUs = 2000, kGbps = 1;  // 2 ms, and 1 ms for each 125 KB
  constexpr size_t kChunk = 4096;                 // floats: 16 KiB a message, 0.131 ms at 1 Gbit/s
  const size_t count = 3 * kChunk + 5;
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kDoubling}) {
    const Case c{algorithm, LinkKind::kPeerStaging, count, kChunk};
    SCOPED_TRACE(case_name(c));
    DeferredMemory memory(5u + r);
    LinkUnderTest lut(c.kind, memory, kChunk);
    auto timing =
        std::make_unique<LinkEmulatedTransport>(std::make_unique<MpiTransport>(MPI_COMM_WORLD), kLatencyUs, kGbps);
    LinkEmulatedRingLink emulated(std::move(lut.link), std::move(timing), /*tag=*/5);
    CountingLink link(emulated);
    std::vector<float> data = random_floats(count, 31u + r), staging(kChunk);
    const int64_t start = monotonic_ns();  // before the barrier: before any rank sends
    MPI_Barrier(MPI_COMM_WORLD);
    device_allreduce(c, data.data(), data.data(), link, memory, staging.data());
    memory.synchronize();
    const double elapsed_us = (monotonic_ns() - start) / 1e3;

    std::vector<float> expected = random_floats(count, 31u + r);
    host_reference(c, expected, std::nullopt);
    size_t i = 0;
    while (i < count && float16::f32_bits(data[i]) == float16::f32_bits(expected[i])) ++i;
    EXPECT_EQ(i, count) << "element " << i << " differs from the unemulated sum";
    // Each message a rank receives arrives a latency after it was sent, and most were sent only after an earlier one
    // to their sender had arrived: half a latency a message received is a bound that holds for either algorithm
    // (~0.5 ms in all without the emulation).
    EXPECT_GE(elapsed_us, link.receives * kLatencyUs / 2) << link.receives << " messages received";
  }
}

TEST(RingDevice, AMessageLargerThanTheLinkBufferIsRefused) {
  HostMemory memory;
  MpiTransport tokens(MPI_COMM_WORLD);
  std::vector<float> host(4), data(5);
  HostStagedLink link(memory, tokens, host.data(), host.data(), host.size() * sizeof(float));
  EXPECT_THROW(link.exchange(data.data(), data.size() * sizeof(float), data.data(), 0), std::invalid_argument);
}

// Ranks whose all-reduces disagree about a message's size (another count, buckets in another order) are stopped
// by the go token's size, as a host link's receive of the wrong size is, instead of summing stale staging bytes:
// rank r sends 4 (r + 1) bytes and takes as many, so no rank's next takes what it sends.
TEST(RingDevice, PeerStagingRefusesAMessageOfAnotherSize) {
  const int r = world_rank(), n = world_size();
  if (n == 1) GTEST_SKIP() << "one rank exchanges nothing";
  HostMemory memory;
  LinkUnderTest lut(LinkKind::kPeerStaging, memory, 4 * n);
  std::vector<float> send(r + 1, 1.0f), recv(r + 1);
  const size_t bytes = send.size() * sizeof(float), next_takes = ((r + 1) % n + 1) * sizeof(float);
  try {
    lut.link->exchange(send.data(), bytes, recv.data(), bytes);
    ADD_FAILURE() << "rank " << r << ": a message of another size was taken";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("it takes " + std::to_string(next_takes) + " bytes, this rank sends " +
                                         std::to_string(bytes)),
              std::string::npos)
        << e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);  // no rank frees its staging while a peer may still touch it
}

// Ranks that run their buckets in another order, with messages of one size: each link whose messages go through a
// Transport carries the bucket (set_operation), so every rank's receive meets another bucket's tag and throws
// TagMismatch, where the sizes alone would have let it sum another bucket's data. Rank r runs bucket 10 + r.
TEST(RingDevice, BucketsInAnotherOrderAreRefused) {
  const int r = world_rank(), n = world_size();
  if (n == 1) GTEST_SKIP() << "one rank exchanges nothing";
  for (const LinkKind kind : {LinkKind::kPeerStaging, LinkKind::kHostStaged}) {
    SCOPED_TRACE(kind == LinkKind::kPeerStaging ? "peer staging" : "host staged");
    HostMemory memory;
    LinkUnderTest lut(kind, memory, 4);
    std::vector<float> send(4, 1.0f), recv(4);
    lut.link->set_operation(10 + r);
    try {
      lut.link->exchange(send.data(), sizeof(float) * 4, recv.data(), sizeof(float) * 4);
      ADD_FAILURE() << "rank " << r << ": another bucket's message was taken";
    } catch (const TagMismatch& e) {
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      const int theirs = kind == LinkKind::kPeerStaging ? 2 * (10 + next) : 10 + prev;  // the go token from next
      EXPECT_EQ(e.received_tag, theirs) << e.what();
    }
    MPI_Barrier(MPI_COMM_WORLD);  // no rank frees its staging or tokens while a peer may still touch them
  }
}

}  // namespace
}  // namespace ddplab
