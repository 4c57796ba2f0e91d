// ThreadPool (thread_pool.h). Slots are claimed, not assigned: run() publishes a job whose
// nth slots (ith = 0 .. nth-1) are taken by compare-and-swap on one atomic word, the caller
// taking slot 0 and then helping with any slot no worker has claimed yet. Each fn(ith, nth)
// still runs exactly once, but a worker that is asleep or descheduled (2 cores shared with a
// build) no longer stalls the caller: it finds the slots gone and goes back to waiting. The
// caller only waits for slots a worker has actually started.
//
// generation_ packs (job generation << 32) | (next unclaimed slot); pending_ counts the slots
// of the current job finished by workers.

#include "core/thread_pool.h"

#include <algorithm>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVTRIM_PAUSE() _mm_pause()
#else
#define KVTRIM_PAUSE() ((void)0)
#endif

namespace kvtrim {

namespace {

constexpr int kSpinIters = 20000;  // pause loop before sleeping: ~1 ms on current x86
constexpr uint64_t kSlotMask = 0xffffffffu;

inline uint64_t gen_of(uint64_t word) {
  return word >> 32;
}

// Claims slots of job generation g from word until none is left; runs each through
// (*job)(slot, nth) and returns how many this thread ran. `job` is read only after a
// successful claim, when the job is guaranteed to be live.
int run_claimed_slots(std::atomic<uint64_t>& word, uint64_t g, int nth,
                      const std::function<void(int, int)>* const& job) {
  int ran = 0;
  uint64_t w = word.load(std::memory_order_acquire);
  while (gen_of(w) == g && static_cast<int>(w & kSlotMask) < nth) {
    if (word.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel,
                                   std::memory_order_acquire)) {
      (*job)(static_cast<int>(w & kSlotMask), nth);
      ++ran;
      w = word.load(std::memory_order_acquire);
    }
  }
  return ran;
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0)
    n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  KVTRIM_CHECK(n_threads <= kMaxThreads, "%d threads requested; at most %d are allowed (the machine has %u cores)",
               n_threads, kMaxThreads, std::thread::hardware_concurrency());
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true, std::memory_order_release);
    const uint64_t g = gen_of(generation_.load(std::memory_order_relaxed)) + 1;
    generation_.store((g << 32) | static_cast<uint64_t>(n_threads_),
                      std::memory_order_release);  // no slots
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int /*ith*/) {
  uint64_t seen = 0;  // generation last served
  for (;;) {
    uint64_t w = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen_of(w) == seen && spin < kSpinIters; ++spin) {
      KVTRIM_PAUSE();
      w = generation_.load(std::memory_order_acquire);
    }
    if (gen_of(w) == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return gen_of(generation_.load(std::memory_order_acquire)) != seen; });
      w = generation_.load(std::memory_order_acquire);
    }
    seen = gen_of(w);
    if (stop_.load(std::memory_order_acquire)) return;
    const int ran = run_claimed_slots(generation_, seen, n_threads_, job_);
    if (ran > 0) pending_.fetch_add(ran, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(0, std::memory_order_relaxed);
  const uint64_t g = gen_of(generation_.load(std::memory_order_relaxed)) + 1;
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation_.store((g << 32) | 1u, std::memory_order_release);  // slot 0 is the caller's
  }
  cv_.notify_all();
  fn(0, n_threads_);
  const int mine = 1 + run_claimed_slots(generation_, g, n_threads_, job_);
  while (pending_.load(std::memory_order_acquire) != n_threads_ - mine) KVTRIM_PAUSE();
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  const int nth = static_cast<int>(std::min<int64_t>(n_threads_, n_chunks));
  if (nth <= 1) {
    fn(0, n);
    return;
  }
  // The job captures one pointer so that std::function needs no heap allocation per call.
  struct Split {
    int64_t n, grain, n_chunks;
    int nth;
    const std::function<void(int64_t, int64_t)>* fn;
  } split{n, grain, n_chunks, nth, &fn};
  const Split* sp = &split;
  run([sp](int ith, int) {
    if (ith >= sp->nth) return;
    const int64_t c0 = sp->n_chunks * ith / sp->nth, c1 = sp->n_chunks * (ith + 1) / sp->nth;
    const int64_t b = c0 * sp->grain, e = std::min(sp->n, c1 * sp->grain);
    if (b < e) (*sp->fn)(b, e);
  });
}

}  // namespace kvtrim
