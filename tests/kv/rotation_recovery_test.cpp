// Quantized rows in the Hadamard rotation, and SPARK's sampled recoveries (kv/recovery.h): the
// rotation's attention and bytes, the recovery distributions' quantiles, moments and stable draws.
// (Split from composed_cache_test.cpp, which holds the axes' combinations.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "kv/recovery.h"
#include "kv_test_util.h"

namespace kvtrim {
namespace {

using kvtest::expect_attention_matches_scaled;
using kvtest::fill;
using kvtest::make_cfg;
using kvtest::randn;
using kvtest::random_basis;
using kvtest::random_keep;

// Quantized dense rows in the Hadamard rotation: attention still equals the reference over
// the reconstruction, the rotation is one interned matrix per head dim, and on keys with an
// outlier channel (as real keys have) the q4 reconstruction error drops.
TEST(ComposedCache, HadamardRotationOfQuantizedRows) {
  for (KvDtype t : {KvDtype::kQ8, KvDtype::kQ4}) {  // (fp8 rows are not rotated)
    std::mt19937 rng(31);
    const int nkv = 2, d = 64, n = 300;
    KvCacheConfig cfg = make_cfg(1, nkv, d, d, t);
    KvCacheConfig rot_cfg = cfg;
    rot_cfg.rotate_quantized = true;
    auto plain = make_kv_cache(cfg);
    auto rot = make_kv_cache(rot_cfg);
    std::vector<float> k = randn(static_cast<size_t>(n * nkv * d), rng), v = randn(k.size(), rng);
    for (int64_t i = 0; i < n * nkv; ++i)
      k[static_cast<size_t>(i * d + 5)] *= 30.f;  // an outlier channel
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = i;
    plain->append(0, n, k.data(), v.data(), pos.data());
    rot->append(0, n, k.data(), v.data(), pos.data());
    plain->advance(n);
    rot->advance(n);
    auto err = [&](const KvCache& c) {
      double e = 0;
      for (int ih = 0; ih < nkv; ++ih) {
        std::vector<float> rk;
        c.read_head(0, ih, &rk, nullptr, nullptr);
        for (int tk = 0; tk < n; ++tk)
          for (int i = 0; i < d; ++i) {
            const double x = k[static_cast<size_t>((tk * nkv + ih) * d + i)] -
                             rk[static_cast<size_t>(tk * d + i)];
            e += x * x;
          }
      }
      return e;
    };
    if (t == KvDtype::kQ4) {
      EXPECT_LT(err(*rot), 0.5 * err(*plain)) << kv_dtype_name(t);
    }
    EXPECT_EQ(rot->bytes().bases, static_cast<size_t>(d * d) * 4);  // one matrix for K and V
    EXPECT_EQ(rot->bytes().keys, plain->bytes().keys);
    ThreadPool pool(2);
    expect_attention_matches_scaled(*rot, 6, 4, n - 4, &pool, rng, kv_dtype_name(t));
    // a plan on top re-encodes from the rotated rows' reconstruction
    CompressionPlan p(1, nkv);
    p.at(0, 1).keep_all = false;
    p.at(0, 1).keep = random_keep(n, 0.5, rng);
    p.at(0, 1).key.rank = 32;
    p.at(0, 1).key.basis = random_basis(d, 32, rng);
    rot->apply(p);
    expect_attention_matches_scaled(*rot, 6, 1, n, nullptr, rng,
                                    std::string(kv_dtype_name(t)) + " planned");
  }
}

// The quantile tables behind the sampled recovery: the 4096 midpoint quantiles of N(0, 1) and
// Exp(1) have the distributions' moments and CDFs (checked against erf / exp), and the draw of
// a hash picks them uniformly.
TEST(ComposedCache, RecoveryQuantilesAreTheDistributions) {
  const kv::RecoveryQuantiles& q = kv::recovery_quantiles();
  const int n = kv::RecoveryQuantiles::kN;
  double gm = 0, gv = 0, em = 0, ev = 0;
  for (int i = 0; i < n; ++i) {
    const double p = (i + 0.5) / n;
    EXPECT_NEAR(0.5 * std::erfc(-q.gauss[i] / std::sqrt(2.0)), p, 1e-6) << i;
    EXPECT_NEAR(1 - std::exp(-static_cast<double>(q.expo[i])), p, 1e-6) << i;
    EXPECT_FLOAT_EQ(q.gauss[i], -q.gauss[n - 1 - i]);
    gm += q.gauss[i];
    gv += static_cast<double>(q.gauss[i]) * q.gauss[i];
    em += q.expo[i];
    ev += static_cast<double>(q.expo[i]) * q.expo[i];
  }
  gm /= n;
  em /= n;
  EXPECT_NEAR(gm, 0, 1e-6);
  EXPECT_NEAR(gv / n, 1, 0.01);  // the midpoints miss a little of the tails' variance
  EXPECT_NEAR(em, 1, 0.005);
  EXPECT_NEAR(ev / n - em * em, 1, 0.02);
  // draws over many coordinates fill every stratum about equally
  std::vector<int> hits(16, 0);
  for (int c = 0; c < 16000; ++c) {
    const float z = kv::recovery_draw(RecoveryDist::kGaussian, 3, 0.f, 1.f, c, false);  // max(0, z)
    const float e = kv::recovery_draw(RecoveryDist::kExponential, 3, 1.f, 0.f, c, false);
    EXPECT_GE(z, 0.f);
    hits[static_cast<size_t>(std::min(15.0, 16 * (1 - std::exp(-static_cast<double>(e)))))]++;
  }
  for (int h : hits) EXPECT_NEAR(h, 1000, 150);
}

// SPARK's sampled recovery: a pruned key coordinate reads sign(k)·m(w̃)·r[c] with w̃ drawn from the
// token's (μ, σ); the draws have the distribution's moments, are the same at every read, after
// other tokens are evicted and in a clone, and differ with the seed.
TEST(ComposedCache, SampledRecoveryDrawsAreStableAndHaveTheirMoments) {
  std::mt19937 rng(11);
  const int dk = 64, dv = 32, n = 400, T = 8;
  for (RecoveryDist dist : {RecoveryDist::kGaussian, RecoveryDist::kExponential}) {
    const bool gauss = dist == RecoveryDist::kGaussian;
    auto c = make_kv_cache(make_cfg(1, 1, dk, dv, KvDtype::kF32));
    fill(*c, n, 0, rng);
    std::vector<float> k0;
    c->read_head(0, 0, &k0, nullptr, nullptr);
    CompressionPlan plan(1, 1);
    // sqrt false: magnitude = the draw itself, so the moments are the draws'
    KeyRecovery rec{.scale = std::vector<float>(dk, 1.f), .dist = dist, .seed = 5, .sqrt = false};
    plan.at(0, 0).key.channels = TokenChannels{.topk = T, .recovery = std::move(rec)};
    TokenRows& ch = plan.at(0, 0).key.rows;
    const float mu = 2.f, sd = 0.25f;
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < T; ++j) ch.channels.push_back(j * 8);
      ch.fill.push_back(mu + 0.001f * t);  // distinct parameters per token
      if (gauss) ch.spread.push_back(sd);
    }
    auto twin = c->clone();
    c->apply(plan);
    std::vector<float> k1, k1b;
    c->read_head(0, 0, &k1, nullptr, nullptr);
    c->read_head(0, 0, &k1b, nullptr, nullptr);
    EXPECT_EQ(k1, k1b);
    double sum = 0, sq = 0;
    int np = 0;
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < dk; ++j) {
        const float x = k1[static_cast<size_t>(t * dk + j)],
                    orig = k0[static_cast<size_t>(t * dk + j)];
        if (j % 8 == 0) {
          EXPECT_EQ(x, orig);  // kept
          continue;
        }
        EXPECT_TRUE(x == 0 || (x < 0) == (orig < 0)) << "the stored sign";
        // back to the draw of (mu, sd): Gaussian draws shift with μ_t, exponential ones scale
        const double w = gauss ? std::fabs(x) - 0.001 * t : std::fabs(x) * mu / (mu + 0.001 * t);
        sum += w;
        sq += w * w;
        ++np;
      }
    const double m = sum / np, v = sq / np - m * m;
    EXPECT_NEAR(m, mu, 0.02 * mu) << (gauss ? "gaussian" : "exponential");
    EXPECT_NEAR(std::sqrt(v), gauss ? sd : mu, gauss ? 0.03 * sd : 0.05 * mu);
    // evict every other token: the survivors read the same
    CompressionPlan ev(1, 1);
    ev.at(0, 0).keep_all = false;
    for (int t = 0; t < n; t += 2) ev.at(0, 0).keep.push_back(t);
    auto cl = c->clone();
    c->apply(ev);
    std::vector<float> k2, k3;
    c->read_head(0, 0, &k2, nullptr, nullptr);
    cl->read_head(0, 0, &k3, nullptr, nullptr);
    EXPECT_EQ(k3, k1);
    for (int t = 0; t < n / 2; ++t)
      for (int j = 0; j < dk; ++j)
        ASSERT_EQ(k2[static_cast<size_t>(t * dk + j)], k1[static_cast<size_t>(2 * t * dk + j)]);
    // another seed draws differently
    plan.at(0, 0).key.channels.get<TokenChannels>()->recovery->seed = 6;
    twin->apply(plan);
    std::vector<float> k4;
    twin->read_head(0, 0, &k4, nullptr, nullptr);
    EXPECT_NE(k4, k1);
  }
}

}  // namespace
}  // namespace kvtrim
