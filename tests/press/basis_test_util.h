// An in-memory calibration for the tiny press-test model (tests/press/basis_*_test.cpp):
// brute-force PCA fits of the keys / values of a capture run (and SWAN's [K; Q] / [V; W_Oᵀ]) (written here independently of
// src/calib/fit.cpp), an oblique KQ-SVD stand-in, installed with set_calibration_override.
#pragma once
#include <cmath>
#include <memory>
#include <vector>

#include "calib/calibration.h"
#include "calib/lowrank.h"
#include "ops/dequant.h"
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

inline std::vector<int32_t> calib_tokens() {
  std::vector<int32_t> t;
  for (int i = 0; i < 96; ++i) t.push_back((i * 53 + 17) % 250);
  return t;
}

}  // namespace kvtrim::test
