// Lexico's dictionaries: learning (MOD over OMP codes) and their calibration-file section
// (see lexico.h).
#include "calib/lexico.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/sparse_code.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace kvtrim {

namespace {

constexpr const char* kLexicoKey = "kvtrim.calib.lexico.";

std::string lexico_tensor(int il, const char* what) { return "blk." + std::to_string(il) + ".lexico." + what; }

// Normalises column j of D [d, N]; false when it is zero or not finite.
bool normalise_col(std::vector<float>& D, int d, int N, int j) {
  double nn = 0;
  for (int i = 0; i < d; ++i) nn += static_cast<double>(D[static_cast<size_t>(i) * N + j]) * D[static_cast<size_t>(i) * N + j];
  if (!(nn > 1e-20) || !std::isfinite(nn)) return false;
  const float inv = static_cast<float>(1.0 / std::sqrt(nn));
  for (int i = 0; i < d; ++i) D[static_cast<size_t>(i) * N + j] *= inv;
  return true;
}

void set_col(std::vector<float>& D, int d, int N, int j, const float* x) {
  for (int i = 0; i < d; ++i) D[static_cast<size_t>(i) * N + j] = x[i];
}

std::vector<float> transpose(const std::vector<float>& D, int d, int N) {  // [d, N] -> [N, d]
  std::vector<float> A(D.size());
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < N; ++j) A[static_cast<size_t>(j) * d + i] = D[static_cast<size_t>(i) * N + j];
  return A;
}

// Per-row squared residual ‖x − D c‖² of sparse codes (idx, coef [n, s]) over atoms A [N, d].
std::vector<double> residuals(const float* X, int64_t n, int d, const std::vector<float>& A, int s,
                              const std::vector<int32_t>& idx, const std::vector<float>& coef) {
  std::vector<double> r(static_cast<size_t>(n));
  std::vector<double> y(static_cast<size_t>(d));
  for (int64_t t = 0; t < n; ++t) {
    for (int i = 0; i < d; ++i) y[static_cast<size_t>(i)] = X[t * d + i];
    for (int e = 0; e < s; ++e) {
      const float c = coef[static_cast<size_t>(t * s + e)];
      const float* a = A.data() + static_cast<size_t>(idx[static_cast<size_t>(t * s + e)]) * d;
      for (int i = 0; i < d; ++i) y[static_cast<size_t>(i)] -= static_cast<double>(c) * a[i];
    }
    double q = 0;
    for (double v : y) q += v * v;
    r[static_cast<size_t>(t)] = q;
  }
  return r;
}

}  // namespace

void LexicoDicts::validate(int n_layer_expected) const {
  KVTRIM_CHECK(dk >= 1 && dv >= 1 && n_atoms >= 1 && n_atoms <= 65535,
               "Lexico dictionaries: head dims %d / %d and %d atoms (need >= 1, atoms <= 65535)", dk, dv,
               n_atoms);
  KVTRIM_CHECK(sparsity_k >= 1 && sparsity_k <= std::min(dk, n_atoms) && sparsity_v >= 1 &&
                   sparsity_v <= std::min(dv, n_atoms),
               "Lexico dictionaries: training sparsities %d / %d out of range", sparsity_k, sparsity_v);
  KVTRIM_CHECK(n_layer() == n_layer_expected && v.size() == k.size() && k_err.size() == k.size() &&
                   v_err.size() == k.size(),
               "Lexico dictionaries cover %d layers, the model has %d", n_layer(), n_layer_expected);
  for (int il = 0; il < n_layer(); ++il) {
    for (int side = 0; side < 2; ++side) {
      const std::vector<float>& D = side ? v[static_cast<size_t>(il)] : k[static_cast<size_t>(il)];
      const int d = side ? dv : dk;
      KVTRIM_CHECK(D.size() == static_cast<size_t>(d) * n_atoms, "Lexico dictionaries: layer %d %s is mis-shaped",
                   il, side ? "values" : "keys");
      for (int j = 0; j < n_atoms; ++j) {
        double nn = 0;
        for (int i = 0; i < d; ++i) nn += static_cast<double>(D[static_cast<size_t>(i) * n_atoms + j]) * D[static_cast<size_t>(i) * n_atoms + j];
        KVTRIM_CHECK(std::isfinite(nn) && std::fabs(std::sqrt(nn) - 1.0) <= 1e-3,
                     "Lexico dictionaries: layer %d %s atom %d has norm %g (not unit norm)", il,
                     side ? "values" : "keys", j, std::sqrt(nn));
      }
      const double e = side ? v_err[static_cast<size_t>(il)] : k_err[static_cast<size_t>(il)];
      KVTRIM_CHECK(e >= 0 && e <= 1, "Lexico dictionaries: layer %d %s training error %g is outside [0, 1]",
                   il, side ? "values" : "keys", e);
    }
  }
}

