// The token cache's basis axis (HeadPlan::basis_k / basis_v / anchors): tokens stored as
// coefficients in a per-head orthonormal basis, read directly by attention ((q·U_k)·k̃ and
// (Σ a·ṽ)·U_vᵀ). Full rank against the dense cache; rank r < d against the reference over
// read_head's reconstruction (every dtype, GQA, sliding window, decode splits); two basis
// epochs (old tokens keep their basis: reconstruction against the original vectors catches a
// token decoded with the wrong epoch); anchors stay exact; exact bytes by part (bases counted
// once, epoch ids under other, a basis freed with its last token); bad plans; truncate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"

namespace kvtrim {
namespace {

using kvtest::AttnCase;
using kvtest::expect_attention_matches;
using kvtest::fill;
using kvtest::kAllDtypes;
using kvtest::make_cfg;
using kvtest::max_abs_diff;
using kvtest::randn;
using kvtest::random_basis;
using kvtest::random_keep;
using kvtest::set_basis;

TEST(BasisCache, FullRankRotationEqualsDenseCache) {
  ThreadPool pool(2);
  for (KvDtype t : kAllDtypes) {
    std::mt19937 rng(3);
    const int nl = 2, nkv = 3, d = 64;
    auto dense = make_kv_cache(make_cfg(nl, nkv, d, d, KvDtype::kF32));
    auto rot = make_kv_cache(make_cfg(nl, nkv, d, d, t));
    fill({dense.get(), rot.get()}, 700, 0, rng);
    CompressionPlan plan(nl, nkv);
    for (int il = 0; il < nl; ++il)
      for (int ih = 0; ih < nkv; ++ih) set_basis(plan.at(il, ih), d, d, d, d, rng);
    rot->apply(plan);
    fill({dense.get(), rot.get()}, 300, 700, rng);  // appended with the current basis
    // f32 coefficients: the same attention as the dense cache up to float rounding; narrower
    // dtypes round the coefficients instead of the vectors (same error size)
    const double tol = t == KvDtype::kF32 ? 2e-5 : t == KvDtype::kF16 ? 5e-3 : 5e-2;
    AttnParams p;
    p.n_head = 9;
    p.scale = 0.125f;
    const auto q = randn(2 * 9 * d, rng);
    const int32_t q_pos[2] = {998, 999};
    std::vector<float> a(2 * 9 * d), b(a.size());
    for (int il = 0; il < nl; ++il) {
      rot->attend(il, 2, q.data(), q_pos, p, a.data(), &pool);
      dense->attend(il, 2, q.data(), q_pos, p, b.data(), &pool);
      EXPECT_LT(max_abs_diff(a, b), tol) << kv_dtype_name(t) << " layer " << il;
      std::vector<float> k0, v0, k1, v1;
      dense->read_head(il, 1, &k0, &v0, nullptr);
      rot->read_head(il, 1, &k1, &v1, nullptr);
      EXPECT_LT(max_abs_diff(k0, k1), t == KvDtype::kF32 ? 1e-5 : 0.2) << kv_dtype_name(t);
      EXPECT_LT(max_abs_diff(v0, v1), t == KvDtype::kF32 ? 1e-5 : 0.2) << kv_dtype_name(t);
    }
    expect_attention_matches(*rot, 9, 1, 999, &pool, rng, 3e-5, kv_dtype_name(t));
  }
}

// Layer 0: a different rank, token selection and anchors per head; layer 1: keys-only basis on
// every head; layer 2: untouched; layer 3: values-only basis with token selection, one head
// without a plan.
CompressionPlan low_rank_plan(const KvCache& c, std::mt19937& rng) {
  const KvCacheConfig& cfg = c.config();
  const int dk = cfg.head_dim_k, dv = cfg.head_dim_v;
  CompressionPlan plan(cfg.n_layer, cfg.n_head_kv);
  for (int ih = 0; ih < cfg.n_head_kv; ++ih) {
    HeadPlan& hp = plan.at(0, ih);
    set_basis(hp, dk, std::max(1, dk / (2 + ih)), dv, std::max(1, dv / (3 + ih)), rng);
    hp.keep_all = false;
    hp.keep = random_keep(c.n_tokens(0, ih), 0.6, rng);
    for (size_t j = 0; j < hp.keep.size(); j += 7) hp.anchors.push_back(hp.keep[j]);
    HeadPlan& h1 = plan.at(1, ih);
    set_basis(h1, dk, std::max(1, dk / 4), dv, 0, rng);
    if (cfg.n_layer > 3 && ih > 0) {
      HeadPlan& h3 = plan.at(3, ih);
      set_basis(h3, dk, 0, dv, std::max(1, dv / 2), rng);
      h3.keep_all = false;
      h3.keep = random_keep(c.n_tokens(3, ih), 0.5, rng);
    }
  }
  return plan;
}

TEST(BasisCache, LowRankAttentionMatchesReconstructedReference) {
  const AttnCase cases[] = {
      {9, 3, 64, 64, 300, 1, 0, false},    {4, 1, 256, 256, 200, 17, 0, false},
      {4, 2, 20, 12, 200, 3, 0, false},    {9, 3, 64, 64, 2000, 1, 0, true},  // decode splits
      {12, 2, 128, 128, 1500, 2, 700, true},                                  // window
      {4, 2, 16, 16, 150, 40, 0, true},                                       // prefill
  };
  ThreadPool pool(2);
  uint32_t seed = 50;
  for (KvDtype t : kAllDtypes) {
    for (const AttnCase& cs : cases) {
      std::mt19937 rng(seed++);
      auto c = make_kv_cache(make_cfg(4, cs.n_head_kv, cs.hdk, cs.hdv, t, cs.window));
      fill({c.get()}, cs.n_prev, 0, rng);
      c->apply(low_rank_plan(*c, rng));
      EXPECT_EQ(c->n_past(), cs.n_prev);
      fill({c.get()}, cs.n_q, c->n_past(), rng);  // the queries' own tokens, in the basis
      expect_attention_matches(*c, cs.n_head, cs.n_q, static_cast<int32_t>(cs.n_prev),
                               cs.pool ? &pool : nullptr, rng, 5e-5,
                               std::string(kv_dtype_name(t)) + " heads " +
                                   std::to_string(cs.n_head) + "/" +
                                   std::to_string(cs.n_head_kv) + " n_prev " +
                                   std::to_string(cs.n_prev));
    }
  }
}

// Appends n tokens to layer 0 whose keys / values lie in span(Uk) / span(Uv) (so a rank-r
// basis of that span stores them exactly up to the dtype), returning them [n, nkv, d].
void append_in_span(KvCache& c, int64_t n, int32_t pos0, const std::vector<float>& uk, int rk,
                    const std::vector<float>& uv, int rv, std::mt19937& rng,
                    std::vector<float>* ks, std::vector<float>* vs) {
  const KvCacheConfig& cfg = c.config();
  const int nkv = cfg.n_head_kv, dk = cfg.head_dim_k, dv = cfg.head_dim_v;
  std::vector<float> k(static_cast<size_t>(n * nkv * dk)), v(static_cast<size_t>(n * nkv * dv));
  for (int64_t t = 0; t < n * nkv; ++t) {
    const auto ck = randn(static_cast<size_t>(rk), rng), cv = randn(static_cast<size_t>(rv), rng);
    for (int i = 0; i < dk; ++i) {
      float s = 0;
      for (int j = 0; j < rk; ++j) s += uk[static_cast<size_t>(i * rk + j)] * ck[j];
      k[static_cast<size_t>(t * dk + i)] = s;
    }
    for (int i = 0; i < dv; ++i) {
      float s = 0;
      for (int j = 0; j < rv; ++j) s += uv[static_cast<size_t>(i * rv + j)] * cv[j];
      v[static_cast<size_t>(t * dv + i)] = s;
    }
  }
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) pos[j] = static_cast<int32_t>(pos0 + j);
  c.append(0, n, k.data(), v.data(), pos.data());
  c.advance(pos0 + static_cast<int32_t>(n));
  ks->insert(ks->end(), k.begin(), k.end());
  vs->insert(vs->end(), v.begin(), v.end());
}

double rel_tol(KvDtype t) {
  return t == KvDtype::kF32 ? 1e-5 : t == KvDtype::kF16 ? 2e-3 : 2e-2;
}

TEST(BasisCache, TwoEpochsDecodeEachTokenWithItsOwnBasis) {
  for (KvDtype t : kAllDtypes) {
    std::mt19937 rng(77);
    const int nkv = 2, dk = 32, dv = 24, rk = 8, rv = 6;
    auto c = make_kv_cache(make_cfg(1, nkv, dk, dv, t));
    const auto uk1 = random_basis(dk, rk, rng), uv1 = random_basis(dv, rv, rng);
    const auto uk2 = random_basis(dk, rk, rng), uv2 = random_basis(dv, rv, rng);
    std::vector<float> k, v;  // every token appended, [n, nkv, d]
    append_in_span(*c, 50, 0, uk1, rk, uv1, rv, rng, &k, &v);
    CompressionPlan p1(1, nkv);
    for (int ih = 0; ih < nkv; ++ih) {
      p1.at(0, ih).key.rank = rk;
      p1.at(0, ih).key.basis = uk1;
      p1.at(0, ih).value.rank = rv;
      p1.at(0, ih).value.basis = uv1;
    }
    c->apply(p1);
    append_in_span(*c, 30, 50, uk1, rk, uv1, rv, rng, &k, &v);  // epoch 1 (current)
    CompressionPlan p2(1, nkv);
    for (int ih = 0; ih < nkv; ++ih) {
      p2.at(0, ih).key.rank = rk;
      p2.at(0, ih).key.basis = uk2;
      p2.at(0, ih).value.rank = rv;
      p2.at(0, ih).value.basis = uv2;
    }
    c->apply(p2);
    append_in_span(*c, 40, 80, uk2, rk, uv2, rv, rng, &k, &v);  // epoch 2
    // tokens 0..79 lie in span(U1) only: decoded with U2 they would be far off
    for (int ih = 0; ih < nkv; ++ih) {
      std::vector<float> hk, hv;
      std::vector<int32_t> pos;
      c->read_head(0, ih, &hk, &hv, &pos);
      ASSERT_EQ(pos.size(), 120u);
      for (int64_t tk = 0; tk < 120; ++tk) {
        EXPECT_EQ(pos[tk], tk);
        double kn = 0, ke = 0, vn = 0, ve = 0;
        for (int i = 0; i < dk; ++i) {
          const double x = k[(tk * nkv + ih) * dk + i];
          kn = std::max(kn, std::fabs(x));
          ke = std::max(ke, std::fabs(x - hk[tk * dk + i]));
        }
        for (int i = 0; i < dv; ++i) {
          const double x = v[(tk * nkv + ih) * dv + i];
          vn = std::max(vn, std::fabs(x));
          ve = std::max(ve, std::fabs(x - hv[tk * dv + i]));
        }
        ASSERT_LT(ke, 4 * rel_tol(t) * std::max(1.0, kn)) << kv_dtype_name(t) << " token " << tk;
        ASSERT_LT(ve, 4 * rel_tol(t) * std::max(1.0, vn)) << kv_dtype_name(t) << " token " << tk;
      }
    }
    ThreadPool pool(2);
    expect_attention_matches(*c, 4, 1, 119, &pool, rng, 5e-5, kv_dtype_name(t));
    // bytes: coefficients, the two bases (both heads were given the same matrices: each is
    // stored once in the cache), one epoch id per segment
    const size_t es = t == KvDtype::kF32 ? 4 : t == KvDtype::kQ8 ? 1 : 2;
    const size_t basis_bytes = (dk * rk + dv * rv) * 4;
    KvBytes b = c->bytes();
    EXPECT_EQ(b.keys, nkv * 120 * rk * es);
    EXPECT_EQ(b.values, nkv * 120 * rv * es);
    EXPECT_EQ(b.positions, nkv * 120 * 4u);
    EXPECT_EQ(b.scales, t == KvDtype::kQ8 ? nkv * 120 * 8u : 0u);
    EXPECT_EQ(b.bases, 2 * basis_bytes);
    EXPECT_EQ(b.other, nkv * 2 * 4u);
    EXPECT_EQ(b.total(), b.per_layer[0]);
    // drop every epoch-1 token of head 0: its first basis is freed
    CompressionPlan drop(1, nkv);
    drop.at(0, 0).keep_all = false;
    for (int32_t i = 80; i < 120; ++i) drop.at(0, 0).keep.push_back(i);
    c->apply(drop);
    b = c->bytes();
    EXPECT_EQ(c->n_tokens(0, 0), 40);
    EXPECT_EQ(b.bases, 2 * basis_bytes);  // head 1 still holds both
    EXPECT_EQ(b.other, 3 * 4u);
    EXPECT_EQ(b.keys, (120 + 40) * rk * es);
    expect_attention_matches(*c, 4, 1, 119, nullptr, rng, 5e-5, kv_dtype_name(t));
  }
}

TEST(BasisCache, AnchorsStayDenseAndExact) {
  for (KvDtype t : kAllDtypes) {
    std::mt19937 rng(12);
    const int nkv = 2, d = 32, r = 4;
    auto c = make_kv_cache(make_cfg(1, nkv, d, d, t));
    auto dense = make_kv_cache(make_cfg(1, nkv, d, d, t));
    fill({c.get(), dense.get()}, 100, 0, rng);
    CompressionPlan plan(1, nkv);
    HeadPlan& hp = plan.at(0, 1);
    set_basis(hp, d, r, d, r, rng);
    hp.keep_all = false;
    hp.keep = {0, 3, 10, 11, 40, 64, 98, 99};
    hp.anchors = {0, 11, 99};
    c->apply(plan);
    std::vector<float> k0, v0, k1, v1;
    std::vector<int32_t> p1;
    dense->read_head(0, 1, &k0, &v0, nullptr);
    c->read_head(0, 1, &k1, &v1, &p1);
    EXPECT_EQ(p1, hp.keep);
    for (size_t j = 0; j < p1.size(); ++j) {
      const bool anchor = p1[j] == 0 || p1[j] == 11 || p1[j] == 99;
      const size_t src = static_cast<size_t>(p1[j]);
      bool equal = true;
      for (int i = 0; i < d; ++i)
        equal = equal && k1[j * d + i] == k0[src * d + i] && v1[j * d + i] == v0[src * d + i];
      EXPECT_EQ(equal, anchor) << "token " << p1[j];  // low-rank tokens are not exact (r = 4)
    }
    // head 0 (no basis) is untouched; bytes: 3 dense + 5 coefficient rows in head 1
    const size_t es = t == KvDtype::kF32 ? 4 : t == KvDtype::kQ8 ? 1 : 2;
    const KvBytes b = c->bytes();
    EXPECT_EQ(b.keys, (100 * d + 3 * d + 5 * r) * es);
    EXPECT_EQ(b.values, (100 * d + 3 * d + 5 * r) * es);
    EXPECT_EQ(b.positions, (100 + 8) * 4u);
    EXPECT_EQ(b.bases, 2u * d * r * 4);
    EXPECT_EQ(b.other, 4u);
    // new tokens go to the basis, the anchors stay; attention reads both
    fill({c.get()}, 20, 100, rng);
    EXPECT_EQ(c->n_tokens(0, 1), 28);
    EXPECT_EQ(c->bytes().keys, (120 * d + 3 * d + 25 * r) * es);
    expect_attention_matches(*c, 4, 1, 119, nullptr, rng, 5e-5, kv_dtype_name(t));
    // a later epoch may keep the anchors dense (they are listed again) or re-encode them
    CompressionPlan again(1, nkv);
    set_basis(again.at(0, 1), d, r, d, r, rng);
    again.at(0, 1).anchors = {0};  // token 0 (position 0) stays; positions 11, 99 go to epoch 2
    c->apply(again);
    EXPECT_EQ(c->bytes().keys, (120 * d + 1 * d + 27 * r) * es);
    EXPECT_EQ(c->bytes().other, 2 * 4u);
    expect_attention_matches(*c, 4, 1, 119, nullptr, rng, 5e-5, kv_dtype_name(t));
  }
}

TEST(BasisCache, BadPlansAreClearErrorsAndLeaveTheCacheUnchanged) {
  std::mt19937 rng(5);
  const int d = 8;
  auto c = make_kv_cache(make_cfg(2, 2, d, d, KvDtype::kF16));
  fill({c.get()}, 20, 0, rng);
  CompressionPlan ok(2, 2);
  set_basis(ok.at(0, 0), d, 4, d, 4, rng);
  c->apply(ok);  // head (0, 0) holds epoch 1
  const size_t before = c->bytes().total();
  auto expect_error = [&](const CompressionPlan& plan, const char* what) {
    try {
      c->apply(plan);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(c->bytes().total(), before) << what;
  };
  CompressionPlan p(2, 2);
  set_basis(p.at(1, 1), d, 3, d, 0, rng);
  p.at(1, 1).key.basis[5] += 0.01f;
  expect_error(p, "(layer 1, kv head 1): key basis columns are not orthonormal");
  p.at(1, 1) = HeadPlan();
  set_basis(p.at(1, 1), d, 3, d, 0, rng);
  p.at(1, 1).key.rank = 4;  // 24 floats for 8 x 4
  expect_error(p, "key basis holds 24 floats, expected head_dim 8 x rank 4 = 32");
  p.at(1, 1) = HeadPlan();
  p.at(1, 1).value.basis = random_basis(d, 2, rng);  // rank 0 with a matrix
  expect_error(p, "value basis rank 0 is out of range [1, 8]");
  p.at(1, 1) = HeadPlan();
  p.at(1, 1).key.rank = 9;
  p.at(1, 1).key.basis.assign(9 * 8, 0.f);
  expect_error(p, "key basis rank 9 is out of range [1, 8]");
  p.at(1, 1) = HeadPlan();
  p.at(1, 1).anchors = {1};
  expect_error(p, "anchors are given without a basis");
  set_basis(p.at(1, 1), d, 2, d, 2, rng);
  p.at(1, 1).keep_all = false;
  p.at(1, 1).keep = {0, 2};
  expect_error(p, "anchors[0] = 1 is not kept");
  p.at(1, 1).keep_all = true;
  p.at(1, 1).anchors = {3, 3};
  expect_error(p, "anchors[1] = 3 after 3");
  p.at(1, 1).anchors = {20};
  expect_error(p, "anchors[0] = 20 is out of range [0, 20)");
  p.at(1, 1) = HeadPlan();
  set_basis(p.at(0, 0), d, 2, d, 2, rng);
  p.at(0, 0).anchors = {5};  // already in epoch 1
  expect_error(p, "anchors[0] = 5 is already stored in a basis");
  std::vector<float> k;
  c->read_head(0, 0, &k, nullptr, nullptr);
  EXPECT_EQ(k.size(), 20u * d);
}

TEST(BasisCache, TruncateAndReadHeadWithBases) {
  for (KvDtype t : {KvDtype::kF32, KvDtype::kBF16, KvDtype::kQ8}) {
    std::mt19937 rng(31);
    const int nkv = 3, d = 16;
    auto c = make_kv_cache(make_cfg(2, nkv, d, d, t));
    fill({c.get()}, 200, 0, rng);
    CompressionPlan p1(2, nkv);
    for (int ih = 0; ih < nkv; ++ih) {
      set_basis(p1.at(0, ih), d, 6, d, 5, rng);
      p1.at(0, ih).anchors = {0, 1, 2};
    }
    c->apply(p1);
    fill({c.get()}, 100, 200, rng);  // epoch 1
    CompressionPlan p2(2, nkv);
    for (int ih = 0; ih < nkv; ++ih) {
      set_basis(p2.at(0, ih), d, 4, d, 4, rng);
      p2.at(0, ih).anchors = {0, 1, 2};  // unlisted, they would be re-encoded into epoch 2
    }
    c->apply(p2);
    fill({c.get()}, 100, 300, rng);  // epoch 2
    EXPECT_EQ(c->bytes().other, nkv * 2 * 4u);
    c->truncate(250);  // epoch 2's segment is emptied and its (current) basis stays
    EXPECT_EQ(c->n_past(), 250);
    EXPECT_EQ(c->bytes().other, nkv * 4u);
    for (int ih = 0; ih < nkv; ++ih) {
      std::vector<float> k, v;
      std::vector<int32_t> pos;
      c->read_head(0, ih, &k, &v, &pos);
      ASSERT_EQ(pos.size(), 250u);
      for (int32_t i = 0; i < 250; ++i) ASSERT_EQ(pos[i], i);
      EXPECT_EQ(k.size(), 250u * d);
    }
    fill({c.get()}, 30, 250, rng);  // into epoch 2 again
    EXPECT_EQ(c->bytes().other, nkv * 2 * 4u);
    const size_t es = t == KvDtype::kF32 ? 4 : t == KvDtype::kQ8 ? 1 : 2;
    EXPECT_EQ(c->bytes().keys, (280 * d * nkv + nkv * (3 * d + 247 * 6 + 30 * 4)) * es);
    expect_attention_matches(*c, 6, 1, 279, nullptr, rng, 5e-5, kv_dtype_name(t));
    c->clear();
    EXPECT_EQ(c->bytes().keys, 0u);
  }
}

TEST(BasisCache, ResetDropsTokensAndBasesLikeANewCache) {
  for (KvDtype t : kAllDtypes) {
    std::mt19937 rng(77);
    const int nkv = 3, d = 16;
    auto c = make_kv_cache(make_cfg(2, nkv, d, d, t));
    fill({c.get()}, 100, 0, rng);
    CompressionPlan p(2, nkv);
    for (int ih = 0; ih < nkv; ++ih) set_basis(p.at(0, ih), d, 6, d, 5, rng);
    c->apply(p);
    c->reset();
    EXPECT_EQ(c->n_past(), 0);
    EXPECT_EQ(c->bytes().total(), 0u);
    for (int ih = 0; ih < nkv; ++ih) EXPECT_EQ(c->head_layout(0, ih).current_epoch, -1);
    // a new context is stored exactly as in a cache that never had a basis
    auto fresh = make_kv_cache(make_cfg(2, nkv, d, d, t));
    std::mt19937 r1(5), r2(5);
    fill({c.get()}, 40, 0, r1);
    fill({fresh.get()}, 40, 0, r2);
    EXPECT_EQ(c->bytes().total(), fresh->bytes().total());
    EXPECT_EQ(c->bytes().positions, fresh->bytes().positions);
    for (int ih = 0; ih < nkv; ++ih) {
      std::vector<float> k1, k2;
      c->read_head(0, ih, &k1, nullptr, nullptr);
      fresh->read_head(0, ih, &k2, nullptr, nullptr);
      EXPECT_EQ(k1, k2) << kv_dtype_name(t);
    }
  }
}

}  // namespace
}  // namespace kvtrim
