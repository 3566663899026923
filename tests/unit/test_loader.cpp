// The input pipeline (data/loader.h): with or without worker threads and prefetching, it hands out exactly the
// batches a direct fill produces, in order, and a batch stays intact until the next one is asked for.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
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

TEST(BatchLoader, WorkersHideTheCostOfAFastEnoughPipeline) {
  // 4 batches of cost 10 ms produced by 4 threads while the consumer "computes" 12 ms per batch: after the first,
  // each batch is waiting when asked for. Checked loosely (a wait under 5 ms), since the machine is shared.
  const SyntheticClassification data(SyntheticConfig{8, 3, 1, 1.0f});
  BatchLoader loader(data, LoaderConfig{1, 10.0, 4, 4}, [](int64_t i) { return i; });
  const float* x;
  const int32_t* y;
  loader.next(&x, &y);
  std::this_thread::sleep_for(std::chrono::milliseconds(12));
  const auto start = std::chrono::steady_clock::now();
  loader.next(&x, &y);
  const double waited = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(waited, 5.0);
}

}  // namespace
}  // namespace ddplab
