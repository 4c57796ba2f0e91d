// StiefAttention: the f32 decoder layer against the engine's forward pass, its backward pass
// and the QR / predictor gradients against finite differences, full rank = zero error, the
// allocation policies against brute force on hand-made surfaces, the calibration file section
// (round trip, version 1 still loads, damage), and the trainer on tiny models (resume from a
// checkpoint gives the same result as an uninterrupted run).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>

#include "../common/test_util.h"
#include "../common/tiny_model.h"
#include "calib/calibration.h"
#include "calib/capture.h"
#include "calib/fit.h"
#include "calib/stief_fits.h"
#include "calib/stief_layer.h"
#include "calib/stief_predictor.h"
#include "calib/stief_train.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "model/gguf.h"
#include "model/model.h"
#include "ops/matmul.h"

namespace kvtrim {
namespace {

std::vector<float> embed(const Model& m, const std::vector<int32_t>& toks) {
  const int64_t D = m.hparams().n_embd;
  std::vector<float> x(toks.size() * static_cast<size_t>(D));
  for (size_t t = 0; t < toks.size(); ++t) {
    get_row(m.tok_embd(), toks[t], x.data() + t * D);
    for (int64_t j = 0; j < D; ++j) x[t * D + j] *= m.hparams().embd_scale;
  }
  return x;
}

struct IoRecorder : ForwardObserver {
  std::vector<std::vector<float>> in, out;
  explicit IoRecorder(int n_layer) : in(n_layer), out(n_layer) {}
  void on_qkv(int, int64_t, const float*, const float*, const float*, const int32_t*) override {}
  bool wants_layer_io() const override { return true; }
  void on_layer_io(int il, int64_t n, const float* x_in, const float* x_out) override {
    const size_t cnt = static_cast<size_t>(n) * static_cast<size_t>(n_embd);
    in[il].assign(x_in, x_in + cnt);
    out[il].assign(x_out, x_out + cnt);
  }
  int64_t n_embd = 0;
};

class StiefArch : public ::testing::TestWithParam<Arch> {};

// The f32 layer (prepare_layer_seq's target y) reproduces the engine's layer outputs for the same
// inputs, layer after layer (its own outputs feeding the next layer).
TEST_P(StiefArch, LayerMatchesTheEngine) {
  const std::string dir = test::temp_dir("stief_layer");
  auto m = Model::load(test::write_tiny_model(test::tiny_spec(GetParam(), 3), dir));
  const HParams& hp = m->hparams();
  const std::vector<int32_t> toks = test::random_tokens(40, hp.n_vocab, 5);
  IoRecorder rec(hp.n_layer);
  rec.n_embd = hp.n_embd;
  KvCacheConfig cfg = m->cache_config(64);
  cfg.dtype = KvDtype::kF32;
  auto cache = make_kv_cache(cfg);
  std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
  m->forward(toks.data(), 40, 0, *cache, logits.data(), false, nullptr, &rec);
  std::vector<float> x = embed(*m, toks);
  for (int il = 0; il < hp.n_layer; ++il) {
    double dx = 0, nx = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      dx += (x[i] - rec.in[il][i]) * (x[i] - rec.in[il][i]);
      nx += rec.in[il][i] * rec.in[il][i];
    }
    EXPECT_LT(std::sqrt(dx / nx), 1e-4) << "layer " << il << " input";
    const LayerWeightsF32 w = layer_weights_f32(*m, il);
    LayerSeq s = prepare_layer_seq(*m, il, w, rec.in[il], nullptr);
    double d = 0, n = 0;
    for (size_t i = 0; i < s.y.size(); ++i) {
      d += (s.y[i] - rec.out[il][i]) * (s.y[i] - rec.out[il][i]);
      n += rec.out[il][i] * rec.out[il][i];
    }
    EXPECT_LT(std::sqrt(d / n), 1e-4) << "layer " << il << " output";
    LayerSeq mine = prepare_layer_seq(*m, il, w, x, nullptr);
    x = mine.y;
  }
}

// ε(P) and its gradient with respect to the key projector (shared) and the value projectors.
struct LossAt {
  const LayerWeightsF32& w;
  const LayerSeq& s;
  std::vector<int32_t> rows;
  double operator()(const std::vector<float>& pk, const std::vector<std::vector<float>>& pv,
                    std::vector<float>* gpk, std::vector<std::vector<float>>* gpv) const {
    LayerProjectors p;
    p.pk.push_back(pk.data());
    for (const auto& x : pv) p.pv.push_back(x.data());
    LayerTape t;
    double e2 = 0, y2 = 0;
    layer_forward(w, s, p, rows, &t, &e2, &y2);
    if (gpk || gpv) {
      const double c = 1.0 / (std::sqrt(e2) * std::sqrt(y2));
      std::vector<float> dout(t.out.size());
      const int64_t D = w.n_embd;
      for (size_t i = 0; i < rows.size(); ++i)
        for (int64_t j = 0; j < D; ++j)
          dout[i * D + j] = static_cast<float>(c * (t.out[i * D + j] - s.y[rows[i] * D + j]));
      layer_backward(w, s, p, t, dout, gpk, gpv);
    }
    return std::sqrt(e2 / y2);
  }
};

TEST_P(StiefArch, LayerBackwardMatchesFiniteDifferences) {
  const std::string dir = test::temp_dir("stief_fd");
  auto m = Model::load(test::write_tiny_model(test::tiny_spec(GetParam(), 4), dir));
  const HParams& hp = m->hparams();
  const int dk = hp.head_dim_k, dv = hp.head_dim_v;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  // every layer: gemma3's tiny spec has sliding-window (local) layers and a global one
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeightsF32 w = layer_weights_f32(*m, il);
    const LayerSeq s = prepare_layer_seq(*m, il, w, embed(*m, test::random_tokens(24, hp.n_vocab, 9 + il)), nullptr);
    LossAt loss{w, s, {0, 3, 7, 8, 15, 23}};
    // projectors near the identity (any matrices: the gradient formula does not need P = UUᵀ)
    auto near_id = [&](int d) {
      std::vector<float> P(static_cast<size_t>(d) * d);
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) P[i * d + j] = (i == j ? 0.8f : 0.f) + 0.1f * nd(rng);
      return P;
    };
    std::vector<float> pk = near_id(dk);
    std::vector<std::vector<float>> pv;
    for (int h = 0; h < hp.n_head_kv; ++h) pv.push_back(near_id(dv));
    std::vector<float> gpk;
    std::vector<std::vector<float>> gpv;
    loss(pk, pv, &gpk, &gpv);
    // directional derivatives along random directions, central differences
    for (int trial = 0; trial < 3; ++trial) {
      std::vector<float> dk_dir(pk.size());
      for (float& x : dk_dir) x = nd(rng);
      const float h = 1e-3f;  // 1e-2 is past the linear range of the softmax: 5-20 % truncation error
      double analytic = 0;
      for (size_t i = 0; i < pk.size(); ++i) analytic += static_cast<double>(gpk[i]) * dk_dir[i];
      std::vector<float> a = pk, b = pk;
      for (size_t i = 0; i < pk.size(); ++i) a[i] += h * dk_dir[i], b[i] -= h * dk_dir[i];
      const double fd = (loss(a, pv, nullptr, nullptr) - loss(b, pv, nullptr, nullptr)) / (2 * h);
      EXPECT_NEAR(analytic, fd, 2e-2 * std::max(1e-3, std::abs(fd)))
          << arch_name(GetParam()) << " layer " << il << " keys";
      const int hv = trial % hp.n_head_kv;
      std::vector<float> dv_dir(pv[hv].size());
      for (float& x : dv_dir) x = nd(rng);
      analytic = 0;
      for (size_t i = 0; i < dv_dir.size(); ++i) analytic += static_cast<double>(gpv[hv][i]) * dv_dir[i];
      auto va = pv, vb = pv;
      for (size_t i = 0; i < dv_dir.size(); ++i) va[hv][i] += h * dv_dir[i], vb[hv][i] -= h * dv_dir[i];
      const double fdv = (loss(pk, va, nullptr, nullptr) - loss(pk, vb, nullptr, nullptr)) / (2 * h);
      EXPECT_NEAR(analytic, fdv, 2e-2 * std::max(1e-3, std::abs(fdv)))
          << arch_name(GetParam()) << " layer " << il << " values head " << hv;
    }
  }
}

