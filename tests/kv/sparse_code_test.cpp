// Orthogonal matching pursuit (src/kv/sparse_code.h) against its double-precision reference and
// against ground truth: exact recovery of planted sparse combinations, full representation at
// s = d, early stops (zero rows, a row that is one atom, duplicate atoms), bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/sparse_code.h"
#include "kv_test_util.h"
#include "test_util.h"

namespace kvtrim::kv {
namespace {

// N random unit atoms of dimension d, atom-major [N, d].
std::vector<float> random_atoms(int d, int N, std::mt19937& rng) {
  const std::vector<float> D = test::random_dictionary(d, N, rng);
  std::vector<float> A(D.size());
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < N; ++j) A[static_cast<size_t>(j) * d + i] = D[static_cast<size_t>(i) * N + j];
  return A;
}

// The dictionary layout omp_encode takes: D [d, N], column j = atom j.
std::vector<float> as_dict(const std::vector<float>& A, int d, int N) {
  std::vector<float> D(A.size());
  for (int j = 0; j < N; ++j)
    for (int i = 0; i < d; ++i) D[static_cast<size_t>(i) * N + j] = A[static_cast<size_t>(j) * d + i];
  return D;
}

using kvtest::randn;

// ‖x − Σ c_e a_idx(e)‖² / ‖x‖² of one row's code.
double rel_residual(const float* A, int d, const float* x, const int32_t* idx, const float* coef, int s) {
  double rr = 0, xx = 0;
  for (int i = 0; i < d; ++i) {
    double v = x[i];
    for (int e = 0; e < s; ++e) v -= static_cast<double>(coef[e]) * A[static_cast<size_t>(idx[e]) * d + i];
    rr += v * v;
    xx += static_cast<double>(x[i]) * x[i];
  }
  return xx > 0 ? rr / xx : rr;
}

TEST(SparseCode, MatchesTheDoubleReference) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  for (auto [d, N] : {std::pair{16, 48}, std::pair{32, 300}, std::pair{8, 8}}) {
    const std::vector<float> A = random_atoms(d, N, rng);
    const int64_t n = 150;
    const std::vector<float> X = randn(static_cast<size_t>(n * (d + 3)), rng);  // rows d + 3 apart
    for (int s : {1, 3, std::min(d, N) / 2, std::min(d, N)}) {
      SCOPED_TRACE("d " + std::to_string(d) + " N " + std::to_string(N) + " s " + std::to_string(s));
      std::vector<int32_t> i1(static_cast<size_t>(n * s)), i2(i1.size());
      std::vector<float> c1(i1.size()), c2(i1.size());
      omp_encode(as_dict(A, d, N).data(), d, N, X.data(), n, d + 3, s, i1.data(), c1.data(), &pool);
      omp_encode_reference(as_dict(A, d, N).data(), d, N, X.data(), n, d + 3, s, i2.data(), c2.data());
      int differ = 0;
      for (int64_t r = 0; r < n; ++r) {
        const bool same = std::equal(i1.begin() + r * s, i1.begin() + (r + 1) * s, i2.begin() + r * s);
        if (!same) {  // a near tie decided differently in f32: both codes must be as good
          differ += s < std::min(d, N) ? 1 : 0;  // (at s = min(d, N) the last picks fit a vanishing residual)
          const double e1 = rel_residual(A.data(), d, X.data() + r * (d + 3), i1.data() + r * s, c1.data() + r * s, s);
          const double e2 = rel_residual(A.data(), d, X.data() + r * (d + 3), i2.data() + r * s, c2.data() + r * s, s);
          EXPECT_NEAR(e1, e2, 0.05) << "row " << r;
          continue;
        }
        for (int e = 0; e < s; ++e) {
          ASSERT_LT(i1[static_cast<size_t>(r * s + e)], N);
          if (e > 0) {
            ASSERT_GT(i1[static_cast<size_t>(r * s + e)], i1[static_cast<size_t>(r * s + e - 1)]);
          }
          const float w = c2[static_cast<size_t>(r * s + e)];
          ASSERT_NEAR(c1[static_cast<size_t>(r * s + e)], w, 1e-3 * (1 + std::fabs(w))) << "row " << r << " entry " << e;
        }
      }
      EXPECT_LE(differ, n / 50) << "rows whose atoms differ from the reference";
      // the threaded and single-threaded runs are identical (blocks are independent)
      std::vector<int32_t> i3(i1.size());
      std::vector<float> c3(i1.size());
      omp_encode(as_dict(A, d, N).data(), d, N, X.data(), n, d + 3, s, i3.data(), c3.data(), nullptr);
      EXPECT_EQ(i3, i1);
      EXPECT_EQ(c3, c1);
    }
  }
}

