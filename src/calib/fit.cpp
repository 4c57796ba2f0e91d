// Basis fits from calibration statistics (see fit.h). Small dense linear algebra in f64 with
// Eigen (d <= 256).
//
// KQ-SVD maths. With Grams G_Q = QᵀQ = L_Q L_Qᵀ and G_K = KᵀK = L_K L_Kᵀ (Cholesky), Q = O_Q L_Qᵀ
// and K = O_K L_Kᵀ for some O_Q, O_K with orthonormal columns, so Q·Kᵀ = O_Q (L_Qᵀ L_K) O_Kᵀ and
// its best rank-r approximation comes from the SVD L_Qᵀ L_K = P Σ Rᵀ: O_Q P_r Σ_r R_rᵀ O_Kᵀ.
// With E = L_K^{-T} R and D = L_Q^{-T} P Σ this is exactly Q D_r E_rᵀ Kᵀ (L_Qᵀ D_r = P_r Σ_r,
// E_rᵀ L_K = R_rᵀ), and D Eᵀ = I at full rank. Energies σ². Values: V = O_V L_Vᵀ,
// V·W_O = O_V L_Vᵀ W_O; eig(L_Vᵀ G_VO L_V) = P Λ Pᵀ gives the best rank-r approximation
// O_V P_r P_rᵀ L_Vᵀ W_O = V E_r D_rᵀ W_O with E = L_V^{-T} P, D = L_V P; energies λ.
#include "calib/fit.h"

#include <Eigen/Cholesky>
#include <Eigen/Eigenvalues>
#include <Eigen/SVD>
#include <algorithm>
#include <cmath>

#include "calib/lowrank.h"
#include "core/error.h"

namespace kvtrim {

namespace {

using Mat = Eigen::MatrixXd;

Mat from_rm(const std::vector<double>& g, int d) {
  KVTRIM_CHECK(g.size() == static_cast<size_t>(d) * d,
               "statistics matrix has %zu entries, expected %d x %d", g.size(), d, d);
  Mat m(d, d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) m(i, j) = g[static_cast<size_t>(i) * d + j];
  return m;
}

Mat from_rm_f(const std::vector<float>& g, int d, int r) {
  Mat m(d, r);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < r; ++j) m(i, j) = g[static_cast<size_t>(i) * r + j];
  return m;
}

std::vector<float> to_rm(const Mat& m) {
  std::vector<float> out(static_cast<size_t>(m.rows() * m.cols()));
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) out[i * m.cols() + j] = static_cast<float>(m(i, j));
  return out;
}

// Flips columns so that each column of E has its largest-magnitude entry positive (D's column
// flips with it, keeping D Eᵀ unchanged).
void fix_signs(Mat& E, Mat* D) {
  for (Eigen::Index j = 0; j < E.cols(); ++j) {
    Eigen::Index imax = 0;
    E.col(j).cwiseAbs().maxCoeff(&imax);
    if (E(imax, j) < 0) {
      E.col(j) *= -1;
      if (D) D->col(j) *= -1;
    }
  }
}

// Eigenvectors of a symmetric G sorted by decreasing eigenvalue (energies clamped at 0).
SideFit sym_eig_fit(const Mat& G) {
  const int d = static_cast<int>(G.rows());
  Eigen::SelfAdjointEigenSolver<Mat> es(0.5 * (G + G.transpose()));
  KVTRIM_CHECK(es.info() == Eigen::Success, "eigen-decomposition of a %d x %d Gram matrix failed",
               d, d);
  Mat U(d, d);
  SideFit f;
  f.d = d;
  f.energy.resize(d);
  for (int j = 0; j < d; ++j) {
    U.col(j) = es.eigenvectors().col(d - 1 - j);
    f.energy[j] = std::max(0.0, es.eigenvalues()(d - 1 - j));
  }
  fix_signs(U, nullptr);
  f.enc = to_rm(U);
  return f;
}

// Lower Cholesky factor of G; adds a relative jitter (1e-6·tr/d, growing) when G is not
// positive definite (rank-deficient statistics), and the identity for an all-zero G.
Mat cholesky(const Mat& G) {
  const int d = static_cast<int>(G.rows());
  const double tr = G.trace();
  double jitter = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    Mat A = 0.5 * (G + G.transpose());
    if (jitter > 0) A.diagonal().array() += jitter;
    Eigen::LLT<Mat> llt(A);
    if (llt.info() == Eigen::Success) return llt.matrixL();
    jitter = jitter == 0 ? (tr > 0 ? 1e-6 * tr / d : 1.0) : jitter * 10;
  }
  fail("Cholesky factorisation of a %d x %d Gram matrix failed (statistics not finite?)", d, d);
}

SideFit kq_keys(const HeadStats& s, int d) {
  const Mat LQ = cholesky(from_rm(s.gram_q, d)), LK = cholesky(from_rm(s.gram_k, d));
  Eigen::BDCSVD<Mat> svd(LQ.transpose() * LK, Eigen::ComputeFullU | Eigen::ComputeFullV);
  const Mat& P = svd.matrixU();
  const Mat& R = svd.matrixV();
  const Eigen::VectorXd sig = svd.singularValues();  // decreasing
  Mat E = LK.transpose().triangularView<Eigen::Upper>().solve(R);
  Mat D = LQ.transpose().triangularView<Eigen::Upper>().solve(P * sig.asDiagonal());
  fix_signs(E, &D);
  SideFit f;
  f.d = d;
  f.enc = to_rm(E);
  f.dec = to_rm(D);
  f.energy.resize(d);
  for (int j = 0; j < d; ++j) f.energy[j] = sig(j) * sig(j);
  return f;
}