// At full rank (P = U·Uᵀ = I for a full orthonormal basis) the layer is exact.
TEST_P(StiefArch, FullRankPredictorGivesZeroError) {
  const std::string dir = test::temp_dir("stief_full");
  auto m = Model::load(test::write_tiny_model(test::tiny_spec(GetParam(), 6), dir));
  const HParams& hp = m->hparams();
  const LayerWeightsF32 w = layer_weights_f32(*m, 0);
  const LayerSeq s = prepare_layer_seq(*m, 0, w, embed(*m, test::random_tokens(20, hp.n_vocab, 2)), nullptr);
  const std::vector<float> feat = basis_features(s.k.data(), s.n * hp.n_head_kv, hp.head_dim_k, hp.head_dim_k);
  BasisPredictor pred(hp.head_dim_k, 16, 3, {});
  const std::vector<float> U = pred.predict(feat);
  const std::vector<float> Pk = projector(U.data(), hp.head_dim_k, hp.head_dim_k);
  BasisPredictor pv(hp.head_dim_v, 16, 4, {});
  const std::vector<float> V = pv.predict(basis_features(s.v.data(), s.n, hp.head_dim_v,
                                                         hp.n_head_kv * hp.head_dim_v));
  const std::vector<float> Pv = projector(V.data(), hp.head_dim_v, hp.head_dim_v);
  LayerProjectors p;
  p.pk.push_back(Pk.data());
  p.pv.push_back(Pv.data());
  LayerTape t;
  double e2 = 0, y2 = 0;
  std::vector<int32_t> rows(20);
  for (int i = 0; i < 20; ++i) rows[i] = i;
  layer_forward(w, s, p, rows, &t, &e2, &y2);
  EXPECT_LT(std::sqrt(e2 / y2), 1e-5);
  // and at half rank it is not
  const std::vector<float> Uh(U.begin(), U.end());
  std::vector<float> Ur(static_cast<size_t>(hp.head_dim_k) * (hp.head_dim_k / 2));
  for (int i = 0; i < hp.head_dim_k; ++i)
    for (int j = 0; j < hp.head_dim_k / 2; ++j) Ur[i * (hp.head_dim_k / 2) + j] = Uh[i * hp.head_dim_k + j];
  const std::vector<float> Ph = projector(Ur.data(), hp.head_dim_k, hp.head_dim_k / 2);
  p.pk[0] = Ph.data();
  layer_forward(w, s, p, rows, &t, &e2, &y2);
  EXPECT_GT(std::sqrt(e2 / y2), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Archs, StiefArch,
                         ::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kGemma3),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

TEST(StiefPredictor, QrGradientMatchesFiniteDifferences) {
  const int d = 6, r = 4;
  std::mt19937 rng(5);
  std::normal_distribution<double> nd(0, 1);
  std::vector<double> A(d * d), C(d * r);
  for (double& x : A) x = nd(rng);
  for (int i = 0; i < d; ++i) A[i * d + i] += 3;  // well conditioned
  for (double& x : C) x = nd(rng);
  auto loss = [&](const std::vector<double>& a) {  // Σ C ⊙ Q[:, :r]
    std::vector<double> Q, R;
    qr_positive(a, d, &Q, &R);
    double s = 0;
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < r; ++j) s += C[i * r + j] * Q[i * d + j];
    return s;
  };
  std::vector<double> Q, R;
  qr_positive(A, d, &Q, &R);
  // Q orthonormal, R upper triangular with a positive diagonal, QR = A
  for (int i = 0; i < d; ++i) {
    EXPECT_GT(R[i * d + i], 0);
    for (int j = 0; j < i; ++j) EXPECT_EQ(R[i * d + j], 0);
    for (int j = 0; j < d; ++j) {
      double qq = 0, qr = 0;
      for (int k = 0; k < d; ++k) qq += Q[k * d + i] * Q[k * d + j], qr += Q[i * d + k] * R[k * d + j];
      EXPECT_NEAR(qq, i == j ? 1 : 0, 1e-12);
      EXPECT_NEAR(qr, A[i * d + j], 1e-12);
    }
  }
  std::vector<double> qbar(d * d, 0);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < r; ++j) qbar[i * d + j] = C[i * r + j];
  const std::vector<double> g = qr_backward(Q, R, qbar, d);
  for (int e = 0; e < d * d; ++e) {
    std::vector<double> a = A, b = A;
    a[e] += 1e-6;
    b[e] -= 1e-6;
    EXPECT_NEAR(g[e], (loss(a) - loss(b)) / 2e-6, 1e-6) << "entry " << e;
  }
}

