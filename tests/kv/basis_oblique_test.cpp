// The token cache's basis axis, second part: oblique bases (HeadPlan::decoder_k / decoder_v,
// KQ-SVD), appends_dense (OjaKV's decode buffer), basis plans on heads with no tokens yet
// (compressed throughout) and clone(). The references are built from first principles on the
// appended f32 data: the key attention must see is D_k E_kᵀ k and the value D_v E_vᵀ v, with
// each token decoded by the basis of the epoch it was encoded in (never from the cache's own
// read_head), through attention_reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "kv/attn_kernels.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"

namespace kvtrim {
namespace {

using kvtest::AttnCase;
using kvtest::esize;
using kvtest::fill;
using kvtest::kAllDtypes;
using kvtest::make_cfg;
using kvtest::max_abs_diff;
using kvtest::randn;
using kvtest::random_basis;
using kvtest::random_keep;

// U + noise: a well-conditioned matrix whose columns are not orthonormal (an encoder or decoder).
std::vector<float> perturbed(const std::vector<float>& u, int d, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 0.3f / std::sqrt(static_cast<float>(d)));
  std::vector<float> m = u;
  for (float& x : m) x += nd(rng);
  return m;
}

// One side of an epoch as the test knows it: encoder E [d, r] and decoder D [d, r] (E empty:
// identity; D empty: D = E).
struct Side {
  int r = 0;
  std::vector<float> e, d;
};
struct Epoch {
  Side k, v;
};

// An oblique side: E and D both perturbations of one orthonormal basis (E ≠ D, neither
// orthonormal).
Side oblique(int d, int r, std::mt19937& rng) {
  const auto u = random_basis(d, r, rng);
  return Side{r, perturbed(u, d, rng), perturbed(u, d, rng)};
}
Side ortho(int d, int r, std::mt19937& rng) {
  return Side{r, random_basis(d, r, rng), {}};
}

void set_side(const Side& s, int* rank, std::vector<float>* basis, std::vector<float>* dec) {
  *rank = s.r;
  *basis = s.e;
  *dec = s.d;
}
void set_epoch(HeadPlan& hp, const Epoch& ep) {
  set_side(ep.k, &hp.key.rank, &hp.key.basis, &hp.key.decoder);
  set_side(ep.v, &hp.value.rank, &hp.value.basis, &hp.value.decoder);
}

// x (d floats) as attention must see it in side s: D (Eᵀ x), in double.
void decode_side(const Side& s, int d, const float* x, float* y) {
  if (s.e.empty()) {
    std::copy(x, x + d, y);
    return;
  }
  const std::vector<float>& dm = s.d.empty() ? s.e : s.d;
  std::vector<double> c(static_cast<size_t>(s.r), 0.0);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < s.r; ++j) c[j] += static_cast<double>(s.e[i * s.r + j]) * x[i];
  for (int i = 0; i < d; ++i) {
    double acc = 0;
    for (int j = 0; j < s.r; ++j) acc += static_cast<double>(dm[i * s.r + j]) * c[j];
    y[i] = static_cast<float>(acc);
  }
}

// Every token appended to layer 0 (f32, [n, nkv, d]) with, per (token, kv head), the epoch
// that must decode it (nullptr: stored dense, exact).
struct Truth {
  int nkv = 0, dk = 0, dv = 0;
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  std::vector<const Epoch*> ep;  // [n, nkv]

