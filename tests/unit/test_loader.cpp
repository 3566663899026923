// The input pipeline (data/loader.h): with or without worker threads and prefetching, it hands out exactly the
// batches a direct fill produces, in order, and a batch stays intact until the next one is asked for. And the MLP's
// sharding (data/synthetic.h): the ranks' micro-batches cover the sample stream exactly once.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "data/loader.h"
#include "data/synthetic.h"

namespace ddplab {
namespace {

TEST(BatchLoader, SameBatchesInOrderForAnyThreadsAndPrefetch) {
  const SyntheticClassification data(SyntheticConfig{16, 5, 7, 1.0f});
  const int batch = 3;
  auto first_sample = [](int64_t i) { return 1000 + 7 * i; };  // any deterministic order
  std::vector<float> want_x(batch * 16);
  std::vector<int32_t> want_y(batch);
  for (int threads : {0, 1, 3}) {
    for (int prefetch : {1, 2, 5}) {
      BatchLoader loader(data, LoaderConfig{batch, threads > 0 ? 0.05 : 0.0, threads, prefetch}, first_sample);
      for (int64_t i = 0; i < 25; ++i) {
        const float* x;
        const int32_t* y;
        loader.next(&x, &y);
        data.fill(want_x.data(), want_y.data(), first_sample(i), batch);
        // Give the workers time to run ahead: they must not touch the batch we hold.
        if (i % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ASSERT_EQ(std::memcmp(x, want_x.data(), want_x.size() * sizeof(float)), 0)
            << "batch " << i << " threads " << threads << " prefetch " << prefetch;
        ASSERT_EQ(std::memcmp(y, want_y.data(), want_y.size() * sizeof(int32_t)), 0) << "batch " << i;
      }
    }
  }
}

TEST(BatchLoader, WorkersProduceAheadOfTheConsumer) {
  // With worker threads, batch 1 is started while the consumer still holds batch 0 and has not asked for more:
  // checked by the order of events, not by how long a call took. A synchronous loader (no threads) would start it
  // only when asked for, and the wait below would end in failure.
  const SyntheticClassification data(SyntheticConfig{8, 3, 1, 1.0f});
  std::promise<void> second_started;
  std::future<void> started = second_started.get_future();
  BatchLoader loader(data, LoaderConfig{1, 10.0, 4, 4}, [&](int64_t i) {
    if (i == 1) second_started.set_value();
    return i;
  });
  const float* x;
  const int32_t* y;
  loader.next(&x, &y);
  EXPECT_EQ(started.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "no worker started batch 1 while the consumer held batch 0";
  loader.next(&x, &y);
}

// Every (step, rank, micro-batch) takes its own run of samples, and together they are [0, steps x global batch):
// nothing duplicated, nothing dropped, whatever the ranks and micro-batches; and step s's global batch is the same
// samples a one-rank run of the same global batch takes at step s.
TEST(ShardedBatches, MicroBatchesCoverTheStreamOnce) {
  constexpr int kSteps = 7;
  for (int world : {1, 2, 3, 4}) {
    for (int micro_batches : {1, 2, 3}) {
      for (int micro_batch : {1, 5}) {
        SCOPED_TRACE(std::to_string(world) + " ranks x " + std::to_string(micro_batches) + " micro-batches of " +
                     std::to_string(micro_batch));
        const int64_t global = int64_t{world} * micro_batches * micro_batch;
        std::vector<int> taken(kSteps * global, 0);
        for (int rank = 0; rank < world; ++rank) {
          const ShardedBatches shard{rank, world, micro_batches * micro_batch};
          for (int64_t step = 0; step < kSteps; ++step)
            for (int u = 0; u < micro_batches; ++u) {
              const int64_t first = shard.first_sample(step, u, micro_batch);
              for (int64_t i = first; i < first + micro_batch; ++i) {
                ASSERT_GE(i, step * global) << "step " << step << " reaches into the step before";
                ASSERT_LT(i, (step + 1) * global) << "step " << step << " reaches into the next";
                ++taken[i];
              }
            }
        }
        EXPECT_EQ(std::count(taken.begin(), taken.end(), 1), static_cast<long>(taken.size()));
      }
    }
  }
}

}  // namespace
}  // namespace ddplab