TEST(StiefPredictor, ParameterGradientMatchesFiniteDifferences) {
  const int d = 5, r = 3;
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> feat(2 * d), C(d * r);
  for (float& x : feat) x = nd(rng);
  for (float& x : C) x = nd(rng);
  for (const bool warm : {false, true}) {
    std::vector<float> init;
    if (warm) {  // an orthonormal start (the identity)
      init.assign(d * d, 0.f);
      for (int i = 0; i < d; ++i) init[i * d + i] = 1.f;
    }
    BasisPredictor p(d, 7, 2, init, 0.3);
    auto loss = [&]() {
      const std::vector<float> U = p.predict(feat);
      double s = 0;
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < r; ++j) s += static_cast<double>(C[i * r + j]) * U[i * d + j];
      return s;
    };
    loss();
    p.backward(C, r);
    const std::vector<double> g = p.grad();
    std::vector<double>& th = p.params();
    ASSERT_EQ(g.size(), th.size());
    for (size_t e = 0; e < th.size(); e += 7) {  // every 7th parameter (all four layers)
      const double keep = th[e];
      th[e] = keep + 1e-3;
      const double a = loss();
      th[e] = keep - 1e-3;
      const double b = loss();
      th[e] = keep;
      // U is f32: allow its rounding in the difference quotient
      EXPECT_NEAR(g[e], (a - b) / 2e-3, 2e-3 + 2e-3 * std::abs(g[e])) << "param " << e << " warm " << warm;
    }
    // the warm start (at the trainer's head scale) predicts (close to) its initial basis
    if (warm) {
      BasisPredictor p0(d, 7, 2, init);
      const std::vector<float> U = p0.predict(feat);
      double off = 0;
      for (int i = 0; i < d; ++i) off += std::abs(std::abs(U[i * d + i]) - 1.0);
      EXPECT_LT(off, 0.05);
    }
  }
}

