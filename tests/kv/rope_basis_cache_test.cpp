// A key basis before RoPE (plan.h SideSpec::rope, Palu): the cache undoes each token's rotary
// embedding before projecting, c = Uᵀ R_pos⁻¹ k, and attention reconstructs R_pos U c.
// rope_rows against ops/nn.h rope (forward and back), rope_cols against rope_rows; full rank equals the dense cache (decode,
// decode splits, prefill tiles, appends encoded with the current epoch, three epochs re-expressed
// into one); rank r keeps exactly the projection of the pre-RoPE key (brute force over the
// model's rope), so keys whose pre-RoPE part lies in the span are stored without loss where the
// same basis on the post-RoPE keys is not; attention against the reference over read_head with
// token eviction composed; bad plans.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "kv/encoding.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"
#include "ops/nn.h"

namespace kvtrim {
namespace {

using kvtest::make_cfg;
using kvtest::max_abs_diff;
using kvtest::randn;
using kvtest::random_basis;
using kvtest::random_keep;

RopeSpec spec(int n_rot, float base, float fs, bool neox) {
  RopeSpec r;
  r.n_rot = n_rot;
  r.base = base;
  r.freq_scale = fs;
  r.neox = neox;
  return r;
}

TEST(RopeRows, MatchesOpsRopeForwardAndBack) {
  std::mt19937 rng(1);
  const int d = 64;
  std::uniform_int_distribution<int32_t> pd(0, 40000);
  for (const RopeSpec& r : {spec(64, 10000.f, 1.f, true), spec(64, 1e6f, 0.125f, false), spec(32, 1e5f, 1.f, true)}) {
    const int64_t n = 300;
    std::vector<int32_t> pos(n);
    for (int32_t& p : pos) p = pd(rng);
    pos[0] = 0;
    pos[1] = 255;
    pos[2] = 256;
    const auto x = randn(static_cast<size_t>(n * d), rng);
    std::vector<float> got = x, want = x;
    kv::rope_rows(r, got.data(), n, d, pos.data(), false);
    for (int64_t j = 0; j < n; ++j) ref::rope(want.data() + j * d, d, r.n_rot, pos[j], r.base, r.freq_scale, r.neox);
    EXPECT_LT(max_abs_diff(got, want), 2e-5) << "n_rot " << r.n_rot << " base " << r.base;
    kv::rope_rows(r, got.data(), n, d, pos.data(), true);
    EXPECT_LT(max_abs_diff(got, x), 2e-5) << "round trip, n_rot " << r.n_rot;
  }
}

TEST(RopeRows, ColumnsMatchRows) {
  // rope_cols on the transposed rows: runs of consecutive positions (one longer than 256),
  // gaps, and single tokens; forward and inverse
  std::mt19937 rng(2);
  const int d = 64;
  std::vector<int32_t> pos;
  for (int32_t p = 100; p < 700; ++p) pos.push_back(p);
  for (int32_t p = 703; p < 900; p += 3) pos.push_back(p);
  for (int32_t p = 1000; p < 1040; ++p) pos.push_back(p);
  const int64_t n = static_cast<int64_t>(pos.size()), ld = n + 5;
  for (const RopeSpec& r : {spec(64, 10000.f, 1.f, true), spec(64, 1e6f, 0.125f, false), spec(48, 1e5f, 1.f, false)}) {
    for (const bool inv : {false, true}) {
      const auto x = randn(static_cast<size_t>(n * d), rng);
      std::vector<float> rows = x, cols(static_cast<size_t>(d * ld), 7.f);
      for (int64_t j = 0; j < n; ++j)
        for (int i = 0; i < d; ++i) cols[static_cast<size_t>(i * ld + j)] = x[static_cast<size_t>(j * d + i)];
      kv::rope_rows(r, rows.data(), n, d, pos.data(), inv);
      kv::rope_cols(r, cols.data(), ld, n, pos.data(), inv);
      double worst = 0;
      for (int64_t j = 0; j < n; ++j)
        for (int i = 0; i < d; ++i)
          worst = std::max(worst, std::fabs(double(cols[static_cast<size_t>(i * ld + j)]) - rows[static_cast<size_t>(j * d + i)]));
      EXPECT_LT(worst, 2e-5) << "n_rot " << r.n_rot << " inverse " << inv;
      for (int i = 0; i < d; ++i)
        for (int64_t j = n; j < ld; ++j) ASSERT_EQ(cols[static_cast<size_t>(i * ld + j)], 7.f);  // padding untouched
    }
  }
}

// Keys of every layer / head built as R_pos k_pre with k_pre = U a + noise·e (a ~ N(0, 1) in the
// span of the head's U, e outside it): pre[il][ih] [n, d] and the post-RoPE keys appended.
struct RopeFixture {
  int nl = 2, nkv = 2, d = 64, r = 24;
  RopeSpec rs = spec(64, 10000.f, 1.f, true);
  std::vector<std::vector<float>> U;  // [nl * nkv] bases [d, r]
  std::vector<std::vector<float>> pre;  // [nl * nkv] pre-RoPE keys [n, d] (position order)
  std::vector<int32_t> pos;

