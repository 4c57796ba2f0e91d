// Small dense linear algebra for the low-rank KV methods (see lowrank.h). Everything is computed
// in f64 internally (bases are f32 at the interface): d is a head dimension (64..256), so the
// cost is dominated by the O(n·d·r) products with the sample matrix, which go through Eigen.
#include "calib/lowrank.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kvtrim {

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapCF = Eigen::Map<const MatF>;
using MapF = Eigen::Map<MatF>;
using MapCD = Eigen::Map<const MatD>;

// Modified Gram-Schmidt with one re-orthogonalisation pass ("twice is enough"), in place on
// the columns of Q [d, r] (f64). For a full-rank input this is the Q of the QR factorisation
// whose R has a positive diagonal. A column whose remainder is numerically zero (relative to
// its original norm, or absolutely zero) is replaced by the standard basis vector least
// represented in the previous columns, orthogonalised the same way: deterministic, and it
// always exists because j < r <= d.
void mgs_in_place(MatD& Q) {
  const int d = static_cast<int>(Q.rows());
  const int r = static_cast<int>(Q.cols());
  for (int j = 0; j < r; ++j) {
    const double norm0 = Q.col(j).norm();
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < j; ++i) Q.col(j) -= Q.col(i).dot(Q.col(j)) * Q.col(i);
    }
    double norm = Q.col(j).norm();
    if (!(norm > 1e-10 * norm0) || !(norm > 1e-300) || !std::isfinite(norm)) {
      // Pick e_m with the smallest energy in span(Q[:, :j]).
      int best = 0;
      double best_e = 2.0;
      for (int m = 0; m < d; ++m) {
        double e = 0.0;
        for (int i = 0; i < j; ++i) e += Q(m, i) * Q(m, i);
        if (e < best_e - 1e-12) {
          best_e = e;
          best = m;
        }
      }
      Q.col(j).setZero();
      Q(best, j) = 1.0;
      for (int pass = 0; pass < 2; ++pass) {
        for (int i = 0; i < j; ++i) Q.col(j) -= Q.col(i).dot(Q.col(j)) * Q.col(i);
      }
      norm = Q.col(j).norm();
    }
    Q.col(j) /= norm;
  }
}

void check_shape(int d, int r, const char* fn) {
  KVTRIM_CHECK(d >= 1 && r >= 1 && r <= d, "%s: bad basis shape [%d, %d] (need 1 <= r <= d)", fn, d,
               r);
}

}  // namespace

std::vector<float> first_columns(const std::vector<float>& U, int d, int r) {
  std::vector<float> o(static_cast<size_t>(d) * static_cast<size_t>(r));
  for (int i = 0; i < d; ++i)
    std::copy_n(U.data() + static_cast<size_t>(i) * static_cast<size_t>(d), r,
                o.data() + static_cast<size_t>(i) * static_cast<size_t>(r));
  return o;
}

void orthonormalize(float* U, int d, int r) {
  check_shape(d, r, "orthonormalize");
  MatD Q = MapCF(U, d, r).cast<double>();
  mgs_in_place(Q);
  MapF(U, d, r) = Q.cast<float>();
}

void oja_update(float* U, int d, int r, const float* X, int64_t n, double eta) {
  check_shape(d, r, "oja_update");
  KVTRIM_CHECK(n >= 0, "oja_update: negative sample count %lld", static_cast<long long>(n));
  if (n == 0) return;
  // C U = Xᵀ (X U) / n and Uᵀ C U = (X U)ᵀ (X U) / n: never form the [d, d] covariance
  // through a loop over tokens; X U is one [n, d] x [d, r] product.
  const MatD Ud = MapCF(U, d, r).cast<double>();
  const MatD XU = (MapCF(X, n, d) * MapCF(U, d, r)).cast<double>();  // [n, r]
  const MatD Xd = MapCF(X, n, d).cast<double>();
  const MatD CU = (Xd.transpose() * XU) / static_cast<double>(n);  // [d, r]
  const MatD UtCU = Ud.transpose() * CU;                           // [r, r]
  MatD Unew = Ud + eta * (CU - Ud * UtCU);
  mgs_in_place(Unew);
  MapF(U, d, r) = Unew.cast<float>();
}