// A hand-made StiefFits with 2 candidates (ranks 2, 3 of d = 4) and the given surfaces.
StiefFits hand_fits(const std::vector<std::vector<double>>& surfaces) {
  StiefFits f;
  f.dk = f.dv = 4;
  f.n_head_kv = 1;
  f.ranks_k = f.ranks_v = {2, 3};
  for (const auto& s : surfaces) {
    StiefLayerFit L;
    std::vector<float> I(16, 0.f);
    for (int i = 0; i < 4; ++i) I[i * 4 + i] = 1.f;
    L.key = {I, I};
    L.value = {{I}, {I}};
    L.surface = s;
    L.diag.assign(kDiagCount, 0.0);
    f.layers.push_back(L);
  }
  return f;
}

// Brute force: the smallest r_k + r_v with E <= eps over all pairs (ties: lower error).
LayerRankChoice brute_pick(const StiefFits& f, int il, double eps) {
  LayerRankChoice best{2, 2, f.surface(il, 2, 2)};
  int bt = 1 << 30;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      const double e = f.surface(il, i, j);
      const int t = f.rank_k(i) + f.rank_v(j);
      if (e <= eps && (t < bt || (t == bt && e < best.err))) best = {i, j, e}, bt = t;
    }
  return best;
}

TEST(StiefAllocation, PoliciesOnHandMadeSurfaces) {
  // rows: key index 0..2 (ranks 2, 3, 4); columns: value index (ranks 2, 3, 4)
  const std::vector<std::vector<double>> S = {
      {0.30, 0.20, 0.15, 0.12, 0.08, 0.05, 0.10, 0.04, 0.0},
      {0.60, 0.40, 0.35, 0.50, 0.20, 0.10, 0.45, 0.15, 0.0},
      {0.05, 0.04, 0.03, 0.04, 0.03, 0.02, 0.03, 0.02, 0.0},
  };
  const StiefFits f = hand_fits(S);
  for (double eps : {0.0, 0.03, 0.05, 0.1, 0.2, 0.35, 1.0}) {
    const auto pareto = allocate_ranks(f, RankAlloc::kPareto, eps);
    for (int il = 0; il < 3; ++il) {
      const LayerRankChoice b = brute_pick(f, il, eps);
      EXPECT_EQ(pareto[il].ik, b.ik) << "eps " << eps << " layer " << il;
      EXPECT_EQ(pareto[il].iv, b.iv) << "eps " << eps << " layer " << il;
      EXPECT_LE(pareto[il].err, eps == 0.0 ? 0.0 : eps);
    }
    // Uniform: one pair for all layers, mean error within the budget, no cheaper pair fits
    const auto uni = allocate_ranks(f, RankAlloc::kUniform, eps);
    const double mean = (f.surface(0, uni[0].ik, uni[0].iv) + f.surface(1, uni[0].ik, uni[0].iv) +
                         f.surface(2, uni[0].ik, uni[0].iv)) / 3;
    EXPECT_LE(mean, eps);
    for (int il = 1; il < 3; ++il) {
      EXPECT_EQ(uni[il].ik, uni[0].ik);
      EXPECT_EQ(uni[il].iv, uni[0].iv);
    }
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        const double mj = (f.surface(0, i, j) + f.surface(1, i, j) + f.surface(2, i, j)) / 3;
        if (mj <= eps) {
          EXPECT_GE(f.rank_k(i) + f.rank_v(j), f.rank_k(uni[0].ik) + f.rank_v(uni[0].iv));
        }
      }
  }
  // eps 0.1, layer 0: total 5 errs 0.12 / 0.20; total 6 has (3, 3) at 0.08 and (4, 2) at 0.10:
  // the tie goes to the lower error
  const auto p = allocate_ranks(f, RankAlloc::kPareto, 0.1);
  EXPECT_EQ(f.rank_k(p[0].ik), 3);
  EXPECT_EQ(f.rank_v(p[0].iv), 3);
  EXPECT_EQ(f.rank_k(p[2].ik) + f.rank_v(p[2].iv), 4);  // the easy layer compresses fully
}

