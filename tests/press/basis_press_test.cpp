// The low-rank presses (ksvd, eigenattention, kqsvd, staticpca, ojakv) on the tiny model with
// an in-memory calibration: plans against brute force (rank, basis = the fit's first r
// columns, anchors = brute-force top-k of OjaKV's error score, OjaKV's prefill basis = a scalar
// Oja step + Gram-Schmidt), full rank is lossless, the after-append hook makes the prefill read
// the compressed cache, OjaKV's decode updates make basis epochs, composition with snapkv
// multiplies the saving, `eval ppl --mode throughout` runs them, and every mistake is an Error.
#include <gtest/gtest.h>

#include <set>

#include "basis_test_util.h"
#include "eval/ppl.h"

namespace kvtrim {
namespace {

constexpr int kBasisTokens = 40;

class BasisPress : public test::PressFixture {
 protected:
  static std::shared_ptr<Calibration> cal() {
    static std::shared_ptr<Calibration> c =
        test::tiny_calibration(*model_, capture(test::calib_tokens()));
    return c;
  }
};

std::string has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos ? "" : "'" + s + "' lacks '" + what + "'";
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(double(b[i]))));
  return m;
}

struct Method {
  const char* name;
  BasisMethod m;
};
const Method kStatic[] = {{"ksvd", BasisMethod::kKSvd},
                          {"eigenattention", BasisMethod::kEigenAttention},
                          {"kqsvd", BasisMethod::kKqSvd},
                          {"staticpca", BasisMethod::kStaticPca}};

TEST_F(BasisPress, RankForRatioRoundsTheKeptFraction) {
  EXPECT_EQ(LowRankPress::rank_for_removed_ratio(0.5, 16), 8);
  EXPECT_EQ(LowRankPress::rank_for_removed_ratio(0.3, 16), 11);  // round(11.2)
  EXPECT_EQ(LowRankPress::rank_for_removed_ratio(0.0, 16), 16);
  EXPECT_EQ(LowRankPress::rank_for_removed_ratio(0.99, 16), 1);  // never 0
  EXPECT_EQ(LowRankPress::rank_for_removed_ratio(0.4, 64), 38);  // round(38.4)
}

TEST_F(BasisPress, StaticPlansTruncateTheFit) {
  test::CalibrationScope scope(cal());
  for (const Method& m : kStatic) {
    for (const bool energy : {false, true}) {
      const std::string spec =
          std::string(m.name) + (energy ? ":energy=0.9,prefill=full" : ":ratio=0.3,prefill=full");
      SCOPED_TRACE(spec);
      auto s = prefilled(spec, tokens(kBasisTokens));
      const CompressionPlan p = plan_with_model(*s);
      for (int il = 0; il < p.n_layer; ++il)
        for (int ih = 0; ih < p.n_head_kv; ++ih) {
          const HeadFit& f = cal()->fit(m.m, il, ih);
          const HeadPlan& h = p.at(il, ih);
          const int rk = energy ? f.k.rank_for_energy(0.9) : 11,
                    rv = energy ? f.v.rank_for_energy(0.9) : 11;
          EXPECT_TRUE(h.keep_all);
          ASSERT_EQ(h.key.rank, rk);
          ASSERT_EQ(h.value.rank, rv);
          EXPECT_EQ(h.key.basis, f.k.enc_cols(rk));
          EXPECT_EQ(h.value.basis, f.v.enc_cols(rv));
          if (m.m == BasisMethod::kKqSvd) {
            EXPECT_EQ(h.key.decoder, f.k.dec_cols(rk));
            EXPECT_EQ(h.value.decoder, f.v.dec_cols(rv));
          } else {
            EXPECT_TRUE(h.key.decoder.empty() && h.value.decoder.empty());
          }
          EXPECT_TRUE(h.anchors.empty());
          EXPECT_FALSE(h.appends_dense);  // no anchors: later appends are encoded at once
        }
      s->compress();
      for (int il = 0; il < p.n_layer; ++il)
        for (int ih = 0; ih < p.n_head_kv; ++ih) {
          const auto lay = s->cache().head_layout(il, ih);
          EXPECT_GE(lay.current_epoch, 0);
          for (int32_t e : lay.epoch) EXPECT_EQ(e, lay.current_epoch);
        }
    }
  }
}

