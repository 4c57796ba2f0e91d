// Orthogonal matching pursuit (sparse_code.h). The batched version keeps, per row of a block,
// the picked atoms (gathered out of D's columns once, contiguous), the Cholesky factor of their
// Gram matrix (double) and the residual (f32); each step's correlations of the whole block with
// every atom are one sgemm (block x d x N), the only O(N) work per row and step.
#include "kv/sparse_code.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/quant_formats.h"

namespace kvtrim::kv {
namespace {

constexpr double kResidualTol = 1e-12;  // relative ‖r‖² at which a row is fully represented
constexpr double kPivotTol = 1e-6;      // Cholesky pivot² below which an atom is dependent

double dot_d(const float* a, const float* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Solves L Lᵀ γ = b for the leading k x k block of L (row-major, stride ld).
void chol_solve(const double* L, int ld, int k, const double* b, double* g) {
  for (int i = 0; i < k; ++i) {  // L y = b
    double v = b[i];
    for (int j = 0; j < i; ++j) v -= L[i * ld + j] * g[j];
    g[i] = v / L[i * ld + i];
  }
  for (int i = k - 1; i >= 0; --i) {  // Lᵀ γ = y
    double v = g[i];
    for (int j = i + 1; j < k; ++j) v -= L[j * ld + i] * g[j];
    g[i] = v / L[i * ld + i];
  }
}

// Factors the symmetric positive definite k x k matrix M (row-major) as L Lᵀ (L lower, row-major
// k x k, written in full); false when a pivot² is <= kPivotTol (a dependent atom).
bool chol_factor(const double* M, int k, double* L) {
  std::fill(L, L + static_cast<size_t>(k) * k, 0.0);
  for (int a = 0; a < k; ++a)
    for (int c = 0; c <= a; ++c) {
      double v = M[static_cast<size_t>(a) * k + c];
      for (int j = 0; j < c; ++j) v -= L[static_cast<size_t>(a) * k + j] * L[static_cast<size_t>(c) * k + j];
      if (a == c) {
        if (!(v > kPivotTol)) return false;
        L[static_cast<size_t>(a) * k + a] = std::sqrt(v);
      } else {
        L[static_cast<size_t>(a) * k + c] = v / L[static_cast<size_t>(c) * k + c];
      }
    }
  return true;
}

// Writes a row's code sorted by atom, padding slots [k, s) with the lowest unused atoms.
void finish_row(const int32_t* sel, const double* gamma, int k, int s, int32_t* idx, float* coef) {
  std::vector<std::pair<int32_t, float>> e;
  e.reserve(static_cast<size_t>(s));
  for (int i = 0; i < k; ++i) e.push_back({sel[i], static_cast<float>(gamma[i])});
  std::sort(e.begin(), e.end());
  int32_t next = 0;
  size_t at = 0;
  while (static_cast<int>(e.size()) < s) {  // lowest atoms not picked (e is sorted)
    while (at < static_cast<size_t>(k) && e[at].first < next) ++at;
    if (at < static_cast<size_t>(k) && e[at].first == next) {
      ++next;
      continue;
    }
    e.push_back({next++, 0.f});
  }
  std::sort(e.begin(), e.end());
  for (int i = 0; i < s; ++i) {
    idx[i] = e[static_cast<size_t>(i)].first;
    coef[i] = e[static_cast<size_t>(i)].second;
  }
}

struct RowState {
  int k = 0;
  bool done = false;
  double xx = 0;
};

// One block of nb rows.
void omp_block(const float* D, int d, int N, const float* x, int64_t nb, int64_t ldx, int s,
               int32_t* idx, float* coef) {
  thread_local std::vector<float> R, C, P;  // P [nb, s, d]: each row's picked atoms
  thread_local std::vector<double> L, b, g;
  thread_local std::vector<int32_t> sel;
  thread_local std::vector<RowState> st;
  const size_t ss = static_cast<size_t>(s) * s;
  R.resize(static_cast<size_t>(nb) * d);
  P.resize(static_cast<size_t>(nb) * s * d);
  C.resize(static_cast<size_t>(nb) * N);
  L.assign(static_cast<size_t>(nb) * ss, 0.0);
  b.resize(static_cast<size_t>(nb) * s);
  g.resize(static_cast<size_t>(nb) * s);
  sel.resize(static_cast<size_t>(nb) * s);
  st.assign(static_cast<size_t>(nb), RowState{});
  for (int64_t r = 0; r < nb; ++r) {
    std::copy(x + r * ldx, x + r * ldx + d, R.data() + r * d);
    st[static_cast<size_t>(r)].xx = dot_d(x + r * ldx, x + r * ldx, d);
    st[static_cast<size_t>(r)].done = !(st[static_cast<size_t>(r)].xx > 0);
  }
  for (int step = 0; step < s; ++step) {
    bool any = false;
    for (const RowState& q : st) any = any || !q.done;
    if (!any) break;
    // C [nb, N] = R [nb, d] · D: one sgemm for a block; a few rows (a decode step's token
    // leaving the buffer) take sgemv, which reads D in place instead of packing it first
    if (nb <= 2) {
      for (int64_t r = 0; r < nb; ++r)
        if (!st[static_cast<size_t>(r)].done)
          cblas_sgemv(CblasRowMajor, CblasTrans, d, N, 1.f, D, N, R.data() + r * d, 1, 0.f, C.data() + r * N, 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(nb), N, d, 1.f, R.data(), d, D, N,
                  0.f, C.data(), N);
    }
    for (int64_t r = 0; r < nb; ++r) {
      RowState& q = st[static_cast<size_t>(r)];
      if (q.done) continue;
      float* c = C.data() + r * N;
      int32_t* sl = sel.data() + r * s;
      for (int i = 0; i < q.k; ++i) c[sl[i]] = 0.f;  // picked atoms are never picked again
      int32_t best = 0;
      float bm = -1.f;
      for (int j = 0; j < N; ++j) {
        const float m = std::fabs(c[j]);
        if (m > bm) {
          bm = m;
          best = j;
        }
      }
      const int k = q.k;
      float* pr = P.data() + static_cast<size_t>(r) * s * d;  // this row's picked atoms
      float* a = pr + static_cast<size_t>(k) * d;
      for (int i = 0; i < d; ++i) a[i] = D[static_cast<int64_t>(i) * N + best];
      double* Lr = L.data() + static_cast<size_t>(r) * ss;
      double w2 = 0;
      for (int i = 0; i < k; ++i) {  // w = L⁻¹ (A_Sᵀ a), row k of L
        double v = dot_d(pr + static_cast<size_t>(i) * d, a, d);
        for (int j = 0; j < i; ++j) v -= Lr[k * s + j] * Lr[i * s + j];
        v /= Lr[i * s + i];
        Lr[k * s + i] = v;
        w2 += v * v;
      }
      const double p2 = dot_d(a, a, d) - w2;
      if (!(p2 > kPivotTol) || !(bm > 0)) {
        q.done = true;
        continue;
      }
      Lr[k * s + k] = std::sqrt(p2);
      double* br = b.data() + r * s;
      double* gr = g.data() + r * s;
      br[k] = dot_d(a, x + r * ldx, d);
      sl[k] = best;
      q.k = k + 1;
      chol_solve(Lr, s, q.k, br, gr);
      if (q.k == s) continue;  // no further step needs the residual
      float* rr = R.data() + r * d;
      const float* xr = x + r * ldx;
      std::copy(xr, xr + d, rr);
      for (int i = 0; i < q.k; ++i) {
        const float gi = static_cast<float>(gr[i]);
        const float* ai = pr + static_cast<size_t>(i) * d;
        for (int t = 0; t < d; ++t) rr[t] -= gi * ai[t];
      }
      if (dot_d(rr, rr, d) <= kResidualTol * q.xx) q.done = true;
    }
  }
  for (int64_t r = 0; r < nb; ++r)
    finish_row(sel.data() + r * s, g.data() + r * s, st[static_cast<size_t>(r)].k, s, idx + r * s, coef + r * s);
}

void check_args(int d, int N, int s) {
  KVTRIM_CHECK(d >= 1 && N >= 1 && s >= 1 && s <= std::min(N, d),
               "sparse coding: %d atoms of dimension %d cannot give %d entries per row (need 1 <= s <= "
               "min(atoms, dimension))",
               N, d, s);
}

}  // namespace

void omp_encode(const float* D, int d, int n_atoms, const float* x, int64_t n, int64_t ldx, int s,
                int32_t* idx, float* coef, ThreadPool* pool) {
  check_args(d, n_atoms, s);
  // blocks of up to 64 rows, smaller when the per-row Cholesky factors would exceed ~2 MiB
  const int64_t blk = std::clamp<int64_t>((int64_t{1} << 18) / (int64_t{s} * s), 1, 64);
  const int64_t nblk = (n + blk - 1) / blk;
  for_range(pool, nblk, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t bi = b0; bi < b1; ++bi) {
      const int64_t r0 = bi * blk, nb = std::min(blk, n - r0);
      omp_block(D, d, n_atoms, x + r0 * ldx, nb, ldx, s, idx + r0 * s, coef + r0 * s);
    }
  });
}