TEST(StiefAllocation, WeightedParetoTightensTheEnds) {
  const std::vector<double> w = layer_weights(12);
  ASSERT_EQ(w.size(), 12u);
  double mean = 0;
  for (double x : w) mean += x;
  EXPECT_NEAR(mean / 12, 1.0, 1e-12);
  EXPECT_NEAR(w[0] / w[6], 2.0, 1e-12);
  EXPECT_NEAR(w[11] / w[6], 2.0, 1e-12);
  EXPECT_NEAR(w[1] / w[6], 1.75, 1e-12);
  EXPECT_NEAR(w[3] / w[6], 1.25, 1e-12);
  EXPECT_NEAR(w[4] / w[6], 1.0, 1e-12);
  EXPECT_NEAR(w[8] / w[6], 1.25, 1e-12);
  // 3 layers: every layer is an end; the ramp overlaps (max), then mean 1
  const std::vector<double> w3 = layer_weights(3);
  EXPECT_NEAR(w3[0], w3[2], 1e-12);
  EXPECT_GT(w3[0], w3[1]);
  // wpareto = pareto with eps / w
  const std::vector<double> s = {0.30, 0.20, 0.15, 0.12, 0.08, 0.05, 0.10, 0.04, 0.0};
  const StiefFits f = hand_fits(std::vector<std::vector<double>>(12, s));
  const auto wp = allocate_ranks(f, RankAlloc::kWeightedPareto, 0.1);
  for (int il = 0; il < 12; ++il) {
    const LayerRankChoice b = brute_pick(f, il, 0.1 / w[il]);
    EXPECT_EQ(wp[il].ik, b.ik) << il;
    EXPECT_EQ(wp[il].iv, b.iv) << il;
  }
  EXPECT_GT(f.rank_k(wp[0].ik) + f.rank_v(wp[0].iv), f.rank_k(wp[6].ik) + f.rank_v(wp[6].iv));
}