TEST(SparseCode, RecoversPlantedSparseCombinations) {
  std::mt19937 rng(5);
  const int d = 64, N = 128, s = 3;
  const std::vector<float> A = random_atoms(d, N, rng);
  std::uniform_int_distribution<int> pick(0, N - 1);
  std::uniform_real_distribution<float> mag(0.5f, 2.f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int32_t> supp;
    while (static_cast<int>(supp.size()) < s) {
      const int j = pick(rng);
      if (std::find(supp.begin(), supp.end(), j) == supp.end()) supp.push_back(j);
    }
    std::sort(supp.begin(), supp.end());
    std::vector<float> coef(s), x(static_cast<size_t>(d), 0.f);
    for (int e = 0; e < s; ++e) {
      coef[static_cast<size_t>(e)] = mag(rng) * (rng() % 2 ? 1.f : -1.f);
      for (int i = 0; i < d; ++i) x[static_cast<size_t>(i)] += coef[static_cast<size_t>(e)] * A[static_cast<size_t>(supp[static_cast<size_t>(e)]) * d + i];
    }
    std::vector<int32_t> idx(s);
    std::vector<float> c(s);
    omp_encode(as_dict(A, d, N).data(), d, N, x.data(), 1, d, s, idx.data(), c.data());
    ASSERT_EQ(idx, supp) << "trial " << trial;
    for (int e = 0; e < s; ++e) EXPECT_NEAR(c[static_cast<size_t>(e)], coef[static_cast<size_t>(e)], 1e-4);
  }
}

TEST(SparseCode, FullSparsityRepresentsEveryRow) {
  std::mt19937 rng(9);
  const int d = 16, N = 40;
  const std::vector<float> A = random_atoms(d, N, rng);
  const std::vector<float> X = randn(static_cast<size_t>(30 * d), rng);
  std::vector<int32_t> idx(static_cast<size_t>(30 * d));
  std::vector<float> c(idx.size());
  omp_encode(as_dict(A, d, N).data(), d, N, X.data(), 30, d, d, idx.data(), c.data());
  for (int r = 0; r < 30; ++r)
    EXPECT_LT(rel_residual(A.data(), d, X.data() + r * d, idx.data() + r * d, c.data() + r * d, d), 1e-8);
}

TEST(SparseCode, EarlyStopsPadWithUnusedAtoms) {
  std::mt19937 rng(3);
  const int d = 8, N = 20, s = 4;
  std::vector<float> A = random_atoms(d, N, rng);
  // atom 5 duplicated as atom 6 (dependent); rows: zero, exactly atom 7 (scaled), atom 5
  std::copy(A.begin() + 5 * d, A.begin() + 6 * d, A.begin() + 6 * d);
  std::vector<float> X(static_cast<size_t>(3 * d), 0.f);
  for (int i = 0; i < d; ++i) {
    X[static_cast<size_t>(d + i)] = 2.5f * A[static_cast<size_t>(7 * d + i)];
    X[static_cast<size_t>(2 * d + i)] = -1.f * A[static_cast<size_t>(5 * d + i)];
  }
  for (bool ref : {false, true}) {
    std::vector<int32_t> idx(static_cast<size_t>(3 * s));
    std::vector<float> c(idx.size());
    if (ref) {
      omp_encode_reference(as_dict(A, d, N).data(), d, N, X.data(), 3, d, s, idx.data(), c.data());
    } else {
      omp_encode(as_dict(A, d, N).data(), d, N, X.data(), 3, d, s, idx.data(), c.data());
    }
    EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + s), (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(std::vector<float>(c.begin(), c.begin() + s), std::vector<float>(s, 0.f));
    EXPECT_EQ(std::vector<int32_t>(idx.begin() + s, idx.begin() + 2 * s), (std::vector<int32_t>{0, 1, 2, 7}));
    EXPECT_NEAR(c[static_cast<size_t>(s + 3)], 2.5f, 1e-5);
    for (int e = 0; e < 3; ++e) EXPECT_EQ(c[static_cast<size_t>(s + e)], 0.f);
    // atom 5 or its duplicate 6 (a tie up to rounding) once, then the residual is zero
    const std::vector<int32_t> third(idx.begin() + 2 * s, idx.end());
    EXPECT_TRUE(third == (std::vector<int32_t>{0, 1, 2, 5}) || third == (std::vector<int32_t>{0, 1, 2, 6}));
    EXPECT_NEAR(c[static_cast<size_t>(2 * s + 3)], -1.f, 1e-5);
  }
}

