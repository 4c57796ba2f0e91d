#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "ops/nn.h"

namespace kvtrim {

TEST(Sampler, GreedyIsArgmaxWithLowestIndexOnTies) {
  const float logits[] = {0.1f, 2.0f, -1.0f, 2.0f};
  Sampler s({0.f, 40, 0.95f, 1});
  EXPECT_EQ(s.sample(logits, 4), 1);
  EXPECT_EQ(argmax(logits, 4), 1);
}

TEST(Sampler, TopK1AndTinyTopPAreGreedy) {
  const float logits[] = {0.5f, 0.4f, 3.0f, 0.3f, 2.9f};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Sampler k1({1.f, 1, 1.f, seed});
    EXPECT_EQ(k1.sample(logits, 5), 2);
    Sampler p({1.f, 0, 1e-6f, seed});
    EXPECT_EQ(p.sample(logits, 5), 2);
  }
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[static_cast<size_t>(i)] = std::sin(static_cast<float>(i));
  Sampler a({0.8f, 20, 0.9f, 7}), b({0.8f, 20, 0.9f, 7});
  for (int i = 0; i < 200; ++i) EXPECT_EQ(a.sample(logits.data(), 100), b.sample(logits.data(), 100));
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  const float logits[] = {0.f, std::log(2.f), std::log(3.f), std::log(4.f)};  // p = 0.1 0.2 0.3 0.4
  Sampler s({1.f, 0, 1.f, 123});
  std::map<int, int> n;
  const int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) n[s.sample(logits, 4)]++;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(n[i] / double(kDraws), 0.1 * (i + 1), 0.015) << i;
}

TEST(Sampler, TopKExcludesTheTail) {
  const float logits[] = {5.f, 4.f, 3.f, 2.f, 1.f};
  Sampler s({2.f, 2, 1.f, 9});
  for (int i = 0; i < 500; ++i) EXPECT_LT(s.sample(logits, 5), 2);
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  // p = 0.5, 0.3, 0.2 (approximately): top_p 0.7 keeps two tokens.
  const float logits[] = {std::log(5.f), std::log(3.f), std::log(2.f)};
  Sampler s({1.f, 0, 0.7f, 3});
  int third = 0;
  for (int i = 0; i < 2000; ++i) third += s.sample(logits, 3) == 2;
  EXPECT_EQ(third, 0);
}

// The sampler sorts only the prefix of the candidates its walk reads; a reference that sorts the
// whole vocabulary (logit descending, lower id first), takes the softmax over the top k, cuts the
// nucleus (top_p < 1) and walks with the same generator must pick the same tokens.
int32_t full_sort_sample(const std::vector<float>& logits, const SamplerParams& p, std::mt19937_64& rng) {
  std::vector<std::pair<float, int32_t>> c;
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({logits[i] / p.temperature, static_cast<int32_t>(i)});
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(static_cast<size_t>(p.top_k));
  // the weights from the sampler's exponential (ops/nn.h exp_sub_sum), summed here in sorted order
  std::vector<float> e(c.size());
  for (size_t i = 0; i < c.size(); ++i) e[i] = c[i].first;
  exp_sub_sum(e.data(), static_cast<int64_t>(e.size()), c[0].first);
  std::vector<double> w(e.begin(), e.end());
  double sum = 0;
  for (double v : w) sum += v;
  size_t keep = c.size();
  double mass = sum;
  if (p.top_p < 1.f) {
    double acc = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      acc += w[i];
      if (acc / sum >= p.top_p) {
        keep = i + 1;
        mass = acc;
        break;
      }
    }
  }
  std::uniform_real_distribution<double> u(0.0, mass);
  double r = u(rng);
  for (size_t i = 0; i < keep; ++i) {
    r -= w[i];
    if (r <= 0) return c[i].second;
  }
  return c[keep - 1].second;
}

TEST(Sampler, PicksWhatAFullSortPicks) {
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(5000);
  for (auto& v : logits) v = nd(gen);
  for (size_t i = 0; i < 200; ++i) logits[i * 7] = logits[3];  // ties
  logits[4000] = logits[3] + 4.f;
  const SamplerParams params[] = {{0.7f, 0, 1.f, 1}, {1.f, 40, 0.95f, 2}, {1.3f, 0, 0.9f, 3}, {0.5f, 300, 1.f, 4},
                                  {2.f, 0, 0.5f, 5}, {1.f, 4999, 0.99f, 6}};
  int differ = 0, draws = 0;
  for (const SamplerParams& p : params) {
    Sampler s(p);
    std::mt19937_64 ref(p.seed);
    for (int i = 0; i < 300; ++i) {
      const int32_t got = s.sample(logits.data(), static_cast<int32_t>(logits.size()));
      const int32_t want = full_sort_sample(logits, p, ref);
      differ += got != want;
      ++draws;
      ASSERT_EQ(got, want) << "temperature " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p << " draw " << i;
    }
  }
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(draws, 1800);
}

TEST(Sampler, RejectsBadParamsAndNaN) {
  EXPECT_THROW(Sampler({-1.f, 40, 0.9f, 1}), Error);
  EXPECT_THROW(Sampler({1.f, 40, 0.f, 1}), Error);
  EXPECT_THROW(Sampler({1.f, 40, 1.5f, 1}), Error);
  const float bad[] = {0.f, NAN};
  Sampler s({0.f, 40, 0.9f, 1});
  EXPECT_THROW(s.sample(bad, 2), Error);
}

}  // namespace kvtrim