// Brute-force OjaKV error score (§5.1) of every token of (il, ih) under U [d, r].
std::vector<double> bf_error(const test::CaptureAll& c, const HParams& hp, int il, int ih,
                             const std::vector<float>& U, int r, int w) {
  const int d = c.d, g = hp.n_head / hp.n_head_kv;
  const int64_t n = static_cast<int64_t>(c.pos.size());
  std::vector<double> e(static_cast<size_t>(n), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> res(static_cast<size_t>(d));
    for (int a = 0; a < d; ++a) {
      double proj = 0;
      for (int j = 0; j < r; ++j) {
        double cj = 0;
        for (int b = 0; b < d; ++b) cj += double(U[b * r + j]) * c.krow(il, t, ih)[b];
        proj += U[a * r + j] * cj;
      }
      res[a] = c.krow(il, t, ih)[a] - proj;
    }
    double acc = 0;
    int cnt = 0;
    for (int64_t i = n - w; i < n; ++i) {
      if (c.pos[t] > c.pos[i]) continue;
      for (int gi = 0; gi < g; ++gi) {
        double dot = 0;
        for (int a = 0; a < d; ++a) dot += double(c.qrow(il, i, ih * g + gi)[a]) * res[a];
        acc += std::abs(dot) / std::sqrt(double(d));
        ++cnt;
      }
    }
    e[t] = cnt ? acc / cnt : 0.0;
  }
  return e;
}

TEST_F(BasisPress, AnchorsAreSinksRecentAndBruteForceTopErrors) {
  test::CalibrationScope scope(cal());
  const auto prompt = tokens(kBasisTokens);
  const test::CaptureAll c = capture(prompt);
  auto s = prefilled("staticpca:ratio=0.5,prefill=full,sinks=2,recent=3,hybrid=0.2,w=8", prompt);
  const CompressionPlan p = plan_with_model(*s);
  for (int il = 0; il < p.n_layer; ++il)
    for (int ih = 0; ih < p.n_head_kv; ++ih) {
      const HeadPlan& h = p.at(il, ih);
      const std::vector<float> U = cal()->fit(BasisMethod::kStaticPca, il, ih).k.enc_cols(8);
      const std::vector<double> e = bf_error(c, model_->hparams(), il, ih, U, 8, 8);
      // Candidates: tokens 2 .. 36; 8 = round(0.2 * 40) of them by error.
      std::vector<double> cand(e.begin() + 2, e.begin() + kBasisTokens - 3);
      std::vector<int32_t> err;
      std::set<int32_t> a(h.anchors.begin(), h.anchors.end());
      for (int32_t t : {0, 1, 37, 38, 39}) EXPECT_TRUE(a.count(t)) << t;
      for (int32_t t : h.anchors)
        if (t >= 2 && t < kBasisTokens - 3) err.push_back(t - 2);
      EXPECT_EQ(h.anchors.size(), 13u);
      test::expect_topk(cand, err, 8, strprintf("layer %d head %d", il, ih));
      EXPECT_TRUE(h.appends_dense);  // anchors: decoding buffers, re-encoded every T steps
    }
  // Applied: the anchors stay dense (epoch -1), everything else is in the basis.
  s->compress();
  const auto lay = s->cache().head_layout(1, 0);
  for (int32_t t = 0; t < kBasisTokens; ++t)
    EXPECT_EQ(lay.epoch[t] < 0,
              std::count(p.at(1, 0).anchors.begin(), p.at(1, 0).anchors.end(), t) == 1)
        << t;
}