  // Appends n random tokens at pos0.. to layer 0 of each cache (one call per chunk), recorded
  // with epoch `e[ih]` per kv head.
  void append(const std::vector<KvCache*>& cs, int64_t n, int32_t pos0,
              const std::vector<const Epoch*>& e, std::mt19937& rng, int64_t chunk = 64) {
    for (int64_t i = 0; i < n; i += chunk) {
      const int64_t m = std::min(chunk, n - i);
      const auto kk = randn(static_cast<size_t>(m * nkv * dk), rng, 1.5f);
      const auto vv = randn(static_cast<size_t>(m * nkv * dv), rng);
      std::vector<int32_t> pp(static_cast<size_t>(m));
      for (int64_t j = 0; j < m; ++j) pp[j] = static_cast<int32_t>(pos0 + i + j);
      for (KvCache* c : cs) {
        c->append(0, m, kk.data(), vv.data(), pp.data());
        c->advance(pp.back() + 1);
      }
      k.insert(k.end(), kk.begin(), kk.end());
      v.insert(v.end(), vv.begin(), vv.end());
      pos.insert(pos.end(), pp.begin(), pp.end());
      for (int64_t j = 0; j < m; ++j) ep.insert(ep.end(), e.begin(), e.end());
    }
  }
  // Re-encodes the tokens of kv head ih that are stored dense (no epoch) into epoch e.
  void reencode_dense(int ih, const Epoch* e) {
    for (size_t t = 0; t < pos.size(); ++t)
      if (!ep[t * nkv + ih]) ep[t * nkv + ih] = e;
  }
  // Attention of layer 0 as the first-principles reference computes it.
  void reference(int64_t n_q, const float* q, const int32_t* q_pos, const AttnParams& p,
                 float* out) const {
    const size_t n = pos.size();
    std::vector<float> ke(k.size()), ve(v.size());
    for (size_t t = 0; t < n; ++t) {
      for (int ih = 0; ih < nkv; ++ih) {
        const size_t r = t * nkv + ih;
        const Epoch* e = ep[r];
        const Side none;
        decode_side(e ? e->k : none, dk, k.data() + r * dk, ke.data() + r * dk);
        decode_side(e ? e->v : none, dv, v.data() + r * dv, ve.data() + r * dv);
      }
    }
    attention_reference(n_q, q, q_pos, static_cast<int64_t>(n), ke.data(), ve.data(), pos.data(),
                        nkv, dk, dv, p, out);
  }
};

// Attention error of the cache's layer 0 against the reference, for n_q queries ending at the
// last appended position.
double attention_error(const KvCache& c, const Truth& tr, int n_head, int64_t n_q, int window,
                       ThreadPool* pool, std::mt19937& rng) {
  AttnParams p;
  p.n_head = n_head;
  p.scale = 1.f / std::sqrt(static_cast<float>(tr.dk));
  p.sliding_window = window;
  std::vector<int32_t> q_pos(static_cast<size_t>(n_q));
  for (int64_t i = 0; i < n_q; ++i) q_pos[i] = tr.pos.back() - static_cast<int32_t>(n_q - 1 - i);
  const auto q = randn(static_cast<size_t>(n_q * n_head * tr.dk), rng);
  std::vector<float> out(static_cast<size_t>(n_q * n_head * tr.dv)), want(out.size());
  c.attend(0, n_q, q.data(), q_pos.data(), p, out.data(), pool);
  tr.reference(n_q, q.data(), q_pos.data(), p, want.data());
  return max_abs_diff(out, want);
}

// The dtype's rounding of coefficients / vectors, seen in attention outputs of O(1) values.
double dtype_tol(KvDtype t) {
  return t == KvDtype::kF32 ? 5e-5 : t == KvDtype::kF16 ? 5e-3 : 5e-2;
}

// The lift kernel (x·Dᵀ) against a plain loop: row tails (cols not a lane multiple), more
// query heads than one register batch, strided inputs and outputs.
TEST(BasisKernels, RowsDotMatchesPlainLoop) {
  std::mt19937 rng(4);
  for (int cols : {1, 7, 16, 33, 128}) {
    for (int n_g : {1, 4, 9}) {
      const int rows = 37, ld_x = cols + 3, ld_y = rows + 2;
      const auto m = randn(static_cast<size_t>(rows) * cols, rng);
      const auto x = randn(static_cast<size_t>(n_g) * ld_x, rng);
      std::vector<float> y(static_cast<size_t>(n_g) * ld_y, -7.f), want = y;
      kv::rows_dot_f32(m.data(), rows, cols, x.data(), n_g, ld_x, y.data(), ld_y);
      for (int g = 0; g < n_g; ++g) {
        for (int i = 0; i < rows; ++i) {
          double acc = 0;
          for (int j = 0; j < cols; ++j)
            acc += static_cast<double>(m[i * cols + j]) * x[g * ld_x + j];
          want[g * ld_y + i] = static_cast<float>(acc);
        }
      }
      EXPECT_LT(max_abs_diff(y, want), 1e-4) << "cols " << cols << " n_g " << n_g;
    }
  }
}

