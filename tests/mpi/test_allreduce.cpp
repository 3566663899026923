// Multi-rank tests of Communicator::allreduce_{sum,gradients} (ring and MPI_Allreduce) and of MpiTransport.
// ctest runs this binary with mpirun -np 1..4; every rank runs every test in the same order.
//
// Collectives inside a test must be reached by every rank, so checks here use EXPECT_* (never ASSERT_*, whose
// early return on one rank would leave the others waiting) and report a count of wrong elements plus the first
// one, as nccl-tests does, rather than millions of individual failures.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "comm/recursive_doubling.h"
#include "comm/ring_allreduce.h"
#include "comm/shm_transport.h"
#include "comm/transport.h"
#include "runtime/cpu_taken.h"
#include "tests/mpi/allreduce_check.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddplab {

void PrintTo(AllreduceImpl impl, std::ostream* os) { *os << to_string(impl); }

namespace {

// Counts that stress the chunking: empty, fewer elements than ranks, not divisible by ranks, large.
struct CountCase {
  const char* name;
  size_t (*count)(int n);
};
const CountCase kCounts[] = {
    {"0", [](int) -> size_t { return 0; }},
    {"1", [](int) -> size_t { return 1; }},
    {"n_minus_1", [](int n) -> size_t { return n - 1; }},
    {"n_plus_1", [](int n) -> size_t { return n + 1; }},
    {"7", [](int) -> size_t { return 7; }},
    {"1000", [](int) -> size_t { return 1000; }},
    {"1000003", [](int) -> size_t { return 1'000'003; }},
    {"4M_plus_5", [](int) -> size_t { return (size_t{4} << 20) + 5; }},
};

// Readable parameters in failure messages (gtest would print raw bytes).
void PrintTo(const CountCase& c, std::ostream* os) { *os << "count " << c.name; }

class AllreduceTest : public testing::TestWithParam<std::tuple<AllreduceImpl, CountCase>> {
 protected:
  AllreduceImpl impl() const { return std::get<0>(GetParam()); }
  size_t count() const { return std::get<1>(GetParam()).count(n_); }
  const int rank_ = world_rank(), n_ = world_size();
};

TEST_P(AllreduceTest, ExactInputsGiveExactSumOnEveryRank) {
  Communicator comm(MPI_COMM_WORLD, impl());
  std::vector<float> data = exact_inputs(rank_, count()), want(count());
  for (size_t i = 0; i < want.size(); ++i) want[i] = exact_sum(n_, i);
  comm.allreduce_sum(data.data(), data.size());
  EXPECT_EQ(bitwise_mismatch(data, want), "");
}

TEST_P(AllreduceTest, RandomInputsMatchMpiAndAreBitwiseEqualAcrossRanks) {
  Communicator comm(MPI_COMM_WORLD, impl());
  std::vector<float> data = random_inputs(rank_, count()), ref = data, abs_sum(count());
  for (size_t i = 0; i < data.size(); ++i) abs_sum[i] = std::fabs(data[i]);
  const int c = static_cast<int>(count());
  MPI_Allreduce(MPI_IN_PLACE, ref.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, abs_sum.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  comm.allreduce_sum(data.data(), data.size());

  // Any two summation orders of n terms differ by at most about (n-1) eps sum|x|; 4 eps covers n <= 4 with room.
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < data.size(); ++i)
    if (!(std::fabs(data[i] - ref[i]) <= 4 * FLT_EPSILON * abs_sum[i]) && wrong++ == 0) first = i;
  EXPECT_EQ(wrong, 0u) << "first at " << first << ": got " << data[first] << ", MPI_Allreduce " << ref[first];
  EXPECT_EQ(count_differing_across_ranks(data), 0u) << "ranks disagree on some elements";
}

// Out of place: the input is only read, the output gets the sum; for every size class (recursive doubling, one
// ring round, several rounds).
TEST_P(AllreduceTest, OutOfPlaceLeavesTheInputAndWritesTheSum) {
  Communicator comm(MPI_COMM_WORLD, CommOptions{impl(), WireDtype::kFp32, LinkModel{}});
  const std::vector<float> in = exact_inputs(rank_, count());
  std::vector<float> copy = in, out(count(), -1.0f), want(count());
  for (size_t i = 0; i < want.size(); ++i) want[i] = exact_sum(n_, i);
  comm.allreduce_sum_into(in.data(), out.data(), in.size(), 3);
  EXPECT_EQ(bitwise_mismatch(out, want), "");
  EXPECT_EQ(bitwise_mismatch(in, copy), "") << "the input changed";
}

// The gradients' all-reduce: the mean (the ring folds the factor into its last reduction) is bitwise the sum times
// 1/n, as a separate pass would round it, and every rank reports a NaN or Inf that any rank put anywhere.
TEST_P(AllreduceTest, GradientsAreTheSumTimesTheScaleBitwise) {
  Communicator comm(MPI_COMM_WORLD, impl());
  const float scale = 1.0f / static_cast<float>(n_);
  std::vector<float> data = exact_inputs(rank_, count()), want(count());
  for (size_t i = 0; i < want.size(); ++i) want[i] = exact_sum(n_, i) * scale;
  EXPECT_TRUE(comm.allreduce_gradients(data.data(), data.size(), scale, 5));
  EXPECT_EQ(bitwise_mismatch(data, want), "");
}

TEST_P(AllreduceTest, GradientsReportANonFiniteValueFromAnyRankAnywhere) {
  Communicator comm(MPI_COMM_WORLD, impl());
  if (count() == 0) GTEST_SKIP() << "no element to poison";
  // The first, a middle and the last element, each put on a different rank, as NaN, +Inf and -Inf.
  const size_t places[] = {0, count() / 2, count() - 1};
  const float poisons[] = {std::nanf(""), INFINITY, -INFINITY};
  for (int k = 0; k < 3; ++k) {
    std::vector<float> data = exact_inputs(rank_, count());
    if (rank_ == (k + 1) % n_) data[places[k]] = poisons[k];
    EXPECT_FALSE(comm.allreduce_gradients(data.data(), data.size(), 0.5f, k))
        << "element " << places[k] << " poisoned on rank " << (k + 1) % n_;
  }
  std::vector<float> clean = exact_inputs(rank_, count());
  EXPECT_TRUE(comm.allreduce_gradients(clean.data(), clean.size(), 0.5f, 3)) << "after the poisoned calls";
}

TEST_P(AllreduceTest, RepeatedCallsOnOneCommunicatorStayCorrect) {
  Communicator comm(MPI_COMM_WORLD, impl());
  std::vector<float> data, want(count());
  for (int rep = 1; rep <= 3; ++rep) {
    data = exact_inputs(rank_, count(), static_cast<float>(rep));
    for (size_t i = 0; i < want.size(); ++i) want[i] = exact_sum(n_, i) * static_cast<float>(rep);
    comm.allreduce_sum(data.data(), data.size());
    EXPECT_EQ(bitwise_mismatch(data, want), "") << "call " << rep;
  }
  // Reducing the (identical) result again multiplies it by n: the buffer that was just sent is valid input.
  for (float& w : want) w *= static_cast<float>(n_);
  comm.allreduce_sum(data.data(), data.size());
  EXPECT_EQ(bitwise_mismatch(data, want), "") << "second reduction of the result";
}

INSTANTIATE_TEST_SUITE_P(Counts, AllreduceTest,
                         testing::Combine(testing::Values(AllreduceImpl::kRing, AllreduceImpl::kMpi),
                                          testing::ValuesIn(kCounts)),
                         [](const testing::TestParamInfo<AllreduceTest::ParamType>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
                         });

// The sharded update's collectives (--zero-stage 1), on the ring's counts: what a rank owns, and the reduce-scatter
// followed by the all-gather giving the all-reduce's bits.
class ShardedTest : public testing::TestWithParam<CountCase> {
 protected:
  size_t count() const { return GetParam().count(n_); }
  bool small(const Communicator& comm) const {
    return count() * sizeof(float) <= small_allreduce_bytes(n_, comm.direct());
  }
  const int rank_ = world_rank(), n_ = world_size();
};

TEST_P(ShardedTest, OwnedChunksCoverTheBufferOnceAcrossRanks) {
  Communicator comm(MPI_COMM_WORLD, AllreduceImpl::kRing);
  std::vector<int> owners(count(), 0);
  size_t end = 0;
  for (const RingChunk& c : comm.owned_chunks(count())) {
    EXPECT_GE(c.offset, end) << "chunks overlap or are out of order";
    EXPECT_LE(c.offset + c.count, count());
    for (size_t i = c.offset; i < std::min(c.offset + c.count, count()); ++i) owners[i] = 1;
    end = c.offset + c.count;
  }
  MPI_Allreduce(MPI_IN_PLACE, owners.data(), static_cast<int>(count()), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  // A buffer small enough for recursive doubling is all-reduced whole and owned by every rank.
  const int want = small(comm) ? n_ : 1;
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < owners.size(); ++i)
    if (owners[i] != want && wrong++ == 0) first = i;
  EXPECT_EQ(wrong, 0u) << "first at " << first << ": " << owners[first] << " owners, want " << want;
}

TEST_P(ShardedTest, ReduceScatterThenAllGatherGiveTheAllReducesBits) {
  Communicator comm(MPI_COMM_WORLD, AllreduceImpl::kRing);
  const float scale = 1.0f / static_cast<float>(n_);
  std::vector<float> data = random_inputs(rank_, count()), reference = data;
  EXPECT_TRUE(comm.allreduce_gradients(reference.data(), count(), scale, 1));
  EXPECT_TRUE(comm.reduce_scatter_gradients(data.data(), count(), scale, 2));
  size_t wrong = 0;
  for (const RingChunk& c : comm.owned_chunks(count()))
    for (size_t i = c.offset; i < c.offset + c.count; ++i) wrong += std::memcmp(&data[i], &reference[i], 4) != 0;
  EXPECT_EQ(wrong, 0u) << "owned elements after the reduce-scatter differ from the all-reduce's";
  comm.all_gather(data.data(), count(), 3);
  EXPECT_EQ(bitwise_mismatch(data, reference), "");
}

// Each rank checks what it owns: the owner of a poisoned element reports it (the Reducer then agrees across ranks).
TEST_P(ShardedTest, TheOwnerOfANonFiniteSumReportsIt) {
  Communicator comm(MPI_COMM_WORLD, AllreduceImpl::kRing);
  if (count() == 0) GTEST_SKIP() << "no element to poison";
  const size_t place = count() / 2;
  std::vector<float> data = exact_inputs(rank_, count());
  if (rank_ == n_ - 1) data[place] = std::nanf("");
  const bool finite = comm.reduce_scatter_gradients(data.data(), count(), 0.5f, 4);
  bool owns = false;
  for (const RingChunk& c : comm.owned_chunks(count())) owns |= place >= c.offset && place < c.offset + c.count;
  EXPECT_EQ(finite, !owns) << "rank " << rank_ << (owns ? " owns" : " does not own") << " the poisoned element";
}

INSTANTIATE_TEST_SUITE_P(Counts, ShardedTest, testing::ValuesIn(kCounts),
                         [](const testing::TestParamInfo<CountCase>& info) { return std::string(info.param.name); });

// One Communicator across growing and shrinking sizes: the ring's scratch is reused, never stale.
class AllreduceImplTest : public testing::TestWithParam<AllreduceImpl> {};

TEST_P(AllreduceImplTest, OneCommunicatorAcrossSizes) {
  const int rank = world_rank(), n = world_size();
  Communicator comm(MPI_COMM_WORLD, GetParam());
  const size_t counts[] = {1000, 7, 1'000'003, 0, 1, static_cast<size_t>(n) + 1, 1000};
  for (size_t count : counts) {
    std::vector<float> data = exact_inputs(rank, count), want(count);
    for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n, i);
    comm.allreduce_sum(data.data(), count);
    EXPECT_EQ(bitwise_mismatch(data, want), "") << "count " << count;
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, AllreduceImplTest, testing::Values(AllreduceImpl::kRing, AllreduceImpl::kMpi),
                         [](const testing::TestParamInfo<AllreduceImpl>& info) { return to_string(info.param); });

// A tiny message limit (odd, so float boundaries split too) runs the >INT_MAX splitting path on small buffers.
TEST(RingOverMpiTransport, MessagesSplitIntoPiecesStayCorrect) {
  const int rank = world_rank(), n = world_size();
  MpiTransport transport(MPI_COMM_WORLD, /*max_message_bytes=*/7);
  RingScratch scratch;
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
    std::vector<float> data = exact_inputs(rank, count), want(count);
    for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n, i);
    ring_allreduce_sum(data.data(), count, transport, scratch, RingOptions{});
    EXPECT_EQ(bitwise_mismatch(data, want), "") << "count " << count;
  }
}