// The OjaKV prefill step written out in scalar f64: pool (p), optional C / λ_max, one Oja step,
// Gram-Schmidt.
std::vector<double> scalar_oja(const std::vector<float>& U0, int d, int r,
                               const std::vector<float>& X, int p, double eta, bool spectral) {
  const size_t n = X.size() / d;
  std::vector<std::vector<double>> P;
  for (size_t g0 = 0; g0 < n; g0 += p) {
    std::vector<double> row(d, 0.0);
    const size_t g1 = std::min(n, g0 + p);
    for (size_t t = g0; t < g1; ++t)
      for (int a = 0; a < d; ++a) row[a] += X[t * d + a] / double(g1 - g0);
    P.push_back(row);
  }
  std::vector<double> C(d * d, 0.0);
  for (const auto& row : P)
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) C[a * d + b] += row[a] * row[b] / double(P.size());
  if (spectral) {  // λ_max by power iteration
    std::vector<double> v(d, 1.0), nv(d);
    double lam = 0;
    for (int it = 0; it < 2000; ++it) {
      double nn = 0;
      for (int a = 0; a < d; ++a) {
        nv[a] = 0;
        for (int b = 0; b < d; ++b) nv[a] += C[a * d + b] * v[b];
        nn += nv[a] * nv[a];
      }
      lam = std::sqrt(nn);
      for (int a = 0; a < d; ++a) v[a] = nv[a] / lam;
    }
    for (double& x : C) x /= lam;
  }
  std::vector<double> CU(d * r, 0.0), B(r * r, 0.0), V(d * r);
  for (int a = 0; a < d; ++a)
    for (int j = 0; j < r; ++j)
      for (int b = 0; b < d; ++b) CU[a * r + j] += C[a * d + b] * U0[b * r + j];
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < r; ++j)
      for (int a = 0; a < d; ++a) B[i * r + j] += U0[a * r + i] * CU[a * r + j];
  for (int a = 0; a < d; ++a)
    for (int j = 0; j < r; ++j) {
      double s = 0;
      for (int i = 0; i < r; ++i) s += U0[a * r + i] * B[i * r + j];
      V[a * r + j] = U0[a * r + j] + eta * (CU[a * r + j] - s);
    }
  for (int j = 0; j < r; ++j) {
    for (int pass = 0; pass < 2; ++pass)
      for (int i = 0; i < j; ++i) {
        double dot = 0;
        for (int a = 0; a < d; ++a) dot += V[a * r + i] * V[a * r + j];
        for (int a = 0; a < d; ++a) V[a * r + j] -= dot * V[a * r + i];
      }
    double nrm = 0;
    for (int a = 0; a < d; ++a) nrm += V[a * r + j] * V[a * r + j];
    for (int a = 0; a < d; ++a) V[a * r + j] /= std::sqrt(nrm);
  }
  return V;
}

TEST_F(BasisPress, OjaPrefillBasisIsOneScalarOjaStep) {
  test::CalibrationScope scope(cal());
  const auto prompt = tokens(kBasisTokens);
  const test::CaptureAll c = capture(prompt);
  for (const char* extra : {"", ",norm=none,eta=0.002"}) {
    const std::string spec =
        std::string("ojakv:ratio=0.5,prefill=full,pool=3,hybrid=0,sinks=0,recent=0") + extra;
    SCOPED_TRACE(spec);
    const bool spectral = std::string(extra).empty();
    const double eta = spectral ? 0.1 : 0.002;
    auto s = prefilled(spec, prompt);
    const CompressionPlan p = plan_with_model(*s);
    for (int il = 0; il < p.n_layer; ++il)
      for (int ih = 0; ih < p.n_head_kv; ++ih) {
        const HeadFit& f = cal()->fit(BasisMethod::kEigenAttention, il, ih);
        std::vector<float> K, V;
        for (int t = 0; t < kBasisTokens; ++t) {
          K.insert(K.end(), c.krow(il, t, ih), c.krow(il, t, ih) + c.d);
          V.insert(V.end(), c.vrow(il, t, ih), c.vrow(il, t, ih) + c.d);
        }
        const std::vector<double> wk = scalar_oja(f.k.enc_cols(8), c.d, 8, K, 3, eta, spectral);
        const std::vector<double> wv = scalar_oja(f.v.enc_cols(8), c.d, 8, V, 3, eta, spectral);
        const HeadPlan& h = p.at(il, ih);
        ASSERT_EQ(h.key.basis.size(), wk.size());
        for (size_t i = 0; i < wk.size(); ++i)
          EXPECT_NEAR(h.key.basis[i], wk[i], 2e-3) << il << "," << ih << "," << i;
        for (size_t i = 0; i < wv.size(); ++i)
          EXPECT_NEAR(h.value.basis[i], wv[i], 2e-3) << il << "," << ih << "," << i;
        // The step moved the basis (it is not the calibration's).
        EXPECT_GT(max_rel_diff(h.key.basis, f.k.enc_cols(8)), 1e-4);
        EXPECT_TRUE(h.appends_dense);
      }
  }
}

