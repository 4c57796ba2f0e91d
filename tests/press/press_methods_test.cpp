// Each press's kept indices against a brute-force computation written here, independently
// of src/press: naive softmax attention from the q/k the tiny model produces (captured by a
// plain ForwardObserver on a separate cache), then the paper's / kvpress's scoring.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/thread_pool.h"
#include "ops/nn.h"
#include "press_fixture.h"

namespace kvtrim {
namespace {

using test::bf_attention;
using test::expect_topk;
using test::kept;

class PressMethods : public test::PressFixture {};

constexpr int kMethodsTokens = 48;  // prompt tokens

TEST_F(PressMethods, StreamingLLMKeepsSinksAndRecent) {
  auto s = prefilled("streamingllm:ratio=0.5,sinks=4", tokens(kMethodsTokens));
  const CompressionPlan p = plan_of(*s);
  std::vector<int32_t> want;
  for (int t = 0; t < 4; ++t) want.push_back(t);
  for (int t = kMethodsTokens - 20; t < kMethodsTokens; ++t) want.push_back(t);  // keep 24 = 4 sinks + 20 recent
  for (int il = 0; il < p.n_layer; ++il)
    for (int ih = 0; ih < p.n_head_kv; ++ih) EXPECT_EQ(kept(p.at(il, ih), kMethodsTokens), want);
}

TEST_F(PressMethods, KnormKeepsSmallestKeyNorms) {
  const auto c = capture(tokens(kMethodsTokens));
  auto s = prefilled("knorm:ratio=0.25", tokens(kMethodsTokens));
  const CompressionPlan p = plan_of(*s);
  const int64_t k = static_cast<int64_t>(kMethodsTokens * 0.75);
  for (int il = 0; il < p.n_layer; ++il)
    for (int ih = 0; ih < p.n_head_kv; ++ih) {
      std::vector<double> sc(kMethodsTokens);
      for (int t = 0; t < kMethodsTokens; ++t) {
        double ss = 0;
        for (int j = 0; j < c.d; ++j) ss += double(c.krow(il, t, ih)[j]) * c.krow(il, t, ih)[j];
        sc[t] = -std::sqrt(ss);
      }
      expect_topk(sc, kept(p.at(il, ih), kMethodsTokens), k, "knorm layer " + std::to_string(il));
    }
}

// SnapKV brute force: window W, pooling kernel, max or avg pool.
std::vector<double> bf_snapkv(const test::CaptureAll& c, const HParams& hp, int il, int ih, int W, int kernel,
                              bool maxpool) {
  const int g = hp.n_head / hp.n_head_kv;
  const int m = kMethodsTokens - W;
  std::vector<double> score(kMethodsTokens, 0.0);
  for (int gi = 0; gi < g; ++gi) {
    std::vector<double> mean(m, 0.0);
    for (int i = kMethodsTokens - W; i < kMethodsTokens; ++i) {
      auto a = bf_attention(c, hp, il, i, ih * g + gi, kMethodsTokens);
      for (int t = 0; t < m; ++t) mean[t] += a[t] / W;
    }
    for (int t = 0; t < m; ++t) {
      double acc = maxpool ? -1e300 : 0.0;
      for (int u = t - kernel / 2; u <= t + kernel / 2; ++u) {
        const double x = (u >= 0 && u < m) ? mean[u] : (maxpool ? -1e300 : 0.0);
        acc = maxpool ? std::max(acc, x) : acc + x;
      }
      score[t] += (maxpool ? acc : acc / kernel) / g;
    }
  }
  for (int t = m; t < kMethodsTokens; ++t) score[t] = 10.0 + t;  // the window is always kept, recent first
  return score;
}

TEST_F(PressMethods, SnapKVMatchesBruteForce) {
  const auto c = capture(tokens(kMethodsTokens));
  const HParams& hp = model_->hparams();
  for (const bool maxpool : {true, false}) {
    const std::string spec = std::string("snapkv:ratio=0.5,window=8,kernel=5,pool=") + (maxpool ? "max" : "avg");
    auto s = prefilled(spec, tokens(kMethodsTokens), 7);  // odd chunks: the window spans chunk boundaries
    const CompressionPlan p = plan_of(*s);
    for (int il = 0; il < p.n_layer; ++il)
      for (int ih = 0; ih < p.n_head_kv; ++ih)
        expect_topk(bf_snapkv(c, hp, il, ih, 8, 5, maxpool), kept(p.at(il, ih), kMethodsTokens), kMethodsTokens / 2,
                    spec + " layer " + std::to_string(il) + " head " + std::to_string(ih));
  }
}

// attention_probs (the sgemm + SIMD softmax helper SnapKV and TOVA score with) against a
// double-precision softmax, with and without a sliding window, on 1 and 2 threads, with the
// head's tokens in stored order and shuffled (the general masked path).
TEST_F(PressMethods, AttentionProbsMatchDoubleSoftmax) {
  auto s = prefilled("snapkv:ratio=0.5,window=8", tokens(kMethodsTokens));
  ThreadPool pool2(2);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
    for (const int window : {0, 11}) {
      HParams hp = model_->hparams();
      hp.sliding_window.assign(static_cast<size_t>(hp.n_layer), window);
      PressContext ctx(s->cache(), hp, s->observations(), pool);
      const ObservedQueries q = last_queries(ctx.queries(1, false, "test"), 8);
      ASSERT_EQ(q.n, 8);
      const int g = ctx.group(), d = ctx.head_dim_k();
      const float scale = hp.attn_scale > 0 ? hp.attn_scale : 1.f / std::sqrt(static_cast<float>(d));
      for (const bool shuffled : {false, true}) {
        HeadData hd;
        ctx.read_head(1, 0, &hd, true, false);
        if (shuffled) {  // reverse the token order: positions decreasing
          std::reverse(hd.pos.begin(), hd.pos.end());
          for (int64_t t = 0; t < hd.n / 2; ++t)
            std::swap_ranges(hd.k.begin() + t * d, hd.k.begin() + (t + 1) * d, hd.k.begin() + (hd.n - 1 - t) * d);
        }
        std::vector<float> probs;
        attention_probs(ctx, 1, 0, hd, q, &probs);
        ASSERT_EQ(probs.size(), static_cast<size_t>(g * q.n * hd.n));
        for (int gi = 0; gi < g; ++gi)
          for (int64_t i = 0; i < q.n; ++i) {
            const float* qv = q.query(i, gi, ctx.n_head(), d);
            const int32_t qp = q.pos[static_cast<size_t>(i)];
            std::vector<double> e(static_cast<size_t>(hd.n), 0.0);
            double mx = -INFINITY, sum = 0;
            for (int64_t t = 0; t < hd.n; ++t) {
              const int32_t kp = hd.pos[static_cast<size_t>(t)];
              if (kp > qp || (window > 0 && qp - kp >= window)) continue;
              double dot = 0;
              for (int c = 0; c < d; ++c) dot += static_cast<double>(qv[c]) * hd.k[static_cast<size_t>(t * d + c)];
              e[static_cast<size_t>(t)] = dot * scale;
              mx = std::max(mx, dot * scale);
            }
            for (int64_t t = 0; t < hd.n; ++t) {
              const int32_t kp = hd.pos[static_cast<size_t>(t)];
              const bool vis = kp <= qp && (window <= 0 || qp - kp < window);
              e[static_cast<size_t>(t)] = vis ? std::exp(e[static_cast<size_t>(t)] - mx) : 0.0;
              sum += e[static_cast<size_t>(t)];
            }
            for (int64_t t = 0; t < hd.n; ++t)
              EXPECT_NEAR(probs[static_cast<size_t>((gi * q.n + i) * hd.n + t)], e[static_cast<size_t>(t)] / sum, 2e-6)
                  << "window " << window << " shuffled " << shuffled << " query " << i << " token " << t;
          }
      }
    }
  }
}

TEST_F(PressMethods, SnapKVWindowLargerThanBudgetKeepsMostRecent) {
  auto s = prefilled("snapkv:budget=4,window=8", tokens(kMethodsTokens));
  const CompressionPlan p = plan_of(*s);
  EXPECT_EQ(kept(p.at(0, 0), kMethodsTokens), (std::vector<int32_t>{kMethodsTokens - 4, kMethodsTokens - 3, kMethodsTokens - 2, kMethodsTokens - 1}));
}

TEST_F(PressMethods, PyramidKVBudgetsAndScores) {
  const auto c = capture(tokens(kMethodsTokens));
  const HParams& hp = model_->hparams();
  auto s = prefilled("pyramidkv:ratio=0.5,window=4,beta=2", tokens(kMethodsTokens));
  const CompressionPlan p = plan_of(*s);
  // kvpress budgets: cap = 4 + 48*0.5 = 28; min = 24/2 = 12; max = 48 - 12 = 36 (< 44);
  // 3 layers: steps = 12 -> 36, 24, 12.
  const int64_t want[3] = {36, 24, 12};
  int64_t total = 0;
  for (int il = 0; il < p.n_layer; ++il)
    for (int ih = 0; ih < p.n_head_kv; ++ih) {
      expect_topk(bf_snapkv(c, hp, il, ih, 4, 5, true), kept(p.at(il, ih), kMethodsTokens), want[il], "pyramidkv");
      total += static_cast<int64_t>(kept(p.at(il, ih), kMethodsTokens).size());
    }
  EXPECT_EQ(total, 24 * p.n_layer * p.n_head_kv);  // the same total as snapkv at ratio 0.5
}

// Python's round() (kvpress): halves go to even. 49 tokens at ratio 0.5, window 4, beta 20:
// cap = 28.5, max = 49 - 4 = 45 (capped), min = 49 - 45 = 4; 3 layers: 45, 24.5, 4, and
// round(24.5) = 24 (away from zero would give 25).
TEST_F(PressMethods, PyramidKVRoundsHalvesToEvenAsKvpress) {
  auto s = prefilled("pyramidkv:ratio=0.5,window=4,beta=20", tokens(49));
  const CompressionPlan p = plan_of(*s);
  ASSERT_EQ(p.n_layer, 3);
  const size_t want[3] = {45, 24, 4};
  for (int il = 0; il < p.n_layer; ++il)
    for (int ih = 0; ih < p.n_head_kv; ++ih) EXPECT_EQ(kept(p.at(il, ih), 49).size(), want[il]) << "layer " << il;
}

// kvpress 0.5.5 protects at least one token per head when alpha > 0: with alpha 0.02, int(24 *
// 0.02) = 0 becomes 1, so every head keeps its best-scored token however the others score.
TEST_F(PressMethods, AdaKVSafeguardKeepsAtLeastOne) {
  const auto c = capture(tokens(kMethodsTokens));
  const HParams& hp = model_->hparams();
  auto s = prefilled("adakv(snapkv:ratio=0.5,window=8):alpha_safeguard=0.02", tokens(kMethodsTokens));
  const CompressionPlan p = plan_of(*s);
  for (int il = 0; il < p.n_layer; ++il)
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      const auto best = test::bf_topk(bf_snapkv(c, hp, il, ih, 8, 5, true), 1);
      const auto k = kept(p.at(il, ih), kMethodsTokens);
      EXPECT_NE(std::find(k.begin(), k.end(), best[0]), k.end()) << "layer " << il << " head " << ih;
    }
}

