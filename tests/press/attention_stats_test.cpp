// The attention statistics kernel (sgemm logits, SIMD softmax, pooled accumulation) and the
// question's self log-sum-exp against straight double-precision references.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "press/attention_stats.h"

namespace kvtrim {
namespace {

struct Case {
  int n_head = 4, n_head_kv = 2, d = 8;
  int64_t n_q = 9, n_k = 23;
  int window = 0;
  std::vector<float> q, k, extra;
  std::vector<int32_t> q_pos, k_pos;
  int group() const { return n_head / n_head_kv; }
  Case(uint32_t seed, int win, bool with_extra) : window(win) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.3f);
    q.resize(static_cast<size_t>(n_q * n_head * d));
    k.resize(static_cast<size_t>(n_k * d));
    for (float& x : q) x = nd(rng);
    for (float& x : k) x = nd(rng);
    // stored keys at increasing positions with gaps (an evicted cache), queries after some
    int32_t p = 0;
    for (int64_t j = 0; j < n_k; ++j) k_pos.push_back(p += 1 + static_cast<int32_t>(rng() % 3));
    for (int64_t i = 0; i < n_q; ++i) q_pos.push_back(k_pos[static_cast<size_t>(5 + 2 * i)]);
    if (with_extra) {
      extra.resize(static_cast<size_t>(n_q * n_head));
      for (size_t i = 0; i < extra.size(); ++i) extra[i] = i % 5 == 0 ? -INFINITY : 2.f * nd(rng);
    }
  }
};

// acc_max / acc_sum [n_k, group] for kv head ih, straight from the definition.
void reference(const Case& c, int ih, float scale, std::vector<double>* mx, std::vector<double>* sum) {
  const int g = c.group();
  mx->assign(static_cast<size_t>(c.n_k * g), 0.0);
  sum->assign(static_cast<size_t>(c.n_k * g), 0.0);
  for (int64_t i = 0; i < c.n_q; ++i)
    for (int gi = 0; gi < g; ++gi) {
      const int h = ih * g + gi;
      std::vector<double> logit(static_cast<size_t>(c.n_k), -INFINITY);
      double m = c.extra.empty() ? -INFINITY : c.extra[static_cast<size_t>(i * c.n_head + h)];
      for (int64_t j = 0; j < c.n_k; ++j) {
        const int32_t qp = c.q_pos[static_cast<size_t>(i)], kp = c.k_pos[static_cast<size_t>(j)];
        if (kp > qp || (c.window > 0 && qp - kp >= c.window)) continue;
        double dot = 0;
        for (int t = 0; t < c.d; ++t)
          dot += static_cast<double>(c.q[static_cast<size_t>((i * c.n_head + h) * c.d + t)]) *
                 c.k[static_cast<size_t>(j * c.d + t)];
        logit[static_cast<size_t>(j)] = dot * scale;
        m = std::max(m, logit[static_cast<size_t>(j)]);
      }
      if (m == -INFINITY) continue;
      double z = c.extra.empty() ? 0.0 : std::exp(static_cast<double>(c.extra[static_cast<size_t>(i * c.n_head + h)]) - m);
      for (double l : logit) z += l == -INFINITY ? 0.0 : std::exp(l - m);
      for (int64_t j = 0; j < c.n_k; ++j) {
        const double a = logit[static_cast<size_t>(j)] == -INFINITY ? 0.0 : std::exp(logit[static_cast<size_t>(j)] - m) / z;
        const size_t at = static_cast<size_t>(j * g + gi);
        (*mx)[at] = std::max((*mx)[at], a);
        (*sum)[at] += a;
      }
    }
}

TEST(AttentionStats, MaxAndSumMatchTheDefinition) {
  ThreadPool pool(3);
  int checked = 0;
  for (int window : {0, 7})
    for (bool with_extra : {false, true})
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const Case c(11u + static_cast<uint32_t>(window) + (with_extra ? 100u : 0u), window, with_extra);
        const float scale = 0.4f;
        for (int ih = 0; ih < c.n_head_kv; ++ih) {
          std::vector<double> want_max, want_sum;
          reference(c, ih, scale, &want_max, &want_sum);
          std::vector<float> got_max(want_max.size(), 0.f), got_sum(want_sum.size(), 0.f);
          attention_max_sum(c.q.data(), c.q_pos.data(), c.n_q, c.n_head, ih, c.group(), c.d, c.k.data(),
                            c.k_pos.data(), c.n_k, scale, c.window, got_max.data(), got_sum.data(), p,
                            with_extra ? c.extra.data() : nullptr);
          for (size_t i = 0; i < want_max.size(); ++i) {
            EXPECT_NEAR(got_max[i], want_max[i], 2e-6 + 1e-5 * want_max[i]) << i;
            EXPECT_NEAR(got_sum[i], want_sum[i], 2e-6 + 1e-5 * want_sum[i]) << i;
          }
          ++checked;
        }
      }
  EXPECT_EQ(checked, 16);
}

TEST(AttentionStats, SelfLogSumExpMatchesTheDefinition) {
  const int n_head = 6, n_head_kv = 2, d = 5, n = 7;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(static_cast<size_t>(n * n_head * d)), k(static_cast<size_t>(n * n_head_kv * d));
  for (float& x : q) x = nd(rng);
  for (float& x : k) x = nd(rng);
  std::vector<int32_t> pos;
  for (int i = 0; i < n; ++i) pos.push_back(100 + i);
  for (int window : {0, 3}) {
    std::vector<float> out(static_cast<size_t>(n * n_head));
    self_logsumexp(q.data(), pos.data(), n, n_head, n_head_kv, d, k.data(), pos.data(), n, 0.7f, window, out.data());
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < n_head; ++h) {
        double z = 0;
        for (int j = 0; j <= i; ++j) {
          if (window > 0 && i - j >= window) continue;
          double dot = 0;
          for (int t = 0; t < d; ++t)
            dot += static_cast<double>(q[static_cast<size_t>((i * n_head + h) * d + t)]) *
                   k[static_cast<size_t>((j * n_head_kv + h / (n_head / n_head_kv)) * d + t)];
          z += std::exp(0.7 * dot);
        }
        EXPECT_NEAR(out[static_cast<size_t>(i * n_head + h)], std::log(z), 1e-5) << "query " << i << " head " << h;
      }
  }
  // a query that sees none of the keys (all later): -inf
  std::vector<int32_t> later(static_cast<size_t>(n), 1000);
  std::vector<float> out(static_cast<size_t>(n * n_head));
  self_logsumexp(q.data(), pos.data(), n, n_head, n_head_kv, d, k.data(), later.data(), n, 0.7f, 0, out.data());
  for (float x : out) EXPECT_EQ(x, -INFINITY);
}

}  // namespace
}  // namespace kvtrim