  void append(const std::vector<KvCache*>& cs, int64_t n, int32_t pos0, float noise, std::mt19937& rng) {
    if (U.empty())
      for (int i = 0; i < nl * nkv; ++i) U.push_back(random_basis(d, r, rng)), pre.emplace_back();
    for (int64_t j = 0; j < n; ++j) pos.push_back(pos0 + static_cast<int32_t>(3 * j));  // gaps: 3 apart
    const int32_t* p = pos.data() + pos.size() - n;
    for (int il = 0; il < nl; ++il) {
      std::vector<float> k(static_cast<size_t>(n * nkv * d));
      for (int ih = 0; ih < nkv; ++ih) {
        const std::vector<float>& B = U[static_cast<size_t>(il * nkv + ih)];
        for (int64_t j = 0; j < n; ++j) {
          const auto a = randn(static_cast<size_t>(r), rng);
          const auto e = randn(static_cast<size_t>(d), rng, noise);
          float* row = k.data() + (j * nkv + ih) * d;
          for (int i = 0; i < d; ++i) {
            double s = e[static_cast<size_t>(i)];
            for (int c = 0; c < r; ++c) s += B[static_cast<size_t>(i * r + c)] * a[static_cast<size_t>(c)];
            row[i] = static_cast<float>(s);
          }
          auto& pr = pre[static_cast<size_t>(il * nkv + ih)];
          pr.insert(pr.end(), row, row + d);
          ref::rope(row, d, rs.n_rot, p[j], rs.base, rs.freq_scale, rs.neox);
        }
      }
      const auto v = randn(static_cast<size_t>(n * nkv * d), rng);
      for (KvCache* c : cs) c->append(il, n, k.data(), v.data(), p);
    }
    for (KvCache* c : cs) c->advance(p[n - 1] + 1);
  }
  HeadPlan plan(int il, int ih, bool rope) const {
    HeadPlan hp;
    hp.key.rank = r;
    hp.key.basis = U[static_cast<size_t>(il * nkv + ih)];
    if (rope) hp.key.rope = rs;
    return hp;
  }
};

void expect_same_attention(const KvCache& a, const KvCache& b, int64_t n_q, int32_t q_pos0, ThreadPool* pool,
                           std::mt19937& rng, double tol, const std::string& what) {
  const KvCacheConfig& cfg = a.config();
  AttnParams p;
  p.n_head = 2 * cfg.n_head_kv;
  p.scale = 0.125f;
  std::vector<int32_t> q_pos(static_cast<size_t>(n_q));
  for (int64_t i = 0; i < n_q; ++i) q_pos[static_cast<size_t>(i)] = q_pos0 + static_cast<int32_t>(i);
  const auto q = randn(static_cast<size_t>(n_q * p.n_head * cfg.head_dim_k), rng);
  std::vector<float> x(static_cast<size_t>(n_q * p.n_head * cfg.head_dim_v)), y(x.size());
  for (int il = 0; il < cfg.n_layer; ++il) {
    a.attend(il, n_q, q.data(), q_pos.data(), p, x.data(), pool);
    b.attend(il, n_q, q.data(), q_pos.data(), p, y.data(), pool);
    EXPECT_LT(max_abs_diff(x, y), tol) << what << " layer " << il << " n_q " << n_q;
  }
}

TEST(RopeBasisCache, FullRankEqualsDenseCache) {
  ThreadPool pool(2);
  for (KvDtype t : {KvDtype::kF32, KvDtype::kF16}) {
    std::mt19937 rng(5);
    RopeFixture f;
    f.r = f.d;
    auto dense = make_kv_cache(make_cfg(f.nl, f.nkv, f.d, f.d, KvDtype::kF32));
    auto pal = make_kv_cache(make_cfg(f.nl, f.nkv, f.d, f.d, t));
    f.append({dense.get(), pal.get()}, 400, 0, 0.f, rng);
    // three epochs of different full-rank bases, tokens appended between them: the head holds
    // more than max_live_bases (2) bases, so older epochs are re-expressed into the newest
    for (int e = 0; e < 3; ++e) {
      CompressionPlan plan(f.nl, f.nkv);
      for (int il = 0; il < f.nl; ++il)
        for (int ih = 0; ih < f.nkv; ++ih) {
          HeadPlan hp = f.plan(il, ih, true);
          hp.key.basis = random_basis(f.d, f.d, rng);
          hp.appends_dense = e < 2;  // the last epoch encodes appends at once
          plan.at(il, ih) = hp;
        }
      pal->apply(plan);
      f.append({dense.get(), pal.get()}, 150, f.pos.back() + 2, 0.f, rng);
    }
    const double tol = t == KvDtype::kF32 ? 1e-4 : 1e-2;
    const int32_t next = f.pos.back() + 1;
    expect_same_attention(*pal, *dense, 1, next, &pool, rng, tol, std::string("decode ") + kv_dtype_name(t));
    expect_same_attention(*pal, *dense, 1, next, nullptr, rng, tol, std::string("decode, no pool ") + kv_dtype_name(t));
    expect_same_attention(*pal, *dense, 96, next, &pool, rng, tol, std::string("prefill tiles ") + kv_dtype_name(t));
  }
}

TEST(RopeBasisCache, LowRankStoresTheProjectionOfThePreRopeKey) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  RopeFixture f;
  auto cfg = make_cfg(f.nl, f.nkv, f.d, f.d, KvDtype::kF32);
  auto dense = make_kv_cache(cfg), pal = make_kv_cache(cfg), post = make_kv_cache(cfg);
  // pre-RoPE keys exactly in each head's span: the rope basis is lossless, the same basis on the
  // post-RoPE keys is not
  f.append({dense.get(), pal.get(), post.get()}, 600, 10, 0.f, rng);
  CompressionPlan pp(f.nl, f.nkv), pq(f.nl, f.nkv);
  for (int il = 0; il < f.nl; ++il)
    for (int ih = 0; ih < f.nkv; ++ih) pp.at(il, ih) = f.plan(il, ih, true), pq.at(il, ih) = f.plan(il, ih, false);
  pal->apply(pp);
  post->apply(pq);
  expect_same_attention(*pal, *dense, 1, f.pos.back() + 1, &pool, rng, 1e-4, "in-span keys, rope basis");
  std::vector<float> kd, kp;
  dense->read_head(1, 1, &kd, nullptr, nullptr);
  post->read_head(1, 1, &kp, nullptr, nullptr);
  EXPECT_GT(max_abs_diff(kd, kp), 0.5) << "a pre-RoPE basis on post-RoPE keys should lose most of them";