TEST_F(PressMethods, TovaUsesLastQueryAveragedOverAllHeads) {
  const auto c = capture(tokens(kMethodsTokens));
  const HParams& hp = model_->hparams();
  auto s = prefilled("tova:ratio=0.75", tokens(kMethodsTokens));
  const CompressionPlan p = plan_of(*s);
  for (int il = 0; il < p.n_layer; ++il) {
    std::vector<double> sc(kMethodsTokens, 0.0);
    for (int h = 0; h < hp.n_head; ++h) {
      auto a = bf_attention(c, hp, il, kMethodsTokens - 1, h, kMethodsTokens);
      for (int t = 0; t < kMethodsTokens; ++t) sc[t] += a[t] / hp.n_head;
    }
    sc[kMethodsTokens - 1] = 10;
    for (int ih = 0; ih < p.n_head_kv; ++ih) expect_topk(sc, kept(p.at(il, ih), kMethodsTokens), kMethodsTokens / 4, "tova");
  }
}

TEST_F(PressMethods, H2OUsesMeanAttentionReceivedDuringPrefill) {
  const auto c = capture(tokens(kMethodsTokens));
  const HParams& hp = model_->hparams();
  const int g = hp.n_head / hp.n_head_kv;
  for (int batch : {48, 5}) {  // one chunk, or many (the observer accumulates chunk by chunk)
    auto s = prefilled("h2o:ratio=0.5", tokens(kMethodsTokens), batch);
    const CompressionPlan p = plan_of(*s);
    for (int il = 0; il < p.n_layer; ++il)
      for (int ih = 0; ih < p.n_head_kv; ++ih) {
        std::vector<double> sc(kMethodsTokens, 0.0);
        for (int gi = 0; gi < g; ++gi)
          for (int i = 0; i < kMethodsTokens; ++i) {
            auto a = bf_attention(c, hp, il, i, ih * g + gi, kMethodsTokens);
            for (int t = 0; t <= i; ++t) sc[t] += a[t] / (kMethodsTokens - t) / g;  // kvpress: / n queries that saw t
          }
        expect_topk(sc, kept(p.at(il, ih), kMethodsTokens), kMethodsTokens / 2, "h2o batch " + std::to_string(batch));
      }
  }
}

