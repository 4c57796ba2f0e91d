// An in-memory calibration for the tiny press-test model (tests/press/basis_*_test.cpp):
// brute-force PCA fits of the keys / values of a capture run (and SWAN's [K; Q] / [V; W_Oᵀ]) (written here independently of
// src/calib/fit.cpp), an oblique KQ-SVD stand-in, installed with set_calibration_override.
#pragma once
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "calib/calibration.h"
#include "calib/lexico.h"
#include "calib/lowrank.h"
#include "calib/stief_fits.h"
#include "model/model.h"
#include "ops/dequant.h"
#include "ops/nn.h"
#include "press/basis/lowrank_press.h"
#include "press_fixture.h"

namespace kvtrim::test {

// Full PCA (d directions) of the rows of X [n, d] (uncentred), energies decreasing.
inline SideFit pca_fit(const std::vector<float>& X, int d) {
  const size_t n = X.size() / static_cast<size_t>(d);
  std::vector<double> G(static_cast<size_t>(d * d), 0.0);
  for (size_t t = 0; t < n; ++t)
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) G[a * d + b] += double(X[t * d + a]) * X[t * d + b];
  SideFit f;
  f.d = d;
  top_eigenvectors(G.data(), d, d, &f.enc, &f.energy);
  for (double& e : f.energy) e = std::max(0.0, e);
  return f;
}

// Oblique version of an orthonormal fit: E = U·diag(s), D = U·diag(1/s) (so D Eᵀ = U Uᵀ).
inline SideFit oblique_of(const SideFit& o) {
  SideFit f = o;
  f.dec = o.enc;
  for (int i = 0; i < o.d; ++i)
    for (int j = 0; j < o.d; ++j) {
      const float s = 1.5f + 0.25f * static_cast<float>(j % 3);
      f.enc[i * o.d + j] *= s;
      f.dec[i * o.d + j] /= s;
    }
  return f;
}

// Lexico dictionaries for the tiny model: kTinyAtoms random unit atoms per layer and side (seeded;
// the OMP codes are what the tests check, not how good the dictionaries are).
inline constexpr int kTinyAtoms = 40;
inline std::shared_ptr<LexicoDicts> tiny_lexico(int n_layer, int dk, int dv) {
  auto d = std::make_shared<LexicoDicts>();
  d->dk = dk;
  d->dv = dv;
  d->n_atoms = kTinyAtoms;
  d->sparsity_k = d->sparsity_v = 4;
  std::mt19937 rng(17);
  auto dict = [&](int dim) { return random_dictionary(dim, kTinyAtoms, rng); };
  for (int il = 0; il < n_layer; ++il) {
    d->k.push_back(dict(dk));
    d->v.push_back(dict(dv));
    d->k_err.push_back(0.5);
    d->v_err.push_back(0.5);
  }
  return d;
}

// The statistics Palu's whiten=calib reads (gram_k_pre, gram_v; the other Grams stay empty),
// brute force from a capture: RoPE undone with the reference rope at each token's position.
inline std::vector<HeadStats> tiny_stats(const Model& model, const CaptureAll& c) {
  const HParams& hp = model.hparams();
  const int d = hp.head_dim_k;
  std::vector<HeadStats> st;
  for (int il = 0; il < hp.n_layer; ++il) {
    const RopeSpec rs = layer_rope(hp, il, hp.n_ctx_train);  // (no LongRoPE in the tiny models)
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      HeadStats h;
      h.n_tokens = static_cast<int64_t>(c.pos.size());
      h.n_group = hp.n_head / hp.n_head_kv;
      h.gram_k_pre.assign(static_cast<size_t>(d * d), 0.0);
      h.gram_v.assign(static_cast<size_t>(d * d), 0.0);
      for (size_t t = 0; t < c.pos.size(); ++t) {
        std::vector<float> k(c.krow(il, static_cast<int64_t>(t), ih), c.krow(il, static_cast<int64_t>(t), ih) + d);
        ref::rope(k.data(), d, rs.n_rot, -c.pos[t], rs.base, rs.freq_scale, rs.neox);  // R_pos⁻¹ = R_{-pos}
        const float* v = c.vrow(il, static_cast<int64_t>(t), ih);
        for (int a = 0; a < d; ++a)
          for (int b = 0; b < d; ++b) {
            h.gram_k_pre[a * d + b] += double(k[a]) * k[b];
            h.gram_v[a * d + b] += double(v[a]) * v[b];
          }
      }
      st.push_back(std::move(h));
    }
  }
  return st;
}