// Every algorithm and wire, sliced into several rounds (the last one short) or not: the contract holds and exact
// inputs (small integers, exact in bf16 and fp16 too) give the exact sum.
struct AlgoCase {
  const char* name;
  bool recursive_doubling;
  size_t slice_elems;
  size_t slices_per_chunk;
  bool wire16;
  float16::Format format;
};
void PrintTo(const AlgoCase& c, std::ostream* os) { *os << c.name; }
const AlgoCase kAlgos[] = {
    {"ring", false, 0, 1, false, float16::Format::kBf16},
    {"ring_sliced", false, 1000, 4, false, float16::Format::kBf16},
    {"ring_sliced_tiny", false, 7, 3, false, float16::Format::kBf16},  // uneven slices, empty ones for tiny counts
    {"ring_sliced_bf16", false, 1000, 4, true, float16::Format::kBf16},
    {"ring_sliced_tiny_fp16", false, 7, 3, true, float16::Format::kFp16},
    {"ring_fp16", false, 0, 1, true, float16::Format::kFp16},
    {"recursive_doubling", true, 0, 1, false, float16::Format::kBf16},
    {"recursive_doubling_bf16", true, 0, 1, true, float16::Format::kBf16},
    {"recursive_doubling_fp16", true, 0, 1, true, float16::Format::kFp16},
};