TEST(StiefAllocation, EigenThresholdWalk) {
  StiefFits f = hand_fits({{0, 0, 0, 0, 0, 0, 0, 0, 0}});
  f.layers[0].eig_tau = {0.5, 0.6, 0.7, 1.0};
  f.layers[0].eig_err = {0.4, 0.2, 0.25, 0.0};
  EXPECT_EQ(eigen_thresholds(f, 0.3)[0], 0.6);
  EXPECT_EQ(eigen_thresholds(f, 0.1)[0], 1.0);
  EXPECT_EQ(eigen_thresholds(f, 0.5)[0], 0.5);
  EXPECT_THROW(parse_rank_alloc("greedy"), Error);
  EXPECT_EQ(parse_rank_alloc("wpareto"), RankAlloc::kWeightedPareto);
}

// Trains on a tiny model twice: uninterrupted, and stopped after layer 0 then resumed from the
// checkpoint; the two give the same fits. Checks the shapes, the error surface's corner (full
// rank = 0), the monotone best-epoch bookkeeping and the calibration-file round trip.
TEST(StiefTrain, TinyModelTrainsResumesAndRoundTrips) {
  const std::string dir = test::temp_dir("stief_train");
  test::TinyModelSpec spec = test::tiny_spec(Arch::kQwen2, 7);
  auto m = Model::load(test::write_tiny_model(spec, dir));
  const HParams& hp = m->hparams();
  std::vector<std::vector<int32_t>> seqs;
  for (int i = 0; i < 5; ++i) seqs.push_back(test::random_tokens(32, hp.n_vocab, 100 + i));
  CalibCapture cap(*m, 0, 1);
  run_capture(*m, seqs, cap, nullptr);
  Calibration cal(model_fingerprint(*m), hp.n_layer, hp.n_head_kv);
  cal.set_stats(cap.stats());
  cal.set_fits(BasisMethod::kEigenAttention, fit_all(BasisMethod::kEigenAttention, cap.stats()));
  StiefTrainConfig cfg;
  cfg.fracs = {0.5, 0.75};
  cfg.max_epochs = 3;
  cfg.rows = 8;
  cfg.val_seqs = 2;
  cfg.val_rows = 8;
  cfg.hidden = 16;
  cfg.eig_step = 0.1;
  const StiefFits a = train_stief(*m, cal, seqs, cfg, nullptr, "");
  ASSERT_EQ(a.n_layer(), hp.n_layer);
  EXPECT_EQ(a.ranks_k, (std::vector<int>{8, 12}));
  const int nc = a.n_cand();
  for (int il = 0; il < a.n_layer(); ++il) {
    const StiefLayerFit& L = a.layers[il];
    EXPECT_EQ(a.surface(il, nc, nc), 0.0);  // (full, full)
    // a side's best validation error is the surface with the other side at full rank (the same
    // held-out rows, the same basis)
    for (int i = 0; i < nc; ++i) {
      EXPECT_NEAR(L.key_err[i], a.surface(il, i, nc), 1e-9) << il << " " << i;
      EXPECT_NEAR(L.value_err[i], a.surface(il, nc, i), 1e-9) << il << " " << i;
      EXPECT_GT(a.surface(il, i, i), 0.0);
      EXPECT_GE(L.key_epochs[i], 1);
    }
    EXPECT_GE(L.eig_tau.size(), 2u);
    EXPECT_EQ(L.eig_tau.back(), 1.0);
    for (double x : L.diag) EXPECT_TRUE(std::isfinite(x));
  }
  // resume: stop after layer 0 (the callback throws), then finish from the checkpoint
  const std::string ck = dir + "/stief.ckpt";
  EXPECT_THROW(train_stief(*m, cal, seqs, cfg, nullptr, ck,
                           [](const StiefLayerReport& r) {
                             if (r.layer == 0) fail("interrupted");
                           }),
               Error);
  ASSERT_TRUE(std::filesystem::exists(ck));
  int resumed_from = -1;
  const StiefFits b = train_stief(*m, cal, seqs, cfg, nullptr, ck, [&](const StiefLayerReport& r) {
    if (resumed_from < 0) resumed_from = r.layer;
  });
  EXPECT_EQ(resumed_from, 1);
  ASSERT_EQ(b.n_layer(), a.n_layer());
  for (int il = 0; il < a.n_layer(); ++il) {
    EXPECT_EQ(a.layers[il].key, b.layers[il].key) << il;
    EXPECT_EQ(a.layers[il].value, b.layers[il].value) << il;
    for (size_t i = 0; i < a.layers[il].surface.size(); ++i)
      EXPECT_NEAR(a.layers[il].surface[i], b.layers[il].surface[i], 1e-6) << il;
  }
  // a changed configuration does not resume from that checkpoint
  StiefTrainConfig other = cfg;
  other.seed = 43;
  int first = -1;
  train_stief(*m, cal, seqs, other, nullptr, ck, [&](const StiefLayerReport& r) {
    if (first < 0) first = r.layer;
  });
  EXPECT_EQ(first, 0);
  // ... nor do other sequences (same count and configuration, other lengths)
  train_stief(*m, cal, seqs, cfg, nullptr, ck);  // a checkpoint for `seqs` again
  std::vector<std::vector<int32_t>> shorter = seqs;
  for (auto& q : shorter) q.resize(30);
  first = -1;
  train_stief(*m, cal, shorter, cfg, nullptr, ck, [&](const StiefLayerReport& r) {
    if (first < 0) first = r.layer;
  });
  EXPECT_EQ(first, 0);

  // calibration file: round trip; version 2 with the section, and errors
  cal.set_stief(std::make_shared<StiefFits>(a));
  const std::string path = dir + "/tiny.kvcalib";
  cal.save(path);
  const Calibration back = Calibration::load(path, m.get());
  ASSERT_TRUE(back.has_stief());
  EXPECT_EQ(back.stief().ranks_v, a.ranks_v);
  for (int il = 0; il < a.n_layer(); ++il) {
    EXPECT_EQ(back.stief().layers[il].key, a.layers[il].key);
    for (size_t i = 0; i < a.layers[il].surface.size(); ++i)
      EXPECT_FLOAT_EQ(back.stief().layers[il].surface[i], a.layers[il].surface[i]);
    EXPECT_EQ(back.stief().layers[il].eig_tau.size(), a.layers[il].eig_tau.size());
  }
  // a file without the section says how to make one
  Calibration plain(model_fingerprint(*m), hp.n_layer, hp.n_head_kv);
  EXPECT_THROW(
      {
        try {
          plain.stief();
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("--stief"), std::string::npos);
          throw;
        }
      },
      Error);
  // a missing StiefAttention tensor is named
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  // a basis that is not orthonormal (past the checksum, as the fuzz target reads) is refused
  {
    std::string bad = bytes;
    const std::vector<float>& k0 = a.layers[0].key[0];
    const size_t at0 = bad.find(std::string(reinterpret_cast<const char*>(k0.data()), 16));
    ASSERT_NE(at0, std::string::npos);
    const float two[4] = {2.f, 2.f, 2.f, 2.f};
    std::memcpy(bad.data() + at0, two, sizeof two);
    auto g = GgufFile::from_memory("bad.kvcalib", bad.data(), bad.size());
    try {
      Calibration::from_gguf(*g, m.get(), false);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not orthonormal"), std::string::npos) << e.what();
    }
  }
  const std::string tn = "blk.1.stief.surface";
  const size_t at = bytes.find(tn);
  ASSERT_NE(at, std::string::npos);
  bytes[at + tn.size() - 1] = 'X';
  std::ofstream(dir + "/renamed.kvcalib", std::ios::binary) << bytes;
  try {
    Calibration::load(dir + "/renamed.kvcalib", m.get());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tn), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvtrim
