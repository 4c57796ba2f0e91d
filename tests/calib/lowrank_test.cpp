// Tests for src/calib/lowrank.{h,cpp}: orthonormalisation, Oja's subspace rule against a known
// spectrum, eigenvectors against a brute-force check, pooling and the OjaKV diagnostics.
#include "calib/lowrank.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"

namespace kvtrim {
namespace {

std::vector<float> random_matrix(int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> m(static_cast<size_t>(rows) * cols);
  for (float& x : m) x = nd(rng);
  return m;
}

// max |UᵀU − I| of U [d, r].
double orthonormality_error(const std::vector<float>& U, int d, int r) {
  double worst = 0.0;
  for (int a = 0; a < r; ++a) {
    for (int b = 0; b < r; ++b) {
      double s = 0.0;
      for (int i = 0; i < d; ++i) s += double(U[i * r + a]) * U[i * r + b];
      worst = std::max(worst, std::abs(s - (a == b ? 1.0 : 0.0)));
    }
  }
  return worst;
}

// A random orthonormal Q [d, d] (columns) for building known spectra.
std::vector<float> random_orthonormal(int d, int r, uint32_t seed) {
  std::vector<float> Q = random_matrix(d, r, seed);
  orthonormalize(Q.data(), d, r);
  return Q;
}

TEST(Lowrank, OrthonormalizeGivesOrthonormalColumnsWithPositiveRDiagonal) {
  const int d = 16, r = 6;
  std::vector<float> A = random_matrix(d, r, 1);
  std::vector<float> Q = A;
  orthonormalize(Q.data(), d, r);
  EXPECT_LT(orthonormality_error(Q, d, r), 1e-5);
  // R = QᵀA must be upper triangular with a positive diagonal (A = QR).
  for (int a = 0; a < r; ++a) {
    for (int b = 0; b < r; ++b) {
      double s = 0.0;
      for (int i = 0; i < d; ++i) s += double(Q[i * r + a]) * A[i * r + b];
      if (a > b) {
        EXPECT_NEAR(s, 0.0, 1e-4) << a << "," << b;
      }
      if (a == b) {
        EXPECT_GT(s, 0.0);
      }
    }
  }
  // An orthonormal input is unchanged.
  std::vector<float> Q2 = Q;
  orthonormalize(Q2.data(), d, r);
  for (size_t i = 0; i < Q.size(); ++i) EXPECT_NEAR(Q2[i], Q[i], 1e-6);
}

TEST(Lowrank, OrthonormalizeReplacesZeroAndDependentColumns) {
  const int d = 5, r = 4;
  std::vector<float> A(d * r, 0.0f);
  A[0 * r + 0] = 1.0f;                            // e0
  A[0 * r + 1] = 2.0f;                            // 2·e0: dependent
  /* column 2 stays zero */ A[3 * r + 3] = 1.0f;  // e3
  orthonormalize(A.data(), d, r);
  EXPECT_LT(orthonormality_error(A, d, r), 1e-6);
  EXPECT_NEAR(A[0 * r + 0], 1.0f, 1e-6);
  for (float x : A) EXPECT_TRUE(std::isfinite(x));
}

TEST(Lowrank, OjaStaysOrthonormalAndConvergesToTopEigenspace) {
  // Samples x = Q diag(sqrt(λ)) z with a known spectrum: the top-r eigenspace is Q[:, :r].
  const int d = 12, r = 3;
  const std::vector<double> lambda = {10, 8, 6, 1, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05};
  const std::vector<float> Q = random_orthonormal(d, d, 7);
  std::vector<float> top(d * r);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < r; ++j) top[i * r + j] = Q[i * d + j];

  std::vector<float> U = random_orthonormal(d, r, 99);
  const double so0 = subspace_overlap(U.data(), r, top.data(), r, d);
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int n = 64;
  std::vector<float> X(n * d);
  for (int step = 0; step < 300; ++step) {
    for (int t = 0; t < n; ++t) {
      std::vector<double> z(d);
      for (int j = 0; j < d; ++j) z[j] = nd(rng) * std::sqrt(lambda[j]);
      for (int i = 0; i < d; ++i) {
        double s = 0.0;
        for (int j = 0; j < d; ++j) s += Q[i * d + j] * z[j];
        X[t * d + i] = static_cast<float>(s);
      }
    }
    oja_update(U.data(), d, r, X.data(), n, 0.05);
    ASSERT_LT(orthonormality_error(U, d, r), 1e-5) << "step " << step;
  }
  const double so = subspace_overlap(U.data(), r, top.data(), r, d);
  EXPECT_LT(so0, 0.9);
  EXPECT_GT(so, 0.99);
}

TEST(Lowrank, OjaWithNoSamplesIsANoOp) {
  std::vector<float> U = random_orthonormal(6, 2, 5);
  const std::vector<float> before = U;
  oja_update(U.data(), 6, 2, nullptr, 0, 0.1);
  EXPECT_EQ(U, before);
}

TEST(Lowrank, OjaMatchesScalarFormula) {
  const int d = 6, r = 2, n = 5;
  std::vector<float> U = random_orthonormal(d, r, 11);
  const std::vector<float> X = random_matrix(n, d, 12);
  const double eta = 0.1;
  // Scalar reference: C = XᵀX/n; U + η(CU − U UᵀCU), then Gram-Schmidt.
  std::vector<double> C(d * d, 0.0);
  for (int t = 0; t < n; ++t)
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) C[a * d + b] += double(X[t * d + a]) * X[t * d + b] / n;
  std::vector<double> CU(d * r, 0.0), UtCU(r * r, 0.0), V(d * r);
  for (int a = 0; a < d; ++a)
    for (int j = 0; j < r; ++j)
      for (int b = 0; b < d; ++b) CU[a * r + j] += C[a * d + b] * U[b * r + j];
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < r; ++j)
      for (int a = 0; a < d; ++a) UtCU[i * r + j] += U[a * r + i] * CU[a * r + j];
  for (int a = 0; a < d; ++a)
    for (int j = 0; j < r; ++j) {
      double s = 0.0;
      for (int i = 0; i < r; ++i) s += U[a * r + i] * UtCU[i * r + j];
      V[a * r + j] = U[a * r + j] + eta * (CU[a * r + j] - s);
    }
  for (int j = 0; j < r; ++j) {
    for (int i = 0; i < j; ++i) {
      double dot = 0.0;
      for (int a = 0; a < d; ++a) dot += V[a * r + i] * V[a * r + j];
      for (int a = 0; a < d; ++a) V[a * r + j] -= dot * V[a * r + i];
    }
    double nrm = 0.0;
    for (int a = 0; a < d; ++a) nrm += V[a * r + j] * V[a * r + j];
    for (int a = 0; a < d; ++a) V[a * r + j] /= std::sqrt(nrm);
  }
  oja_update(U.data(), d, r, X.data(), n, eta);
  for (int i = 0; i < d * r; ++i) EXPECT_NEAR(U[i], V[i], 1e-5);
}

TEST(Lowrank, AvgPoolRows) {
  const std::vector<float> X = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // [5, 2]
  const std::vector<float> p2 = avg_pool_rows(X.data(), 5, 2, 2);
  ASSERT_EQ(p2.size(), 6u);
  const std::vector<float> want = {2, 3, 6, 7, 9, 10};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(p2[i], want[i]);
  EXPECT_EQ(avg_pool_rows(X.data(), 5, 2, 1), X);
  EXPECT_TRUE(avg_pool_rows(X.data(), 0, 2, 3).empty());
  EXPECT_THROW(avg_pool_rows(X.data(), 5, 2, 0), Error);
}