std::vector<float> avg_pool_rows(const float* X, int64_t n, int d, int p) {
  KVTRIM_CHECK(p >= 1, "avg_pool_rows: pool size must be >= 1, got %d", p);
  KVTRIM_CHECK(n >= 0 && d >= 1, "avg_pool_rows: bad shape [%lld, %d]", static_cast<long long>(n),
               d);
  const int64_t m = (n + p - 1) / p;
  std::vector<float> out(static_cast<size_t>(m) * d, 0.0f);
  std::vector<double> acc(d);
  for (int64_t g = 0; g < m; ++g) {
    const int64_t t0 = g * p, t1 = std::min<int64_t>(n, t0 + p);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t t = t0; t < t1; ++t) {
      const float* x = X + t * d;
      for (int c = 0; c < d; ++c) acc[c] += x[c];
    }
    const double inv = 1.0 / static_cast<double>(t1 - t0);
    for (int c = 0; c < d; ++c) out[g * d + c] = static_cast<float>(acc[c] * inv);
  }
  return out;
}

void top_eigenvectors(const double* G, int d, int r, std::vector<float>* U,
                      std::vector<double>* eig) {
  check_shape(d, r, "top_eigenvectors");
  MatD S = MapCD(G, d, d);
  S = 0.5 * (S + S.transpose()).eval();  // tolerate rounding asymmetry
  Eigen::SelfAdjointEigenSolver<MatD> es(S);
  KVTRIM_CHECK(es.info() == Eigen::Success, "top_eigenvectors: eigen-decomposition failed");
  // Eigen sorts eigenvalues increasingly: column d-1-j is the j-th largest.
  if (U) {
    U->assign(static_cast<size_t>(d) * r, 0.0f);
    for (int j = 0; j < r; ++j) {
      Eigen::VectorXd v = es.eigenvectors().col(d - 1 - j);
      int arg = 0;
      for (int i = 1; i < d; ++i) {
        if (std::abs(v(i)) > std::abs(v(arg)) + 1e-12) arg = i;
      }
      if (v(arg) < 0) v = -v;
      for (int i = 0; i < d; ++i) (*U)[static_cast<size_t>(i) * r + j] = static_cast<float>(v(i));
    }
  }
  if (eig) {
    eig->resize(d);
    for (int j = 0; j < d; ++j) (*eig)[j] = es.eigenvalues()(d - 1 - j);
  }
}

double residual_energy_ratio(const float* X, int64_t n, int d, const float* U, int r) {
  check_shape(d, r, "residual_energy_ratio");
  if (n <= 0) return 0.0;
  const MatD Xd = MapCF(X, n, d).cast<double>();
  const MatD Ud = MapCF(U, d, r).cast<double>();
  const double total = Xd.squaredNorm();
  if (total <= 0.0) return 0.0;
  const MatD R = Xd - (Xd * Ud) * Ud.transpose();
  return R.squaredNorm() / total;
}

double residual_energy_ratio_gram(const double* G, int d, const float* U, int r) {
  check_shape(d, r, "residual_energy_ratio_gram");
  const MapCD Gm(G, d, d);
  const double tr = Gm.trace();
  if (tr <= 0.0) return 0.0;
  const MatD Ud = MapCF(U, d, r).cast<double>();
  const double kept = (Ud.transpose() * Gm * Ud).trace();
  return 1.0 - kept / tr;
}

double subspace_overlap(const float* U1, int r1, const float* U2, int r2, int d) {
  check_shape(d, r1, "subspace_overlap");
  check_shape(d, r2, "subspace_overlap");
  const MatD A = MapCF(U1, d, r1).cast<double>();
  const MatD B = MapCF(U2, d, r2).cast<double>();
  return (A.transpose() * B).squaredNorm() / static_cast<double>(r1);
}

}  // namespace kvtrim
