// The input pipeline (data/loader.h): with or without worker threads and prefetching, it hands out exactly the
// batches a direct fill produces, in order, and a batch stays intact until the next one is asked for.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "data/loader.h"

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

}  // namespace
}  // namespace ddplab