// fp8 storage: refitting the free coefficients after rounding each one (largest first) adds less
// error to the exact fit than rounding the least-squares coefficients directly (coherent atoms and
// a large common component, as Qwen's keys have), and every coefficient lands on the fp8 grid.
TEST(SparseCode, RefitRoundedBeatsPlainRoundingOnFp8) {
  std::mt19937 rng(21);
  const int d = 32, N = 96, s = 10;
  std::vector<float> A = random_atoms(d, N, rng);
  // a shared direction in every atom makes them coherent (large, cancelling coefficients)
  for (int j = 0; j < N; ++j) {
    double nn = 0;
    for (int i = 0; i < d; ++i) {
      A[static_cast<size_t>(j) * d + i] += (i == 0 ? 2.f : 0.f);
      nn += static_cast<double>(A[static_cast<size_t>(j) * d + i]) * A[static_cast<size_t>(j) * d + i];
    }
    for (int i = 0; i < d; ++i) A[static_cast<size_t>(j) * d + i] = static_cast<float>(A[static_cast<size_t>(j) * d + i] / std::sqrt(nn));
  }
  const std::vector<float> D = as_dict(A, d, N);
  const int64_t n = 200;
  std::vector<float> X = randn(static_cast<size_t>(n * d), rng);
  for (int64_t r = 0; r < n; ++r) X[static_cast<size_t>(r * d)] += 40.f;  // the outlier component
  std::vector<int32_t> idx(static_cast<size_t>(n * s));
  std::vector<float> c(idx.size());
  omp_encode(D.data(), d, N, X.data(), n, d, s, idx.data(), c.data());
  std::vector<float> plain = c, refit = c;
  for (int64_t r = 0; r < n; ++r) {
    float mx = 0;
    for (int e = 0; e < s; ++e) mx = std::max(mx, std::fabs(plain[static_cast<size_t>(r * s + e)]));
    for (int e = 0; e < s; ++e)
      plain[static_cast<size_t>(r * s + e)] = fp8_grid_round(plain[static_cast<size_t>(r * s + e)], mx / 448.f);
  }
  refit_rounded(D.data(), d, N, X.data(), n, d, s, idx.data(), refit.data(), fp8_grid_round, 448.f);
  double e_plain = 0, e_refit = 0, e_exact = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = X.data() + r * d;
    const int32_t* ir = idx.data() + r * s;
    e_plain += rel_residual(A.data(), d, xr, ir, plain.data() + r * s, s);
    e_refit += rel_residual(A.data(), d, xr, ir, refit.data() + r * s, s);
    e_exact += rel_residual(A.data(), d, xr, ir, c.data() + r * s, s);
    float mx = 0;
    for (int e = 0; e < s; ++e) mx = std::max(mx, std::fabs(refit[static_cast<size_t>(r * s + e)]));
    for (int e = 0; e < s; ++e) {  // on the grid of the row's scale
      const float v = refit[static_cast<size_t>(r * s + e)];
      ASSERT_EQ(fp8_grid_round(v, mx / 448.f), v) << "row " << r << " entry " << e;
    }
  }
  // the error the rounding adds to the exact fit's: at least halved
  EXPECT_LT(e_refit - e_exact, 0.5 * (e_plain - e_exact))
      << "exact " << e_exact / n << ", plain rounding " << e_plain / n << ", refit " << e_refit / n;
}

TEST(SparseCode, BadArgumentsAreErrors) {
  std::vector<float> A(16 * 4, 0.25f), x(4, 1.f), c(8);
  std::vector<int32_t> idx(8);
  EXPECT_THROW(omp_encode(A.data(), 4, 16, x.data(), 1, 4, 5, idx.data(), c.data()), Error);  // s > d
  EXPECT_THROW(omp_encode(A.data(), 4, 16, x.data(), 1, 4, 0, idx.data(), c.data()), Error);
  EXPECT_THROW(omp_encode(A.data(), 4, 2, x.data(), 1, 4, 3, idx.data(), c.data()), Error);  // s > N
}

}  // namespace
}  // namespace kvtrim::kv
