// The device ring (comm/ring_device.h) on host memory: the schedule, the primitives and the links' protocols are the
// code the GPU runs, with the CUDA stream replaced by a RingMemory that runs each queued operation only when the
// host synchronizes (so a missing wait in a link reads stale data and breaks the sums), and CUDA IPC's mapped
// neighbour buffer replaced by an MPI shared-memory window. References: exactly summable inputs, and the host
// all-reduce of the same arithmetic bit for bit: the host ring with the same chunking (the same summation order),
// and at two ranks recursive doubling (one exchange of the whole round, both operands on the wire).
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
#include <vector>

#include "comm/recursive_doubling.h"
#include "comm/ring_allreduce.h"
#include "comm/ring_device.h"
#include "comm/transport.h"
#include "mpi_test_util.h"

namespace ddplab {
namespace {

// A stream stand-in: copies and adds wait in a queue until synchronize(), the way a GPU runs them "later".
class DeferredMemory final : public RingMemory {
 public:
  void copy(void* dst, const void* src, size_t bytes) override {
    queue_.push_back([=] { host_.copy(dst, src, bytes); });
  }
  void add(float* out, const float* a, const float* b, size_t count) override {
    queue_.push_back([=] { host_.add(out, a, b, count); });
  }
  void encode(float16::Format f, uint16_t* dst, const float* src, size_t count) override {
    queue_.push_back([=] { host_.encode(f, dst, src, count); });
  }
  void decode(float16::Format f, float* dst, const uint16_t* src, size_t count) override {
    queue_.push_back([=] { host_.decode(f, dst, src, count); });
  }
  void add_encode(float16::Format f, uint16_t* io, const float* own, size_t count) override {
    queue_.push_back([=] { host_.add_encode(f, io, own, count); });
  }
  void synchronize() override {
    for (auto& op : queue_) op();
    queue_.clear();
  }

 private:
  HostMemory host_;
  std::vector<std::function<void()>> queue_;
};

// The staging buffers of every rank of the node in one MPI shared-memory window: each rank gets its own and a
// pointer to next's, as cudaIpcOpenMemHandle gives on the GPU.
class SharedStaging {
 public:
  explicit SharedStaging(size_t bytes) {
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_);
    int n = 1, r = 0;
    MPI_Comm_size(node_, &n);
    MPI_Comm_rank(node_, &r);
    if (n != world_size()) throw std::runtime_error("the peer-staging test needs every rank on one node");
    MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, MPI_INFO_NULL, node_, &mine_, &win_);
    MPI_Aint size = 0;
    int disp = 1;
    MPI_Win_shared_query(win_, (r + 1) % n, &size, &disp, &next_);
  }
  ~SharedStaging() {
    MPI_Win_free(&win_);
    MPI_Comm_free(&node_);
  }
  void* mine() const { return mine_; }
  void* next() const { return next_; }

 private:
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  void* mine_ = nullptr;
  void* next_ = nullptr;
};

enum class LinkKind { kPeerStaging, kHostStaged };