TEST_F(BasisPress, FullRankIsLossless) {
  test::CalibrationScope scope(cal());
  const auto prompt = tokens(kBasisTokens);
  Session ref(*model_, params());
  const std::vector<float> l0 = ref.prefill(prompt);
  const std::vector<float> l1 = ref.decode(9);
  for (const char* spec :
       {"ksvd:ratio=0", "eigenattention:ratio=0", "kqsvd:ratio=0", "staticpca:ratio=0",
        "ojakv:ratio=0", "ojakv:ratio=0,prefill=full", "ojakv:ratio=0,init=prompt"}) {
    SCOPED_TRACE(spec);
    Session s(*model_, params());
    s.set_press(make_press(spec));
    const std::vector<float> a = s.prefill(prompt);
    EXPECT_LT(max_rel_diff(a, l0), 1e-3);
    s.compress();
    const std::vector<float> b = s.decode(9);
    EXPECT_LT(max_rel_diff(b, l1), 1e-3);
    EXPECT_GE(s.cache().head_layout(0, 0).current_epoch, 0);  // it did compress
  }
}

TEST_F(BasisPress, LowrankPrefillReadsTheCompressedCache) {
  test::CalibrationScope scope(cal());
  const auto prompt = tokens(kBasisTokens);
  // The press's hook during a chunked prefill (16 tokens per forward call) ...
  Session s(*model_, params(16));
  s.set_press(make_press("staticpca:ratio=0.5"));
  const std::vector<float> hooked = s.prefill(prompt);
  // ... equals one forward call into a cache whose heads got the basis before any token.
  KvCacheConfig cfg = model_->cache_config(256);
  cfg.dtype = KvDtype::kF32;
  auto cache = make_kv_cache(cfg);
  CompressionPlan p(cfg.n_layer, cfg.n_head_kv);
  for (int il = 0; il < cfg.n_layer; ++il)
    for (int ih = 0; ih < cfg.n_head_kv; ++ih) {
      const HeadFit& f = cal()->fit(BasisMethod::kStaticPca, il, ih);
      HeadPlan& h = p.at(il, ih);
      h.key.rank = h.value.rank = 8;
      h.key.basis = f.k.enc_cols(8);
      h.value.basis = f.v.enc_cols(8);
    }
  cache->apply(p);
  std::vector<float> want(static_cast<size_t>(model_->hparams().n_vocab));
  model_->forward(prompt.data(), kBasisTokens, 0, *cache, want.data(), false, nullptr, nullptr);
  EXPECT_LT(max_rel_diff(hooked, want), 1e-4);
  Session plain(*model_, params());
  EXPECT_GT(max_rel_diff(plain.prefill(prompt), want), 1e-3);  // compression changed the prefill
  EXPECT_EQ(s.cache().bytes().keys, cache->bytes().keys);
  // compress() after the hook has nothing left to do.
  const size_t before = s.cache().bytes().total();
  s.compress();
  EXPECT_EQ(s.cache().bytes().total(), before);
}