TEST(BasisOblique, AttentionEqualsReferenceOnDecodedKeysAndValues) {
  const AttnCase cases[] = {
      {9, 3, 64, 64, 300, 1, 0, false},    {4, 1, 128, 128, 200, 5, 0, false},
      {4, 2, 20, 12, 150, 3, 0, false},    {9, 3, 64, 64, 1800, 1, 0, true},    // decode splits
      {12, 2, 32, 32, 1200, 2, 500, true},                                      // sliding window
      {4, 1, 64, 48, 2100, 1, 0, true},    {4, 1, 64, 48, 2100, 1, 600, true},  // 4 splits
  };
  ThreadPool pool(2);
  uint32_t seed = 100;
  for (KvDtype t : kAllDtypes) {
    for (const AttnCase& cs : cases) {
      std::mt19937 rng(seed++);
      const std::string what = std::string(kv_dtype_name(t)) + " heads " +
                               std::to_string(cs.n_head) + "/" + std::to_string(cs.n_head_kv) +
                               " dims " + std::to_string(cs.hdk) + " window " +
                               std::to_string(cs.window);
      auto c = make_kv_cache(make_cfg(1, cs.n_head_kv, cs.hdk, cs.hdv, t));
      Truth tr{cs.n_head_kv, cs.hdk, cs.hdv, {}, {}, {}, {}};
      const std::vector<const Epoch*> none(static_cast<size_t>(cs.n_head_kv), nullptr);
      tr.append({c.get()}, cs.n_prev, 0, none, rng, 97);
      // head 0: both sides oblique; head 1: oblique keys, orthonormal values; head 2: oblique
      // values only (keys full)
      std::vector<Epoch> eps(static_cast<size_t>(cs.n_head_kv));
      CompressionPlan plan(1, cs.n_head_kv);
      size_t basis_floats = 0;
      for (int ih = 0; ih < cs.n_head_kv; ++ih) {
        Epoch& e = eps[static_cast<size_t>(ih)];
        if (ih != 2) e.k = oblique(cs.hdk, cs.hdk / 2, rng);
        e.v = ih == 1 ? ortho(cs.hdv, cs.hdv / 3, rng) : oblique(cs.hdv, cs.hdv / 2, rng);
        set_epoch(plan.at(0, ih), e);
        tr.reencode_dense(ih, &e);
        basis_floats += e.k.e.size() + e.k.d.size() + e.v.e.size() + e.v.d.size();
      }
      c->apply(plan);
      std::vector<const Epoch*> cur;
      for (const Epoch& e : eps) cur.push_back(&e);
      tr.append({c.get()}, cs.n_q, static_cast<int32_t>(cs.n_prev), cur, rng);
      EXPECT_LT(
          attention_error(*c, tr, cs.n_head, cs.n_q, cs.window, cs.pool ? &pool : nullptr, rng),
          dtype_tol(t))
          << what;
      // read_head reconstructs D·c; bytes count both matrices of each side under bases
      std::vector<float> hk, hv;
      c->read_head(0, 0, &hk, &hv, nullptr);
      std::vector<float> y(static_cast<size_t>(cs.hdk));
      double worst = 0;
      for (size_t tk = 0; tk < tr.pos.size(); ++tk) {
        decode_side(eps[0].k, cs.hdk, tr.k.data() + tk * cs.n_head_kv * cs.hdk, y.data());
        for (int i = 0; i < cs.hdk; ++i)
          worst = std::max(worst, static_cast<double>(std::fabs(y[i] - hk[tk * cs.hdk + i])));
      }
      EXPECT_LT(worst, 20 * dtype_tol(t)) << what;
      const KvBytes b = c->bytes();
      EXPECT_EQ(b.bases, basis_floats * sizeof(float)) << what;
      size_t coef_k = 0;
      for (const Epoch& e : eps) coef_k += e.k.e.empty() ? cs.hdk : e.k.r;
      EXPECT_EQ(b.keys, coef_k * tr.pos.size() * esize(t)) << what;
      const KvCache::HeadLayout hl = c->head_layout(0, 0);
      EXPECT_EQ(hl.decoder_k, eps[0].k.d);
      EXPECT_EQ(hl.decoder_v, eps[0].v.d);
      EXPECT_EQ(hl.basis_k, eps[0].k.e);
      EXPECT_FALSE(hl.appends_dense);
    }
  }
}