float fp8_grid_round(float v, float scale) {
  return scale > 0 ? scale * fp8_e4m3_to_f32(fp8_e4m3_from_f32(v / scale)) : 0.f;
}

void refit_rounded(const float* D, int d, int N, const float* x, int64_t n, int64_t ldx, int s,
                   const int32_t* idx, float* coef, GridRound round, float grid_max) {
  std::vector<float> A(static_cast<size_t>(s) * d);  // the row's atoms, contiguous [s, d]
  std::vector<double> G(static_cast<size_t>(s) * s), r(static_cast<size_t>(d)), cur(static_cast<size_t>(s));
  std::vector<double> M, L, rhs, g;
  std::vector<char> fixed(static_cast<size_t>(s));
  std::vector<int> free_at;
  for (int64_t row = 0; row < n; ++row) {
    const float* xr = x + row * ldx;
    const int32_t* ix = idx + row * s;
    float* cf = coef + row * s;
    float mx = 0;
    for (int e = 0; e < s; ++e) mx = std::max(mx, std::fabs(cf[e]));
    if (!(mx > 0)) continue;
    const float scale = mx / grid_max;
    for (int e = 0; e < s; ++e)
      for (int i = 0; i < d; ++i) A[static_cast<size_t>(e) * d + i] = D[static_cast<int64_t>(i) * N + ix[e]];
    auto atom = [&](int e) { return A.data() + static_cast<size_t>(e) * d; };
    for (int a = 0; a < s; ++a)
      for (int c = 0; c <= a; ++c) G[static_cast<size_t>(a) * s + c] = G[static_cast<size_t>(c) * s + a] = dot_d(atom(a), atom(c), d);
    for (int i = 0; i < d; ++i) r[static_cast<size_t>(i)] = xr[i];
    std::fill(fixed.begin(), fixed.end(), char{0});
    std::copy(cf, cf + s, cur.begin());
    for (int step = 0; step < s; ++step) {
      // the largest free coefficient (of the current fit) is rounded and fixed
      int pick = -1;
      for (int e = 0; e < s; ++e)
        if (!fixed[static_cast<size_t>(e)] && (pick < 0 || std::fabs(cur[static_cast<size_t>(e)]) > std::fabs(cur[static_cast<size_t>(pick)])))
          pick = e;
      const float q = round(static_cast<float>(cur[static_cast<size_t>(pick)]), scale);
      cf[pick] = q;
      fixed[static_cast<size_t>(pick)] = 1;
      for (int i = 0; i < d; ++i) r[static_cast<size_t>(i)] -= static_cast<double>(q) * atom(pick)[i];
      // refit the free ones to r: (A_Fᵀ A_F) γ = A_Fᵀ r (kept as they were when dependent)
      free_at.clear();
      for (int e = 0; e < s; ++e)
        if (!fixed[static_cast<size_t>(e)]) free_at.push_back(e);
      const int k = static_cast<int>(free_at.size());
      if (k == 0) break;
      M.resize(static_cast<size_t>(k) * k);
      L.resize(static_cast<size_t>(k) * k);
      rhs.resize(static_cast<size_t>(k));
      g.assign(static_cast<size_t>(k), 0.0);
      for (int a = 0; a < k; ++a) {
        for (int c = 0; c < k; ++c) M[static_cast<size_t>(a) * k + c] = G[static_cast<size_t>(free_at[a]) * s + free_at[c]];
        double v = 0;
        for (int i = 0; i < d; ++i) v += static_cast<double>(atom(free_at[a])[i]) * r[static_cast<size_t>(i)];
        rhs[static_cast<size_t>(a)] = v;
      }
      if (!chol_factor(M.data(), k, L.data())) continue;
      chol_solve(L.data(), k, k, rhs.data(), g.data());
      for (int a = 0; a < k; ++a) cur[static_cast<size_t>(free_at[a])] = g[static_cast<size_t>(a)];
    }
  }
}

