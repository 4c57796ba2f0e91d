// Whole items spread over a pool's threads: each item (a sequence's attention) runs on one thread
// from start to end, and the threads get about equal work. The pool owns the threads,
// so which thread runs which item is decided here, not by the callers (Model::forward_batch
// hands its decode sequences over with their costs).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace kvtrim {

// bins[t] = the items thread t runs, in order.
using ItemBins = std::vector<std::vector<size_t>>;

// Longest processing time first: the items sorted by decreasing cost (ties: lower index first),
// each onto the bin with the least cost so far (ties: the lowest bin). Within 4/3 of the best
// makespan (Graham); an even split by count left one thread waiting whenever the costs differ.
// Deterministic: the same costs give the same bins. n_bins >= 1; costs >= 0.
inline ItemBins longest_first_bins(const std::vector<int64_t>& cost, int n_bins) {
  ItemBins bins(static_cast<size_t>(std::max(n_bins, 1)));
  std::vector<size_t> order(cost.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<int64_t> load(bins.size(), 0);
  for (size_t i : order) {
    const size_t t = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    bins[t].push_back(i);
    load[t] += cost[i];
  }
  return bins;
}

// Calls fn(item) for every item of bins and returns when all have run: bins[t] is slot t of
// pool.run (bins.size() must be the pool's thread count), its items back to back, in order, on
// one thread (a thread done with its own slot may take another's, so two bins can share one).
// The job holds one pointer: no allocation per call (a decode step calls it once per layer).
template <typename Fn>
void run_item_bins(ThreadPool& pool, const ItemBins& bins, const Fn& fn) {
  KVTRIM_CHECK(bins.size() == static_cast<size_t>(pool.n_threads()),
               "run_item_bins: %zu bins for %d threads", bins.size(), pool.n_threads());
  struct Job {
    const ItemBins* bins;
    const Fn* fn;
  } job{&bins, &fn};
  const Job* jp = &job;
  pool.run([jp](int ith, int) {
    for (size_t i : (*jp->bins)[static_cast<size_t>(ith)]) (*jp->fn)(i);
  });
}

}  // namespace kvtrim
