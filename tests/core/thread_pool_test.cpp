#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
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

// parallel_for_stealing: every index once, every call a run of whole grains (but the last), for
// thread counts, sizes, grains and piece counts around the edges.
TEST(ThreadPool, StealingCoversRangeExactlyOnceInWholeGrains) {
  for (int nth : {1, 2, 3, 5}) {
    ThreadPool pool(nth);
    for (int64_t n : {0, 1, 7, 16, 64, 1000, 1001}) {
      for (int64_t grain : {1, 4, 16}) {
        for (int pieces : {1, 2, 4, 7}) {
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          std::atomic<int> bad{0};
          pool.parallel_for_stealing(n, [&](int64_t b, int64_t e) {
            if (b % grain != 0 || (e % grain != 0 && e != n) || b >= e) bad++;
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
          }, grain, pieces);
          EXPECT_EQ(bad.load(), 0) << nth << " threads, n " << n << ", grain " << grain << ", pieces " << pieces;
          for (auto& h : hits) ASSERT_EQ(h.load(), 1) << nth << " threads, n " << n << ", grain " << grain;
        }
      }
    }
  }
}

// A thread held up in its first run: the other thread takes the rest of its range from the back.
// Range [0, 32) is the caller's (slot 0), run front to back: [0, 8) first. Whoever starts [0, 8)
// is held there until some thread has run row 31, up to 20 s: without stealing nobody would, and
// the test fails below. (If row 31 already ran when [0, 8) starts, the back run went before the
// owner's first: a thief took it while the owner was late to start, which happened under a
// loaded CI machine, the worker taking the caller's whole range; stealing is shown either way.)
TEST(ThreadPool, StealingFinishesALateThreadsRange) {
  for (int rep = 0; rep < 20; ++rep) {
    ThreadPool pool(2);
    constexpr int64_t kN = 64;
    std::vector<std::atomic<int>> by(kN);  // 1 + the index of the thread that ran each row
    for (auto& b : by) b = 0;
    std::atomic<bool> first{true}, back_went_first{false};
    std::atomic<int> held{0};  // who was held in [0, 8)
    const std::thread::id caller = std::this_thread::get_id();
    pool.parallel_for_stealing(kN, [&](int64_t b, int64_t e) {
      const int who = std::this_thread::get_id() == caller ? 1 : 2;
      if (b == 0 && first.exchange(false) && by[31].load() != 0) back_went_first = true;
      for (int64_t i = b; i < e; ++i) by[static_cast<size_t>(i)] = who;
      if (b == 0 && !back_went_first.load() && held.load() == 0) {
        held = who;
        const auto t0 = std::chrono::steady_clock::now();
        while (by[31].load() == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
          std::this_thread::yield();
      }
    }, 4, 4);
    for (auto& b : by) EXPECT_NE(b.load(), 0);
    // rows [24, 32), the back run of the range that began at row 0, were run by the other thread
    // than the one held in [0, 8), or before [0, 8) began
    if (!back_went_first.load()) {
      EXPECT_NE(by[31].load(), held.load()) << "rep " << rep;
    }
  }
}

}  // namespace kvtrim
