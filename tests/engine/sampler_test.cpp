#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"

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

TEST(Sampler, RejectsBadParamsAndNaN) {
  EXPECT_THROW(Sampler({-1.f, 40, 0.9f, 1}), Error);
  EXPECT_THROW(Sampler({1.f, 40, 0.f, 1}), Error);
  EXPECT_THROW(Sampler({1.f, 40, 1.5f, 1}), Error);
  const float bad[] = {0.f, NAN};
  Sampler s({0.f, 40, 0.9f, 1});
  EXPECT_THROW(s.sample(bad, 2), Error);
}

}  // namespace kvtrim