TEST_F(PressMethods, ExpectedAttentionMatchesBruteForce) {
  const auto c = capture(tokens(kMethodsTokens));
  const HParams& hp = model_->hparams();
  const int g = hp.n_head / hp.n_head_kv, d = hp.head_dim_k;
  const int W = 16, F = 64, sinks = 4;
  for (const bool cov : {false, true}) {
    const std::string spec = strprintf("expected_attention:ratio=0.5,window=%d,n_future=%d,sinks=%d,cov=%s,vnorm=true",
                                       W, F, sinks, cov ? "true" : "false");
    auto s = prefilled(spec, tokens(kMethodsTokens));
    const CompressionPlan p = plan_of(*s);
    for (int il = 0; il < p.n_layer; ++il)
      for (int ih = 0; ih < p.n_head_kv; ++ih) {
        std::vector<double> sc(kMethodsTokens, 0.0);
        for (int gi = 0; gi < g; ++gi) {
          const int h = ih * g + gi;
          // Pre-RoPE window queries (un-rotate), mean and covariance.
          std::vector<std::vector<double>> xs;
          for (int i = kMethodsTokens - W; i < kMethodsTokens; ++i) {
            std::vector<float> x(c.qrow(il, i, h), c.qrow(il, i, h) + d);
            ref::rope(x.data(), d, hp.n_rot, -c.pos[i], hp.rope_base, hp.rope_freq_scale, hp.rope_neox);
            xs.emplace_back(x.begin(), x.end());
          }
          std::vector<double> mu(d, 0.0);
          for (auto& x : xs) for (int j = 0; j < d; ++j) mu[j] += x[j] / W;
          // E over future positions of the rotated mean / covariance, by rotating explicitly
          // at each future position and averaging the rotation (kvpress: mean rotation matrix).
          std::vector<std::vector<double>> Rbar(d, std::vector<double>(d, 0.0));
          for (int f = 0; f < F; ++f)
            for (int j = 0; j < d; ++j) {
              std::vector<float> e(d, 0.f);
              e[j] = 1.f;
              ref::rope(e.data(), d, hp.n_rot, kMethodsTokens + f, hp.rope_base, hp.rope_freq_scale, hp.rope_neox);
              for (int r = 0; r < d; ++r) Rbar[r][j] += e[r] / F;  // column j = R(p) e_j
            }
          std::vector<double> m2(d, 0.0);
          for (int r = 0; r < d; ++r) for (int j = 0; j < d; ++j) m2[r] += Rbar[r][j] * mu[j];
          std::vector<std::vector<double>> S(d, std::vector<double>(d, 0.0)), S2 = S;
          for (auto& x : xs) for (int a = 0; a < d; ++a) for (int b = 0; b < d; ++b) S[a][b] += (x[a] - mu[a]) * (x[b] - mu[b]) / W;
          for (int a = 0; a < d; ++a) for (int b = 0; b < d; ++b) {
            double acc = 0;
            for (int u = 0; u < d; ++u) for (int w = 0; w < d; ++w) acc += Rbar[a][u] * S[u][w] * Rbar[b][w];
            S2[a][b] = acc;
          }
          std::vector<double> z(kMethodsTokens, -1e300);
          double mx = -1e300;
          for (int t = sinks; t < kMethodsTokens; ++t) {
            const float* k = c.krow(il, t, ih);
            double v = 0;
            for (int j = 0; j < d; ++j) v += m2[j] * k[j];
            v *= hp.attn_scale;
            if (cov) {
              double qd = 0;
              for (int a = 0; a < d; ++a) for (int b = 0; b < d; ++b) qd += k[a] * S2[a][b] * k[b];
              v += hp.attn_scale * hp.attn_scale / 2 * qd;
            }
            z[t] = v;
            mx = std::max(mx, v);
          }
          double zs = 0;
          for (int t = sinks; t < kMethodsTokens; ++t) zs += std::exp(z[t] - mx);
          for (int t = sinks; t < kMethodsTokens; ++t) sc[t] += std::exp(z[t] - mx) / zs / g;
        }
        for (int t = sinks; t < kMethodsTokens; ++t) {
          double vn = 0;
          for (int j = 0; j < d; ++j) vn += double(c.vrow(il, t, ih)[j]) * c.vrow(il, t, ih)[j];
          sc[t] *= std::sqrt(vn);
        }
        for (int t = 0; t < sinks; ++t) sc[t] = 1e9;
        expect_topk(sc, kept(p.at(il, ih), kMethodsTokens), kMethodsTokens / 2, spec);
      }
  }
}