// The transports beneath: MPI, shared memory with a roomy FIFO, and shared memory with a FIFO far smaller than
// the messages (every message streams through in pieces, wraps around, and waits for the receiver).
enum class TransportKind { kMpi, kShm, kShmTiny };
std::unique_ptr<Transport> make_transport(TransportKind kind) {
  switch (kind) {
    case TransportKind::kMpi:
      return std::make_unique<MpiTransport>(MPI_COMM_WORLD);
    case TransportKind::kShm:
      return std::make_unique<ShmTransport>(MPI_COMM_WORLD);
    case TransportKind::kShmTiny:
      return std::make_unique<ShmTransport>(MPI_COMM_WORLD, /*fifo_bytes=*/256);
  }
  return nullptr;
}
const char* name_of(TransportKind kind) {
  return kind == TransportKind::kMpi ? "mpi" : kind == TransportKind::kShm ? "shm" : "shm_tiny";
}

class AlgorithmTest : public testing::TestWithParam<std::tuple<AlgoCase, TransportKind>> {
 protected:
  std::unique_ptr<Transport> transport() const { return make_transport(std::get<1>(GetParam())); }
  // A 256-byte FIFO moves 192 bytes per hand-off, and 7-element slices make a message per 21 elements: large buffers
  // would be ~100K messages per rank (minutes on a busy 2-core host, where every message waits for its receiver to
  // get a CPU) and test nothing the smaller counts do not.
  bool too_large(size_t count) const {
    const size_t slice = std::get<0>(GetParam()).slice_elems;
    const bool tiny_pieces = std::get<1>(GetParam()) == TransportKind::kShmTiny || (slice > 0 && slice < 100);
    return tiny_pieces && count > 10'000;
  }
  void run(float* data, size_t count, Transport& t, RingScratch& scratch, int tag = 0) {
    const AlgoCase& a = std::get<0>(GetParam());
    RingOptions o;
    o.slice_elems = a.slice_elems;
    o.slices_per_chunk = a.slices_per_chunk;
    o.wire16 = a.wire16;
    o.format = a.format;
    o.tag = tag;
    if (a.recursive_doubling)
      recursive_doubling_allreduce_sum(data, count, t, scratch, o);
    else
      ring_allreduce_sum(data, count, t, scratch, o);
  }
};

