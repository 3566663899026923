// Single copy over shared memory (comm/shm_transport.h): sends from a RegisteredBuffer travel by reference and the
// receiver reads the sender's buffer. Exact sums over registered, ordinary and mixed buffers; the send contract
// (a buffer stays untouched until retired) held while peers read it in place; the acknowledgement that completes
// such a send; references only to peers that map the segment; tag checks; hier and link emulation on top.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/link_emulation.h"
#include "comm/ring_allreduce.h"
#include "comm/shm_direct.h"
#include "comm/shm_transport.h"
#include "tests/mpi/allreduce_check.h"

namespace ddplab {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Whether this rank reaches a peer through shared memory at all (ranks on other hosts would not).
bool host_has_peers() {
  ShmTransport t(MPI_COMM_WORLD);
  return t.local_peers() > 0;
}

std::vector<float> copy_of(const float* p, size_t count) { return std::vector<float>(p, p + count); }

// Where the buffers of one all-reduce live: registered on every rank, registered on even ranks only (odd ranks
// all-reduce ordinary vectors: both paths meet in one ring), or out of place with only the input registered.
enum class Layout { kRegistered, kEvenRanksOnly, kInputOnly };
const char* name_of(Layout l) {
  return l == Layout::kRegistered ? "registered" : l == Layout::kEvenRanksOnly ? "even_ranks_only" : "input_only";
}

class RegisteredAllreduce : public testing::TestWithParam<std::tuple<Layout, bool /*in place*/>> {};

// The ring's messages (the direct all-reduce, which sends none, is tested below).
CommOptions ring_only() {
  CommOptions o;
  o.direct = false;
  return o;
}

TEST_P(RegisteredAllreduce, SumsExactlyAndSendsByReferenceFromRegisteredBuffersOnly) {
  const auto [layout, in_place] = GetParam();
  if (layout == Layout::kInputOnly && in_place) GTEST_SKIP() << "one buffer in place";
  const int rank = world_rank(), n = world_size();
  Communicator comm(MPI_COMM_WORLD, ring_only());
  EXPECT_FALSE(comm.direct());
  const bool shm = n > 1 && host_has_peers();
  EXPECT_EQ(comm.single_copy(), shm);
  // Odd sizes: recursive doubling (<= 16 KiB), one unsliced ring message per chunk, many slices and rounds.
  for (size_t count : {size_t{1}, size_t{11}, size_t{4099}, size_t{100'003}, size_t{1'000'003}}) {
    const RegisteredBuffer in_memory = comm.allocate_registered(count * sizeof(float));
    const RegisteredBuffer out_memory = comm.allocate_registered(count * sizeof(float));
    EXPECT_EQ(in_memory.registered(), shm);
    std::vector<float> in_heap(count), out_heap(count);
    const bool use_registered = layout != Layout::kEvenRanksOnly || rank % 2 == 0;
    float* in = use_registered ? static_cast<float*>(in_memory.data()) : in_heap.data();
    float* out = layout == Layout::kInputOnly ? out_heap.data()
                 : use_registered             ? static_cast<float*>(out_memory.data())
                                              : out_heap.data();
    const std::vector<float> inputs = exact_inputs(rank, count);
    std::copy(inputs.begin(), inputs.end(), in);
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n, i);

    const ShmSendCounts before = shm_send_counts();
    if (in_place)
      comm.allreduce_sum(in, count, /*tag=*/static_cast<int>(count % 1000));
    else
      comm.allreduce_sum_into(in, out, count, /*tag=*/static_cast<int>(count % 1000));
    const ShmSendCounts sent = {shm_send_counts().by_reference - before.by_reference,
                                shm_send_counts().copied - before.copied};

    EXPECT_EQ(bitwise_mismatch(copy_of(in_place ? in : out, count), want), "") << "count " << count;
    if (!in_place) {
      EXPECT_EQ(bitwise_mismatch(copy_of(in, count), inputs), "") << "count " << count << ": input changed";
    }
    // A message larger than a record's 40 bytes goes by reference exactly when it lies in registered memory. Out of
    // place, recursive doubling (small buffers) first copies the input into the output, and sends from there.
    const bool large = count / n * sizeof(float) > 40;
    const bool sends_from_registered =
        layout != Layout::kInputOnly || count * sizeof(float) > small_allreduce_bytes(n, comm.direct());
    if (shm && use_registered && large && sends_from_registered) {
      EXPECT_GT(sent.by_reference, 0u) << "count " << count << ": nothing went by reference";
    }
    if (!use_registered || !shm) {
      EXPECT_EQ(sent.by_reference, 0u) << "count " << count;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RegisteredAllreduce,
                         testing::Combine(testing::Values(Layout::kRegistered, Layout::kEvenRanksOnly,
                                                          Layout::kInputOnly),
                                          testing::Bool()),
                         [](const testing::TestParamInfo<RegisteredAllreduce::ParamType>& info) {
                           return std::string(name_of(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_in_place" : "_out_of_place");
                         });

// The direct all-reduce (comm/shm_direct.h): where every rank's buffers are registered, each rank sums
// its chunks of every rank's buffer and stores them into every rank's output. Its result is the ring's bit for bit
// (random inputs, whose sums round: the order of the additions shows), the input is untouched out of place, and
// where some rank's buffer is ordinary memory every rank runs the ring instead.
TEST_P(RegisteredAllreduce, DirectGivesTheRingsBitsWhereEveryRankIsRegistered) {
  const auto [layout, in_place] = GetParam();
  if (layout == Layout::kInputOnly && in_place) GTEST_SKIP() << "one buffer in place";
  const int rank = world_rank(), n = world_size();
  Communicator direct(MPI_COMM_WORLD, CommOptions{}), ring(MPI_COMM_WORLD, ring_only());
  const bool one_host = n > 1 && ShmTransport(MPI_COMM_WORLD).local_peers() == n - 1;
  EXPECT_EQ(direct.direct(), one_host);
  EXPECT_EQ(direct.transport_name().find("direct collectives") != std::string::npos, one_host);
  // The last count puts every rank's output together past the last-level cache: out of place, the sums then go out
  // with non-temporal stores (odd, so that chunks start unaligned: the stores' ordinary ends).
  const size_t streamed = last_level_cache_bytes() / sizeof(float) / static_cast<size_t>(n) + 1001;
  for (size_t count : {size_t{11}, size_t{2'001}, size_t{16'411}, size_t{100'003}, size_t{1'000'003}, streamed}) {
    RegisteredBuffer in_memory = direct.allocate_registered(count * sizeof(float));
    RegisteredBuffer out_memory = direct.allocate_registered(count * sizeof(float));
    std::vector<float> in_heap(count), out_heap(count);
    const bool use_registered = layout != Layout::kEvenRanksOnly || rank % 2 == 0;
    float* in = use_registered ? static_cast<float*>(in_memory.data()) : in_heap.data();
    float* out =
        layout == Layout::kInputOnly || !use_registered ? out_heap.data() : static_cast<float*>(out_memory.data());
    if (in_place) out = in;
    const std::vector<float> inputs = random_inputs(rank, count);
    std::vector<float> want = inputs;
    ring.allreduce_sum(want.data(), count, /*tag=*/1);

    std::copy(inputs.begin(), inputs.end(), in);
    const uint64_t before = shm_direct_collectives(), streamed_before = shm_streamed_collectives();
    direct.allreduce_sum_into(in, out, count, /*tag=*/2);
    const bool everyone_registered = layout == Layout::kRegistered || (layout == Layout::kEvenRanksOnly && n == 1);
    const bool expect_direct =
        one_host && everyone_registered && count * sizeof(float) > small_allreduce_bytes(n, direct.direct());
    EXPECT_EQ(shm_direct_collectives() - before, expect_direct ? 1u : 0u) << "count " << count;
    const bool expect_streamed =  // out of place, every rank's output together past the last-level cache
        expect_direct && !in_place && count * sizeof(float) * static_cast<size_t>(n) >= last_level_cache_bytes();
    EXPECT_EQ(shm_streamed_collectives() - streamed_before, expect_streamed ? 1u : 0u) << "count " << count;
    EXPECT_EQ(bitwise_mismatch(copy_of(out, count), want), "") << "count " << count;
    if (!in_place) {
      EXPECT_EQ(bitwise_mismatch(copy_of(in, count), inputs), "") << "count " << count << ": input changed";
    }
  }
}

// The gradients' all-reduce on the direct path: the mean's scale applied where each sum is formed, as the ring does
// (the same bits), and a NaN on one rank reported by every rank.
TEST(RegisteredAllreduceDirect, ScalesAndReportsANonFiniteSumOnEveryRank) {
  const int rank = world_rank(), n = world_size();
  Communicator direct(MPI_COMM_WORLD, CommOptions{}), ring(MPI_COMM_WORLD, ring_only());
  if (!direct.direct()) GTEST_SKIP() << "the direct all-reduce needs 2+ ranks on one host";
  const size_t count = 300'007;
  RegisteredBuffer memory = direct.allocate_registered(count * sizeof(float));
  float* data = static_cast<float*>(memory.data());
  const std::vector<float> inputs = random_inputs(rank, count);
  for (size_t poisoned : {count, size_t{0}, count / 2, count - 1}) {  // count: none
    std::vector<float> want = inputs;
    std::copy(inputs.begin(), inputs.end(), data);
    if (poisoned < count && rank == n - 1) want[poisoned] = data[poisoned] = std::nanf("");
    const bool ring_finite = ring.allreduce_gradients(want.data(), count, 1.0f / n, /*tag=*/3);
    const uint64_t before = shm_direct_collectives();
    const bool finite = direct.allreduce_gradients(data, count, 1.0f / n, /*tag=*/4);
    EXPECT_EQ(shm_direct_collectives() - before, 1u);
    EXPECT_EQ(finite, poisoned == count) << "NaN at " << poisoned;
    EXPECT_EQ(ring_finite, finite);
    if (poisoned == count) {
      EXPECT_EQ(bitwise_mismatch(copy_of(data, count), want), "");
    }
  }
}

// A registration that fails (here every rank's file size limit, as a /dev/shm too small fails it) leaves ordinary
// memory, and what the Communicator says it uses is what its collectives then do: no single copy and no direct
// collectives, in transport_name() and in the messages, the sums exact.
TEST(RegisteredAllreduceDirect, AFailedRegistrationDropsSingleCopyAndDirectInNameAndDeed) {
  const int rank = world_rank(), n = world_size();
  Communicator comm(MPI_COMM_WORLD, CommOptions{});
  if (!comm.direct()) GTEST_SKIP() << "the direct all-reduce needs 2+ ranks on one host";
  const size_t count = 300'007;  // above the recursive-doubling size: the ring, or direct
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  void (*saved_handler)(int) = signal(SIGXFSZ, SIG_IGN);  // ftruncate past the limit: EFBIG, not death
  rlimit small = saved;
  small.rlim_cur = count * sizeof(float) / 2;
  setrlimit(RLIMIT_FSIZE, &small);
  RegisteredBuffer memory = comm.allocate_registered(count * sizeof(float));
  RegisteredBuffer later = comm.allocate_registered(count * sizeof(float));  // after the limit is gone: still copies
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, saved_handler);

  EXPECT_FALSE(memory.registered());
  EXPECT_NE(memory.registration_error().find("File too large"), std::string::npos) << memory.registration_error();
  EXPECT_FALSE(later.registered());
  EXPECT_FALSE(comm.single_copy());
  EXPECT_FALSE(comm.direct());
  EXPECT_EQ(comm.transport_name(), "shm (copies: registering the buffers failed)");
  for (float* data : {static_cast<float*>(memory.data()), static_cast<float*>(later.data())}) {
    const std::vector<float> inputs = exact_inputs(rank, count);
    std::copy(inputs.begin(), inputs.end(), data);
    const uint64_t direct_before = shm_direct_collectives();
    const ShmSendCounts before = shm_send_counts();
    comm.allreduce_sum(data, count, /*tag=*/8);
    EXPECT_EQ(shm_direct_collectives() - direct_before, 0u) << "a direct collective ran";
    EXPECT_EQ(shm_send_counts().by_reference - before.by_reference, 0u) << "a send went by reference";
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n, i);
    EXPECT_EQ(bitwise_mismatch(copy_of(data, count), want), "");
  }
}

// Calls back to back, as the Reducer's buckets come, with one rank late by turns: a rank that leaves a call early
// must not read a board its late peer has not yet rewritten, nor the late one a board already at the next call.
TEST(RegisteredAllreduceDirect, BackToBackCallsWithALateRankStayExact) {
  const int rank = world_rank(), n = world_size();
  Communicator direct(MPI_COMM_WORLD, CommOptions{});
  if (!direct.direct()) GTEST_SKIP() << "the direct all-reduce needs 2+ ranks on one host";
  const size_t count = 50'021;
  RegisteredBuffer memory = direct.allocate_registered(2 * count * sizeof(float));
  float* buckets[2] = {static_cast<float*>(memory.data()), static_cast<float*>(memory.data()) + count};
  std::mt19937 late(99u + static_cast<unsigned>(rank));
  const uint64_t before = shm_direct_collectives();
  for (int call = 0; call < 60; ++call) {
    float* data = buckets[call % 2];
    for (size_t i = 0; i < count; ++i) data[i] = exact_input(rank, i + static_cast<size_t>(call));
    if (call % n == rank) std::this_thread::sleep_for(std::chrono::microseconds(late() % 2000));
    direct.allreduce_sum(data, count, /*tag=*/call);
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += data[i] != exact_sum(n, i + static_cast<size_t>(call));
    ASSERT_EQ(wrong, 0u) << "call " << call;
  }
  EXPECT_EQ(shm_direct_collectives() - before, 60u);
}

// A direct all-reduce (tag 7) of `count` ones in registered memory: what it throws ("" if nothing), and whether it
// left the buffer as it was.
struct Refusal {
  std::string what;
  bool untouched = false;
};
Refusal direct_allreduce_of_ones(Communicator& direct, size_t count) {
  RegisteredBuffer memory = direct.allocate_registered(count * sizeof(float));
  float* data = static_cast<float*>(memory.data());
  std::fill(data, data + count, 1.0f);
  Refusal r;
  try {
    direct.allreduce_sum(data, count, /*tag=*/7);
  } catch (const std::runtime_error& e) {
    r.what = e.what();
  }
  r.untouched = std::all_of(data, data + count, [](float x) { return x == 1.0f; });
  return r;
}

// A rank that all-reduces another size is named on every rank, before any buffer is touched.
TEST(RegisteredAllreduceDirect, RefusesASizeMismatchOnEveryRank) {
  const int rank = world_rank();
  Communicator direct(MPI_COMM_WORLD, CommOptions{});
  if (!direct.direct()) GTEST_SKIP() << "the direct all-reduce needs 2+ ranks on one host";
  const size_t count = rank == 0 ? 100'000 : 100'016;
  const Refusal r = direct_allreduce_of_ones(direct, count);
  EXPECT_NE(r.what.find("all-reduce size mismatch on tag 7: this rank has " + std::to_string(count) + " elements"),
            std::string::npos)
      << r.what;
  EXPECT_TRUE(r.untouched) << "a refused all-reduce wrote into the buffer";
  MPI_Barrier(MPI_COMM_WORLD);
}

// Over a sub-communicator (the lab's smaller world sizes), the direct collectives name ranks as the user sees them,
// by their ranks in MPI_COMM_WORLD: here world ranks n-1, ..., 1 are the sub-communicator's 0, ..., n-2.
TEST(RegisteredAllreduceDirect, NamesRanksByTheirWorldRanksOnASubCommunicator) {
  const int rank = world_rank(), n = world_size();
  if (n < 3) GTEST_SKIP() << "a sub-communicator of 2+ ranks numbered unlike the world needs 3 ranks";
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 0, -rank, &sub);
  if (sub != MPI_COMM_NULL) {
    Communicator direct(sub, CommOptions{});
    if (direct.direct()) {
      const std::string what = direct_allreduce_of_ones(direct, rank == 1 ? 100'016 : 100'000).what;
      EXPECT_EQ(what.rfind("rank " + std::to_string(rank) + ": all-reduce size mismatch on tag 7", 0), 0u) << what;
      if (rank != 1) {
        EXPECT_NE(what.find(", rank 1 has 100016"), std::string::npos) << what;
      }
    } else {
      std::printf("[ skipped  ] rank %d: no direct collectives on this host, nothing to check\n", rank);
    }
    MPI_Comm_free(&sub);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The sharded update's collectives on the direct path (--zero-stage 1): the reduce-scatter leaves each rank's owned
// elements holding the ring's sums bit for bit (random inputs: the order of the additions shows), the all-gather then
// gives every rank the ring all-reduce's buffer, and a buffer that some rank holds in ordinary memory (the optimizer's
// moments) takes the ring on every rank.
TEST(RegisteredShardedDirect, ReduceScatterThenAllGatherGiveTheRingAllReducesBits) {
  const int rank = world_rank(), n = world_size();
  Communicator direct(MPI_COMM_WORLD, CommOptions{}), ring(MPI_COMM_WORLD, ring_only());
  if (!direct.direct()) GTEST_SKIP() << "the direct collectives need 2+ ranks on one host";
  for (size_t count : {size_t{16'411}, size_t{100'003}, size_t{1'000'003}}) {
    RegisteredBuffer memory = direct.allocate_registered(count * sizeof(float));
    float* data = static_cast<float*>(memory.data());
    const std::vector<float> inputs = random_inputs(rank, count);
    const float scale = 1.0f / static_cast<float>(n);
    std::vector<float> want = inputs;
    ASSERT_TRUE(ring.allreduce_gradients(want.data(), count, scale, /*tag=*/1));
    std::copy(inputs.begin(), inputs.end(), data);
    const uint64_t before = shm_direct_collectives();
    EXPECT_TRUE(direct.reduce_scatter_gradients(data, count, scale, /*tag=*/2));
    // Owned: the ring's sums. Elsewhere this rank's own input, untouched: no rank writes into another's buffer.
    std::vector<char> owned(count, 0);
    for (const RingChunk& c : direct.owned_chunks(count)) std::fill_n(owned.begin() + c.offset, c.count, 1);
    size_t wrong = 0, touched = 0;
    for (size_t i = 0; i < count; ++i) {
      if (owned[i])
        wrong += std::memcmp(&data[i], &want[i], 4) != 0;
      else
        touched += std::memcmp(&data[i], &inputs[i], 4) != 0;
    }
    EXPECT_EQ(wrong, 0u) << "count " << count << ": owned elements differ from the ring all-reduce's";
    if (direct.sharded(count)) {
      EXPECT_EQ(touched, 0u) << "count " << count << ": elements others own were written";
    }
    direct.all_gather(data, count, /*tag=*/3);
    EXPECT_EQ(shm_direct_collectives() - before, direct.sharded(count) ? 2u : 0u) << "count " << count;
    EXPECT_EQ(bitwise_mismatch(copy_of(data, count), want), "") << "count " << count;

    std::vector<float> moment = inputs;  // ordinary memory on the last rank only: every rank takes the ring
    std::copy(inputs.begin(), inputs.end(), data);
    float* gathered = rank == n - 1 ? moment.data() : data;
    const uint64_t before_ring = shm_direct_collectives();
    direct.all_gather(gathered, count, /*tag=*/4);
    EXPECT_EQ(shm_direct_collectives() - before_ring, 0u) << "count " << count;
    // Each element is now its owner's input.
    std::vector<int> owner_of(count, -1);
    for (const RingChunk& c : direct.owned_chunks(count))
      for (size_t i = c.offset; i < c.offset + c.count; ++i) owner_of[i] = rank;
    MPI_Allreduce(MPI_IN_PLACE, owner_of.data(), static_cast<int>(count), MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    std::vector<std::vector<float>> inputs_of;
    for (int r = 0; r < n; ++r) inputs_of.push_back(random_inputs(r, count));
    size_t not_owners = 0;
    for (size_t i = 0; i < count; ++i)
      not_owners += owner_of[i] < 0 || std::memcmp(&gathered[i], &inputs_of[owner_of[i]][i], 4) != 0;
    EXPECT_EQ(not_owners, 0u) << "count " << count;
  }
}

// The owner of a non-finite sum reports it (each rank checks what it owns, as on the ring), and a rank that runs
// another kind of collective under the same tag is named on every rank before any buffer is touched.
TEST(RegisteredShardedDirect, TheOwnerReportsANonFiniteSumAndAKindMismatchIsNamed) {
  const int rank = world_rank(), n = world_size();
  Communicator direct(MPI_COMM_WORLD, CommOptions{});
  if (!direct.direct()) GTEST_SKIP() << "the direct collectives need 2+ ranks on one host";
  const size_t count = 300'007, place = count / 2;
  RegisteredBuffer memory = direct.allocate_registered(count * sizeof(float));
  float* data = static_cast<float*>(memory.data());
  const std::vector<float> inputs = exact_inputs(rank, count);
  std::copy(inputs.begin(), inputs.end(), data);
  if (rank == n - 1) data[place] = std::nanf("");
  const uint64_t before = shm_direct_collectives();
  const bool finite = direct.reduce_scatter_gradients(data, count, 0.5f, /*tag=*/5);
  EXPECT_EQ(shm_direct_collectives() - before, 1u) << "the reduce-scatter did not take the direct path";
  bool owns = false;
  for (const RingChunk& c : direct.owned_chunks(count)) owns |= place >= c.offset && place < c.offset + c.count;
  EXPECT_EQ(finite, !owns) << "rank " << rank << (owns ? " owns" : " does not own") << " the poisoned element";

  std::fill(data, data + count, 1.0f);
  std::string what;
  try {
    if (rank == 0)
      direct.all_gather(data, count, /*tag=*/6);
    else
      direct.reduce_scatter_gradients(data, count, 1.0f, /*tag=*/6);
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("collective mismatch on tag 6: this rank runs "), std::string::npos) << what;
  EXPECT_EQ(data[0], 1.0f) << "a refused collective wrote into the buffer";
  MPI_Barrier(MPI_COMM_WORLD);
}

// The ring's sends from registered memory are read by the peer where they lie: the wrapper hashes each send buffer
// when sent and again when retired, so a write to a buffer a peer may still be reading shows up.
TEST(RegisteredRing, SendBuffersStayUntouchedWhilePeersReadThem) {
  const int rank = world_rank(), n = world_size();
  ShmTransport shm(MPI_COMM_WORLD);
  ContractCheckingTransport transport(shm);
  RingScratch scratch;
  for (size_t slice : {size_t{0}, size_t{1000}}) {
    for (size_t count : {size_t{4003}, size_t{1'000'003}}) {
      RegisteredBuffer memory(MPI_COMM_WORLD, count * sizeof(float), true);
      float* data = static_cast<float*>(memory.data());
      const std::vector<float> inputs = exact_inputs(rank, count);
      std::copy(inputs.begin(), inputs.end(), data);
      RingOptions o;
      o.slice_elems = slice;
      o.slices_per_chunk = 4;
      const size_t modified_before = transport.modified();
      ring_allreduce_sum(data, count, transport, scratch, o);
      EXPECT_EQ(transport.modified() - modified_before, 0u) << "a send buffer changed before it was retired";
      EXPECT_EQ(transport.in_flight(), 0u);
      std::vector<float> want(count);
      for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n, i);
      EXPECT_EQ(bitwise_mismatch(copy_of(data, count), want), "") << "slice " << slice << " count " << count;
    }
  }
}

// A send by reference completes when the receiver has read it, not when its record is queued: rank 1 receives
// 30 ms late, and rank 0's wait_sends lasts until then. After it, the buffer is the sender's again.
TEST(RegisteredTransport, ASendByReferenceCompletesWhenTheReceiverHasReadIt) {
  if (world_size() < 2 || !host_has_peers()) GTEST_SKIP() << "needs 2 ranks on one host";
  const int rank = world_rank();
  ShmTransport t(MPI_COMM_WORLD);
  const size_t count = 10'000;
  RegisteredBuffer memory(MPI_COMM_WORLD, count * sizeof(float), true);
  float* data = static_cast<float*>(memory.data());
  if (rank == 0)
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(i);
  // Before the barrier: rank 1 leaves it, and starts its 30 ms, only after rank 0 has entered it, however late
  // rank 0 itself leaves it on a busy host.
  const auto start = std::chrono::steady_clock::now();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    const ShmSendCounts before = shm_send_counts();
    t.send(1, data, count * sizeof(float), 5);
    EXPECT_EQ(shm_send_counts().by_reference - before.by_reference, 1u);
    t.wait_sends();
    const double waited_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(waited_ms, 20.0) << "the send completed before the receiver read it";
    std::fill(data, data + count, -1.0f);  // ours again: the receiver holds its own copy
    MPI_Barrier(MPI_COMM_WORLD);
  } else if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    std::vector<float> got(count);
    t.recv(0, got.data(), count * sizeof(float), 5);
    MPI_Barrier(MPI_COMM_WORLD);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], static_cast<float>(i)) << "element " << i;
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// Registered on ranks {0, 1} only: rank 0's sends from it go by reference to rank 1, which maps it, and are copied
// to rank 2, which does not. The choice is per message; both arrive intact.
TEST(RegisteredTransport, OnlyPeersThatMapTheSegmentGetReferences) {
  if (world_size() < 3 || !host_has_peers()) GTEST_SKIP() << "needs 3 ranks on one host";
  const int rank = world_rank();
  ShmTransport t(MPI_COMM_WORLD);
  MPI_Comm pair;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &pair);
  const size_t count = 1001;
  if (rank == 0) {
    RegisteredBuffer memory(pair, count * sizeof(float), true);
    ASSERT_TRUE(memory.registered());
    float* data = static_cast<float*>(memory.data());
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(3 * i);
    const ShmSendCounts before = shm_send_counts();
    t.send(1, data, count * sizeof(float), 1);
    t.send(2, data, count * sizeof(float), 2);
    const ShmSendCounts after = shm_send_counts();
    EXPECT_EQ(after.by_reference - before.by_reference, 1u);
    EXPECT_EQ(after.copied - before.copied, 1u);
    t.wait_sends();
    MPI_Barrier(MPI_COMM_WORLD);  // the peers have checked their data: the segment may go
  } else if (rank <= 2) {
    RegisteredBuffer memory;
    if (rank == 1) memory = RegisteredBuffer(pair, 64, true);
    std::vector<float> got(count);
    t.recv(0, got.data(), count * sizeof(float), rank);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(got[i], static_cast<float>(3 * i)) << "rank " << rank << " element " << i;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (pair != MPI_COMM_NULL) MPI_Comm_free(&pair);
}

// The record of a message sent by reference carries its tag like any other: a receive expecting another tag throws
// TagMismatch before reading the sender's buffer.
TEST(RegisteredTransport, ReferencesCarryTheirTag) {
  if (world_size() < 2 || !host_has_peers()) GTEST_SKIP() << "needs 2 ranks on one host";
  const int rank = world_rank();
  const size_t count = 512;
  RegisteredBuffer memory(MPI_COMM_WORLD, count * sizeof(float), true);
  {
    ShmTransport t(MPI_COMM_WORLD);
    if (rank == 0) {
      t.send(1, memory.data(), count * sizeof(float), 3);  // never acknowledged: the transport is dropped unwaited
    } else if (rank == 1) {
      std::vector<float> got(count);
      try {
        t.recv(0, got.data(), count * sizeof(float), 4);
        ADD_FAILURE() << "a message tagged 3 was received as tag 4";
      } catch (const TagMismatch& e) {
        EXPECT_EQ(e.expected_tag, 4);
        EXPECT_EQ(e.received_tag, 3);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The hierarchical all-reduce's rings within a node and the link emulation wrapper pass registered buffers through.
TEST(RegisteredAllreduceOnTop, HierAndLinkEmulationSumExactlyByReference) {
  const int rank = world_rank(), n = world_size();
  const bool shm = n > 1 && host_has_peers();
  std::vector<CommOptions> setups;
  CommOptions emulated;
  emulated.link = parse_link("pcie4");
  setups.push_back(emulated);
  if (n >= 4 && n % 2 == 0) {
    CommOptions hier;
    hier.impl = AllreduceImpl::kHier;
    hier.ranks_per_node = 2;
    setups.push_back(hier);
  }
  for (const CommOptions& options : setups) {
    Communicator comm(MPI_COMM_WORLD, options);
    const size_t count = 300'007;
    RegisteredBuffer memory = comm.allocate_registered(count * sizeof(float));
    float* data = static_cast<float*>(memory.data());
    const std::vector<float> inputs = exact_inputs(rank, count);
    std::copy(inputs.begin(), inputs.end(), data);
    const ShmSendCounts before = shm_send_counts();
    comm.allreduce_sum(data, count, 9);
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i) want[i] = exact_sum(n, i);
    EXPECT_EQ(bitwise_mismatch(copy_of(data, count), want), "") << comm.transport_name();
    if (shm) {
      EXPECT_GT(shm_send_counts().by_reference - before.by_reference, 0u) << comm.transport_name();
    }
  }
}

}  // namespace
}  // namespace ddplab
