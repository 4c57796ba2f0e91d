#include "core/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "core/timer.h"

namespace kvtrim {

namespace {

volatile uint64_t g_sink = 0;

uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) a[k] += p[i + static_cast<size_t>(k)];
  for (; i < n; ++i) a[0] += p[i];
  uint64_t s = 0;
  for (uint64_t x : a) s += x;
  return s;
}

}  // namespace

Bandwidth measure_read_bandwidth(ThreadPool* pool, size_t bytes, int reps) {
  const size_t n = std::max<size_t>(bytes / sizeof(uint64_t), 1024);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);
  const int nth = pool ? pool->n_threads() : 1;
  std::atomic<uint64_t> sink{0};
  auto pass = [&](bool write) {
    auto part = [&](int ith, int nt) {
      const size_t b = n * static_cast<size_t>(ith) / static_cast<size_t>(nt);
      const size_t e = n * static_cast<size_t>(ith + 1) / static_cast<size_t>(nt);
      if (write) {
        for (size_t i = b; i < e; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;  // first touch by the reader
      } else {
        sink.fetch_add(sum_words(buf.get() + b, e - b), std::memory_order_relaxed);
      }
    };
    if (pool && nth > 1) pool->run(part); else part(0, 1);
  };
  pass(true);
  pass(false);
  std::vector<double> g;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    const double t0 = now_seconds();
    pass(false);
    const double dt = now_seconds() - t0;
    g.push_back(static_cast<double>(n * sizeof(uint64_t)) / dt * 1e-9);
  }
  std::sort(g.begin(), g.end());
  Bandwidth bw;
  bw.gbps = g.back();
  bw.gbps_median = g.size() % 2 ? g[g.size() / 2] : 0.5 * (g[g.size() / 2 - 1] + g[g.size() / 2]);
  bw.bytes = n * sizeof(uint64_t);
  bw.threads = nth;
  bw.reps = static_cast<int>(g.size());
  g_sink = sink.load();  // the sums are observable, so the reads cannot be elided
  return bw;
}

}  // namespace kvtrim