TEST_P(AlgorithmTest, SendBuffersStayUntouchedUntilRetired) {
  const int rank = world_rank(), n = world_size();
  const std::unique_ptr<Transport> inner = this->transport();
  ContractCheckingTransport transport(*inner);
  RingScratch scratch;
  // Exact in 16 bits too: sums up to 17 * 10 = 170 are integers below 256 (bf16 has 8 significant bits).
  for (size_t count : {size_t{1}, static_cast<size_t>(n) + 1, size_t{1000}, size_t{4003}, size_t{1'000'003}}) {
    if (too_large(count)) continue;
    std::vector<float> data = exact_inputs(rank, count), want(count);
    for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n, i);
    const size_t modified_before = transport.modified();
    run(data.data(), count, transport, scratch, /*tag=*/static_cast<int>(count % 1000));
    EXPECT_EQ(transport.modified() - modified_before, 0u)
        << "count " << count << ": a send buffer changed before wait_sends";
    EXPECT_EQ(transport.in_flight(), 0u) << "count " << count << ": returned with sends in flight";
    EXPECT_EQ(bitwise_mismatch(data, want), "") << "count " << count;
  }
}

TEST_P(AlgorithmTest, RandomInputsAreBitwiseEqualAcrossRanks) {
  const int rank = world_rank();
  const std::unique_ptr<Transport> transport = this->transport();
  RingScratch scratch;
  for (size_t count : {size_t{3}, size_t{4001}, size_t{100'000}}) {
    if (too_large(count)) continue;
    std::vector<float> data = random_inputs(rank, count);
    run(data.data(), count, *transport, scratch);
    EXPECT_EQ(count_differing_across_ranks(data), 0u) << "count " << count << ": ranks disagree";
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AlgorithmTest,
                         testing::Combine(testing::ValuesIn(kAlgos),
                                          testing::Values(TransportKind::kMpi, TransportKind::kShm,
                                                          TransportKind::kShmTiny)),
                         [](const testing::TestParamInfo<AlgorithmTest::ParamType>& info) {
                           return std::string(std::get<0>(info.param).name) + "_" + name_of(std::get<1>(info.param));
                         });

TEST(RingChunk, CoversTheBufferWithFirstChunksOneLonger) {
  for (int n = 1; n <= 5; ++n) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{4}, size_t{5}, size_t{6}, size_t{13}}) {
      size_t next_offset = 0;
      for (int k = 0; k < n; ++k) {
        const RingChunk c = ring_chunk(count, n, k);
        EXPECT_EQ(c.offset, next_offset) << "n " << n << " count " << count << " k " << k;
        EXPECT_EQ(c.count, count / n + (static_cast<size_t>(k) < count % n ? 1 : 0));
        next_offset += c.count;
      }
      EXPECT_EQ(next_offset, count) << "n " << n;
    }
  }
}