std::vector<float> train_dictionary(const float* X, int64_t n, int d, int N, int s, int iters, uint64_t seed,
                                    ThreadPool* pool, double* rel_err) {
  KVTRIM_CHECK(N >= 1 && n >= N, "Lexico: %lld sample rows cannot train %d atoms (need at least as many rows)",
               static_cast<long long>(n), N);
  KVTRIM_CHECK(s >= 1 && s <= std::min(d, N), "Lexico: training sparsity %d out of range [1, %d]", s,
               std::min(d, N));
  KVTRIM_CHECK(iters >= 0, "Lexico: %d training iterations", iters);
  double xx = 0;
  for (int64_t t = 0; t < n * d; ++t) xx += static_cast<double>(X[t]) * X[t];
  // D_0: N distinct rows, a seeded permutation (rows of zero norm skipped)
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> D(static_cast<size_t>(d) * N);
  size_t next = 0;
  auto fresh_col = [&](int j) {  // the next unused sample row as atom j
    while (next < order.size()) {
      set_col(D, d, N, j, X + order[next++] * d);
      if (normalise_col(D, d, N, j)) return;
    }
    for (int i = 0; i < d; ++i) D[static_cast<size_t>(i) * N + j] = (i == j % d) ? 1.f : 0.f;  // a basis vector
  };
  for (int j = 0; j < N; ++j) fresh_col(j);
  std::vector<int32_t> idx(static_cast<size_t>(n * s));
  std::vector<float> coef(static_cast<size_t>(n * s));
  for (int it = 0; it < iters; ++it) {
    const std::vector<float> A = transpose(D, d, N);  // atom-major, for the residuals
    kv::omp_encode(D.data(), d, N, X, n, d, s, idx.data(), coef.data(), pool);
    // MOD: D = B M⁻¹ with M = C Cᵀ [N, N] and B = X Cᵀ [d, N] (C [N, n] the sparse codes)
    Eigen::MatrixXd M = Eigen::MatrixXd::Zero(N, N), B = Eigen::MatrixXd::Zero(d, N);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t* ix = idx.data() + t * s;
      const float* cf = coef.data() + t * s;
      for (int a = 0; a < s; ++a) {
        if (cf[a] == 0.f) continue;
        for (int b = 0; b < s; ++b) M(ix[a], ix[b]) += static_cast<double>(cf[a]) * cf[b];
        for (int i = 0; i < d; ++i) B(i, ix[a]) += static_cast<double>(cf[a]) * X[t * d + i];
      }
    }
    std::vector<char> used(static_cast<size_t>(N));
    double tr = 0;
    for (int j = 0; j < N; ++j) {
      used[static_cast<size_t>(j)] = M(j, j) > 0;
      tr += M(j, j);
    }
    M.diagonal().array() += 1e-6 * std::max(tr / N, 1e-12);  // unused atoms: a well-posed system
    const Eigen::MatrixXd Dn = M.ldlt().solve(B.transpose()).transpose();  // [d, N]
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < N; ++j) D[static_cast<size_t>(i) * N + j] = static_cast<float>(Dn(i, j));
    // unused or degenerate atoms take the worst-represented rows
    const std::vector<double> res = residuals(X, n, d, A, s, idx, coef);
    std::vector<int64_t> worst(static_cast<size_t>(n));
    std::iota(worst.begin(), worst.end(), 0);
    std::stable_sort(worst.begin(), worst.end(),
                     [&](int64_t a, int64_t b) { return res[static_cast<size_t>(a)] > res[static_cast<size_t>(b)]; });
    size_t wi = 0;
    for (int j = 0; j < N; ++j) {
      if (used[static_cast<size_t>(j)] && normalise_col(D, d, N, j)) continue;
      bool ok = false;
      while (!ok && wi < worst.size()) {
        set_col(D, d, N, j, X + worst[wi++] * d);
        ok = normalise_col(D, d, N, j);
      }
      if (!ok) fresh_col(j);
    }
  }
  if (rel_err) {
    const std::vector<float> A = transpose(D, d, N);
    kv::omp_encode(D.data(), d, N, X, n, d, s, idx.data(), coef.data(), pool);
    const std::vector<double> res = residuals(X, n, d, A, s, idx, coef);
    const double e = std::accumulate(res.begin(), res.end(), 0.0);
    *rel_err = xx > 0 ? std::clamp(e / xx, 0.0, 1.0) : 0.0;
  }
  return D;
}