TEST(BasisOblique, AppendsDenseStayExactUntilTheNextPlanReencodesThem) {
  ThreadPool pool(2);
  for (KvDtype t : kAllDtypes) {
    std::mt19937 rng(21);
    const int nkv = 2, d = 32, r = 8, n_head = 4;
    const int n0 = 1100;  // long enough for decode splits over both epochs and the buffer
    auto c = make_kv_cache(make_cfg(1, nkv, d, d, t));
    auto dense = make_kv_cache(make_cfg(1, nkv, d, d, t));
    Truth tr{nkv, d, d, {}, {}, {}, {}};
    const std::vector<const Epoch*> none(nkv, nullptr);
    tr.append({c.get(), dense.get()}, n0, 0, none, rng, 211);
    // epoch 1: head 0 orthonormal, head 1 oblique; both with a dense decode buffer
    const Epoch e1[2] = {{ortho(d, r, rng), ortho(d, r, rng)},
                         {oblique(d, r, rng), oblique(d, r, rng)}};
    CompressionPlan p1(1, nkv);
    for (int ih = 0; ih < nkv; ++ih) {
      set_epoch(p1.at(0, ih), e1[ih]);
      p1.at(0, ih).appends_dense = true;
      tr.reencode_dense(ih, &e1[ih]);
    }
    c->apply(p1);
    tr.append({c.get(), dense.get()}, 40, n0, none, rng, 7);  // the buffer: dense
    const std::string what = kv_dtype_name(t);
    int32_t id1[nkv];  // epoch ids are unique in the cache: one per head
    for (int ih = 0; ih < nkv; ++ih) {
      const KvCache::HeadLayout hl = c->head_layout(0, ih);
      ASSERT_EQ(hl.epoch.size(), static_cast<size_t>(n0 + 40));
      id1[ih] = hl.current_epoch;
      EXPECT_GE(id1[ih], 0);
      EXPECT_TRUE(hl.appends_dense);
      for (int tk = 0; tk < n0 + 40; ++tk) ASSERT_EQ(hl.epoch[tk], tk < n0 ? id1[ih] : -1) << tk;
      // the buffered tokens are exactly what a dense cache stores
      std::vector<float> k0, v0, k1, v1;
      std::vector<int32_t> p0, p1v;
      dense->read_head(0, ih, &k0, &v0, &p0);
      c->read_head(0, ih, &k1, &v1, &p1v);
      EXPECT_EQ(p0, p1v);
      EXPECT_TRUE(std::equal(k0.begin() + n0 * d, k0.end(), k1.begin() + n0 * d)) << what;
      EXPECT_TRUE(std::equal(v0.begin() + n0 * d, v0.end(), v1.begin() + n0 * d)) << what;
    }
    // a query whose window holds only buffered tokens sees exactly the dense cache's attention
    {
      AttnParams p;
      p.n_head = n_head;
      p.scale = 0.2f;
      p.sliding_window = 40;
      const auto q = randn(n_head * d, rng);
      const int32_t q_pos = n0 + 39;
      std::vector<float> a(n_head * d), b(a.size());
      c->attend(0, 1, q.data(), &q_pos, p, a.data(), nullptr);
      dense->attend(0, 1, q.data(), &q_pos, p, b.data(), nullptr);
      EXPECT_LT(max_abs_diff(a, b), 1e-6) << what;
    }
    EXPECT_LT(attention_error(*c, tr, n_head, 3, 0, &pool, rng), dtype_tol(t)) << what;
    EXPECT_LT(attention_error(*c, tr, n_head, 1, 0, &pool, rng), dtype_tol(t)) << what;  // splits
    // bytes: n0 coefficient rows + 40 dense rows per head, one basis epoch
    EXPECT_EQ(c->bytes().keys, nkv * (n0 * r + 40 * d) * esize(t));
    {  // truncate cuts into the buffer (and the epoch); later appends are buffered again
      auto cut = c->clone();
      cut->truncate(n0 + 20);
      EXPECT_EQ(cut->bytes().keys, nkv * (n0 * r + 20 * d) * esize(t));
      cut->truncate(n0 - 10);
      EXPECT_EQ(cut->n_past(), n0 - 10);
      EXPECT_EQ(cut->bytes().keys, nkv * (n0 - 10) * r * esize(t));
      std::vector<float> kk(static_cast<size_t>(2 * nkv * d), 0.25f), vv = kk;
      const int32_t pp[2] = {n0 - 10, n0 - 9};
      cut->append(0, 2, kk.data(), vv.data(), pp);
      const KvCache::HeadLayout hl = cut->head_layout(0, 1);
      ASSERT_EQ(hl.epoch.size(), static_cast<size_t>(n0 - 8));
      EXPECT_EQ(hl.epoch[n0 - 11], id1[1]);
      EXPECT_EQ(hl.epoch[n0 - 10], -1);
      EXPECT_EQ(hl.epoch[n0 - 9], -1);
      std::vector<float> k1;
      cut->read_head(0, 1, &k1, nullptr, nullptr);
      EXPECT_EQ(k1[static_cast<size_t>(n0 - 9) * d + 3], 0.25f);
    }
    // epoch 2 re-encodes the buffer; epoch 1's tokens keep their basis; appends now encoded
    const Epoch e2[2] = {{oblique(d, r, rng), ortho(d, r, rng)},
                         {ortho(d, r, rng), oblique(d, r, rng)}};
    CompressionPlan p2(1, nkv);
    for (int ih = 0; ih < nkv; ++ih) {
      set_epoch(p2.at(0, ih), e2[ih]);
      tr.reencode_dense(ih, &e2[ih]);
    }
    c->apply(p2);
    std::vector<const Epoch*> cur{&e2[0], &e2[1]};
    tr.append({c.get()}, 20, n0 + 40, cur, rng);
    for (int ih = 0; ih < nkv; ++ih) {
      const KvCache::HeadLayout hl = c->head_layout(0, ih);
      ASSERT_EQ(hl.epoch.size(), static_cast<size_t>(n0 + 60));
      EXPECT_FALSE(hl.appends_dense);
      EXPECT_NE(hl.current_epoch, id1[ih]);
      EXPECT_GE(hl.current_epoch, 0);
      for (int tk = 0; tk < n0 + 60; ++tk)
        ASSERT_EQ(hl.epoch[tk], tk < n0 ? id1[ih] : hl.current_epoch) << tk;
    }
    EXPECT_LT(attention_error(*c, tr, n_head, 2, 0, &pool, rng), dtype_tol(t)) << what;
    EXPECT_LT(attention_error(*c, tr, n_head, 1, 70, nullptr, rng), dtype_tol(t)) << what;
    EXPECT_LT(attention_error(*c, tr, n_head, 1, 0, &pool, rng), dtype_tol(t)) << what;  // splits
    EXPECT_LT(attention_error(*c, tr, n_head, 1, 45, &pool, rng), dtype_tol(t)) << what;
    EXPECT_EQ(c->bytes().keys, nkv * (n0 + 60) * r * esize(t));
    EXPECT_EQ(c->bytes().other, nkv * 2 * 4u);
  }
}

