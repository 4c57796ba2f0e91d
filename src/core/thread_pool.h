// A fixed pool of worker threads for data-parallel kernels. The calling thread takes part
// in the work; workers spin briefly before sleeping so back-to-back small jobs (one per
// matrix-vector product during decode) do not pay a futex wake each time.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtrim {

class ThreadPool {
 public:
  // n_threads total threads including the caller; 0 = hardware concurrency.
  // n_threads <= 0: one per hardware thread; more than kMaxThreads is an Error.
  static constexpr int kMaxThreads = 1024;
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(ith, nth) once on each of nth = n_threads() threads (ith = 0 is the caller)
  // and returns when all calls have returned. Not reentrant.
  void run(const std::function<void(int ith, int nth)>& fn);

  // Splits [0, n) into contiguous ranges (multiples of `grain` where possible) and calls
  // fn(begin, end) on each thread's range.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

  // parallel_for with work stealing: each thread's contiguous range is cut into up to `pieces`
  // runs of whole grains, which the thread takes front to back; a thread done with its own runs
  // takes the others' from their back end. The same calls fn(begin, end) cover [0, n) exactly
  // once, but a thread that is late (descheduled on a shared machine, slower on its half) no
  // longer holds the others at the barrier: they finish its tail. For work whose result does
  // not depend on the thread (each row computed alone), results are those of parallel_for.
  // Up to kMaxStealThreads threads; more fall back to parallel_for.
  static constexpr int kMaxStealThreads = 64;
  void parallel_for_stealing(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain, int pieces);

 private:
  void worker(int ith);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Runs fn(begin, end) over [0, n) on the pool (ranges of at least `grain`), or inline when
// there is no pool, one thread, or no more than `grain` items.
template <typename Fn>
void for_range(ThreadPool* pool, int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  if (pool && pool->n_threads() > 1 && n > grain) {
    pool->parallel_for(n, fn, grain);
  } else {
    fn(0, n);
  }
}

}  // namespace kvtrim