// Fits of every method from a capture of `prompt` through the tiny model. ksvd / staticpca:
// PCA of keys; eigenattention: PCA of keys and the group's queries; kqsvd: oblique PCA.
inline std::shared_ptr<Calibration> tiny_calibration(const Model& model, const CaptureAll& c) {
  const HParams& hp = model.hparams();
  const int nl = hp.n_layer, nkv = hp.n_head_kv, d = hp.head_dim_k, g = hp.n_head / hp.n_head_kv;
  const size_t n = c.pos.size();
  auto cal = std::make_shared<Calibration>(model_fingerprint(model), nl, nkv);
  std::vector<HeadFit> ksvd, ea, kq, swan;
  for (int il = 0; il < nl; ++il) {
    // W_O [n_embd, n_head * d] dequantized: head h owns columns h·d .. (h+1)·d of each row
    const WeightView& wo = model.layers().at(static_cast<size_t>(il)).wo;
    std::vector<float> w(static_cast<size_t>(wo.n_rows * wo.n_cols));
    for (int64_t r = 0; r < wo.n_rows; ++r)
      dequantize_row(wo.type, static_cast<const uint8_t*>(wo.data) + r * wo.row_bytes, w.data() + r * wo.n_cols, wo.n_cols);
    for (int ih = 0; ih < nkv; ++ih) {
      std::vector<float> K, V, KQ;
      for (size_t t = 0; t < n; ++t) {
        K.insert(K.end(), c.krow(il, t, ih), c.krow(il, t, ih) + d);
        V.insert(V.end(), c.vrow(il, t, ih), c.vrow(il, t, ih) + d);
      }
      KQ = K;
      for (size_t t = 0; t < n; ++t)
        for (int gi = 0; gi < g; ++gi)
          KQ.insert(KQ.end(), c.qrow(il, t, ih * g + gi), c.qrow(il, t, ih * g + gi) + d);
      HeadFit f{pca_fit(K, d), pca_fit(V, d)};
      ksvd.push_back(f);
      ea.push_back(HeadFit{pca_fit(KQ, d), f.v});
      kq.push_back(HeadFit{oblique_of(f.k), oblique_of(f.v)});
      // SWAN's P_VO: the rows of [V; W_O,groupᵀ] (each W_O row's slice of each group head)
      std::vector<float> VO = V;
      for (int64_t r = 0; r < wo.n_rows; ++r)
        for (int gi = 0; gi < g; ++gi) {
          const float* x = w.data() + r * wo.n_cols + (ih * g + gi) * d;
          VO.insert(VO.end(), x, x + d);
        }
      swan.push_back(HeadFit{pca_fit(KQ, d), pca_fit(VO, d)});
    }
  }
  cal->set_fits(BasisMethod::kKSvd, ksvd);
  cal->set_fits(BasisMethod::kStaticPca, ksvd);
  cal->set_fits(BasisMethod::kEigenAttention, ea);
  cal->set_fits(BasisMethod::kKqSvd, kq);
  cal->set_fits(BasisMethod::kSwan, swan);
  cal->set_lexico(tiny_lexico(nl, hp.head_dim_k, hp.head_dim_v));
  cal->set_stats(tiny_stats(model, c));
  return cal;
}

// Installs the tiny calibration for the test's lifetime.
struct CalibrationScope {
  std::shared_ptr<Calibration> cal;
  explicit CalibrationScope(std::shared_ptr<Calibration> c) : cal(std::move(c)) {
    set_calibration_override(cal);
  }
  ~CalibrationScope() { set_calibration_override(nullptr); }
};

// Hand-made StiefAttention fits for the tiny model (candidates 4, 8, 12 of d = 16): random
// orthonormal bases (seeded), error surfaces that grow with depth and with the removed rank, an
// EigenAttention walk likewise; attached to a copy of `base`.
inline std::shared_ptr<Calibration> with_stief_fits(const Model& model, const Calibration& base) {
  const HParams& hp = model.hparams();
  auto f = std::make_shared<StiefFits>();
  f->dk = hp.head_dim_k;
  f->dv = hp.head_dim_v;
  f->n_head_kv = hp.n_head_kv;
  f->ranks_k = {4, 8, 12};
  f->ranks_v = {4, 8, 12};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  auto basis = [&](int d) {
    std::vector<float> U(static_cast<size_t>(d) * d);
    for (float& x : U) x = nd(rng);
    orthonormalize(U.data(), d, d);
    return U;
  };
  for (int il = 0; il < hp.n_layer; ++il) {
    StiefLayerFit L;
    for (int i = 0; i < 3; ++i) {
      L.key.push_back(basis(f->dk));
      L.value.emplace_back();
      for (int h = 0; h < hp.n_head_kv; ++h) L.value.back().push_back(basis(f->dv));
    }
    const double hard = 1.0 + il;  // errors grow with depth
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        L.surface.push_back(i == 3 && j == 3 ? 0.0 : hard * 0.01 * ((3 - i) * 1.3 + (3 - j)));
    L.eig_tau = {0.5, 0.8, 0.95, 1.0};
    L.eig_err = {hard * 0.3, hard * 0.1, hard * 0.03, 0.0};
    L.diag.assign(kDiagCount, 0.0);
    f->layers.push_back(L);
  }
  auto c = std::make_shared<Calibration>(base);
  c->set_stief(f);
  return c;
}

inline std::vector<int32_t> calib_tokens() {
  std::vector<int32_t> t;
  for (int i = 0; i < 96; ++i) t.push_back((i * 53 + 17) % 250);
  return t;
}

}  // namespace kvtrim::test