// Only local argument checks fail here, so every rank throws at the same call and no collective is left hanging.
TEST(MpiTransport, ErrorsThrowWithRankAndCall) {
  const int rank = world_rank(), n = world_size();
  MpiTransport transport(MPI_COMM_WORLD);
  float x = 0;
  const std::string prefix = "rank " + std::to_string(rank) + ": ";
  try {
    transport.send(/*peer=*/n, &x, sizeof x, /*tag=*/0);
    ADD_FAILURE() << "send to a rank outside the communicator did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(prefix + "MPI_Isend failed: ", 0), 0u) << e.what();
  }
  try {
    transport.recv(/*peer=*/n + 1, &x, sizeof x, /*tag=*/0);
    ADD_FAILURE() << "recv from a rank outside the communicator did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(prefix + "MPI_Irecv failed: ", 0), 0u) << e.what();
  }
  EXPECT_THROW(MpiTransport(MPI_COMM_WORLD, 0), std::invalid_argument);
}

TEST(ParseAllreduceImpl, NamesRoundTrip) {
  for (AllreduceImpl impl : {AllreduceImpl::kRing, AllreduceImpl::kMpi, AllreduceImpl::kHier, AllreduceImpl::kNccl})
    EXPECT_EQ(parse_choice<AllreduceImpl>(to_string(impl), "--comm"), impl);
  EXPECT_STREQ(to_string(AllreduceImpl::kRing), "ring");
  EXPECT_STREQ(to_string(AllreduceImpl::kMpi), "mpi");
}

