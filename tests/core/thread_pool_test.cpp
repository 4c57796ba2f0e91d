#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace kvtrim {

TEST(ThreadPool, ParallelForCoversRangeExactlyOnce) {
  for (int nth : {1, 2, 3}) {
    ThreadPool pool(nth);
    for (int64_t n : {0, 1, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      }, 4);
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, RunGivesEachThreadItsIndex) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 100; ++rep) {
    std::vector<std::atomic<int>> seen(3);
    pool.run([&](int ith, int nth) {
      EXPECT_EQ(nth, 3);
      seen[static_cast<size_t>(ith)]++;
    });
    for (auto& s : seen) EXPECT_EQ(s.load(), 1);
  }
}

}  // namespace kvtrim
