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

namespace {

// One thread's runs: `front` (low 32 bits) and `back` (high 32 bits) delimit the runs not yet
// taken, [front, back); the owner takes the front one, a thief the back one, each by one CAS.
struct alignas(64) StealRange {
  std::atomic<uint64_t> fb{0};
  int64_t c0 = 0, c1 = 0, per = 1;  // the range's grains [c0, c1), grains per run
};

inline uint64_t pack_fb(uint64_t f, uint64_t b) { return f | (b << 32); }

// The front (take_front) or back run of r; -1 when none is left.
int64_t take_run(StealRange& r, bool take_front) {
  uint64_t w = r.fb.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t f = w & kSlotMask, b = w >> 32;
    if (f >= b) return -1;
    const uint64_t nw = take_front ? pack_fb(f + 1, b) : pack_fb(f, b - 1);
    if (r.fb.compare_exchange_weak(w, nw, std::memory_order_acq_rel, std::memory_order_relaxed))
      return static_cast<int64_t>(take_front ? f : b - 1);
  }
}

}  // namespace

void ThreadPool::parallel_for_stealing(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain,
                                       int pieces) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  const int nth = static_cast<int>(std::min<int64_t>(n_threads_, n_chunks));
  if (nth <= 1 || nth > kMaxStealThreads || pieces <= 1) {
    parallel_for(n, fn, grain);
    return;
  }
  StealRange ranges[kMaxStealThreads];
  for (int i = 0; i < nth; ++i) {
    StealRange& r = ranges[i];
    r.c0 = n_chunks * i / nth;
    r.c1 = n_chunks * (i + 1) / nth;
    const int64_t len = r.c1 - r.c0;
    r.per = std::max<int64_t>(1, (len + pieces - 1) / pieces);
    r.fb.store(pack_fb(0, static_cast<uint64_t>((len + r.per - 1) / r.per)), std::memory_order_relaxed);
  }
  struct Job {
    StealRange* ranges;
    int nth;
    int64_t n, grain;
    const std::function<void(int64_t, int64_t)>* fn;
    void run_piece(const StealRange& r, int64_t k) const {
      const int64_t g0 = r.c0 + k * r.per, g1 = std::min(r.c1, g0 + r.per);
      const int64_t b = g0 * grain, e = std::min(n, g1 * grain);
      if (b < e) (*fn)(b, e);
    }
  } job{ranges, nth, n, grain, &fn};
  const Job* jp = &job;  // (one pointer: the std::function needs no allocation)
  run([jp](int ith, int) {
    if (ith >= jp->nth) return;
    for (int64_t k; (k = take_run(jp->ranges[ith], true)) >= 0;) jp->run_piece(jp->ranges[ith], k);
    for (int d = 1; d < jp->nth; ++d) {
      StealRange& other = jp->ranges[(ith + d) % jp->nth];
      for (int64_t k; (k = take_run(other, false)) >= 0;) jp->run_piece(other, k);
    }
  });
}

}  // namespace kvtrim
