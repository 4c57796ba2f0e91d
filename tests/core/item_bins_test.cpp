#include "core/item_bins.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace kvtrim {
namespace {

int64_t makespan(const ItemBins& bins, const std::vector<int64_t>& cost) {
  int64_t worst = 0;
  for (const auto& b : bins) {
    int64_t load = 0;
    for (size_t i : b) load += cost[i];
    worst = std::max(worst, load);
  }
  return worst;
}

// The best makespan over every assignment of the items to n_bins bins (brute force).
int64_t best_makespan(const std::vector<int64_t>& cost, int n_bins) {
  const size_t n = cost.size();
  size_t combos = 1;
  for (size_t i = 0; i < n; ++i) combos *= static_cast<size_t>(n_bins);
  int64_t best = INT64_MAX;
  for (size_t c = 0; c < combos; ++c) {
    std::vector<int64_t> load(static_cast<size_t>(n_bins), 0);
    size_t code = c;
    for (size_t i = 0; i < n; ++i, code /= static_cast<size_t>(n_bins))
      load[code % static_cast<size_t>(n_bins)] += cost[i];
    best = std::min(best, *std::max_element(load.begin(), load.end()));
  }
  return best;
}

TEST(ItemBins, LongestFirstOntoTheLeastLoadedBin) {
  // 5 -> bin 0, 4 -> bin 1, 3 -> bin 1 (4 < 5), 3 -> bin 0 (5 < 7), 3 -> bin 1 (7 < 8)
  const ItemBins bins = longest_first_bins({5, 4, 3, 3, 3}, 2);
  EXPECT_EQ(bins, (ItemBins{{0, 3}, {1, 2, 4}}));
  // ties in cost keep the items' order; ties in load take the lowest bin
  EXPECT_EQ(longest_first_bins({1, 1, 1}, 3), (ItemBins{{0}, {1}, {2}}));
  EXPECT_EQ(longest_first_bins({}, 2), (ItemBins{{}, {}}));
}

TEST(ItemBins, EveryItemOnceWithinFourThirdsOfTheBestMakespan) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n_bins = 2 + trial % 3;
    std::vector<int64_t> cost(static_cast<size_t>(1 + trial % 8));
    for (auto& c : cost) c = std::uniform_int_distribution<int64_t>(0, 100)(rng);
    const ItemBins bins = longest_first_bins(cost, n_bins);
    ASSERT_EQ(bins.size(), static_cast<size_t>(n_bins));
    std::vector<int> seen(cost.size(), 0);
    for (const auto& b : bins)
      for (size_t i : b) ++seen[i];
    EXPECT_EQ(seen, std::vector<int>(cost.size(), 1));
    // Graham's bound for LPT: makespan <= (4/3 - 1/(3m)) OPT
    const int64_t opt = best_makespan(cost, n_bins);
    EXPECT_LE(3 * n_bins * makespan(bins, cost), (4 * n_bins - 1) * opt) << "trial " << trial;
    EXPECT_EQ(longest_first_bins(cost, n_bins), bins);  // deterministic
  }
}

TEST(ItemBins, RunsEachBinWholeAndInOrderOnOneThread) {
  ThreadPool pool(3);
  const std::vector<int64_t> cost = {9, 1, 4, 4, 2, 7, 3};
  const ItemBins bins = longest_first_bins(cost, pool.n_threads());
  std::mutex mu;
  std::map<size_t, std::pair<std::thread::id, int>>
      ran;  // item -> (thread, its turn on that thread)
  std::map<std::thread::id, int> turns;
  run_item_bins(pool, bins, [&](size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    const std::thread::id me = std::this_thread::get_id();
    EXPECT_TRUE(ran.emplace(i, std::make_pair(me, turns[me]++)).second)
        << "item " << i << " ran twice";
  });
  ASSERT_EQ(ran.size(), cost.size());
  // a bin is one slot of pool.run: one thread runs its items back to back, in the bin's order
  // (a thread done with its own slot may take another's, so two bins can share a thread)
  for (const auto& bin : bins) {
    for (size_t j = 1; j < bin.size(); ++j) {
      EXPECT_EQ(ran[bin[j]].first, ran[bin[0]].first) << "a bin split over threads";
      EXPECT_EQ(ran[bin[j]].second, ran[bin[j - 1]].second + 1) << "a bin's items not back to back";
    }
  }
  EXPECT_THROW(run_item_bins(pool, ItemBins(2), [](size_t) {}), Error);
}

}  // namespace
}  // namespace kvtrim