  // keys with a part outside the span, then token eviction composed with the basis: each stored
  // key is R_pos U Uᵀ k_pre (brute force, double) and attention matches the reference over read_head
  std::mt19937 rng2(8);
  RopeFixture g;
  auto c = make_kv_cache(cfg);
  g.append({c.get()}, 500, 0, 0.3f, rng2);
  CompressionPlan plan(g.nl, g.nkv);
  std::vector<std::vector<int32_t>> keeps;
  for (int il = 0; il < g.nl; ++il)
    for (int ih = 0; ih < g.nkv; ++ih) {
      HeadPlan hp = g.plan(il, ih, true);
      hp.keep_all = false;
      hp.keep = random_keep(500, 0.6, rng2);
      keeps.push_back(hp.keep);
      plan.at(il, ih) = hp;
    }
  c->apply(plan);
  g.append({c.get()}, 40, g.pos.back() + 1, 0.3f, rng2);  // encoded at once with the epoch
  for (int il = 0; il < g.nl; ++il)
    for (int ih = 0; ih < g.nkv; ++ih) {
      std::vector<float> k;
      std::vector<int32_t> kpos;
      c->read_head(il, ih, &k, nullptr, &kpos);
      const std::vector<int32_t>& keep = keeps[static_cast<size_t>(il * g.nkv + ih)];
      ASSERT_EQ(kpos.size(), keep.size() + 40);
      const std::vector<float>& B = g.U[static_cast<size_t>(il * g.nkv + ih)];
      const std::vector<float>& pre = g.pre[static_cast<size_t>(il * g.nkv + ih)];
      double worst = 0;
      for (size_t t = 0; t < kpos.size(); ++t) {
        const size_t src = t < keep.size() ? static_cast<size_t>(keep[t]) : 500 + (t - keep.size());
        ASSERT_EQ(kpos[t], g.pos[src]);
        std::vector<double> a(static_cast<size_t>(g.r), 0.0);
        for (int cc = 0; cc < g.r; ++cc)
          for (int i = 0; i < g.d; ++i)
            a[static_cast<size_t>(cc)] += static_cast<double>(B[static_cast<size_t>(i * g.r + cc)]) * pre[src * g.d + i];
        std::vector<float> want(static_cast<size_t>(g.d));
        for (int i = 0; i < g.d; ++i) {
          double s = 0;
          for (int cc = 0; cc < g.r; ++cc) s += B[static_cast<size_t>(i * g.r + cc)] * a[static_cast<size_t>(cc)];
          want[static_cast<size_t>(i)] = static_cast<float>(s);
        }
        ref::rope(want.data(), g.d, g.rs.n_rot, kpos[t], g.rs.base, g.rs.freq_scale, g.rs.neox);
        for (int i = 0; i < g.d; ++i)
          worst = std::max(worst, std::fabs(static_cast<double>(k[t * g.d + i]) - want[static_cast<size_t>(i)]));
      }
      EXPECT_LT(worst, 1e-4) << "layer " << il << " head " << ih;
    }
  AttnParams p;
  p.n_head = 4;
  p.scale = 0.125f;
  const int32_t qp = g.pos.back() + 1;
  const auto q = randn(static_cast<size_t>(p.n_head * g.d), rng2);
  std::vector<float> out(static_cast<size_t>(p.n_head * g.d)), want(out.size());
  for (int il = 0; il < g.nl; ++il) {
    c->attend(il, 1, q.data(), &qp, p, out.data(), &pool);
    attention_reference_cache(*c, il, 1, q.data(), &qp, p, want.data());
    EXPECT_LT(max_abs_diff(out, want), 1e-4) << "layer " << il;
  }
}

TEST(RopeBasisCache, BadPlansAreClearErrors) {
  std::mt19937 rng(9);
  RopeFixture f;
  auto c = make_kv_cache(make_cfg(f.nl, f.nkv, f.d, f.d, KvDtype::kF16));
  f.append({c.get()}, 50, 0, 0.f, rng);
  auto expect_error = [&](HeadPlan hp, const std::string& needle) {
    CompressionPlan plan(f.nl, f.nkv);
    plan.at(0, 0) = std::move(hp);
    try {
      c->apply(plan);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  HeadPlan a = f.plan(0, 0, true);
  a.key.rope->n_rot = 63;
  expect_error(a, "n_rot 63");
  HeadPlan b = f.plan(0, 0, true);
  b.key.rope->n_rot = 128;
  expect_error(b, "n_rot 128");
  HeadPlan cc;
  cc.key.rope = f.rs;
  cc.value.rank = 8;
  cc.value.basis = random_basis(f.d, 8, rng);
  expect_error(cc, "needs a basis");
  HeadPlan d = f.plan(0, 0, true);
  d.value.rank = 8;
  d.value.basis = random_basis(f.d, 8, rng);
  d.value.rope = f.rs;
  expect_error(d, "value basis cannot have a RoPE");
  HeadPlan e = f.plan(0, 0, true);
  e.key.rope->base = -1.f;
  expect_error(e, "must be finite and positive");
  EXPECT_EQ(c->n_tokens(0, 0), 50);  // rejected plans leave the cache as it was
}

}  // namespace
}  // namespace kvtrim