void omp_encode_reference(const float* D, int d, int n_atoms, const float* x, int64_t n, int64_t ldx,
                          int s, int32_t* idx, float* coef) {
  check_args(d, n_atoms, s);
  auto atom = [&](int j, int i) { return static_cast<double>(D[static_cast<int64_t>(i) * n_atoms + j]); };
  for (int64_t row = 0; row < n; ++row) {
    const float* xr = x + row * ldx;
    std::vector<double> r(xr, xr + d);
    double xx = 0;
    for (double v : r) xx += v * v;
    std::vector<int32_t> sel;
    std::vector<double> gamma;
    bool done = !(xx > 0);
    while (!done && static_cast<int>(sel.size()) < s) {
      int32_t best = -1;
      double bm = -1;
      for (int j = 0; j < n_atoms; ++j) {
        if (std::find(sel.begin(), sel.end(), j) != sel.end()) continue;
        double c = 0;
        for (int i = 0; i < d; ++i) c += atom(j, i) * r[static_cast<size_t>(i)];
        if (std::fabs(c) > bm) {
          bm = std::fabs(c);
          best = j;
        }
      }
      // Gram of the picked atoms plus the candidate, factored from scratch
      std::vector<int32_t> S = sel;
      S.push_back(best);
      const int k = static_cast<int>(S.size());
      std::vector<double> G(static_cast<size_t>(k) * k), L(static_cast<size_t>(k) * k), bb(static_cast<size_t>(k));
      for (int a = 0; a < k; ++a) {
        for (int c = 0; c < k; ++c) {
          double v = 0;
          for (int i = 0; i < d; ++i) v += atom(S[a], i) * atom(S[c], i);
          G[static_cast<size_t>(a) * k + c] = v;
        }
        double v = 0;
        for (int i = 0; i < d; ++i) v += atom(S[a], i) * xr[i];
        bb[static_cast<size_t>(a)] = v;
      }
      if (!(bm > 0) || !chol_factor(G.data(), k, L.data())) break;
      sel = S;
      gamma.assign(static_cast<size_t>(k), 0.0);
      chol_solve(L.data(), k, k, bb.data(), gamma.data());
      double rr = 0;
      for (int i = 0; i < d; ++i) {
        double v = xr[i];
        for (int a = 0; a < k; ++a) v -= gamma[static_cast<size_t>(a)] * atom(S[a], i);
        r[static_cast<size_t>(i)] = v;
        rr += v * v;
      }
      done = rr <= kResidualTol * xx;
    }
    finish_row(sel.data(), gamma.data(), static_cast<int>(sel.size()), s, idx + row * s, coef + row * s);
  }
}

}  // namespace kvtrim::kv