TEST_F(BasisPress, OjaDecodeUpdatesStartNewEpochs) {
  test::CalibrationScope scope(cal());
  Session s(*model_, params(16));
  s.set_press(make_press("ojakv:ratio=0.5,T=4,sinks=1,recent=2,hybrid=0"));
  s.prefill(tokens(kBasisTokens));  // compressed during prefill (3 chunks)
  const auto after_prefill = s.cache().head_layout(1, 1);
  ASSERT_GE(after_prefill.current_epoch, 0);
  GenerateParams gp;
  gp.max_new_tokens = 13;
  gp.stop_at_eog = false;
  const auto r = s.generate({}, gp);  // 12 decode steps: updates after steps 4, 8, 12
  ASSERT_EQ(r.tokens.size(), 13u);
  EXPECT_EQ(s.n_past(), kBasisTokens + 12);
  EXPECT_EQ(s.press_updates(), 3);
  const int nh = model_->hparams().n_layer * model_->hparams().n_head_kv;
  EXPECT_EQ(total_tokens(s.cache()), nh * (kBasisTokens + 12));  // low rank keeps every token
  for (int il = 0; il < model_->hparams().n_layer; ++il)
    for (int ih = 0; ih < model_->hparams().n_head_kv; ++ih) {
      const auto lay = s.cache().head_layout(il, ih);
      std::vector<int32_t> pos;
      s.cache().read_head(il, ih, nullptr, nullptr, &pos);
      std::set<int32_t> dense, epochs;
      for (size_t t = 0; t < pos.size(); ++t) {
        if (lay.epoch[t] < 0)
          dense.insert(pos[t]);
        else
          epochs.insert(lay.epoch[t]);
      }
      // The sink and the recent window of the last update stay dense; the buffer of the last
      // update (48, 49) and the previous recent window (46, 47) are in the newest epoch.
      EXPECT_EQ(dense, (std::set<int32_t>{0, kBasisTokens + 10, kBasisTokens + 11}));
      for (size_t t = 0; t < pos.size(); ++t) {
        if (pos[t] >= kBasisTokens + 6 && pos[t] < kBasisTokens + 10) {
          EXPECT_EQ(lay.epoch[t], lay.current_epoch) << pos[t];
        }
      }
      // Every update started an epoch, and the head holds at most max_live_bases (2) of them:
      // the third update re-expressed the first two epochs' tokens in its basis.
      EXPECT_EQ(epochs.size(), 2u);
      EXPECT_TRUE(lay.appends_dense);
    }
  // Oja moved the basis, and it stayed orthonormal.
  const auto now = s.cache().head_layout(1, 1);
  ASSERT_EQ(now.basis_k.size(), after_prefill.basis_k.size());
  EXPECT_GT(max_rel_diff(now.basis_k, after_prefill.basis_k), 1e-6);
  EXPECT_NEAR(subspace_overlap(now.basis_k.data(), now.rank_k, now.basis_k.data(), now.rank_k, 16),
              1.0, 1e-4);
  // Keys and values shrank (an f32 cache, rank 8 of 16; 3 dense tokens).
  const KvBytes b = s.cache().bytes();
  EXPECT_LT(b.keys + b.values, static_cast<size_t>(nh) * (kBasisTokens + 12) * 16 * 4 * 2 * 6 / 10);
  const auto& lg = s.decode(3);
  for (float x : lg) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(BasisPress, OjaDecodeUpdateIsOneScalarOjaStepOnTheBuffer) {
  test::CalibrationScope scope(cal());
  Session s(*model_, params(16));
  s.set_press(make_press("ojakv:ratio=0.5,T=4,sinks=1,recent=4,hybrid=0,pool=2"));
  s.prefill(tokens(kBasisTokens));
  for (int i = 0; i < 3; ++i) s.decode(11 + i);
  EXPECT_EQ(s.press_updates(), 0);
  std::vector<KvCache::HeadLayout> before;
  for (int ih = 0; ih < 2; ++ih) before.push_back(s.cache().head_layout(2, ih));
  s.decode(20);  // the 4th decode step: update on the buffer, positions 40 .. 43
  EXPECT_EQ(s.press_updates(), 1);
  for (int ih = 0; ih < 2; ++ih) {
    const auto after = s.cache().head_layout(2, ih);
    EXPECT_GT(after.current_epoch, before[ih].current_epoch);
    std::vector<float> k, v, kb, vb;
    std::vector<int32_t> pos;
    s.cache().read_head(2, ih, &k, &v, &pos);
    for (size_t t = 0; t < pos.size(); ++t) {
      if (pos[t] < kBasisTokens) continue;
      ASSERT_LT(after.epoch[t], 0);  // recent=4: the whole buffer stays dense (exact rows)
      kb.insert(kb.end(), k.begin() + t * 16, k.begin() + (t + 1) * 16);
      vb.insert(vb.end(), v.begin() + t * 16, v.begin() + (t + 1) * 16);
    }
    ASSERT_EQ(kb.size(), 4u * 16);
    const std::vector<double> wk = scalar_oja(before[ih].basis_k, 16, 8, kb, 2, 0.01, true);
    const std::vector<double> wv = scalar_oja(before[ih].basis_v, 16, 8, vb, 2, 0.01, true);
    for (size_t i = 0; i < wk.size(); ++i) EXPECT_NEAR(after.basis_k[i], wk[i], 1e-4) << i;
    for (size_t i = 0; i < wv.size(); ++i) EXPECT_NEAR(after.basis_v[i], wv[i], 1e-4) << i;
  }
}

TEST_F(BasisPress, ComposedWithSnapkvMultipliesTheSaving) {
  test::CalibrationScope scope(cal());
  const auto prompt = tokens(kBasisTokens);
  const int nh = model_->hparams().n_layer * model_->hparams().n_head_kv;
  auto run = [&](const std::string& spec) {
    auto s = std::make_unique<Session>(*model_, params());
    s->set_press(make_press(spec));
    s->prefill(prompt);
    s->compress();
    return s;
  };
  // No anchors: exactly 20 tokens x rank 10 (of 16) per head, keys and values.
  auto c = run("snapkv:ratio=0.5+ojakv:ratio=0.4,prefill=full,sinks=0,recent=0,hybrid=0,T=4");
  EXPECT_EQ(total_tokens(c->cache()), nh * 20);
  EXPECT_EQ(c->cache().bytes().keys, static_cast<size_t>(nh) * 20 * 10 * 4);
  EXPECT_EQ(c->cache().bytes().values, static_cast<size_t>(nh) * 20 * 10 * 4);
  auto e = run("snapkv:ratio=0.5");
  EXPECT_EQ(e->cache().bytes().keys, static_cast<size_t>(nh) * 20 * 16 * 4);
  // snapkv does not re-evict at OjaKV's decode updates.
  GenerateParams gp;
  gp.max_new_tokens = 9;
  gp.stop_at_eog = false;
  c->generate({}, gp);
  EXPECT_EQ(c->press_updates(), 2);
  EXPECT_EQ(total_tokens(c->cache()), nh * 28);
  // Compressed during prefill, with anchors (a short recent window: the context is 40 tokens):
  // runs, and saves more than either alone.
  auto d = run("snapkv:ratio=0.5+ojakv:ratio=0.4,recent=4");
  auto o = run("ojakv:ratio=0.4,recent=4");
  EXPECT_EQ(total_tokens(d->cache()), nh * 20);
  const auto kv = [](const Session& s) {
    return s.cache().bytes().keys + s.cache().bytes().values;
  };
  EXPECT_LT(kv(*d), kv(*o));
  EXPECT_LT(kv(*d), kv(*e));
  for (float x : d->decode(5)) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(BasisPress, PplThroughoutRunsTheHook) {
  test::CalibrationScope scope(cal());
  std::vector<int32_t> win = tokens(32, 3);
  eval::PplConfig c;
  c.ctx = 32;
  c.mode = eval::PplMode::kThroughout;
  Session s(*model_, params(8));
  s.set_press(make_press("staticpca:ratio=0"));
  const eval::PplWindow lossless = eval::score_ppl_window(s, win, 0, c);
  EXPECT_NEAR(lossless.nll_press, lossless.nll_full, 1e-3 * std::abs(lossless.nll_full));
  EXPECT_EQ(lossless.n_compress, 4);  // one forward call per batch of 8
  s.set_press(make_press("ojakv:ratio=0.5,recent=2"));
  const eval::PplWindow w = eval::score_ppl_window(s, win, 0, c);
  EXPECT_NEAR(w.nll_full, lossless.nll_full,
              1e-6 * std::abs(lossless.nll_full));  // hooks off in the full pass
  EXPECT_GT(std::abs(w.nll_press - w.nll_full), 1e-4);
  EXPECT_GT(w.kv_bytes, 0);
  // Windows one after the other: reset() starts each from an uncompressed cache (no basis
  // left over from the previous window), so the full pass and the press pass repeat exactly.
  s.set_press(make_press("staticpca:ratio=0.5"));
  const eval::PplWindow a = eval::score_ppl_window(s, win, 0, c);
  const eval::PplWindow b = eval::score_ppl_window(s, win, 1, c);
  EXPECT_NEAR(a.nll_full, lossless.nll_full, 1e-9 * std::abs(lossless.nll_full));
  EXPECT_NEAR(b.nll_full, lossless.nll_full, 1e-9 * std::abs(lossless.nll_full));
  EXPECT_NEAR(a.nll_press, b.nll_press, 1e-9 * std::abs(a.nll_press));
  EXPECT_GT(std::abs(a.nll_press - a.nll_full), 1e-4);
  s.set_press(make_press("snapkv:ratio=0.5+ojakv:ratio=0.5"));
  EXPECT_TRUE(has(test::error_of([&] { eval::check_ppl_config(s, c); }), "use --mode pcc").empty());
}

TEST_F(BasisPress, ClearErrors) {
  set_calibration_override(nullptr);
  const auto prompt = tokens(kBasisTokens);
  // No calibration next to the tiny model: the message names the command.
  const std::string e = test::error_of([&] { prefilled("ksvd:ratio=0.5", prompt); });
  EXPECT_TRUE(has(e, "kvtrim calibrate -m " + model_->gguf().path()).empty()) << e;
  EXPECT_TRUE(has(e, ".kvcalib").empty()) << e;
  const std::string e2 = test::error_of([&] {
    prefilled("staticpca:calib=/nonexistent/x.kvcalib,prefill=full", prompt)->compress();
  });
  EXPECT_TRUE(has(e2, "-o /nonexistent/x.kvcalib").empty()) << e2;
  // init=prompt needs none.
  auto s = prefilled("ojakv:ratio=0.5,init=prompt", prompt);
  EXPECT_GE(s->cache().head_layout(0, 0).current_epoch, 0);
  // A calibration of another model.
  ModelFingerprint fp = cal()->fingerprint();
  fp.name = "another";
  auto other = std::make_shared<Calibration>(fp, cal()->n_layer(), cal()->n_head_kv());
  {
    test::CalibrationScope scope(other);
    const std::string e3 = test::error_of([&] { prefilled("ksvd", prompt); });
    EXPECT_TRUE(has(e3, "another model").empty()) << e3;
  }
  {  // ... and as a file: Calibration::load's error
    const std::string path = test::temp_dir("basis_calib") + "/other.kvcalib";
    other->save(path);
    const std::string e5 = test::error_of([&] { prefilled("ksvd:calib=" + path, prompt); });
    EXPECT_TRUE(has(e5, "was made for another model").empty()) << e5;
  }
  // Bad options.
  for (const auto& [spec, text] : std::vector<std::pair<std::string, std::string>>{
           {"ksvd:ratio=1", "out of range [0, 1)"},
           {"ojakv:energy=1.5", "out of range [0, 1]"},
           {"ojakv:prefill=half", "must be lowrank or full"},
           {"ojakv:init=random", "must be calib or prompt"},
           {"ojakv:norm=l2", "must be spectral or none"},
           {"staticpca:hybrid=1", "out of range [0, 1)"},
           {"kqsvd:sinks=-1", "must be >= 0"},
           {"ojakv:T=0", "must be >= 1"},
           {"ojakv:pool=0", "must be >= 1"},
           {"ojakv:eta=0", "'eta' must be > 0"},
           {"ksvd:eta=0.1", "has no option 'eta'"}}) {
    const std::string m = test::error_of([&s = spec] { make_press(s); });
    EXPECT_TRUE(has(m, text).empty()) << spec << ": " << m;
  }
  // Two feature-axis presses on the same heads.
  test::CalibrationScope scope(cal());
  const std::string e4 =
      test::error_of([&] { prefilled("staticpca:prefill=full+ksvd:prefill=full", prompt)->compress(); });
  EXPECT_TRUE(has(e4, "do not compose").empty()) << e4;
}

// Press::calibration_id (what an eval config records of the calibration a press reads): the
// file's stored checksum, another one for a file with other fits at the same path, joined over
// a composition, "" for presses that read none, "memory" for the in-memory override.
TEST_F(BasisPress, CalibrationIdNamesTheFitsRead) {
  set_calibration_override(nullptr);
  const std::string path = test::temp_dir("basis_calib_id") + "/a.kvcalib";
  Calibration base = *cal();
  base.set_stats({});  // (the fixture's partial statistics are not a savable set; the fits are)
  base.save(path);
  const std::string id = make_press("ksvd:calib=" + path)->calibration_id(*model_);
  EXPECT_EQ(id, Calibration::load(path).checksum());
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(make_press("snapkv:0.5+ksvd:calib=" + path)->calibration_id(*model_), id);
  EXPECT_EQ(make_press("eigenattention:calib=" + path + "+ksvd:calib=" + path)->calibration_id(*model_),
            id + "+" + id);
  EXPECT_EQ(make_press("snapkv:0.5")->calibration_id(*model_), "");
  EXPECT_EQ(make_press("ojakv:ratio=0.5,init=prompt")->calibration_id(*model_), "");
  // other fits written to the same path (`kvtrim calibrate` again): another identity. Here the
  // first K-SVD key direction of one head negated (still an orthonormal fit).
  {
    Calibration other = base;
    std::vector<HeadFit> fits;
    for (int il = 0; il < other.n_layer(); ++il)
      for (int ih = 0; ih < other.n_head_kv(); ++ih) fits.push_back(other.fit(BasisMethod::kKSvd, il, ih));
    SideFit& k = fits[0].k;
    for (int r = 0; r < k.d; ++r) k.enc[static_cast<size_t>(r * k.d)] *= -1.f;
    other.set_fits(BasisMethod::kKSvd, fits);
    other.save(path);
  }
  const std::string id2 = make_press("ksvd:calib=" + path)->calibration_id(*model_);
  EXPECT_NE(id2, id);
  EXPECT_EQ(id2, Calibration::load(path).checksum());
  {
    test::CalibrationScope scope(cal());
    EXPECT_EQ(make_press("ksvd")->calibration_id(*model_), "memory");
  }
  // a missing file: the press's own error, before any work
  const std::string e = test::error_of([&] { make_press("ksvd:calib=/nonexistent/x.kvcalib")->calibration_id(*model_); });
  EXPECT_TRUE(has(e, "does not exist").empty()) << e;
}

}  // namespace
}  // namespace kvtrim