// One link of either kind with its buffers, over a fresh MpiTransport.
struct LinkUnderTest {
  LinkUnderTest(LinkKind kind, RingMemory& memory, size_t max_floats) : tokens(MPI_COMM_WORLD) {
    const size_t bytes = max_floats * sizeof(float);
    if (kind == LinkKind::kPeerStaging) {
      shared = std::make_unique<SharedStaging>(bytes);
      link = std::make_unique<PeerStagingLink>(memory, tokens, shared->mine(), shared->next(), bytes, /*tag=*/3);
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

struct Case {
  LinkKind kind;
  size_t count;
  size_t max_chunk;  // floats per link message: small values force many rounds
};

std::string case_name(const Case& c) {
  return std::string(c.kind == LinkKind::kPeerStaging ? "PeerStaging" : "HostStaged") + "_count" +
         std::to_string(c.count) + "_chunk" + std::to_string(c.max_chunk);
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

class RingDeviceTest : public testing::TestWithParam<Case> {};

// What the device all-reduce must equal bit for bit, computed in place by the host's own all-reduce: the ring with
// the device ring's chunking, or at two ranks recursive doubling (elementwise, so its chunking does not matter).
void host_reference(std::vector<float>& data, size_t max_chunk, std::optional<float16::Format> wire) {
  MpiTransport transport(MPI_COMM_WORLD);
  RingScratch scratch;
  RingOptions options;
  options.slice_elems = max_chunk;
  options.slices_per_chunk = 1;
  options.wire16 = wire.has_value();
  if (wire) options.format = *wire;
  if (world_size() == 2) return recursive_doubling_allreduce_sum(data.data(), data.size(), transport, scratch, options);
  ring_allreduce_sum(data.data(), data.size(), transport, scratch, options);
}

// Counts a link's exchanges: what an exchange costs where ranks share a GPU is a fixed time.
class CountingLink final : public RingLink {
 public:
  explicit CountingLink(RingLink& link) : link_(link) {}
  int rank() const override { return link_.rank(); }
  int size() const override { return link_.size(); }
  size_t max_bytes() const override { return link_.max_bytes(); }
  void exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) override {
    ++exchanges;
    link_.exchange(send, send_bytes, recv, recv_bytes);
  }
  const char* name() const override { return link_.name(); }
  int exchanges = 0;

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
  ring_allreduce_sum(data.data(), data.data(), c.count, *lut.link, memory, staging.data());
  memory.synchronize();
  for (size_t i = 0; i < c.count; ++i)
    ASSERT_EQ(data[i], static_cast<float>(n * (i % 97) + 100 * n * (n - 1) / 2)) << "element " << i;
}

TEST_P(RingDeviceTest, RandomInputsMatchTheHostRingBitForBitOutOfPlace) {
  const Case c = GetParam();
  const int r = world_rank();
  DeferredMemory memory;
  LinkUnderTest lut(c.kind, memory, c.max_chunk);
  const std::vector<float> in = random_floats(c.count, 1234u + r);
  std::vector<float> out(c.count, -7.f), staging(device_ring_max_chunk(*lut.link));
  ring_allreduce_sum(in.data(), out.data(), c.count, *lut.link, memory, staging.data());
  memory.synchronize();
  EXPECT_EQ(in, random_floats(c.count, 1234u + r)) << "the input was written";

  std::vector<float> expected = in;
  host_reference(expected, c.max_chunk, std::nullopt);
  for (size_t i = 0; i < c.count; ++i) ASSERT_EQ(out[i], expected[i]) << "element " << i;
}

// The 16-bit wire: the host's wire16 arithmetic, so the same chunking gives the same bits; in place, the owner
// keeps the rounded sum everyone else decodes (at two ranks, both compute it).
TEST_P(RingDeviceTest, SixteenBitWireMatchesTheHostRingBitForBit) {
  const Case c = GetParam();
  const int r = world_rank();
  for (float16::Format format : {float16::Format::kBf16, float16::Format::kFp16}) {
    DeferredMemory memory;
    LinkUnderTest lut(c.kind, memory, c.max_chunk);
    std::vector<uint16_t> a(device_ring_max_chunk(*lut.link)), b(a.size());
    const DeviceRingWire wire{format, {a.data(), b.data()}};
    std::vector<float> data = random_floats(c.count, 99u + r);
    ring_allreduce_sum(data.data(), data.data(), c.count, *lut.link, memory, nullptr, &wire);
    memory.synchronize();

    std::vector<float> expected = random_floats(c.count, 99u + r);
    host_reference(expected, c.max_chunk, format);
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
    ring_allreduce_sum(data.data(), data.data(), c.count, *lut.link, memory, staging.data());
    memory.synchronize();
    EXPECT_EQ(std::count(data.begin(), data.end(), static_cast<float>(call * n)), static_cast<long>(c.count))
        << "call " << call;
  }
}

// The ring's 2(n-1) exchanges a round of n chunks; two ranks one a round of one chunk, half the ring's count for a
// buffer that fits one round. Either wire.
TEST_P(RingDeviceTest, ExchangesPerRound) {
  const Case c = GetParam();
  const size_t n = static_cast<size_t>(world_size());
  DeferredMemory memory;
  LinkUnderTest lut(c.kind, memory, c.max_chunk);
  CountingLink link(*lut.link);
  std::vector<float> data(c.count, 1.f), staging(c.max_chunk);
  std::vector<uint16_t> a(c.max_chunk), b(c.max_chunk);
  const DeviceRingWire wire{float16::Format::kBf16, {a.data(), b.data()}};
  for (const DeviceRingWire* w : {static_cast<const DeviceRingWire*>(nullptr), &wire}) {
    link.exchanges = 0;
    ring_allreduce_sum(data.data(), data.data(), c.count, link, memory, staging.data(), w);
    memory.synchronize();
    const size_t expected = n == 1 || c.count == 0 ? 0
                            : n == 2               ? (c.count + c.max_chunk - 1) / c.max_chunk
                                     : 2 * (n - 1) * ((c.count + n * c.max_chunk - 1) / (n * c.max_chunk));
    EXPECT_EQ(static_cast<size_t>(link.exchanges), expected) << (w ? "bf16 wire" : "fp32");
  }
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (LinkKind kind : {LinkKind::kPeerStaging, LinkKind::kHostStaged})
    for (Case c : {Case{kind, 0, 16}, Case{kind, 1, 16}, Case{kind, 3, 16}, Case{kind, 1000, 4096},
                   Case{kind, 1000, 7}, Case{kind, 100003, 1024}})
      all.push_back(c);
  return all;
}

INSTANTIATE_TEST_SUITE_P(Links, RingDeviceTest, testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(RingDevice, AMessageLargerThanTheLinkBufferIsRefused) {
  HostMemory memory;
  MpiTransport tokens(MPI_COMM_WORLD);
  std::vector<float> host(4), data(5);
  HostStagedLink link(memory, tokens, host.data(), host.data(), host.size() * sizeof(float));
  EXPECT_THROW(link.exchange(data.data(), data.size() * sizeof(float), data.data(), 0), std::invalid_argument);
}

}  // namespace
}  // namespace ddplab