TEST_F(PressMethods, RandomIsSeededAndUniformish) {
  auto a = plan_of(*prefilled("random:ratio=0.5,seed=1", tokens(kMethodsTokens)));
  auto b = plan_of(*prefilled("random:ratio=0.5,seed=1", tokens(kMethodsTokens)));
  auto c = plan_of(*prefilled("random:ratio=0.5,seed=2", tokens(kMethodsTokens)));
  EXPECT_EQ(a.at(1, 1).keep, b.at(1, 1).keep);
  EXPECT_NE(a.at(1, 1).keep, c.at(1, 1).keep);
  EXPECT_NE(a.at(0, 0).keep, a.at(0, 1).keep);  // heads choose independently
  EXPECT_EQ(a.at(0, 0).keep.size(), static_cast<size_t>(kMethodsTokens / 2));
}

TEST_F(PressMethods, AdaKVGlobalTopKWithSafeguard) {
  const auto c = capture(tokens(kMethodsTokens));
  const HParams& hp = model_->hparams();
  auto s = prefilled("adakv(snapkv:ratio=0.5,window=8):alpha_safeguard=0.2", tokens(kMethodsTokens));
  const CompressionPlan p = plan_of(*s);
  for (int il = 0; il < p.n_layer; ++il) {
    // Brute force: per head protect the top int(24 * 0.2) = 4, then the layer keeps its 2 x 24 best.
    struct C { bool prot; double s; int h, t; };
    std::vector<C> all;
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      auto sc = bf_snapkv(c, hp, il, ih, 8, 5, true);
      auto safe = test::bf_topk(sc, 4);
      for (int t = 0; t < kMethodsTokens; ++t)
        all.push_back({std::find(safe.begin(), safe.end(), t) != safe.end(), sc[t], ih, t});
    }
    std::stable_sort(all.begin(), all.end(), [](const C& a, const C& b) {
      if (a.prot != b.prot) return a.prot;
      return a.s > b.s;
    });
    std::vector<std::set<int>> want(hp.n_head_kv);
    for (int i = 0; i < 24 * hp.n_head_kv; ++i) want[all[i].h].insert(all[i].t);
    int64_t total = 0;
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      const auto k = kept(p.at(il, ih), kMethodsTokens);
      total += static_cast<int64_t>(k.size());
      EXPECT_GE(k.size(), 4u);
      EXPECT_EQ(std::set<int>(k.begin(), k.end()), want[ih]) << "layer " << il << " head " << ih;
    }
    EXPECT_EQ(total, 24 * hp.n_head_kv);
  }
}