SideFit kq_values(const HeadStats& s, int d) {
  KVTRIM_CHECK(!s.gram_vo.empty(), "KQ-SVD values need the W_O Gram (gram_vo) in the statistics");
  const Mat LV = cholesky(from_rm(s.gram_v, d));
  const Mat GVO = from_rm(s.gram_vo, d);
  Mat A = LV.transpose() * GVO * LV;
  Eigen::SelfAdjointEigenSolver<Mat> es(0.5 * (A + A.transpose()));
  KVTRIM_CHECK(es.info() == Eigen::Success, "eigen-decomposition for KQ-SVD values failed");
  Mat P(d, d);
  SideFit f;
  f.d = d;
  f.energy.resize(d);
  for (int j = 0; j < d; ++j) {
    P.col(j) = es.eigenvectors().col(d - 1 - j);
    f.energy[j] = std::max(0.0, es.eigenvalues()(d - 1 - j));
  }
  Mat E = LV.transpose().triangularView<Eigen::Upper>().solve(P);
  Mat D = LV * P;
  fix_signs(E, &D);
  f.enc = to_rm(E);
  f.dec = to_rm(D);
  return f;
}

int dim_of(const std::vector<double>& g) {
  const int d = static_cast<int>(std::lround(std::sqrt(static_cast<double>(g.size()))));
  KVTRIM_CHECK(d > 0 && static_cast<size_t>(d) * d == g.size(),
               "statistics Gram of %zu entries is not square", g.size());
  return d;
}

Mat trunc_product(const SideFit& f, int r, bool dec_enc) {
  // dec_enc: D_r E_rᵀ, else E_r D_rᵀ.
  const Mat E = from_rm_f(f.enc_cols(r), f.d, r), D = from_rm_f(f.dec_cols(r), f.d, r);
  return dec_enc ? Mat(D * E.transpose()) : Mat(E * D.transpose());
}

}  // namespace

HeadFit fit_head(BasisMethod m, const HeadStats& s) {
  const int dk = dim_of(s.gram_k), dv = dim_of(s.gram_v);
  HeadFit h;
  switch (m) {
    case BasisMethod::kKSvd:
      h.k = sym_eig_fit(from_rm(s.gram_k, dk));
      h.v = sym_eig_fit(from_rm(s.gram_v, dv));
      break;
    case BasisMethod::kEigenAttention:
    case BasisMethod::kStaticPca:
      h.k = sym_eig_fit(from_rm(s.gram_k, dk) + from_rm(s.gram_q, dk));
      h.v = sym_eig_fit(from_rm(s.gram_v, dv));
      break;
    case BasisMethod::kKqSvd:
      h.k = kq_keys(s, dk);
      h.v = kq_values(s, dv);
      break;
    case BasisMethod::kSwan:
      // P_QK: right singular vectors of S_QK = [Q_group; K] (eigenvectors of G_Q + G_K);
      // P_VO: of S_VO = [V; W_O,groupᵀ] (eigenvectors of G_V + Σ_h W_O^h W_O^hᵀ)
      KVTRIM_CHECK(s.gram_vo.size() == static_cast<size_t>(dv) * dv,
                   "swan fit: the statistics hold no W_O Gram (gram_vo)");
      h.k = sym_eig_fit(from_rm(s.gram_k, dk) + from_rm(s.gram_q, dk));
      h.v = sym_eig_fit(from_rm(s.gram_v, dv) + from_rm(s.gram_vo, dv));
      break;
  }
  return h;
}

std::vector<HeadFit> fit_all(BasisMethod m, const std::vector<HeadStats>& stats) {
  std::vector<HeadFit> out;
  out.reserve(stats.size());
  for (const HeadStats& s : stats) out.push_back(fit_head(m, s));
  return out;
}

double rer_gram(const std::vector<double>& G, int d, const std::vector<float>& U, int r) {
  KVTRIM_CHECK(G.size() == static_cast<size_t>(d) * d && U.size() == static_cast<size_t>(d) * r,
               "rer_gram: shapes do not match d = %d, r = %d", d, r);
  return residual_energy_ratio_gram(G.data(), d, U.data(), r);
}

double span_overlap(const std::vector<float>& U1, const std::vector<float>& U2, int d, int r) {
  KVTRIM_CHECK(U1.size() == static_cast<size_t>(d) * r && U2.size() == U1.size(),
               "span_overlap: shapes do not match d = %d, r = %d", d, r);
  std::vector<float> a = U1, b = U2;
  orthonormalize(a.data(), d, r);
  orthonormalize(b.data(), d, r);
  return subspace_overlap(a.data(), r, b.data(), r, d);
}

double kq_score_rel_error(const HeadStats& s, const SideFit& f, int r) {
  const int d = f.d;
  const Mat GQ = from_rm(s.gram_q, d), GK = from_rm(s.gram_k, d);
  const Mat M = Mat::Identity(d, d) - trunc_product(f, r, true);
  const double den = (GQ * GK).trace();
  return den > 0 ? (M.transpose() * GQ * M * GK).trace() / den : 0.0;
}

double vo_rel_error(const HeadStats& s, const SideFit& f, int r) {
  const int d = f.d;
  const Mat GV = from_rm(s.gram_v, d), GVO = from_rm(s.gram_vo, d);
  const Mat N = Mat::Identity(d, d) - trunc_product(f, r, false);
  const double den = (GV * GVO).trace();
  return den > 0 ? (N.transpose() * GV * N * GVO).trace() / den : 0.0;
}

}  // namespace kvtrim