LexicoDicts train_lexico(const std::vector<std::vector<float>>& k_rows, const std::vector<std::vector<float>>& v_rows,
                         int dk, int dv, const LexicoTrainOptions& o, ThreadPool* pool,
                         const std::function<void(int64_t, int64_t)>& progress) {
  KVTRIM_CHECK(k_rows.size() == v_rows.size() && !k_rows.empty(), "Lexico: key and value samples of %zu / %zu layers",
               k_rows.size(), v_rows.size());
  LexicoDicts out;
  out.dk = dk;
  out.dv = dv;
  out.n_atoms = o.n_atoms;
  out.sparsity_k = o.sparsity > 0 ? std::min(o.sparsity, dk) : std::max(4, dk / 8);
  out.sparsity_v = o.sparsity > 0 ? std::min(o.sparsity, dv) : std::max(4, dv / 8);
  const int L = static_cast<int>(k_rows.size());
  out.k.resize(static_cast<size_t>(L));
  out.v.resize(static_cast<size_t>(L));
  out.k_err.resize(static_cast<size_t>(L));
  out.v_err.resize(static_cast<size_t>(L));
  for (int il = 0; il < L; ++il) {
    const auto& K = k_rows[static_cast<size_t>(il)];
    const auto& V = v_rows[static_cast<size_t>(il)];
    const uint64_t sd = o.seed ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(2 * il + 1));
    out.k[static_cast<size_t>(il)] = train_dictionary(K.data(), static_cast<int64_t>(K.size() / static_cast<size_t>(dk)), dk,
                                                      o.n_atoms, out.sparsity_k, o.iters, sd, pool,
                                                      &out.k_err[static_cast<size_t>(il)]);
    out.v[static_cast<size_t>(il)] = train_dictionary(V.data(), static_cast<int64_t>(V.size() / static_cast<size_t>(dv)), dv,
                                                      o.n_atoms, out.sparsity_v, o.iters, sd + 1, pool,
                                                      &out.v_err[static_cast<size_t>(il)]);
    if (progress) progress(il + 1, L);
  }
  return out;
}

void lexico_write(const LexicoDicts& d, GgufWriter& w, std::vector<CalibTensor>* ts) {
  d.validate(d.n_layer());
  w.set_u32(std::string(kLexicoKey) + "n_atoms", static_cast<uint32_t>(d.n_atoms));
  w.set_u32(std::string(kLexicoKey) + "sparsity_k", static_cast<uint32_t>(d.sparsity_k));
  w.set_u32(std::string(kLexicoKey) + "sparsity_v", static_cast<uint32_t>(d.sparsity_v));
  for (int il = 0; il < d.n_layer(); ++il) {
    ts->push_back({lexico_tensor(il, "k"), {d.n_atoms, d.dk}, d.k[static_cast<size_t>(il)]});
    ts->push_back({lexico_tensor(il, "v"), {d.n_atoms, d.dv}, d.v[static_cast<size_t>(il)]});
    ts->push_back({lexico_tensor(il, "err"), {2},
                   {static_cast<float>(d.k_err[static_cast<size_t>(il)]), static_cast<float>(d.v_err[static_cast<size_t>(il)])}});
  }
}

bool lexico_present(const GgufFile& f) { return f.get_int(std::string(kLexicoKey) + "n_atoms", 0) > 0; }

LexicoDicts lexico_read(const GgufFile& f, const std::string& path, int n_layer, int dk, int dv) {
  LexicoDicts d;
  d.dk = dk;
  d.dv = dv;
  const int64_t na = f.get_int(std::string(kLexicoKey) + "n_atoms");
  const int64_t sk = f.get_int(std::string(kLexicoKey) + "sparsity_k"), sv = f.get_int(std::string(kLexicoKey) + "sparsity_v");
  KVTRIM_CHECK(na >= 1 && na <= 65535 && sk >= 1 && sk <= std::min<int64_t>(dk, na) && sv >= 1 &&
                   sv <= std::min<int64_t>(dv, na),
               "calibration file '%s': Lexico section has %lld atoms and training sparsities %lld / %lld "
               "(out of range)",
               path.c_str(), static_cast<long long>(na), static_cast<long long>(sk), static_cast<long long>(sv));
  d.n_atoms = static_cast<int>(na);
  d.sparsity_k = static_cast<int>(sk);
  d.sparsity_v = static_cast<int>(sv);
  auto get = [&](const std::string& name, const std::vector<int64_t>& ne) -> const float* {
    const GgufTensor* t = f.find_tensor(name);
    KVTRIM_CHECK(t, "calibration file '%s' is incomplete: missing tensor '%s'", path.c_str(), name.c_str());
    KVTRIM_CHECK(t->type == GgmlType::F32 && t->ne == ne, "calibration file '%s': tensor '%s' is mis-shaped",
                 path.c_str(), name.c_str());
    return reinterpret_cast<const float*>(t->data);
  };
  for (int il = 0; il < n_layer; ++il) {
    const float* k = get(lexico_tensor(il, "k"), {na, dk});
    const float* v = get(lexico_tensor(il, "v"), {na, dv});
    const float* e = get(lexico_tensor(il, "err"), {2});
    d.k.emplace_back(k, k + static_cast<size_t>(na) * dk);
    d.v.emplace_back(v, v + static_cast<size_t>(na) * dv);
    d.k_err.push_back(e[0]);
    d.v_err.push_back(e[1]);
  }
  try {
    d.validate(n_layer);
  } catch (const Error& e) {
    fail("calibration file '%s': %s", path.c_str(), e.what());
  }
  return d;
}

}  // namespace kvtrim