TEST(ParseAllreduceImpl, UnknownNamesThrowWithTheExpectedChoices) {
  for (const char* bad : {"gloo", "", "Ring", "mpi "}) {
    try {
      parse_choice<AllreduceImpl>(bad, "--comm");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "--comm must be ring, mpi, hier or nccl (got '" + std::string(bad) + "')");
    }
  }
}

// allreduce_perf --diag's counters: a receiver whose sender comes 30 ms late waits once, and that wait's time covers
// the delay; its sleeps fall inside it. The shared segments' pages are reported placed once the FIFOs are written.
TEST(ShmTransportDiagnosis, CountsAWaitAndItsTimeAndPlacesPages) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  ShmTransport t(MPI_COMM_WORLD);
  if (t.local_peers() == 0) GTEST_SKIP() << "ranks on different hosts";
  const int rank = world_rank();
  // From before the barrier: a receiver that leaves it late, waiting for a CPU, sees less of the sender's 30 ms.
  const CpuTakenMeter meter;
  const CpuTaken cpu_before = meter.read();
  MPI_Barrier(MPI_COMM_WORLD);
  float value = 1.0f;
  std::string excused;
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    t.send(0, &value, sizeof value, 7);
    t.wait_sends();
  } else if (rank == 0) {
    const ShmWaitStats before = shm_wait_stats();
    t.recv(1, &value, sizeof value, 7);
    const ShmWaitStats w = shm_wait_stats() - before;
    const double short_ms = 25.0 - static_cast<double>(w.wait_ns) * 1e-6;  // the sender's 30 ms, less the skew
    const double cpu_wait_ms = taken_between(cpu_before, meter.read()).cpu_wait_ms;
    if (short_ms > 0 && cpu_wait_ms >= short_ms) {
      excused = "the wait was " + std::to_string(short_ms) + " ms short of 25 ms, and this rank waited " +
                std::to_string(cpu_wait_ms) + " ms for a CPU meanwhile";
    } else {
      EXPECT_EQ(w.waits, 1u);
      EXPECT_GE(w.wait_ns, 25'000'000u) << "this rank waited " << cpu_wait_ms << " ms for a CPU";
      EXPECT_GE(w.spin_polls + w.yield_polls + w.sleeps, 1u);
    }
    EXPECT_LE(w.sleep_ns, w.wait_ns);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string placement = shm_page_placement();
  EXPECT_NE(placement.find("NUMA node"), std::string::npos) << placement;
  EXPECT_NE(placement.find("pages on node"), std::string::npos) << placement;
  if (!excused.empty()) GTEST_SKIP() << "the wait's count and time: " << excused;
}

}  // namespace
}  // namespace ddplab