TEST_F(PressMethods, QueryAwareSnapKVScoresWithTheQuestion) {
  const auto ctx_tokens = tokens(kMethodsTokens);
  const auto question = tokens(6, 3);
  std::vector<int32_t> both = ctx_tokens;
  both.insert(both.end(), question.begin(), question.end());
  const auto c = capture(both);  // the question's queries at positions kMethodsTokens .. kMethodsTokens+5
  const HParams& hp = model_->hparams();
  const int g = hp.n_head / hp.n_head_kv;
  auto s = prefilled("snapkv:ratio=0.5,kernel=1,query_aware=true", ctx_tokens);
  s->observe_question(question);
  EXPECT_EQ(s->n_past(), kMethodsTokens);  // the question's tokens were dropped again
  const CompressionPlan p = plan_of(*s);
  for (int il = 0; il < p.n_layer; ++il)
    for (int ih = 0; ih < p.n_head_kv; ++ih) {
      std::vector<double> sc(kMethodsTokens, 0.0);
      for (int gi = 0; gi < g; ++gi)
        for (int i = kMethodsTokens; i < kMethodsTokens + 6; ++i) {
          // Attention over the context's keys only (the question's own keys are not in the cache).
          auto a = bf_attention(c, hp, il, i, ih * g + gi, kMethodsTokens);
          for (int t = 0; t < kMethodsTokens; ++t) sc[t] += a[t] / 6 / g;
        }
      expect_topk(sc, kept(p.at(il, ih), kMethodsTokens), kMethodsTokens / 2, "query-aware snapkv");
    }
}

}  // namespace
}  // namespace kvtrim
