// ThreadPool under the conditions the kernels create: thousands of back-to-back tiny jobs
// (one per matvec), more threads than cores, and a caller that may run slots of workers
// that have not woken up (thread_pool.cpp claims slots instead of assigning them).

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace kvtrim {
namespace {

TEST(ThreadPoolClaim, EverySlotRunsExactlyOnceAcrossManyTinyJobs) {
  for (int nth : {2, 3, 5}) {
    ThreadPool pool(nth);
    std::vector<std::atomic<int>> hits(static_cast<size_t>(nth));
    constexpr int kJobs = 20000;
    for (int job = 0; job < kJobs; ++job) {
      pool.run([&](int ith, int n) {
        ASSERT_EQ(n, nth);
        hits[static_cast<size_t>(ith)].fetch_add(1, std::memory_order_relaxed);
      });
    }
    for (auto& h : hits) EXPECT_EQ(h.load(), kJobs);
  }
}

TEST(ThreadPoolClaim, ResultsOfAllSlotsAreVisibleAfterRun) {
  ThreadPool pool(3);
  std::vector<int64_t> out(3000);
  for (int job = 0; job < 2000; ++job) {
    pool.parallel_for(
        static_cast<int64_t>(out.size()),
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = job + i;  // plain stores
        },
        16);
    for (size_t i = 0; i < out.size(); i += 499) ASSERT_EQ(out[i], job + static_cast<int64_t>(i));
  }
}

TEST(ThreadPoolClaim, WorksAfterWorkersFellAsleep) {
  ThreadPool pool(2);
  std::atomic<int> n{0};
  for (int rep = 0; rep < 3; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin phase
    pool.run([&](int, int) { n++; });
  }
  EXPECT_EQ(n.load(), 6);
}

TEST(ThreadPoolClaim, CreateAndDestroyQuickly) {
  for (int rep = 0; rep < 200; ++rep) {
    ThreadPool pool(3);
    if (rep % 2 == 0) pool.run([](int, int) {});
  }
}

}  // namespace
}  // namespace kvtrim