TEST(BasisOblique, PlanBeforeAnyTokenEncodesEveryAppend) {
  for (KvDtype t : kAllDtypes) {
    std::mt19937 rng(5);
    const int nkv = 3, d = 32, r = 12, n_head = 6;
    auto c = make_kv_cache(make_cfg(2, nkv, d, d, t));
    const std::string what = kv_dtype_name(t);
    Epoch eps[3] = {{oblique(d, r, rng), oblique(d, r, rng)},
                    {ortho(d, r, rng), ortho(d, r, rng)},
                    {ortho(d, r, rng), oblique(d, r, rng)}};
    CompressionPlan plan(2, nkv);
    for (int ih = 0; ih < nkv; ++ih) set_epoch(plan.at(0, ih), eps[ih]);
    plan.at(1, 2).key.rank = r;  // layer 1: one head buffers its appends dense
    plan.at(1, 2).key.basis = random_basis(d, r, rng);
    plan.at(1, 2).appends_dense = true;
    c->apply(plan);
    EXPECT_EQ(c->n_past(), 0);
    EXPECT_EQ(c->bytes().keys, 0u);
    EXPECT_EQ(c->bytes().bases, 4u * (4 * d * r + 2 * d * r + 3 * d * r + d * r));
    for (int ih = 0; ih < nkv; ++ih) {
      const KvCache::HeadLayout hl = c->head_layout(0, ih);
      EXPECT_TRUE(hl.epoch.empty());
      EXPECT_GE(hl.current_epoch, 0);
      EXPECT_EQ(hl.basis_k, eps[ih].k.e);
    }
    // compressed throughout: each step appends its token, then its own query attends over
    // data that is already encoded (its own token included)
    Truth tr{nkv, d, d, {}, {}, {}, {}};
    const std::vector<const Epoch*> cur{&eps[0], &eps[1], &eps[2]};
    tr.append({c.get()}, 64, 0, cur, rng, 64);  // a "prefill"
    for (int step = 0; step < 5; ++step) {
      tr.append({c.get()}, 1, 64 + step, cur, rng);
      EXPECT_LT(attention_error(*c, tr, n_head, 1, 0, nullptr, rng), dtype_tol(t)) << what;
    }
    EXPECT_LT(attention_error(*c, tr, n_head, 8, 0, nullptr, rng), dtype_tol(t)) << what;
    const int64_t n = 69;
    std::vector<float> k, v;
    std::vector<int32_t> pos;
    c->read_head(0, 1, &k, &v, &pos);
    ASSERT_EQ(pos.size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(pos[i], i);
    EXPECT_EQ(c->n_past(), n);
    for (int ih = 0; ih < nkv; ++ih) {
      const KvCache::HeadLayout hl = c->head_layout(0, ih);
      ASSERT_EQ(hl.epoch.size(), static_cast<size_t>(n));
      for (int32_t e : hl.epoch) EXPECT_EQ(e, hl.current_epoch);
    }
    // layer 1 got no tokens in Truth; fill it: heads 0, 1 dense, head 2 dense (appends_dense)
    std::vector<float> kk(static_cast<size_t>(nkv * d), 0.5f), vv = kk;
    const int32_t p1 = 0;
    c->append(1, 1, kk.data(), vv.data(), &p1);
    EXPECT_EQ(c->head_layout(1, 2).epoch, std::vector<int32_t>{-1});
    EXPECT_TRUE(c->head_layout(1, 2).appends_dense);
    // keys: layer 0 r per token and head; layer 1 three dense rows
    EXPECT_EQ(c->bytes().keys, (nkv * n * r + nkv * d) * esize(t));
    // truncate and clear keep the current basis: later appends are still encoded
    c->truncate(30);
    EXPECT_EQ(c->n_tokens(0, 0), 30);
    c->clear();
    EXPECT_EQ(c->bytes().keys, 0u);
    Truth tr2{nkv, d, d, {}, {}, {}, {}};
    tr2.append({c.get()}, 40, 0, cur, rng, 13);
    EXPECT_EQ(c->bytes().keys, nkv * 40 * r * esize(t));
    EXPECT_LT(attention_error(*c, tr2, n_head, 4, 0, nullptr, rng), dtype_tol(t)) << what;
  }
}

TEST(BasisOblique, BadPlansAreErrorsAndLeaveTheCacheUnchanged) {
  std::mt19937 rng(9);
  const int d = 8, r = 4;
  auto c = make_kv_cache(make_cfg(2, 2, d, d, KvDtype::kF16));
  fill({c.get()}, 20, 0, rng);
  CompressionPlan ok(2, 2);
  set_epoch(ok.at(0, 0), Epoch{oblique(d, r, rng), {}});
  ok.at(0, 0).appends_dense = true;
  c->apply(ok);
  fill({c.get()}, 5, 20, rng);  // buffered dense in head (0, 0)
  const size_t before = c->bytes().total();
  std::vector<float> k_before, v_before;
  c->read_head(0, 0, &k_before, &v_before, nullptr);
  const KvCache::HeadLayout hl_before = c->head_layout(0, 0);
  auto expect_error = [&](const CompressionPlan& plan, const char* what) {
    try {
      c->apply(plan);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(c->bytes().total(), before) << what;
    std::vector<float> k, v;
    c->read_head(0, 0, &k, &v, nullptr);
    EXPECT_EQ(k, k_before) << what;
    EXPECT_EQ(v, v_before) << what;
    EXPECT_EQ(c->head_layout(0, 0).epoch, hl_before.epoch) << what;
    EXPECT_EQ(c->head_layout(0, 0).current_epoch, hl_before.current_epoch) << what;
  };
  // every plan also re-encodes head (0, 0)'s buffer if applied: a partial apply would show
  CompressionPlan p(2, 2);
  set_epoch(p.at(0, 0), Epoch{ortho(d, r, rng), ortho(d, r, rng)});
  set_epoch(p.at(1, 1), Epoch{oblique(d, r, rng), {}});
  p.at(1, 1).key.decoder.pop_back();
  expect_error(p,
               "(layer 1, kv head 1): key decoder holds 31 floats, expected head_dim 8 x rank 4");
  set_epoch(p.at(1, 1), Epoch{{}, oblique(d, r, rng)});
  p.at(1, 1).value.decoder[3] = std::numeric_limits<float>::quiet_NaN();
  expect_error(p, "value decoder element 3 is not finite");
  set_epoch(p.at(1, 1), Epoch{oblique(d, r, rng), {}});
  p.at(1, 1).key.basis[7] = std::numeric_limits<float>::infinity();
  expect_error(p, "key basis element 7 is not finite");
  set_epoch(p.at(1, 1), Epoch{ortho(d, r, rng), {}});
  p.at(1, 1).key.basis[2] = std::numeric_limits<float>::quiet_NaN();  // no decoder: orthonormality
  expect_error(p, "key basis columns are not orthonormal");
  p.at(1, 1) = HeadPlan();
  p.at(1, 1).key.decoder = oblique(d, r, rng).d;
  p.at(1, 1).key.rank = r;
  expect_error(p, "key decoder given without a key basis");
  p.at(1, 1) = HeadPlan();
  set_epoch(p.at(1, 1), Epoch{oblique(d, r, rng), {}});
  p.at(1, 1).value.decoder = random_basis(d, r, rng);  // value decoder, no value basis
  expect_error(p, "value decoder given without a value basis");
  p.at(1, 1) = HeadPlan();
  p.at(1, 1).appends_dense = true;
  expect_error(p, "(layer 1, kv head 1): appends_dense is given without a basis");
  p.at(1, 1).keep_all = false;
  p.at(1, 1).keep = {0, 1};
  expect_error(p, "appends_dense is given without a basis");
  // a decoder of the wrong rank with a correct basis
  p.at(1, 1) = HeadPlan();
  set_epoch(p.at(1, 1), Epoch{oblique(d, r, rng), {}});
  p.at(1, 1).key.decoder = oblique(d, r - 1, rng).d;
  expect_error(p, "key decoder holds 24 floats");
}

TEST(BasisOblique, CloneWithSeveralEpochsAttendsIdenticallyAndIsIndependent) {
  for (KvDtype t : {KvDtype::kF16, KvDtype::kQ8}) {
    std::mt19937 rng(33);
    const int nkv = 2, d = 32, r = 8, n_head = 4;
    auto c = make_kv_cache(make_cfg(2, nkv, d, d, t));
    fill({c.get()}, 150, 0, rng);
    CompressionPlan p1(2, nkv);
    for (int ih = 0; ih < nkv; ++ih) {
      set_epoch(p1.at(0, ih), Epoch{oblique(d, r, rng), ortho(d, r, rng)});
      p1.at(0, ih).appends_dense = true;
      p1.at(0, ih).anchors = {0, 1};
    }
    p1.at(1, 1).keep_all = false;
    p1.at(1, 1).keep = random_keep(150, 0.5, rng);
    c->apply(p1);
    fill({c.get()}, 30, 150, rng);
    CompressionPlan p2(2, nkv);
    for (int ih = 0; ih < nkv; ++ih)
      set_epoch(p2.at(0, ih), Epoch{ortho(d, r, rng), oblique(d, r, rng)});
    c->apply(p2);
    fill({c.get()}, 20, 180, rng);  // epoch 2
    auto snapshot = [&](const KvCache& x, std::vector<float>* out) {
      AttnParams p;
      p.n_head = n_head;
      p.scale = 0.2f;
      std::mt19937 qr(1);
      const auto q = randn(2 * n_head * d, qr);
      const int32_t q_pos[2] = {198, 199};
      out->clear();
      for (int il = 0; il < 2; ++il) {
        std::vector<float> o(2 * n_head * d);
        x.attend(il, 2, q.data(), q_pos, p, o.data(), nullptr);
        out->insert(out->end(), o.begin(), o.end());
        for (int ih = 0; ih < nkv; ++ih) {
          std::vector<float> k, v;
          x.read_head(il, ih, &k, &v, nullptr);
          out->insert(out->end(), k.begin(), k.end());
          out->insert(out->end(), v.begin(), v.end());
        }
      }
    };
    std::vector<float> s0, s1;
    snapshot(*c, &s0);
    auto cl = c->clone();
    snapshot(*cl, &s1);
    EXPECT_EQ(s0, s1);  // bit-identical
    EXPECT_EQ(cl->n_past(), c->n_past());
    EXPECT_EQ(cl->bytes().total(), c->bytes().total());
    for (int ih = 0; ih < nkv; ++ih) {
      EXPECT_EQ(cl->head_layout(0, ih).epoch, c->head_layout(0, ih).epoch);
      EXPECT_EQ(cl->head_layout(0, ih).current_epoch, c->head_layout(0, ih).current_epoch);
    }
    const size_t bytes0 = c->bytes().total();
    // mutating the clone leaves the original as it was
    fill({cl.get()}, 10, 200, rng);
    CompressionPlan p3(2, nkv);
    set_epoch(p3.at(0, 0), Epoch{oblique(d, r, rng), {}});
    p3.at(0, 1).keep_all = false;
    p3.at(0, 1).keep = {5, 50, 100, 170, 205};
    cl->apply(p3);
    cl->truncate(190);
    snapshot(*c, &s1);
    EXPECT_EQ(s0, s1);
    EXPECT_EQ(c->bytes().total(), bytes0);
    EXPECT_EQ(c->n_past(), 200);
    // and the other way round
    auto cl2 = c->clone();
    std::vector<float> s2;
    snapshot(*cl2, &s2);
    c->clear();
    snapshot(*cl2, &s1);
    EXPECT_EQ(s1, s2);
    EXPECT_EQ(c->n_tokens(0, 0), 0);
    EXPECT_EQ(cl2->n_tokens(0, 0), 200);
  }
}

}  // namespace
}  // namespace kvtrim