TEST(Lowrank, TopEigenvectorsMatchBruteForce) {
  const int d = 7, r = 4;
  const std::vector<float> A = random_matrix(20, d, 21);
  std::vector<double> G(d * d, 0.0);
  for (int t = 0; t < 20; ++t)
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) G[a * d + b] += double(A[t * d + a]) * A[t * d + b];
  std::vector<float> U;
  std::vector<double> eig;
  top_eigenvectors(G.data(), d, r, &U, &eig);
  ASSERT_EQ(U.size(), size_t(d * r));
  ASSERT_EQ(eig.size(), size_t(d));
  for (int j = 1; j < d; ++j) EXPECT_GE(eig[j - 1], eig[j]);
  EXPECT_LT(orthonormality_error(U, d, r), 1e-5);
  double trace = 0.0, eig_sum = 0.0;
  for (int a = 0; a < d; ++a) trace += G[a * d + a];
  for (double e : eig) eig_sum += e;
  EXPECT_NEAR(trace, eig_sum, 1e-6 * trace);
  for (int j = 0; j < r; ++j) {
    // G u = λ u.
    for (int a = 0; a < d; ++a) {
      double gu = 0.0;
      for (int b = 0; b < d; ++b) gu += G[a * d + b] * U[b * r + j];
      EXPECT_NEAR(gu, eig[j] * U[a * r + j], 1e-4 * eig[0]);
    }
    // Deterministic sign: the largest-magnitude entry is positive.
    int arg = 0;
    for (int a = 1; a < d; ++a)
      if (std::abs(U[a * r + j]) > std::abs(U[arg * r + j])) arg = a;
    EXPECT_GT(U[arg * r + j], 0.0f);
  }
  // A diagonal matrix: the eigenvectors are the sorted standard basis vectors.
  std::vector<double> D(9, 0.0);
  D[0] = 1.0, D[4] = 3.0, D[8] = 2.0;
  top_eigenvectors(D.data(), 3, 2, &U, nullptr);
  const std::vector<float> wantU = {0, 0, 1, 0, 0, 1};  // [3, 2]: e1, e2
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(U[i], wantU[i], 1e-9);
}

TEST(Lowrank, ResidualEnergyRatioAndSubspaceOverlapHandCases) {
  // X = [[3, 4, 0], [0, 0, 5]] and U = e0: residual energy = 16 + 25 of 50.
  const std::vector<float> X = {3, 4, 0, 0, 0, 5};
  const std::vector<float> e0 = {1, 0, 0};
  EXPECT_NEAR(residual_energy_ratio(X.data(), 2, 3, e0.data(), 1), 41.0 / 50.0, 1e-9);
  std::vector<double> G(9, 0.0);
  for (int t = 0; t < 2; ++t)
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b) G[a * 3 + b] += double(X[t * 3 + a]) * X[t * 3 + b];
  EXPECT_NEAR(residual_energy_ratio_gram(G.data(), 3, e0.data(), 1), 41.0 / 50.0, 1e-9);
  const std::vector<float> I3 = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  EXPECT_NEAR(residual_energy_ratio(X.data(), 2, 3, I3.data(), 3), 0.0, 1e-12);
  const std::vector<float> Z = {0, 0, 0};
  EXPECT_EQ(residual_energy_ratio(Z.data(), 1, 3, e0.data(), 1), 0.0);

  const int d = 8, r = 3;
  const std::vector<float> Q = random_orthonormal(d, d, 31);
  std::vector<float> U(d * r), W(d * (d - r));
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < r; ++j) U[i * r + j] = Q[i * d + j];
    for (int j = r; j < d; ++j) W[i * (d - r) + j - r] = Q[i * d + j];
  }
  EXPECT_NEAR(subspace_overlap(U.data(), r, U.data(), r, d), 1.0, 1e-6);
  EXPECT_NEAR(subspace_overlap(U.data(), r, W.data(), d - r, d), 0.0, 1e-6);
  EXPECT_NEAR(subspace_overlap(U.data(), r, Q.data(), d, d), 1.0, 1e-6);  // span(U) ⊆ R^d
  // Half-overlapping: U1 = [e0, e1], U2 = [e0, e2] → 1/2.
  const std::vector<float> U1 = {1, 0, 0, 1, 0, 0}, U2 = {1, 0, 0, 0, 0, 1};
  EXPECT_NEAR(subspace_overlap(U1.data(), 2, U2.data(), 2, 3), 0.5, 1e-9);
}

TEST(Lowrank, BadShapesThrow) {
  std::vector<float> U(6, 0.0f);
  EXPECT_THROW(orthonormalize(U.data(), 2, 3), Error);
  EXPECT_THROW(oja_update(U.data(), 3, 0, nullptr, 0, 0.1), Error);
}

}  // namespace
}  // namespace kvtrim
