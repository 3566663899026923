// The step-time model of `ddplab predict` (analysis/predict.h) on schedules whose answer is worked out by hand:
// one bucket, comm much shorter and much longer than backward, the small closing bucket, the 16-bit wire, a slow
// rank, the slowdowns; the alpha-beta fit; and a RunRecord synthesised from a known schedule, which the model must
// replay at its own setting and predict at others.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "analysis/predict.h"
#include "tests/unit/synthetic_gpu_run.h"

namespace ddplab {
namespace {

constexpr double kTol = 0.01;  // ms: the replay's time step is 1/20000 of a step of ~20-40 ms

// Four gradient pieces of 1000 floats (4000 bytes), back to back.
const std::vector<int64_t> kNumel = {1000, 1000, 1000, 1000}, kOffset = {0, 1000, 2000, 3000};

// Data + forward 2 ms, backward 10 ms releasing a piece every 2.5 ms, optimizer 3 ms.
RankProfile profile(double before_ms = 2) { return RankProfile{before_ms, 10, {2.5, 5, 7.5, 10}, 3}; }

// The first bucket cut as the others (--first-bucket-mb auto), the closing one at last_cap_bytes.
std::vector<Bucket> buckets(double cap_bytes, double last_cap_bytes) {
  return assign_buckets(kNumel, kOffset, BucketCaps{cap_bytes, BucketCaps::kAsTheOthers, last_cap_bytes});
}

std::vector<BucketCost> same_cost(size_t n, double ms) { return std::vector<BucketCost>(n, BucketCost{ms, 0}); }

// An fp32 ring all-reduce of `bytes` at 2 ranks on the link `ab`.
double ring_ms_at_2(const AlphaBeta& ab, double bytes) {
  const double small = static_cast<double>(small_allreduce_bytes(2));
  return ab.ms(allreduce_terms(bytes, 2, AllreduceImpl::kRing, WireDtype::kFp32, small));
}

// Overlap off at 2 ranks: every piece is its own bucket, all-reduced alone after backward; their sum.
double pieces_alone_after_backward_ms(const RunRecord& run, const AlphaBeta& ab) {
  double comm = 0;
  for (const PieceRecord& p : run.pieces) comm += ring_ms_at_2(ab, p.numel * 4.0);
  return comm;
}

// A long run is replayed in blocks of consecutive steps: a cost of every 4th step keeps its share in the mean step
// (20 ms every 4th: +5 ms), where a stride of 4 through 800 steps would have seen it in none of them, or in all.
TEST(Predict, ALongRunsPeriodicCostKeepsItsShare) {
  const auto b = buckets(1e9, 1e9);
  for (int phase : {0, 1, 3}) {
    std::vector<std::vector<RankProfile>> steps;
    for (int s = 0; s < 800; ++s) {
      std::vector<RankProfile> ranks{profile(), profile()};
      if ((s + phase) % 4 == 0)
        for (RankProfile& r : ranks) r.after_ms += 20;
      steps.push_back(ranks);
    }
    const SimulatedStep s = simulate_steps(steps, b, same_cost(1, 4), true, HostCores{}, {});
    EXPECT_NEAR(s.step_ms, 2 + 10 + 4 + 3 + 5, 0.5) << "phase " << phase;
  }
}

TEST(Predict, OneBucketWaitsForTheWholeBackward) {
  const auto b = buckets(1e9, 1e9);
  ASSERT_EQ(b.size(), 1u);
  for (bool overlap : {true, false}) {
    const SimulatedStep s = simulate_step({profile(), profile()}, b, same_cost(1, 4), overlap);
    EXPECT_NEAR(s.step_ms, 2 + 10 + 4 + 3, kTol) << overlap;
    EXPECT_NEAR(s.exposed_ms, 4, kTol);
    EXPECT_NEAR(s.hidden_ms, 0, kTol);
    EXPECT_NEAR(s.comm_ms, 4, kTol);
  }
}

TEST(Predict, CommMuchShorterThanBackwardHidesAllButTheLastBucket) {
  const auto b = buckets(0, 0);  // a bucket per piece
  ASSERT_EQ(b.size(), 4u);
  const SimulatedStep on = simulate_step({profile(), profile()}, b, same_cost(4, 0.1), true);
  EXPECT_NEAR(on.step_ms, 2 + 10 + 0.1 + 3, kTol);
  EXPECT_NEAR(on.exposed_ms, 0.1, kTol);
  EXPECT_NEAR(on.hidden_ms, 0.3, kTol);
  const SimulatedStep off = simulate_step({profile(), profile()}, b, same_cost(4, 0.1), false);
  EXPECT_NEAR(off.step_ms, 2 + 10 + 0.4 + 3, kTol);
  EXPECT_NEAR(off.hidden_ms, 0, kTol);
}

TEST(Predict, CommMuchLongerThanBackwardQueuesOnTheCommThread) {
  // Buckets of 5 ms, ready every 2.5 ms: the comm thread runs them back to back from 2.5 ms, ending at 22.5 ms.
  const auto b = buckets(0, 0);
  const SimulatedStep on = simulate_step({profile(), profile()}, b, same_cost(4, 5), true);
  EXPECT_NEAR(on.step_ms, 2 + 22.5 + 3, kTol);
  EXPECT_NEAR(on.exposed_ms, 12.5, kTol);
  EXPECT_NEAR(on.hidden_ms, 7.5, kTol);
  const SimulatedStep off = simulate_step({profile(), profile()}, b, same_cost(4, 5), false);
  EXPECT_NEAR(off.step_ms, 2 + 10 + 20 + 3, kTol);
}

TEST(Predict, SmallClosingBucketShortensTheTail) {
  // 1 ms per 4000 bytes. A closing cap of one piece: buckets {0,1} {2} {3}, the last ready at 10 ms and 1 ms
  // long. A closing cap of two pieces: {0,1} {2,3}, the last 2 ms long.
  const auto cost_of = [](const std::vector<Bucket>& bs) {
    std::vector<BucketCost> c;
    for (const Bucket& b : bs) c.push_back({b.count / 1000.0, 0});
    return c;
  };
  const auto small = buckets(8000, 4000), large = buckets(8000, 8000);
  ASSERT_EQ(small.size(), 3u);
  EXPECT_EQ(small.back().first_piece, 3);
  ASSERT_EQ(large.size(), 2u);
  EXPECT_EQ(large.back().first_piece, 2);
  const SimulatedStep s = simulate_step({profile(), profile()}, small, cost_of(small), true);
  const SimulatedStep l = simulate_step({profile(), profile()}, large, cost_of(large), true);
  EXPECT_NEAR(s.step_ms, 2 + 11 + 3, kTol);
  EXPECT_NEAR(s.exposed_ms, 1, kTol);
  EXPECT_NEAR(l.step_ms, 2 + 12 + 3, kTol);
  EXPECT_NEAR(l.exposed_ms, 2, kTol);
}

TEST(Predict, SlowRankSetsThePace) {
  // Rank 2 starts its backward 4 ms late: every all-reduce waits for it, the others wait for the last one.
  const auto b = buckets(0, 0);
  const SimulatedStep s = simulate_step({profile(), profile(), profile(6)}, b, same_cost(4, 0.1), true);
  EXPECT_NEAR(s.step_ms, 6 + 10 + 0.1 + 3, kTol);
  // A slow optimizer on one rank makes it start later, and the others wait for it in the next step's comm.
  RankProfile slow_optimizer = profile();
  slow_optimizer.after_ms = 5;
  const SimulatedStep t = simulate_step({profile(), slow_optimizer}, b, same_cost(4, 0.1), true);
  EXPECT_NEAR(t.step_ms, 2 + 10 + 0.1 + 5, kTol);
}

TEST(Predict, BackwardSlowedBesideComm) {
  // 2 ranks x 1 thread on 3 cores, the comm thread on a core all the time (CPU = time alone): backward at half pace
  // while an all-reduce runs. Bucket 0 runs 2.5..7.5, when backward has done 5 ms of work and releases bucket 1, and
  // so on: the comm thread stays busy and backward ends at 17.5 ms.
  const auto b = buckets(0, 0);
  const HostCores host{3, 2, 1, std::nullopt};
  ASSERT_FALSE(host.full());
  const SimulatedStep s = simulate_step({profile(), profile()}, b, std::vector<BucketCost>(4, {5, 5}), true, host);
  EXPECT_NEAR(s.backward_ms, 17.5, kTol);
  EXPECT_NEAR(s.step_ms, 2 + 22.5 + 3, kTol);
  EXPECT_NEAR(s.hidden_ms, 15, kTol);
  EXPECT_NEAR(s.exposed_ms, 5, kTol);
}

TEST(Predict, CommStallsBesideBackwardByItsLostYields) {
  // A yield lost to backward costs 2 ms (measured), one per message step: each all-reduce of one step started
  // beside backward takes its 0.1 ms alone plus 2. Bucket 0 runs 2.5..4.6, bucket 1 from 5, bucket 2 from 7.5 to
  // 9.6; bucket 3 starts after backward, at 10, and takes 0.1.
  const auto b = buckets(0, 0);
  const HostCores host{2, 2, 1, 2.0};
  const SimulatedStep s = simulate_step({profile(), profile()}, b, std::vector<BucketCost>(4, {0.1, 0, 1}), true, host);
  EXPECT_NEAR(s.comm_ms, 3 * 2.1 + 0.1, kTol);
  EXPECT_NEAR(s.step_ms, 2 + 10 + 0.1 + 3, kTol);
  // Two message steps: 4.1 ms each. Bucket 0 runs 2.5..6.6, bucket 1 6.6..10.7, but backward ends at 10 with 0.7 of
  // 4.1 ms left: the remaining share of its 0.1 ms alone, 0.017, then buckets 2 and 3 alone: 10.217.
  const SimulatedStep two =
      simulate_step({profile(), profile()}, b, std::vector<BucketCost>(4, {0.1, 0, 2}), true, host);
  EXPECT_NEAR(two.step_ms, 2 + 10 + 0.1 * 0.7 / 4.1 + 2 * 0.1 + 3, kTol);
  // No yield lost (a spare core): no stall.
  const HostCores spare_core{2, 2, 1, 0.0};
  EXPECT_NEAR(
      simulate_step({profile(), profile()}, b, std::vector<BucketCost>(4, {0.1, 0, 1}), true, spare_core).comm_ms,
      4 * 0.1, kTol);
}

TEST(Predict, CommWaitsBesideBackwardOnAFullHostWhenItsYieldsWereNotMeasured) {
  // 2 ranks x 1 thread on 2 cores: the first all-reduce, started at 2.5 ms beside backward, makes no progress until
  // backward ends at 10, then takes its 0.1 ms; the other three follow it. With a spare core it runs at once.
  const auto b = buckets(0, 0);
  const HostCores full{2, 2, 1, std::nullopt}, spare{3, 2, 1, std::nullopt};
  ASSERT_TRUE(full.full());
  const SimulatedStep waits = simulate_step({profile(), profile()}, b, same_cost(4, 0.1), true, full);
  EXPECT_NEAR(waits.comm_ms, (10 - 2.5) + 4 * 0.1, kTol);
  EXPECT_NEAR(waits.exposed_ms, 4 * 0.1, kTol);
  EXPECT_NEAR(waits.step_ms, 2 + 10 + 4 * 0.1 + 3, kTol);
  const SimulatedStep runs = simulate_step({profile(), profile()}, b, same_cost(4, 0.1), true, spare);
  EXPECT_NEAR(runs.comm_ms, 4 * 0.1, kTol);
  EXPECT_NEAR(runs.step_ms, 2 + 10 + 0.1 + 3, kTol);

  // Its comm thread's CPU (polls while it waits) slows backward, spread over its whole time: started with 7.5 ms of
  // backward left, 0.5 ms alone, 2 ms of CPU: a share of 2 / (7.5 + 0.5) of a core, so 1.5 of 2 cores for compute,
  // backward at 3/4 pace: its 7.5 ms take 10, it ends at 12.5, and the four all-reduces of 0.5 ms end at 14.5.
  const SimulatedStep slowed =
      simulate_step({profile(), profile()}, b, std::vector<BucketCost>(4, {0.5, 2}), true, full);
  EXPECT_NEAR(slowed.backward_ms, 12.5, kTol);
  EXPECT_NEAR(slowed.step_ms, 2 + 14.5 + 3, kTol);
  // One rank still in backward is enough to hold the all-reduce: the other's comm thread waits for its peer.
  const SimulatedStep late = simulate_step({profile(), profile(4)}, b, same_cost(4, 0.1), true, full);
  EXPECT_NEAR(late.step_ms, 4 + 10 + 4 * 0.1 + 3, kTol);
}

TEST(Predict, AllreduceTerms) {
  const double mib = 1 << 20, small = 16 << 10;
  const AllreduceTerms ring = allreduce_terms(mib, 4, AllreduceImpl::kRing, WireDtype::kFp32, small);
  EXPECT_DOUBLE_EQ(ring.message_steps, 6);
  EXPECT_DOUBLE_EQ(ring.bytes, 1.5 * mib);
  const AllreduceTerms bf16 = allreduce_terms(mib, 4, AllreduceImpl::kRing, WireDtype::kBf16, small);
  EXPECT_DOUBLE_EQ(bf16.message_steps, 6);
  EXPECT_DOUBLE_EQ(bf16.bytes, 0.75 * mib);  // the 16-bit wire halves the bytes, not the steps
  // Recursive doubling up to the threshold: log2 p exchanges of the whole buffer, +2 to fold in ranks beyond p.
  EXPECT_DOUBLE_EQ(allreduce_terms(small, 2, AllreduceImpl::kRing, WireDtype::kFp32, small).message_steps, 1);
  EXPECT_DOUBLE_EQ(allreduce_terms(small, 4, AllreduceImpl::kRing, WireDtype::kFp32, small).bytes, 2 * small);
  EXPECT_DOUBLE_EQ(allreduce_terms(small, 3, AllreduceImpl::kRing, WireDtype::kFp32, small).message_steps, 3);
  EXPECT_DOUBLE_EQ(allreduce_terms(small, 2, AllreduceImpl::kRing, WireDtype::kFp16, small).bytes, small / 2);
  // --comm mpi: the ring's cost at every size. One rank: nothing.
  EXPECT_DOUBLE_EQ(allreduce_terms(small, 2, AllreduceImpl::kMpi, WireDtype::kFp32, small).message_steps, 2);
  EXPECT_DOUBLE_EQ(allreduce_terms(mib, 1, AllreduceImpl::kRing, WireDtype::kFp32, small).message_steps, 0);
  // The ring on GPU buffers: rounds of ranks x its chunk of the fp32 buffer, a whole ring each; the bytes unchanged.
  const double chunk = 64 * mib;
  const auto gpu_ring = [&](double bytes, int ranks, WireDtype wire, bool doubling = false) {
    return allreduce_terms(bytes, ranks, AllreduceImpl::kRing, wire, small, 1, chunk, doubling);
  };
  EXPECT_DOUBLE_EQ(gpu_ring(128 * mib, 2, WireDtype::kFp32).message_steps, 2);
  EXPECT_DOUBLE_EQ(gpu_ring(154.5e6, 2, WireDtype::kFp32).message_steps, 4);  // wte at 2 ranks: 2 rounds
  EXPECT_DOUBLE_EQ(gpu_ring(154.5e6, 2, WireDtype::kFp32).bytes, 154.5e6);
  EXPECT_DOUBLE_EQ(gpu_ring(154.5e6, 2, WireDtype::kBf16).message_steps, 4);  // a round is of fp32 words
  EXPECT_DOUBLE_EQ(gpu_ring(154.5e6, 4, WireDtype::kFp32).message_steps, 6);
  // Its recursive doubling: rounds of one chunk, log2 p exchanges of the whole round each (+2 beyond p).
  EXPECT_DOUBLE_EQ(gpu_ring(20 * mib, 2, WireDtype::kFp32, true).message_steps, 1);
  EXPECT_DOUBLE_EQ(gpu_ring(154.5e6, 2, WireDtype::kFp32, true).message_steps, 3);  // wte: 3 rounds, not 4 steps
  EXPECT_DOUBLE_EQ(gpu_ring(154.5e6, 2, WireDtype::kFp32, true).bytes, 154.5e6);
  EXPECT_DOUBLE_EQ(gpu_ring(154.5e6, 2, WireDtype::kBf16, true).bytes, 154.5e6 / 2);
  EXPECT_DOUBLE_EQ(gpu_ring(20 * mib, 4, WireDtype::kFp32, true).message_steps, 2);  // the ring: 6
  EXPECT_DOUBLE_EQ(gpu_ring(154.5e6, 4, WireDtype::kFp32, true).message_steps, 6);   // 3 rounds of 2
  EXPECT_DOUBLE_EQ(gpu_ring(154.5e6, 4, WireDtype::kFp32, true).bytes, 2 * 154.5e6);
  EXPECT_DOUBLE_EQ(gpu_ring(20 * mib, 3, WireDtype::kFp32, true).message_steps, 3);  // folded in and out
  EXPECT_DOUBLE_EQ(
      allreduce_terms(20 * mib, 4, AllreduceImpl::kRing, WireDtype::kFp32, small, 1, 0, true).message_steps,
      6);  // only the GPU ring's rounds double
  EXPECT_DOUBLE_EQ(gpu_ring(257 * mib, 4, WireDtype::kFp32).message_steps, 12);
  EXPECT_DOUBLE_EQ(allreduce_terms(257 * mib, 4, AllreduceImpl::kMpi, WireDtype::kFp32, small, 1, chunk).message_steps,
                   6);  // only our GPU ring has rounds
}

// Our GPU ring doubles where recursive doubling takes fewer exchanges than the ring: at two ranks, or ranks sharing
// a GPU; rounds of one 64 MiB chunk against the ring's n.
TEST(Predict, TheGpuRingDoublesWhereItTakesFewerExchanges) {
  const double mib = 1 << 20, chunk = 64 * mib;
  EXPECT_EQ(doubling_steps(2), 1);
  EXPECT_EQ(doubling_steps(4), 2);
  EXPECT_EQ(doubling_steps(3), 3);                             // one step, and the fold in and out
  EXPECT_TRUE(gpu_ring_doubles(2, false, 25 * mib, chunk));    // 1 exchange against 2, GPUs of their own too
  EXPECT_TRUE(gpu_ring_doubles(2, false, 154.5e6, chunk));     // 3 against 4
  EXPECT_FALSE(gpu_ring_doubles(2, false, 128 * mib, chunk));  // 2 against 2: the ring, on a tie
  EXPECT_FALSE(gpu_ring_doubles(4, false, 25 * mib, chunk));   // GPUs of their own: the ring's bytes
  EXPECT_TRUE(gpu_ring_doubles(4, true, 25 * mib, chunk));     // 2 against 6
  EXPECT_TRUE(gpu_ring_doubles(4, true, 104e6, chunk));        // 4 against 6
  EXPECT_FALSE(gpu_ring_doubles(4, true, 154.5e6, chunk));     // 6 against 6
  EXPECT_TRUE(gpu_ring_doubles(3, true, 25 * mib, chunk));     // 3 against 4
  EXPECT_FALSE(gpu_ring_doubles(1, true, 25 * mib, chunk));
  EXPECT_FALSE(gpu_ring_doubles(2, true, 25 * mib, 0));  // no chunk: not our GPU ring
}

// Per class of hop, at 2 nodes x 2 ranks (docs/PREDICT.md: per-hop terms). A link-bound inter-node link (bandwidth
// only) and a free intra-node link: the flat ring puts 2(n-1)/n = 1.5 buffers through each NIC (one stream per NIC),
// hier 2(N-1)/N x K shards of 1/K = 1 buffer, so hier / ring = 2/3 (docs/COMM.md: bytes per NIC); mpi is the ring.
TEST(Predict, HierAgainstRingOnALinkBoundInterNodeLink) {
  const double bytes = 64 << 20, beta = 1e-6, small = 32 << 10;
  const HopCosts costs{{}, {0, beta}};
  const double ring = ring_ms(bytes, 4, 2, WireDtype::kFp32, small, costs);
  EXPECT_DOUBLE_EQ(ring, 1.5 * bytes * beta);
  EXPECT_DOUBLE_EQ(hier_ms(bytes, 4, 2, WireDtype::kFp32, costs), bytes * beta);
  EXPECT_DOUBLE_EQ(hier_ms(bytes, 4, 2, WireDtype::kFp32, costs) / ring, 2.0 / 3);
  EXPECT_DOUBLE_EQ(mpi_ms(bytes, 4, 2, costs), ring);
  EXPECT_DOUBLE_EQ(hier_ms(bytes, 4, 2, WireDtype::kBf16, costs), bytes / 2 * beta);  // the wire halves the bytes
  // The ring's step waits for its slowest hop: a slower intra-node link takes over.
  EXPECT_DOUBLE_EQ(ring_ms(bytes, 4, 2, WireDtype::kFp32, small, HopCosts{{0, 2 * beta}, {0, beta}}),
                   1.5 * bytes * 2 * beta);
  // One node: every hop is intra, the inter link never counts.
  EXPECT_DOUBLE_EQ(ring_ms(bytes, 4, 1, WireDtype::kFp32, small, HopCosts{{0, beta}, {1, 1}}), 1.5 * bytes * beta);
}

// Hier's phases on each class: with intra none the node's reduce-scatter and all-gather cost nothing and the
// cross-node ring is 2(N-1) steps of the inter link's latency; an intra link adds 2(K-1) steps and 2(K-1)/K of the
// buffer on it, pipelined over the ring's rounds: the longer end to end, the shorter for one round.
TEST(Predict, HierPhasesOnEachClassOfHop) {
  const double bytes = 8 << 20, alpha = 0.01, beta = 1e-6;
  const HopCosts inter_only{{}, {alpha, beta}};
  EXPECT_DOUBLE_EQ(hier_ms(bytes, 8, 2, WireDtype::kFp32, inter_only), 2 * alpha + bytes * beta);        // 2 x 4
  EXPECT_DOUBLE_EQ(hier_ms(bytes, 8, 4, WireDtype::kFp32, inter_only), 6 * alpha + 1.5 * bytes * beta);  // 4 x 2
  const HopCosts both{{0.001, 1e-7}, {alpha, beta}};
  const RingOptions ring = ring_options(WireDtype::kFp32);
  const double rounds = std::ceil(bytes / 4 / (ring.slice_elems * ring.slices_per_chunk * 4.0));  // K = 4
  ASSERT_GT(rounds, 1) << "the case should pipeline";
  EXPECT_DOUBLE_EQ(hier_ms(bytes, 8, 2, WireDtype::kFp32, both),
                   2 * alpha + bytes * beta + (6 * 0.001 + 1.5 * bytes * 1e-7) / rounds);
  // One rank per node: no phase within the node, hier is the ring across the nodes.
  EXPECT_DOUBLE_EQ(hier_ms(bytes, 4, 4, WireDtype::kFp32, both),
                   ring_ms(bytes, 4, 4, WireDtype::kFp32, 0, HopCosts{{}, {alpha, beta}}));
}

// The node's NIC is shared: recursive doubling's exchange across nodes has both ranks of a 2-rank node on the NIC at
// once, twice the inter-node time of one pair crossing it (1 rank per node); the exchange within the node is free
// on intra none. The flat ring, in rank order, has one stream per NIC whatever K is.
TEST(Predict, NicSharedByTheNodesRanks) {
  const double message = 16 << 10, small = 32 << 10, alpha = 0.05, beta = 1e-5;
  const HopCosts costs{{}, {alpha, beta}};
  const double one_pair = ring_ms(message, 2, 2, WireDtype::kFp32, small, costs);
  const double two_pairs = ring_ms(message, 4, 2, WireDtype::kFp32, small, costs);
  EXPECT_DOUBLE_EQ(one_pair, alpha + message * beta);
  EXPECT_DOUBLE_EQ(two_pairs - alpha, 2 * (one_pair - alpha));
  EXPECT_EQ(kRingStreamsPerNic, 1);
  const double large = 1 << 20;
  EXPECT_DOUBLE_EQ(ring_ms(large, 4, 2, WireDtype::kFp32, small, costs), 6 * alpha + 1.5 * large * beta);
}

TEST(Predict, WireHalvesTheBandwidthTermOfTheStep) {
  // Comm-bound (bandwidth only, 1 ms per MiB): a bf16 wire halves every bucket and the exposed tail.
  const double small = 16 << 10;
  const AlphaBeta ab{0, 1.0 / (1 << 20)};
  const auto b = buckets(0, 0);
  std::vector<BucketCost> fp32, bf16;
  for (const Bucket& x : b) {
    const double bytes = x.count * 4.0 * 1000;  // as if each piece were 4 MB
    fp32.push_back({ab.ms(allreduce_terms(bytes, 2, AllreduceImpl::kRing, WireDtype::kFp32, small)), 0});
    bf16.push_back({ab.ms(allreduce_terms(bytes, 2, AllreduceImpl::kRing, WireDtype::kBf16, small)), 0});
  }
  const SimulatedStep a = simulate_step({profile(), profile()}, b, fp32, false);
  const SimulatedStep h = simulate_step({profile(), profile()}, b, bf16, false);
  EXPECT_NEAR(a.comm_ms, 2 * h.comm_ms, kTol);
  EXPECT_NEAR(a.step_ms - h.step_ms, h.comm_ms, kTol);
}

TEST(Predict, FitRecoversAlphaBeta) {
  const AlphaBeta alone{0.01, 2e-6};
  std::vector<AllreduceTerms> terms;
  std::vector<double> ms;
  for (double bytes : {4e3, 1e5, 1e6, 4e6}) {
    terms.push_back(allreduce_terms(bytes, 4, AllreduceImpl::kRing, WireDtype::kFp32, 32 << 10));
    ms.push_back(alone.ms(terms.back()));
  }
  const auto fit = fit_comm(terms, ms);
  ASSERT_TRUE(fit);
  EXPECT_NEAR(fit->alone.alpha_ms, alone.alpha_ms, 1e-9);
  EXPECT_NEAR(fit->alone.beta_ms_per_byte, alone.beta_ms_per_byte, 1e-12);
  EXPECT_FALSE(fit->latency_from_link);
  // One size cannot tell alpha from beta, nor can sizes less than 2x apart (noise would become latency): without
  // the link's latency no fit, with it alpha is the link's and the rest beta.
  EXPECT_FALSE(fit_comm({terms[0], terms[0]}, {1, 1}));
  const AllreduceTerms big = allreduce_terms(4e6, 4, AllreduceImpl::kRing, WireDtype::kFp32, 32 << 10);
  const AllreduceTerms alike = allreduce_terms(3.2e6, 4, AllreduceImpl::kRing, WireDtype::kFp32, 32 << 10);
  const AllreduceTerms half = allreduce_terms(2e6, 4, AllreduceImpl::kRing, WireDtype::kFp32, 32 << 10);
  EXPECT_FALSE(fit_comm({alike, big}, {alone.ms(alike), alone.ms(big)}));
  EXPECT_TRUE(fit_comm({half, big}, {alone.ms(half), alone.ms(big)}));
  const auto from_link = fit_comm({alike, big}, {alone.ms(alike), alone.ms(big)}, alone.alpha_ms);
  ASSERT_TRUE(from_link);
  EXPECT_TRUE(from_link->latency_from_link);
  EXPECT_NEAR(from_link->alone.alpha_ms, alone.alpha_ms, 1e-12);
  EXPECT_NEAR(from_link->alone.beta_ms_per_byte, alone.beta_ms_per_byte, 1e-12);
  // Coefficients stay >= 0: time falling with size would need a negative beta.
  const auto flat = fit_comm({terms[0], terms[1], terms[2]}, {1.0, 0.9, 0.8});
  ASSERT_TRUE(flat);
  EXPECT_GE(flat->alone.beta_ms_per_byte, 0);
  EXPECT_GE(flat->alone.alpha_ms, 0);
}

// A two-rank run of `steps` steps whose every bucket follows the model exactly: a bucket per piece, the ring's
// alpha-beta cost, the comm thread one bucket at a time, no slowdown. The training thread resumes `wake_ms` after
// the last all-reduce is done (its wait for a core on oversubscribed cores), inside its exposed comm time. On a
// full host (2 cores, comm threads' CPU recorded as 0) an all-reduce started beside backward ends its time alone
// after backward's end. direct: the ranks took the direct all-reduce (on one host), as its transport then names.
RunRecord synthetic_run(const AlphaBeta& ab, int steps, double wake_ms = 0,
                        const std::vector<int64_t>& numel = {1000, 1 << 20, 1000, 1 << 20}, bool full_host = false,
                        bool direct = false) {
  RunRecord run;
  run.path = "synthetic.h5";
  run.meta.world_size = 2;
  run.steps = steps;
  run.config = {{"bucket_mb", 0.0},      {"first_bucket_mb", "auto"},
                {"last_bucket_mb", 0.0}, {"overlap", true},
                {"link", "none"},        {"comm", "ring"},
                {"comm_dtype", "fp32"},  {"batch", 32},
                {"grad_accum", 1},       {"warmup_steps", 0},
                {"link_latency_us", -1}, {"link_gbps", -1}};
  // By default pieces of 4000 bytes and 4 MB alternately (recursive doubling and the ring: alpha and beta tell
  // apart).
  int64_t offset = 0;
  for (size_t k = 0; k < numel.size(); ++k) {
    run.pieces.push_back({offset, numel[k]});
    run.buckets.push_back({static_cast<int>(k), static_cast<int>(k), numel[k], "p" + std::to_string(k)});
    offset += numel[k];
  }
  if (direct) run.meta.transport = "shm + direct collectives";
  const double small = static_cast<double>(small_allreduce_bytes(2, direct));
  std::vector<StepRecord> per_rank_steps;
  std::vector<BucketTimes> times;
  double step_start = 0;
  for (int s = 0; s < steps; ++s) {
    StepRecord x;
    x.start_ms = step_start;
    x.data_ms = 1;
    x.forward_ms = 1;
    x.backward_ms = 10;
    x.optimizer_ms = 2;
    x.samples = 32;
    const double backward_start = step_start + 2;
    double comm_free = 0, comm = 0;
    std::vector<BucketTimes> step_times;
    for (size_t k = 0; k < numel.size(); ++k) {
      BucketTimes t;
      t.ready_ms = backward_start + 2.5 * (k + 1);
      t.comm_start_ms = std::max(t.ready_ms, comm_free);
      const double runs_from = full_host ? std::max(t.comm_start_ms, backward_start + 10) : t.comm_start_ms;
      t.comm_end_ms =
          runs_from + ab.ms(allreduce_terms(numel[k] * 4.0, 2, AllreduceImpl::kRing, WireDtype::kFp32, small));
      if (full_host) t.comm_cpu_ms = 0;
      comm_free = t.comm_end_ms;
      comm += t.comm_end_ms - t.comm_start_ms;
      step_times.push_back(t);
    }
    x.comm_ms = comm;
    x.exposed_comm_ms = std::max(0.0, comm_free - (backward_start + 10)) + wake_ms;
    x.step_ms = 2 + 10 + x.exposed_comm_ms + 2;
    step_start += x.step_ms;
    per_rank_steps.push_back(x);
    times.insert(times.end(), step_times.begin(), step_times.end());
  }
  if (full_host) {
    run.meta.hostnames = {"node", "node"};
    run.meta.host_cores = 2;
    run.config["threads"] = 1;
  }
  for (int r = 0; r < 2; ++r) {  // both ranks alike
    run.records.insert(run.records.end(), per_rank_steps.begin(), per_rank_steps.end());
    run.bucket_times.insert(run.bucket_times.end(), times.begin(), times.end());
  }
  return run;
}

// Beside the direct all-reduce two ranks stop recursive doubling at 2 KiB, not 16: a run whose transport names it
// is fitted by the exchanges it made, its 8000-byte buckets the ring's two steps (as doubling's one, the fit's
// alpha and beta came out wrong).
TEST(Predict, ADirectRunsBucketsAreFittedByTheExchangesItMade) {
  const AlphaBeta ab{0.05, 2.0 / (1 << 20)};
  const RunRecord run = synthetic_run(ab, 4, 0, {2000, 1 << 20, 2000, 1 << 20}, false, /*direct=*/true);
  const StepModel model = build_model(run, std::nullopt);
  EXPECT_TRUE(model.measured_direct);
  ASSERT_TRUE(model.comm_fit);
  EXPECT_NEAR(model.comm_fit->alone.alpha_ms, ab.alpha_ms, 1e-6);
  EXPECT_NEAR(model.comm_fit->alone.beta_ms_per_byte, ab.beta_ms_per_byte, 1e-9);
  EXPECT_NEAR(predict(model, model.measured).step.step_ms, model.measured_step_ms, kTol);
}

TEST(Predict, ReplaysASyntheticRunAndPredictsOtherSettings) {
  const AlphaBeta ab{0.05, 2.0 / (1 << 20)};  // 50 us per message, 2 ms per MiB: 4 MB takes 8.1 ms (comm-bound)
  const RunRecord run = synthetic_run(ab, 4);
  const StepModel model = build_model(run, std::nullopt);
  ASSERT_TRUE(model.comm_fit);
  EXPECT_NEAR(model.comm_fit->alone.alpha_ms, ab.alpha_ms, 1e-6);
  EXPECT_NEAR(model.comm_fit->alone.beta_ms_per_byte, ab.beta_ms_per_byte, 1e-9);
  EXPECT_EQ(model.backward_slowdown, 0);  // no comm CPU times recorded: not measured

  const Prediction own = predict(model, model.measured);
  EXPECT_NEAR(own.step.step_ms, model.measured_step_ms, kTol);
  EXPECT_TRUE(own.extrapolated.empty());
  EXPECT_NEAR(own.samples_per_s, 64 / own.step.step_ms * 1000, 1e-6);

  // Overlap off: every all-reduce after backward.
  const double comm = pieces_alone_after_backward_ms(run, ab);
  PredictSetting off = model.measured;
  off.overlap = false;
  EXPECT_NEAR(predict(model, off).step.step_ms, 2 + 10 + comm + 2, kTol);

  // One bucket for everything but the closing piece, which gets its own: {0,1,2} ready at 7.5, {3} at 10.
  PredictSetting merged = model.measured;
  merged.bucket_mb = 100;
  merged.last_bucket_mb = 4;
  const double first_ms = ring_ms_at_2(ab, (2 * 1000 + (1 << 20)) * 4.0);
  const double last_ms = ring_ms_at_2(ab, (1 << 20) * 4.0);
  const Prediction m = predict(model, merged);
  EXPECT_EQ(m.buckets, 2);
  EXPECT_NEAR(m.step.step_ms, 2 + std::max(7.5 + first_ms, 10.0) + last_ms + 2, kTol);

  // Another link and world size are extrapolations, and say so.
  PredictSetting far = model.measured;
  far.ranks = 4;
  far.link = parse_link("10gbe");
  const Prediction f = predict(model, far);
  EXPECT_EQ(f.extrapolated.size(), 2u);
  EXPECT_GT(f.step.step_ms, own.step.step_ms);  // the ring moves 3/2 of the bytes at 4 ranks, over a slower link

  // Two nodes of two with 10gbe between them, hier: the run (one node, link none) timed the intra-node hops' link,
  // so only the inter-node link, the shape and the implementation are extrapolations.
  PredictSetting nodes = model.measured;
  nodes.ranks = 4;
  nodes.ranks_per_node = 2;
  nodes.link = parse_links("intra=none,inter=10gbe");
  nodes.impl = AllreduceImpl::kHier;
  const Prediction h = predict(model, nodes);
  const std::vector<std::string> expected = {"inter-node link 10gbe: link model only (measured none)",
                                             "4 ranks (measured 2)", "2 nodes x 2 (measured 1 node)",
                                             "comm hier (measured ring)"};
  EXPECT_EQ(h.extrapolated, expected);
  EXPECT_EQ(h.comm_source, "run + link");

  // An allreduce_perf calibration of hier: on two nodes its rows time the inter-node hop (at 2 nodes, 2 exchanges
  // of the buffer's half) and are fitted: a hop twice as slow in the file predicts a longer step, by the hops the
  // closing bucket's all-reduce makes after backward. On one node they time no such hop, are not fitted, and the
  // prediction says so.
  const auto calibration_of = [](int nodes, double gbps) {
    Calibration cal;
    cal.ranks = 4, cal.nodes = nodes, cal.link = "10gbe", cal.link_model = parse_link("10gbe");
    const AlphaBeta hop{cal.link_model.latency_us / 1000, 8 / (gbps * 1e9) * 1000};
    for (const double bytes : {1 << 20, 16 << 20})
      cal.points.push_back({"hier", bytes, 2 * hop.alpha_ms + bytes / 2 * 2 * hop.beta_ms_per_byte});
    return cal;
  };
  StepModel calibrated = model;
  calibrated.calibration = calibration_of(2, 10);
  const Prediction two_nodes = predict(calibrated, nodes);
  EXPECT_EQ(two_nodes.comm_source.rfind("calibration", 0), 0u) << two_nodes.comm_source;
  calibrated.calibration = calibration_of(2, 5);
  EXPECT_GT(predict(calibrated, nodes).step.step_ms, two_nodes.step.step_ms + 1) << "a slower hop in the file";
  calibrated.calibration = calibration_of(1, 10);
  const Prediction one_node = predict(calibrated, nodes);
  EXPECT_NE(one_node.comm_source.rfind("calibration", 0), 0u) << one_node.comm_source;
  EXPECT_NE(std::find(one_node.extrapolated.begin(), one_node.extrapolated.end(),
                      "the calibration ran on one node: its hier rows time no inter-node hop"),
            one_node.extrapolated.end());
  EXPECT_NEAR(one_node.step.step_ms, h.step.step_ms, kTol);  // what the run and the link model predict

  // A ring calibration that ran beside the direct all-reduce (-J's transports) took the ring from 2 KiB up at 2
  // ranks, not from 16 KiB: its 4 and 8 KiB rows, fitted so, predict what its large rows alone do. Fitted as
  // recursive doubling (a file that does not say), they do not. The run's 4 MB buckets lie beyond every row, where
  // the fit alone prices them (between rows, the rows' own times correct it: below).
  const AlphaBeta ring_costs{0.2, 1.0 / (1 << 20)};
  const auto ring_calibration = [&](const std::vector<double>& sizes, bool direct) {
    Calibration c;
    c.ranks = 2, c.link = "none", c.link_model = parse_link("none");
    if (direct) c.direct_impls = {"ring"};
    for (const double bytes : sizes)
      c.points.push_back(
          {"ring", bytes, ring_costs.ms(allreduce_terms(bytes, 2, AllreduceImpl::kRing, WireDtype::kFp32, 0, 1, 0))});
    return c;
  };
  const auto step_with = [&](const Calibration& c) {
    StepModel with = model;
    with.calibration = c;
    return predict(with, model.measured).step.step_ms;
  };
  const double large_only = step_with(ring_calibration({256 << 10, 1 << 20}, false));
  const std::vector<double> with_small = {3 << 10, 4 << 10, 6 << 10, 8 << 10, 12 << 10, 256 << 10, 1 << 20};
  EXPECT_NEAR(step_with(ring_calibration(with_small, true)), large_only, kTol);
  EXPECT_GT(std::abs(step_with(ring_calibration(with_small, false)) - large_only), 0.05);
}

// The training thread's wake after the last all-reduce is part of its step (it waits for a core), but the replay
// computes the exposed wait itself, ending when the all-reduce does: the wake must come back as part of `after`, or
// the own setting replays short by it (it did by 1-2 ms at 4 ranks on 2 cores).
TEST(Predict, ReplaysTheWakeAfterTheLastAllreduce) {
  const AlphaBeta ab{0.05, 2.0 / (1 << 20)};
  const double wake = 1.5;
  const RunRecord run = synthetic_run(ab, 4, wake);
  const StepModel model = build_model(run, std::nullopt);
  EXPECT_NEAR(model.steps[0][0].after_ms, 2 + wake, 1e-9);
  EXPECT_NEAR(predict(model, model.measured).step.step_ms, model.measured_step_ms, kTol);
  PredictSetting off = model.measured;  // every setting pays it
  off.overlap = false;
  EXPECT_NEAR(predict(model, off).step.step_ms, 2 + 10 + pieces_alone_after_backward_ms(run, ab) + 2 + wake, kTol);
}

// A calibration whose times are no cost per exchange plus one per byte (a floor up to 1 MiB, then the link's rate, as
// ranks sharing a GPU over an emulated link measured): a bucket between two of its sizes, at its ranks and link, costs
// what those rows took, linearly between them, not the fit's line through all of them; past the rows, the fit and the
// last row's residual. At other ranks or links, or beside the direct all-reduce, the fit alone serves: the rows timed
// none of those exchanges.
TEST(Predict, ACalibrationsRowsPriceTheBucketsBetweenThem) {
  const AlphaBeta ab{0.05, 2.0 / (1 << 20)};
  const RunRecord run = synthetic_run(ab, 4, 0, {1 << 21, 1 << 21});  // two buckets of 8 MiB
  const double small = static_cast<double>(small_allreduce_bytes(2));
  const auto calibration_of = [&](const std::function<double(double)>& time_ms) {
    Calibration c;
    c.ranks = 2, c.link = "none", c.link_model = parse_link("none");
    for (const double mib : {0.25, 1.0, 4.0, 16.0}) c.points.push_back({"ring", mib * kMiB, time_ms(mib * kMiB)});
    return c;
  };
  const auto floor_then_rate = [](double bytes) { return std::max(6.0, 0.1 + bytes * 1e-6); };
  const Calibration bent = calibration_of(floor_then_rate);
  std::vector<AllreduceTerms> terms;
  std::vector<double> times;
  for (const Calibration::Point& p : bent.points) {
    terms.push_back(allreduce_terms(p.bytes, 2, AllreduceImpl::kRing, WireDtype::kFp32, small));
    times.push_back(p.time_ms);
  }
  const AlphaBeta line = fit_comm(terms, times, 0.0).value().alone;
  const Calibration straight = calibration_of(
      [&](double bytes) { return line.ms(allreduce_terms(bytes, 2, AllreduceImpl::kRing, WireDtype::kFp32, small)); });

  PredictSetting off = build_model(run, std::nullopt).measured;
  off.overlap = false;  // every all-reduce after backward: the step is their sum beside the compute
  const double bucket = 8 * kMiB, below = floor_then_rate(4 * kMiB), above = floor_then_rate(16 * kMiB);
  const double between = below + (above - below) * (bucket - 4 * kMiB) / (12 * kMiB);
  const Prediction p = predict(build_model(run, bent), off);
  EXPECT_EQ(p.comm_source, "calibration");
  EXPECT_NEAR(p.step.step_ms, 2 + 10 + 2 * between + 2, kTol);
  const double fitted = line.ms(allreduce_terms(bucket, 2, AllreduceImpl::kRing, WireDtype::kFp32, small));
  EXPECT_GT(std::abs(fitted - between), 0.5) << "the rows' bend must be one the fit misses";
  EXPECT_NEAR(predict(build_model(run, straight), off).step.step_ms, 2 + 10 + 2 * fitted + 2, kTol);

  // Past the last row, that row's residual: the cost continuous in the bucket's size.
  const RunRecord large = synthetic_run(ab, 4, 0, {1 << 23, 1 << 23});  // two buckets of 32 MiB
  const auto fit_at = [&](double bytes) {
    return line.ms(allreduce_terms(bytes, 2, AllreduceImpl::kRing, WireDtype::kFp32, small));
  };
  EXPECT_NEAR(predict(build_model(large, bent), off).step.step_ms,
              2 + 10 + 2 * (fit_at(32 * kMiB) + floor_then_rate(16 * kMiB) - fit_at(16 * kMiB)) + 2, kTol);
  // Rows that ran beside the direct all-reduce say nothing of a ring's buckets of the same size.
  Calibration direct = bent;
  direct.direct_impls = {"ring"};
  EXPECT_NEAR(predict(build_model(run, direct), off).step.step_ms, 2 + 10 + 2 * fitted + 2, kTol);
  PredictSetting four = off;
  four.ranks = 4;
  EXPECT_NEAR(predict(build_model(run, bent), four).step.step_ms,
              predict(build_model(run, straight), four).step.step_ms, kTol);
  PredictSetting slower = off;
  slower.link = parse_link("10gbe");
  EXPECT_NEAR(predict(build_model(run, bent), slower).step.step_ms,
              predict(build_model(run, straight), slower).step.step_ms, kTol);
}

// A one-rank run says nothing of the direct all-reduce; at 2 ranks on its host the trainer takes it, and recursive
// doubling only up to 2 KiB: buckets of 8000 bytes are the ring's two exchanges, timed by a calibration of the ring
// beside the direct all-reduce. Under an emulated link there is no direct all-reduce: up to 16 KiB, one exchange.
TEST(Predict, AOneRankRunsRanksOnItsHostTakeTheDirectAllreducesSmallSize) {
  const AlphaBeta ab{0.05, 2.0 / (1 << 20)};
  RunRecord run = synthetic_run(ab, 4, 0, {2000, 2000, 2000, 2000});
  run.meta.world_size = 1;
  run.records.resize(run.records.size() / 2);  // rank 0's: both ranks ran alike
  run.bucket_times.resize(run.bucket_times.size() / 2);
  Calibration cal;
  cal.path = "synthetic.json", cal.link = "none", cal.link_model = parse_link("none"), cal.ranks = 2;
  cal.direct_impls = {"ring"};
  const double direct_small = static_cast<double>(small_allreduce_bytes(2, /*direct=*/true));
  for (const double bytes : {65536.0, 1048576.0})
    cal.points.push_back(
        {"ring", bytes, ab.ms(allreduce_terms(bytes, 2, AllreduceImpl::kRing, WireDtype::kFp32, direct_small))});
  const StepModel model = build_model(run, cal);
  const auto says_cold = [](const StepModel& m) {
    return std::any_of(m.notes.begin(), m.notes.end(),
                       [](const std::string& n) { return n.find("without --hot-cache") != std::string::npos; });
  };
  EXPECT_FALSE(says_cold(model));
  cal.cold_calls = true;  // its calls found their data out of the cache, which the output says
  EXPECT_TRUE(says_cold(build_model(run, cal)));
  PredictSetting two = model.measured;
  two.ranks = 2;
  two.overlap = false;
  const double ring = ab.ms(allreduce_terms(8000, 2, AllreduceImpl::kRing, WireDtype::kFp32, direct_small));
  const double doubling = ab.ms(allreduce_terms(8000, 2, AllreduceImpl::kRing, WireDtype::kFp32, 16384));
  ASSERT_GT(ring - doubling, 0.04);  // the second exchange's latency tells them apart
  EXPECT_NEAR(predict(model, two).step.comm_ms, 4 * ring, 1e-3);
  // 10 GbE's latency and time per byte are both below the calibration's, which bound another link's from below.
  two.link = parse_links("10gbe");
  EXPECT_NEAR(predict(model, two).step.comm_ms, 4 * doubling, 1e-3);
}

// A run on a full host (2 ranks x 1 thread on 2 cores, its comm threads' CPU recorded): its first all-reduce, started
// beside backward, waited for a core until backward ended. The time alone is fitted on the others only (with it,
// alpha and beta took in its wait), and the replay of the run's own setting waits as the run did.
TEST(Predict, AloneFromTheAllreducesAfterBackwardAndTheWaitReplayedOnAFullHost) {
  const AlphaBeta ab{0.05, 2.0 / (1 << 20)};
  const RunRecord run = synthetic_run(ab, 4, 0, {1000, 1 << 20, 1000, 1 << 20}, /*full_host=*/true);
  const BucketTimes& waited = run.bucket_at(0, 0, 0);
  ASSERT_NEAR(waited.comm_end_ms - waited.comm_start_ms, 7.5 + ring_ms_at_2(ab, 4000), 1e-9);
  const StepModel model = build_model(run, std::nullopt);
  EXPECT_TRUE(model.host.full());
  ASSERT_TRUE(model.comm_fit);
  EXPECT_NEAR(model.comm_fit->alone.alpha_ms, ab.alpha_ms, 1e-6);
  EXPECT_NEAR(model.comm_fit->alone.beta_ms_per_byte, ab.beta_ms_per_byte, 1e-9);
  EXPECT_NEAR(predict(model, model.measured).step.step_ms, model.measured_step_ms, kTol);
  PredictSetting off = model.measured;
  off.overlap = false;
  EXPECT_NEAR(predict(model, off).step.step_ms, 2 + 10 + pieces_alone_after_backward_ms(run, ab) + 2, kTol);

  // A run that measured what a lost yield costs stalls by that, not until backward ends.
  EXPECT_FALSE(model.host.lost_yield_ms);
  RunRecord measured = run;
  measured.meta.comm_lost_yield_us = 500;
  const StepModel stalls = build_model(measured, std::nullopt);
  EXPECT_EQ(stalls.host.lost_yield_ms, 0.5);
  EXPECT_LT(predict(stalls, stalls.measured).step.step_ms, model.measured_step_ms - 1);
}

// Ranks taking turns on one GPU: their all-reduce, started beside backward, waits for backward's end (as on a full
// host whose yields were not measured); with a GPU each it runs at once.
TEST(Predict, AllreduceBetweenRanksSharingAGpuWaitsForBackward) {
  const auto b = buckets(0, 0);
  HostCores shared;
  shared.ranks_per_gpu = 2;
  const SimulatedStep waits = simulate_step({profile(), profile()}, b, same_cost(4, 0.1), true, shared);
  EXPECT_NEAR(waits.comm_ms, (10 - 2.5) + 4 * 0.1, kTol);
  EXPECT_NEAR(waits.step_ms, 2 + 10 + 4 * 0.1 + 3, kTol);
  EXPECT_NEAR(simulate_step({profile(), profile()}, b, same_cost(4, 0.1), true, HostCores{}).step_ms, 2 + 10 + 0.1 + 3,
              kTol);

  // From a GPU run's file (no comm CPU times, no cores): the same bus id on both ranks of a host is what says so.
  // Its all-reduces waited for backward's end, and the replay does too; on two GPUs it would hide them.
  const AlphaBeta ab{0.05, 2.0 / (1 << 20)};
  RunRecord run = synthetic_run(ab, 4, 0, {1000, 1 << 20, 1000, 1 << 20}, /*full_host=*/true);
  run.meta.host_cores = 0;
  for (BucketTimes& t : run.bucket_times) t.comm_cpu_ms = -1;
  run.meta.gpus = {"0000:19:00.0", "0000:19:00.0"};
  const StepModel model = build_model(run, std::nullopt);
  EXPECT_EQ(model.host.ranks_per_gpu, 2);
  EXPECT_FALSE(model.host.full());
  EXPECT_NEAR(predict(model, model.measured).step.step_ms, model.measured_step_ms, kTol);
  // On another link the ranks are on GPUs of their own: no wait, the run's per-step cost (the GPU's switches) no
  // floor for the link's, and the row says so.
  PredictSetting nvlink = model.measured;
  nvlink.link = parse_links("nvlink4-nccl");
  const Prediction own_gpus = predict(model, nvlink);
  EXPECT_LT(own_gpus.step.step_ms, model.measured_step_ms - 1);
  EXPECT_TRUE(std::any_of(own_gpus.extrapolated.begin(), own_gpus.extrapolated.end(),
                          [](const std::string& e) { return e.find("a GPU per rank") != std::string::npos; }));
  // There each rank's compute is the shared run's over 2, its gradients' ready times too: every bucket is ready
  // within the halved backward, and over NVLink only the closing one's all-reduce (1000 elements) shows.
  const RankProfile& shared_rank = model.steps[0][0];
  EXPECT_NEAR(own_gpus.step.backward_ms, shared_rank.backward_ms / 2, kTol);
  EXPECT_NEAR(own_gpus.step.step_ms,
              (shared_rank.before_ms + shared_rank.backward_ms + shared_rank.after_ms) / 2 + own_gpus.step.exposed_ms,
              kTol);
  EXPECT_LT(own_gpus.step.exposed_ms, 0.1);
  // Over 10 GbE the buckets' all-reduces take milliseconds: those ready early in the halved backward run beside it.
  PredictSetting ten = nvlink;
  ten.link = parse_links("10gbe");
  const Prediction slow = predict(model, ten);
  EXPECT_GT(slow.step.hidden_ms, 0.25 * slow.step.comm_ms);  // had the ready times kept the run's, none would
  run.meta.gpus = {"0000:19:00.0", "0000:3b:00.0"};
  const StepModel two_gpus = build_model(run, std::nullopt);
  EXPECT_EQ(two_gpus.host.ranks_per_gpu, 0);
  EXPECT_LT(predict(two_gpus, two_gpus.measured).step.step_ms, model.measured_step_ms - 1);
}

// Fair shares of the cores: compute gets what the comm threads' measured CPU leaves.
TEST(Predict, BackwardSlowdownFromTheCommThreadsCpuShare) {
  // 2 ranks x 1 thread on 2 cores, comm threads on a core all the time: compute keeps nothing of its cores by
  // the accounting, bounded by the fair share (comm is a second thread beside one): half pace, slowdown 1.
  EXPECT_DOUBLE_EQ(backward_slowdown_beside_comm(2, 2, 1, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(backward_slowdown_beside_comm(4, 2, 1, 1.0), 0.0);       // a spare core per comm thread
  EXPECT_DOUBLE_EQ(backward_slowdown_beside_comm(3, 2, 1, 1.0), 1.0);       // pace 1 alone, 1/2 beside
  EXPECT_DOUBLE_EQ(backward_slowdown_beside_comm(2, 2, 1, 0.25), 1.0 / 3);  // 1.5 of 2 cores left: 3/4 pace
  // Oversubscribed: 4 ranks x 1 thread on 2 cores, pace 1/2 alone; comm takes 4 x 0.25 = 1 core: 1/4 beside.
  EXPECT_DOUBLE_EQ(backward_slowdown_beside_comm(2, 4, 1, 0.25), 1.0);
  EXPECT_DOUBLE_EQ(backward_slowdown_beside_comm(2, 4, 1, 0.1), 0.25);  // 1.6 cores left: pace 0.4
  // 2 ranks x 2 threads on 4 cores, share 0.5: 3 of 4 cores left. Bounded at 1/threads = 1/2.
  EXPECT_DOUBLE_EQ(backward_slowdown_beside_comm(4, 2, 2, 0.5), 1.0 / 3);
  EXPECT_DOUBLE_EQ(backward_slowdown_beside_comm(4, 2, 2, 1.5), 0.5);
  EXPECT_DOUBLE_EQ(backward_slowdown_beside_comm(2, 2, 1, 0.0), 0.0);
}

// From a run: the synthetic run's comm threads were on a core 1/4 of each all-reduce's time, so their CPU is 1/4 of
// its alpha-beta cost, which the fit recovers, and 2 ranks x 1 thread on 2 cores run backward at 3/4 pace beside
// comm (slowdown 1/3). Buckets 0 and 1 start beside backward (at 2.5 and 5 ms of its 10): the backward without
// comm is the measured one less 1/4 of the time they ran beside it.
TEST(Predict, BackwardSlowdownFromARunsCommCpuTimesAndCores) {
  const AlphaBeta ab{0.05, 2.0 / (1 << 20)};
  RunRecord run = synthetic_run(ab, 4);
  run.meta.hostnames = {"node", "node"};
  run.meta.host_cores = 2;
  run.config["threads"] = 1;
  for (BucketTimes& t : run.bucket_times) t.comm_cpu_ms = 0.25 * (t.comm_end_ms - t.comm_start_ms);
  StepModel model = build_model(run, std::nullopt);
  ASSERT_TRUE(model.comm_cpu);
  EXPECT_NEAR(model.comm_cpu->alpha_ms, 0.25 * ab.alpha_ms, 1e-9);
  EXPECT_NEAR(model.comm_cpu->beta_ms_per_byte, 0.25 * ab.beta_ms_per_byte, 1e-12);
  EXPECT_NEAR(model.backward_slowdown, 1.0 / 3, 1e-12) << model.slowdown_source;
  const BucketTimes& b0 = run.bucket_at(0, 0, 0);
  const double backward_start = run.at(0, 0).start_ms + 2, beside = (b0.comm_end_ms - b0.comm_start_ms) + 5;
  EXPECT_NEAR(model.steps[0][0].backward_ms, 10 - 0.25 * beside, 1e-9);
  EXPECT_NEAR(model.steps[0][0].piece_ready_ms[0], b0.ready_ms - backward_start, 1e-9);  // nothing beside before it
  // Overlap off from it: backward without comm beside it, 10 - 0.25 x beside, then every all-reduce alone.
  const double comm = pieces_alone_after_backward_ms(run, ab);
  PredictSetting off = model.measured;
  off.overlap = false;
  EXPECT_NEAR(predict(model, off).step.step_ms, 2 + 10 - 0.25 * beside + comm + 2, kTol);

  // The same run on 4 cores: a spare core per comm thread, no slowdown. Without its cores or CPU times (older
  // files, GPU runs): not measured, 0.
  run.meta.host_cores = 4;
  EXPECT_EQ(build_model(run, std::nullopt).backward_slowdown, 0);
  run.meta.host_cores = 0;
  model = build_model(run, std::nullopt);
  EXPECT_EQ(model.backward_slowdown, 0);
  EXPECT_FALSE(model.comm_cpu);
  EXPECT_NE(model.slowdown_source.find("not measured"), std::string::npos);
}

// From buckets of alike sizes (3 and 4 MB, as `small`'s default run) the CPU cannot be split into a part per
// message step and a part per byte: the part per step is the run's poll time (its comm_spin_us), the rest per byte.
// Fitted on the two sizes, the noise below (+-0.1 ms) made the part per step 0.2 ms, whatever the size.
TEST(Predict, CommCpuFromAlikeSizesIsThePollsPerStepAndTheRestPerByte) {
  RunRecord run = synthetic_run({0.05, 2.0 / (1 << 20)}, 4, 0, {768 << 10, 1 << 20, 768 << 10, 1 << 20});
  run.meta.hostnames = {"node", "node"};
  run.meta.host_cores = 2;
  run.meta.comm_spin_us = 40;
  run.config["threads"] = 1;
  const double poll_ms = 0.04, cpu_per_byte = 0.25e-6, steps = 2;  // the ring at 2 ranks: 2 message steps
  for (size_t i = 0; i < run.bucket_times.size(); ++i) {
    const int b = static_cast<int>(i % run.buckets.size());
    run.bucket_times[i].comm_cpu_ms = steps * poll_ms + cpu_per_byte * run.buckets[b].bytes() + (b == 1 ? -0.1 : 0.1);
  }
  StepModel model = build_model(run, std::nullopt);
  ASSERT_TRUE(model.comm_cpu);
  EXPECT_NEAR(model.comm_cpu->alpha_ms, poll_ms, 1e-12);
  EXPECT_NEAR(model.comm_cpu->beta_ms_per_byte, cpu_per_byte, 0.1 * cpu_per_byte);
  EXPECT_NE(model.slowdown_source.find("sizes too alike"), std::string::npos) << model.slowdown_source;
  // A comm thread that spins rather than sleeps has no poll budget to go by: all of it per byte.
  run.meta.comm_spin_us = -1;
  model = build_model(run, std::nullopt);
  EXPECT_EQ(model.comm_cpu->alpha_ms, 0);
}

TEST(Predict, RunWithoutBucketTimingsIsRefused) {
  RunRecord run = synthetic_run({0.05, 1e-6}, 2);
  for (BucketTimes& t : run.bucket_times) t = BucketTimes{};
  EXPECT_THROW(build_model(run, std::nullopt), std::invalid_argument);
}

TEST(Predict, RecommendationRanksOnlyWhatTheRunsNoiseCanTellApart) {
  PredictSetting own;  // 25 MB, overlap on
  own.ranks = 2;
  const auto row = [&](double bucket_mb, bool overlap, int buckets, double step_ms) {
    Prediction p;
    p.setting = own;
    p.setting.bucket_mb = bucket_mb;
    p.setting.overlap = overlap;
    p.buckets = buckets;
    p.step.step_ms = step_ms;
    return p;
  };
  const std::vector<Prediction> rows = {row(0.5, true, 6, 10.0), row(5, true, 3, 10.1), row(25, true, 2, 10.4),
                                        row(25, false, 2, 11.0)};
  // No tolerance: the fastest.
  Recommendation r = recommend(rows, own, 0);
  EXPECT_EQ(r.row, 0u);
  EXPECT_EQ(r.within_noise, 0);
  EXPECT_FALSE(r.own);
  // 2%: 10.0 and 10.1 cannot be told apart; the fewer buckets.
  r = recommend(rows, own, 0.02);
  EXPECT_EQ(r.row, 1u);
  EXPECT_EQ(r.within_noise, 1);
  EXPECT_FALSE(r.own);
  // 5%: the run's own setting (10.4) is among them: it wins.
  r = recommend(rows, own, 0.05);
  EXPECT_EQ(r.row, 2u);
  EXPECT_EQ(r.within_noise, 2);
  EXPECT_TRUE(r.own);
  // Caps that cut the same buckets predict exactly the same step: the own setting, else the first.
  const std::vector<Prediction> same = {row(0.5, true, 2, 6.0), row(25, true, 2, 6.0), row(100, true, 2, 6.0)};
  EXPECT_EQ(recommend(same, own, 0).row, 1u);
  PredictSetting other = own;
  other.overlap = false;
  EXPECT_EQ(recommend(same, other, 0).row, 0u);
  // At another world size no row is the own setting, but the own knobs still win a tie, in whatever order the caps
  // were listed.
  std::vector<Prediction> at_four = same;
  for (Prediction& p : at_four) p.setting.ranks = 4;
  EXPECT_EQ(recommend(at_four, own, 0).row, 1u);
  std::reverse(at_four.begin(), at_four.end());
  EXPECT_EQ(recommend(at_four, own, 0).row, 1u);
  EXPECT_FALSE(recommend(at_four, own, 0).own);
  // One rank on another link than the run's (the first column of a prediction for 1, 2, 4, 8 GPUs): no row is the
  // own setting, no all-reduce runs, and the own knobs win over fewer buckets, which change nothing there.
  std::vector<Prediction> one_rank = {row(100, true, 5, 6.0), row(25, true, 17, 6.0), row(5, true, 74, 6.0)};
  for (Prediction& p : one_rank) p.setting.ranks = 1;
  EXPECT_EQ(recommend(one_rank, own, 0.01).row, 1u);
  for (Prediction& p : one_rank) p.setting.ranks = 2;
  EXPECT_EQ(recommend(one_rank, own, 0.01).row, 1u) << "2 ranks: the own setting";
  for (Prediction& p : one_rank) p.setting.ranks = 4;
  EXPECT_EQ(recommend(one_rank, own, 0.01).row, 0u) << "4 ranks: the fewest buckets";
}

TEST(Predict, CalibrationFilesOfAllreducePerf) {
  const std::string json = "/tmp/ddplab_test_predict_" + std::to_string(getpid()) + ".json";
  std::ofstream(json) << "{\"nranks\": 2, \"link\": {\"name\": \"none\"}, \"results\": ["
                         "{\"impl\": \"ring\", \"size_bytes\": 65536, \"out_of_place\": {\"time_us\": 20}}, "
                         "{\"impl\": \"ring\", \"size_bytes\": 1048576, \"out_of_place\": {\"time_us\": 150}}]}";
  const Calibration cal = read_calibration(json);
  EXPECT_EQ(cal.ranks, 2);
  EXPECT_EQ(cal.link, "none");
  ASSERT_EQ(cal.points.size(), 2u);
  EXPECT_DOUBLE_EQ(cal.points[1].time_ms, 0.15);
  EXPECT_DOUBLE_EQ(cal.gpu_chunk_bytes, kGpuRingChunkBytes);  // no chunk named: the trainer's
  EXPECT_FALSE(cal.points[0].doubling);                       // nor an algorithm: the ring
  EXPECT_EQ(cal.nodes, 1);                                    // no node_of_rank: one node
  EXPECT_TRUE(cal.direct_impls.empty());                      // no transports: none beside the direct all-reduce
  // The link's figures past its preset, as allreduce_perf --link 10gbe --link-gbps 5 writes them.
  std::ofstream(json) << "{\"nranks\": 2, \"link\": {\"name\": \"10gbe\", \"latency_us\": 10, \"gbps\": 5}, "
                         "\"results\": [{\"impl\": \"ring\", \"size_bytes\": 65536, \"out_of_place\": "
                         "{\"time_us\": 90}}]}";
  EXPECT_EQ(read_calibration(json).link_model.gbps, 5);
  EXPECT_NE(parse_link("10gbe").gbps, 5);
  // allreduce_perf's --csv names none of that, nor each row's algorithm: refused with the file to give instead.
  const std::string csv = json + ".csv";
  std::ofstream(csv) << "impl,nranks,link,size_bytes,count,type,redop,oop_time_us,oop_algbw_gbs\n"
                        "ring,2,none,65536,16384,float,sum,20.0,3.2\n";
  try {
    read_calibration(csv);
    ADD_FAILURE() << "a CSV calibration was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not allreduce_perf's -J file"), std::string::npos) << e.what();
  }
  std::remove(csv.c_str());
  std::ofstream(json) << "{\"nranks\": 4, \"node_of_rank\": [0, 0, 1, 1], \"link\": {\"name\": \"10gbe\"}, "
                         "\"results\": [{\"impl\": \"hier\", \"size_bytes\": 1048576, \"out_of_place\": "
                         "{\"time_us\": 900}}]}";
  EXPECT_EQ(read_calibration(json).nodes, 2);
  EXPECT_EQ(read_calibration(json).ranks_per_gpu, 0);  // no gpus: not said
  // Each rank's GPU: the most ranks on one, a bus id counting once per node (two nodes' GPU 0 are two GPUs).
  for (const auto& [gpus, sharing] : {std::pair{"[\"0:1b\", \"0:1b\", \"0:1b\", \"0:1b\"]", 2},
                                      std::pair{"[\"0:1b\", \"0:2c\", \"0:1b\", \"0:2c\"]", 1},
                                      std::pair{"[\"0:1b\", \"0:1b\", \"0:1b\", \"0:2c\"]", 2}}) {
    std::ofstream(json) << "{\"nranks\": 4, \"node_of_rank\": [0, 0, 1, 1], \"gpus\": " << gpus
                        << ", \"link\": {\"name\": \"10gbe\"}, \"results\": [{\"impl\": \"gpu-ring-ipc\", "
                           "\"size_bytes\": 1048576, \"out_of_place\": {\"time_us\": 900}}]}";
    EXPECT_EQ(read_calibration(json).ranks_per_gpu, sharing) << gpus;
  }
  std::ofstream(json)
      << "{\"nranks\": 2, \"gpus\": [\"0:1b\"], \"link\": {\"name\": \"none\"}, \"results\": "
         "[{\"impl\": \"gpu-ring-ipc\", \"size_bytes\": 1048576, \"out_of_place\": {\"time_us\": 900}}]}";
  EXPECT_THROW(read_calibration(json), std::runtime_error);  // a GPU for one of its two ranks
  std::ofstream(json)
      << "{\"nranks\": 2, \"link\": {\"name\": \"none\"}, \"transports\": [\"ring over shm + direct "
         "collectives\", \"mpi over MPI_Allreduce\"], \"results\": [{\"impl\": \"ring\", \"size_bytes\": "
         "4096, \"out_of_place\": {\"time_us\": 9}}]}";
  EXPECT_EQ(read_calibration(json).direct_impls, std::vector<std::string>{"ring"});
  // The chunk as the file names it, or as its command line asked for it (files from before the field), else the
  // trainer's.
  for (const char* chunk : {"", ", \"gpu_chunk_mb\": 4", ", \"args\": \"allreduce_perf --gpu-chunk-mb 4 -J f.json\""}) {
    std::ofstream(json) << "{\"nranks\": 2, \"link\": {\"name\": \"none\"}" << chunk
                        << ", \"results\": [{\"impl\": \"gpu-ring-ipc\", \"size_bytes\": 1048576, "
                           "\"out_of_place\": {\"time_us\": 800}}]}";
    EXPECT_DOUBLE_EQ(read_calibration(json).gpu_chunk_bytes, *chunk ? 4 * kMiB : kGpuRingChunkBytes) << chunk;
  }
  // Whether its calls moved along the buffers (allreduce_perf without --hot-cache); files before the field ran them
  // in place.
  for (const char* hot : {"", ", \"hot_cache\": true", ", \"hot_cache\": false"}) {
    std::ofstream(json) << "{\"nranks\": 2, \"link\": {\"name\": \"none\"}" << hot
                        << ", \"results\": [{\"impl\": \"ring\", \"size_bytes\": 1048576, "
                           "\"out_of_place\": {\"time_us\": 800}}]}";
    EXPECT_EQ(read_calibration(json).cold_calls, std::string(hot).find("false") != std::string::npos) << hot;
  }
  // Each row's algorithm as the file names it; a row without one ran the ring.
  for (const char* field : {"", ", \"algorithm\": \"ring\"", ", \"algorithm\": \"recursive doubling\""}) {
    std::ofstream(json) << "{\"nranks\": 2, \"link\": {\"name\": \"none\"}, \"results\": [{\"impl\": "
                           "\"gpu-ring-ipc\", \"size_bytes\": 1048576, \"out_of_place\": {\"time_us\": 800}"
                        << field << "}]}";
    EXPECT_EQ(read_calibration(json).points.at(0).doubling, std::string(field).find("doubling") != std::string::npos)
        << field;
  }
  std::ofstream(json) << "{\"nranks\": 2, \"results\": []}";
  EXPECT_THROW(read_calibration(json), std::runtime_error);  // no link, no results
  // A damaged file, each field's damage named: a world size past int (it read as -727379968 ranks), nodes for ranks
  // it does not have, a call of no time, nothing at all.
  const auto refused = [&](const std::string& text, const std::string& why) {
    std::ofstream(json) << text;
    try {
      read_calibration(json);
      ADD_FAILURE() << "read: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  const std::string row = "\"results\": [{\"impl\": \"ring\", \"size_bytes\": 4096, \"out_of_place\": {\"time_us\": ";
  refused("{\"nranks\": 1e12, \"link\": {\"name\": \"none\"}, " + row + "9}}]}", "nranks 1e+12: not a world size");
  refused("{\"nranks\": 2, \"node_of_rank\": [0, 7], \"link\": {\"name\": \"none\"}, " + row + "9}}]}",
          "node_of_rank does not give each of its 2 ranks a node");
  refused("{\"nranks\": 2, \"link\": {\"name\": \"none\"}, " + row + "0}}]}", "a result with no size or time");
  refused("", "empty file");
  std::remove(json.c_str());
  EXPECT_THROW(read_calibration(json), std::runtime_error);  // missing
}

// ---- a single-GPU run (tests/unit/synthetic_gpu_run.h) predicted on more GPUs ------------------------------------

// The closing all-reduces replayed by hand: buckets in order, each when ready and when the one before is done.
double exposed_by_hand(const StepModel& m, const PredictSetting& s, const HopCosts& costs) {
  std::vector<int64_t> numel, offset;
  for (const PieceRecord& p : m.pieces) numel.push_back(p.numel), offset.push_back(p.offset);
  const std::vector<Bucket> buckets = assign_buckets(numel, offset, s.caps());
  const RankProfile& r = m.steps[0][0];
  double comm_free = 0, total = 0, update = r.backward_ms;
  for (const Bucket& b : buckets) total += static_cast<double>(b.count);
  for (const Bucket& b : buckets) {
    const double bytes = static_cast<double>(b.count) * sizeof(float);
    const double alone = s.impl == AllreduceImpl::kHier
                             ? hier_ms(bytes, s.ranks, s.nodes(), s.wire, costs)
                             : ring_ms(bytes, s.ranks, s.nodes(), s.wire, small_allreduce_bytes(s.ranks), costs);
    comm_free = std::max(r.piece_ready_ms[b.last_piece], comm_free) + alone;
    // The bucketed update: this bucket's share of the update once backward and its all-reduce are done.
    update = std::max(update, comm_free) + r.after_ms * static_cast<double>(b.count) / total;
  }
  if (s.bucketed_update) return update - r.backward_ms - r.after_ms;
  return std::max(0.0, comm_free - r.backward_ms);
}

AlphaBeta preset_costs(const std::string& name) {
  const LinkModel l = parse_link(name);
  return {l.latency_us / 1000, 8 / (l.gbps * 1e9) * 1000};
}

TEST(Predict, AGpuRunPredictsMoreGpusOverNvlinkAndInfiniband) {
  const RunRecord run = fake_runs::synthetic_gpu_run();
  const StepModel model = build_model(run, std::nullopt);
  EXPECT_EQ(model.measured.impl, AllreduceImpl::kRing);  // NCCL, modelled as the ring, and said so
  EXPECT_TRUE(std::any_of(model.notes.begin(), model.notes.end(),
                          [](const std::string& n) { return n.find("NCCL") != std::string::npos; }));
  EXPECT_NEAR(predict(model, model.measured).step.step_ms, model.measured_step_ms, kTol);

  // The closing bucket is wte alone (154.5 MB): final at backward's end, its all-reduce exposed whole.
  EXPECT_EQ(run.buckets.back().count, 50304 * 768);
  const HopCosts nvlink{preset_costs("nvlink4-nccl"), preset_costs("nvlink4-nccl")};
  double previous_efficiency = 1;
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(std::to_string(n) + " GPUs");
    PredictSetting s = model.measured;
    s.ranks = n;
    s.link = parse_links("nvlink4-nccl");
    const Prediction p = predict(model, s);
    EXPECT_EQ(p.comm_source, "link model");
    EXPECT_FALSE(p.extrapolated.empty()) << "every cell beyond one GPU extrapolates";
    EXPECT_NEAR(p.step.exposed_ms, exposed_by_hand(model, s, nvlink), kTol);
    const double efficiency = weak_scaling_efficiency(model, p);
    PredictSetting one = s;
    one.ranks = 1;
    EXPECT_NEAR(efficiency, predict(model, one).step.step_ms / p.step.step_ms, 1e-12);
    EXPECT_LT(efficiency, previous_efficiency);  // the ring moves 2(n-1)/n of the buffer: more with every GPU
    previous_efficiency = efficiency;

    // The update bucket by bucket: the other buckets' share runs beside wte's all-reduce.
    PredictSetting bucketed = s;
    bucketed.bucketed_update = true;
    const Prediction b = predict(model, bucketed);
    EXPECT_NEAR(b.step.exposed_ms, exposed_by_hand(model, bucketed, nvlink), kTol);
    EXPECT_LT(b.step.exposed_ms, p.step.exposed_ms);
    EXPECT_NEAR(b.step.step_ms - b.step.exposed_ms, p.step.step_ms - p.step.exposed_ms, kTol);  // the rest as before
  }

  // 2 nodes x 8 over 400 Gb/s InfiniBand per GPU: flat (the NICs bound every step) and hierarchical.
  const HopCosts cluster{preset_costs("nvlink4-nccl"), preset_costs("ndr400-x8")};
  for (AllreduceImpl impl : {AllreduceImpl::kRing, AllreduceImpl::kHier}) {
    SCOPED_TRACE(to_string(impl));
    PredictSetting s = model.measured;
    s.ranks = 16;
    s.ranks_per_node = 8;
    s.impl = impl;
    s.link = parse_links("intra=nvlink4-nccl,inter=ndr400-x8");
    const Prediction p = predict(model, s);
    EXPECT_FALSE(p.extrapolated.empty());
    EXPECT_NEAR(p.step.exposed_ms, exposed_by_hand(model, s, cluster), kTol);
  }
}

// Two ranks that shared a GPU over our ring, each bucket's all-reduce after backward at alpha per exchange and beta per
// byte, its exchanges those of the ring or of recursive doubling (`doubled`: as the trainer runs them now, and as
// the engine's name then says in the run file's transport).
RunRecord two_ranks_on_one_gpu(bool doubled, const AlphaBeta& cost) {
  const RunRecord one = fake_runs::synthetic_gpu_run();
  RunRecord run = one;
  run.meta.world_size = 2;
  run.meta.hostnames = {"gpu-node", "gpu-node"};
  run.meta.gpus = {"0000:1b:00.0", "0000:1b:00.0"};
  run.meta.transport = std::string("ring/ipc") + (doubled ? kGpuRingDoublingName : "");
  run.config["comm"] = "ring";
  const int nb = static_cast<int>(run.buckets.size());
  run.records.clear();
  run.bucket_times.clear();
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < run.steps; ++s) {
      StepRecord x = one.at(0, s);
      const double backward_end = x.start_ms + x.data_ms + x.forward_ms + x.backward_ms;
      double free = backward_end;  // ranks sharing a GPU: the all-reduces wait for backward's end
      for (int b = 0; b < nb; ++b) {
        BucketTimes t = one.bucket_at(0, s, b);
        const double bytes = static_cast<double>(run.buckets[b].bytes());
        const bool doubling = doubled && gpu_ring_doubles(2, true, bytes, kGpuRingChunkBytes);
        t.comm_start_ms = std::max(t.ready_ms, free);
        t.comm_end_ms = free =
            t.comm_start_ms + cost.ms(allreduce_terms(bytes, 2, AllreduceImpl::kRing, WireDtype::kFp32, 0, 1,
                                                      kGpuRingChunkBytes, doubling));
        run.bucket_times.push_back(t);
      }
      x.exposed_comm_ms = free - backward_end;
      x.step_ms = x.data_ms + x.forward_ms + x.backward_ms + x.exposed_comm_ms + x.optimizer_ms;
      run.records.push_back(x);
    }
  return run;
}

// The run's own all-reduces are fitted by the exchanges it made: a run whose transport names no doubling ran the
// ring throughout, one that names it doubled where the rule says.
TEST(Predict, ARunsAllReducesAreFittedByTheAlgorithmItsTransportNames) {
  const AlphaBeta shared{0.4, 1.0 / 2e8};  // 0.4 ms an exchange, 200 GB/s
  for (bool doubled : {false, true}) {
    SCOPED_TRACE(doubled ? "recursive doubling" : "the ring");
    const RunRecord run = two_ranks_on_one_gpu(doubled, shared);
    ASSERT_EQ(run.ranks_sharing_a_gpu(), 2);
    const StepModel m = build_model(run, std::nullopt);
    EXPECT_EQ(m.measured_doubling, doubled);
    ASSERT_TRUE(m.comm_fit.has_value());
    EXPECT_NEAR(m.comm_fit->alone.alpha_ms, shared.alpha_ms, 1e-3 * shared.alpha_ms);
    EXPECT_NEAR(m.comm_fit->alone.beta_ms_per_byte, shared.beta_ms_per_byte, 1e-3 * shared.beta_ms_per_byte);
    // And replayed as it ran.
    EXPECT_NEAR(predict(m, m.measured).step.step_ms, m.measured_step_ms, 0.01 * m.measured_step_ms);
  }
}

// Under an emulated link (--link) the GPU ring's exchanges cost their bytes, shared GPU or not, so at 4 ranks it
// keeps to the ring, whose bytes are fewer: the same all-reduce time whether the 4 ranks share a GPU or have one each
// (overlap off, so that no all-reduce stalls beside backward). Recursive doubling there would move 2 buffers a rank
// where the ring moves 1.5.
TEST(Predict, AnEmulatedLinkKeepsRanksSharingAGpuOnTheRing) {
  const StepModel m = build_model(two_ranks_on_one_gpu(true, AlphaBeta{0.4, 1.0 / 2e8}), std::nullopt);
  PredictSetting setting = m.measured;
  setting.ranks = 4;
  setting.link = parse_links("10gbe");
  setting.overlap = false;
  setting.ranks_per_gpu = 4;
  const double shared = predict(m, setting).step.comm_ms;
  setting.ranks_per_gpu = 1;
  EXPECT_NEAR(shared, predict(m, setting).step.comm_ms, 1e-9 * shared);
}

// The run of two_ranks_on_one_gpu updated bucket by bucket (--optimizer-in-backward on), as the GPU does: each
// bucket's share of the update (of its elements) once backward and its all-reduce are done, in bucket order. The
// closing bucket (wte, 154.5 MB) all-reduces long after backward; the others' update runs beside it, so the time
// after the last all-reduce is only wte's share.
RunRecord with_bucketed_update(RunRecord run) {
  run.config["optimizer_in_backward"] = "on";
  const int nb = static_cast<int>(run.buckets.size());
  double elements = 0;
  for (const BucketRecord& b : run.buckets) elements += static_cast<double>(b.count);
  for (int r = 0; r < run.world_size(); ++r)
    for (int s = 0; s < run.steps; ++s) {
      StepRecord& x = run.records.at(static_cast<size_t>(r) * run.steps + s);
      double end = x.start_ms + x.data_ms + x.forward_ms + x.backward_ms;
      for (int b = 0; b < nb; ++b) {
        double done = 0;  // the all-reduce is done on every rank
        for (int q = 0; q < run.world_size(); ++q) done = std::max(done, run.bucket_at(q, s, b).comm_end_ms);
        end = std::max(end, done) + x.optimizer_ms * static_cast<double>(run.buckets[b].count) / elements;
      }
      x.step_ms = end - x.start_ms;
    }
  return run;
}

// A run that updated bucket by bucket is taken with its whole update, not only the closing bucket's share after the
// last all-reduce, so that its own setting replays as it ran.
TEST(Predict, ABucketedUpdateIsTakenWhole) {
  const RunRecord run = with_bucketed_update(two_ranks_on_one_gpu(false, AlphaBeta{0.4, 1.0 / 2e8}));
  const StepModel m = build_model(run, std::nullopt);
  ASSERT_TRUE(m.measured.bucketed_update);
  const double update = run.at(0, 1).optimizer_ms;
  for (const std::vector<RankProfile>& ranks : m.steps)
    for (const RankProfile& r : ranks) EXPECT_NEAR(r.after_ms, update, 1e-6);
  EXPECT_NEAR(predict(m, m.measured).step.step_ms, m.measured_step_ms, 1e-3 * m.measured_step_ms);
}

// One GPU's run, predicted for ranks taking turns on that GPU: each rank's compute `turns` times as long (its kernels
// wait for the others'), its all-reduces after backward, timed by the calibration's GPU all-reduce (allreduce_perf
// --impls gpu-ring-ipc on the shared GPU).
TEST(Predict, AGpuRunPredictsRanksTakingTurnsOnIt) {
  const RunRecord run = fake_runs::synthetic_gpu_run();
  const AlphaBeta shared{0.37, 1.0 / 1e8};  // per message step, per byte (100 GB/s): ranks switching on one H200
  Calibration cal;
  cal.path = "ipc_np2.json";
  cal.link = "none";
  cal.ranks = 2;
  const double small = static_cast<double>(small_allreduce_bytes(2));
  const double chunk = kGpuRingChunkBytes;  // the file names none: the trainer's
  for (double mib : {1, 4, 16, 64, 256}) {  // 256 MiB: two rounds of 2 x 64 MiB
    const AllreduceTerms t = allreduce_terms(mib * kMiB, 2, AllreduceImpl::kRing, WireDtype::kFp32, small, 1, chunk);
    cal.points.push_back(
        {"gpu-ring-ipc", mib * kMiB, shared.alpha_ms * t.message_steps + shared.beta_ms_per_byte * t.bytes});
  }
  const StepModel model = build_model(run, cal);
  EXPECT_EQ(model.calibration_gpu_impl, "gpu-ring-ipc");
  const RankProfile& one = model.steps[0][0];
  const double compute = one.before_ms + one.backward_ms + one.after_ms;
  // A setting's buckets, in bytes of fp32 gradients.
  const auto bucket_bytes = [&](const PredictSetting& s) {
    std::vector<int64_t> numel, offset;
    for (const PieceRecord& piece : model.pieces) numel.push_back(piece.numel), offset.push_back(piece.offset);
    std::vector<double> bytes;
    for (const Bucket& b : assign_buckets(numel, offset, s.caps()))
      bytes.push_back(static_cast<double>(b.count) * sizeof(float));
    return bytes;
  };
  // Their all-reduces, one after another, at the calibration's alpha and beta.
  const auto comm_ms = [&](const PredictSetting& s) {
    double comm = 0;
    for (double bytes : bucket_bytes(s))
      comm += ring_ms(bytes, s.ranks, 1, s.wire, static_cast<double>(small_allreduce_bytes(s.ranks)),
                      HopCosts{shared, shared}, chunk, gpu_ring_doubles(s.ranks, true, bytes, chunk));
    return comm;
  };
  for (const auto& [ranks, per_gpu] : {std::pair{2, 2}, {4, 4}, {4, 2}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks, " + std::to_string(per_gpu) + " a GPU");
    PredictSetting s = model.measured;
    s.ranks = ranks;
    s.ranks_per_gpu = per_gpu;
    const Prediction p = predict(model, s);
    EXPECT_EQ(p.comm_source, "calibration");
    EXPECT_EQ(p.setting.ranks_per_gpu, per_gpu);
    EXPECT_TRUE(std::any_of(p.extrapolated.begin(), p.extrapolated.end(), [&](const std::string& e) {
      return e.find(std::to_string(per_gpu) + " ranks taking turns on a GPU") != std::string::npos;
    }));
    const double comm = comm_ms(s);
    // Every all-reduce after backward, one after another (those taken up beside it wait there): the replay's time
    // step is 1/20000 of the step.
    const double want = per_gpu * compute + comm;
    EXPECT_NEAR(p.step.step_ms, want, 1e-3 * want);
    EXPECT_NEAR(p.step.exposed_ms, comm, 1e-3 * want);
  }
  // A 16-bit wire moves half the bytes of the fp32 buffers the calibration timed: the same message steps (their
  // alpha), half the time per byte.
  PredictSetting bf16 = model.measured;
  bf16.ranks = 2, bf16.ranks_per_gpu = 2, bf16.wire = WireDtype::kBf16;
  PredictSetting fp32 = bf16;
  fp32.wire = WireDtype::kFp32;
  double steps_ms = 0;
  for (double bytes : bucket_bytes(bf16))
    steps_ms += shared.alpha_ms * allreduce_terms(bytes, 2, AllreduceImpl::kRing, WireDtype::kFp32, small, 1, chunk,
                                                  gpu_ring_doubles(2, true, bytes, chunk))
                                      .message_steps;
  const Prediction p16 = predict(model, bf16), p32 = predict(model, fp32);
  EXPECT_NEAR(p16.step.exposed_ms - steps_ms, 0.5 * (p32.step.exposed_ms - steps_ms), 1e-3 * p16.step.step_ms);
  EXPECT_NEAR(p16.step.exposed_ms, comm_ms(bf16), 1e-3 * p16.step.step_ms);
  // A calibration timed at another chunk (allreduce_perf --gpu-chunk-mb 4: 2 x 4 MiB rounds, 20 of them at 154.5 MB)
  // fits the same cost per exchange, and the prediction is of the trainer's ring, in its own 64 MiB rounds.
  Calibration small_chunks = cal;
  small_chunks.gpu_chunk_bytes = 4 * kMiB;
  small_chunks.points.clear();
  for (double mib : {1, 4, 16, 64, 256}) {
    const AllreduceTerms t =
        allreduce_terms(mib * kMiB, 2, AllreduceImpl::kRing, WireDtype::kFp32, small, 1, small_chunks.gpu_chunk_bytes);
    small_chunks.points.push_back(
        {"gpu-ring-ipc", mib * kMiB, shared.alpha_ms * t.message_steps + shared.beta_ms_per_byte * t.bytes});
  }
  PredictSetting two = model.measured;
  two.ranks = 2, two.ranks_per_gpu = 2;
  EXPECT_NEAR(predict(build_model(run, small_chunks), two).step.step_ms, predict(model, two).step.step_ms,
              1e-6 * predict(model, two).step.step_ms);
  // A calibration whose rows ran recursive doubling (-J's `algorithm`) fits the same cost per exchange from its
  // own exchanges, and predicts the same.
  Calibration doubled = cal;
  doubled.points.clear();
  for (double mib : {1, 4, 16, 64, 256}) {
    const AllreduceTerms t =
        allreduce_terms(mib * kMiB, 2, AllreduceImpl::kRing, WireDtype::kFp32, small, 1, chunk, true);
    doubled.points.push_back(
        {"gpu-ring-ipc", mib * kMiB, shared.alpha_ms * t.message_steps + shared.beta_ms_per_byte * t.bytes, true});
  }
  EXPECT_NEAR(predict(build_model(run, doubled), two).step.step_ms, predict(model, two).step.step_ms,
              1e-6 * predict(model, two).step.step_ms);

  // A calibration whose file says its two ranks had a GPU each: a setting of two ranks on one GPU is another
  // sharing, said as such; one of a GPU each is not.
  Calibration own_gpus = cal;
  own_gpus.ranks_per_gpu = 1;
  const StepModel apart = build_model(run, own_gpus);
  const auto says_sharing = [](const Prediction& p) {
    return std::any_of(p.extrapolated.begin(), p.extrapolated.end(), [](const std::string& e) {
      return e.rfind("the calibration's ranks took turns on a GPU 1 to one (here ", 0) == 0;
    });
  };
  PredictSetting each_own = two;
  each_own.ranks_per_gpu = 1;
  EXPECT_TRUE(says_sharing(predict(apart, two)));
  EXPECT_FALSE(says_sharing(predict(apart, each_own)));
  EXPECT_FALSE(says_sharing(predict(model, two)));  // a file that does not say: nothing to compare

  // More turns than ranks: the world is what shares.
  PredictSetting alone = model.measured;
  alone.ranks_per_gpu = 4;
  EXPECT_EQ(predict(model, alone).setting.ranks_per_gpu, 1);
  EXPECT_NEAR(predict(model, alone).step.step_ms, model.measured_step_ms, kTol);

  // The calibration must be of one GPU all-reduce: a host ring's, or two of the GPU's, model nothing of this run.
  cal.points.push_back({"nccl", kMiB, 0.02});
  EXPECT_THROW(build_model(run, cal), std::invalid_argument);
  for (Calibration::Point& point : cal.points) point.impl = "ring";
  EXPECT_THROW(build_model(run, cal), std::invalid_argument);
}

}  // namespace
}  // namespace ddplab
