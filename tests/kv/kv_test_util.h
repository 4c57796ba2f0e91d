// Fixtures shared by the KV cache tests: random K/V, cache configs, random plans.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "kv/kv_cache.h"

namespace kvtrim::kvtest {

inline constexpr KvDtype kAllDtypes[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8};

inline std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// One attention shape a layout test runs: query / kv heads, head dims, tokens stored before the
// queries, queries, sliding window (0 = none), and whether a thread pool runs it (decode splits).
struct AttnCase {
  int n_head, n_head_kv, hdk, hdv;
  int64_t n_prev, n_q;
  int window;
  bool pool;
};

// A random [d, r] (row-major) matrix with orthonormal columns: QR (Gram-Schmidt, twice) of a
// Gaussian matrix.
inline std::vector<float> random_basis(int d, int r, std::mt19937& rng) {
  std::vector<double> a(static_cast<size_t>(d) * r);
  std::normal_distribution<double> nd(0, 1);
  for (double& x : a) x = nd(rng);
  for (int j = 0; j < r; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int c = 0; c < j; ++c) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += a[i * r + j] * a[i * r + c];
        for (int i = 0; i < d; ++i) a[i * r + j] -= dot * a[i * r + c];
      }
    }
    double nrm = 0;
    for (int i = 0; i < d; ++i) nrm += a[i * r + j] * a[i * r + j];
    nrm = std::sqrt(nrm);
    for (int i = 0; i < d; ++i) a[i * r + j] /= nrm;
  }
  return std::vector<float>(a.begin(), a.end());
}

// Bytes of one stored element of dtype t (q8: the int8 value; its block scales apart).
inline size_t esize(KvDtype t) {
  return t == KvDtype::kF32 ? 4 : t == KvDtype::kQ8 ? 1 : 2;
}

// A random orthonormal basis of rank rk (keys, dim dk) and rv (values, dim dv) in hp; a rank of
// 0 leaves that side as it was.
inline void set_basis(HeadPlan& hp, int dk, int rk, int dv, int rv, std::mt19937& rng) {
  if (rk > 0) {
    hp.key.rank = rk;
    hp.key.basis = random_basis(dk, rk, rng);
  }
  if (rv > 0) {
    hp.value.rank = rv;
    hp.value.basis = random_basis(dv, rv, rng);
  }
}

// n_ctx 65536; layer 0 gets the sliding window when window > 0.
inline KvCacheConfig make_cfg(int n_layer, int n_head_kv, int hdk, int hdv, KvDtype t, int window = 0) {
  KvCacheConfig cfg;
  cfg.n_layer = n_layer;
  cfg.n_head_kv = n_head_kv;
  cfg.head_dim_k = hdk;
  cfg.head_dim_v = hdv;
  cfg.n_ctx = 1 << 16;
  cfg.dtype = t;
  cfg.sliding_window.assign(static_cast<size_t>(n_layer), 0);
  if (window > 0) cfg.sliding_window[0] = window;
  return cfg;
}

// Appends n random tokens at positions pos0, pos0 + 1, ... to every layer of each cache (the
// same data), in chunks of varying size.
inline void fill(const std::vector<KvCache*>& cs, int64_t n, int32_t pos0, std::mt19937& rng) {
  const KvCacheConfig& cfg = cs[0]->config();
  for (int64_t i = 0; i < n;) {
    const int64_t m = std::min<int64_t>(n - i, 1 + (i * 13) % 200);
    std::vector<int32_t> pos(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) pos[static_cast<size_t>(j)] = static_cast<int32_t>(pos0 + i + j);
    for (int il = 0; il < cfg.n_layer; ++il) {
      const auto k = randn(static_cast<size_t>(m * cfg.n_head_kv * cfg.head_dim_k), rng, 1.5f);
      const auto v = randn(static_cast<size_t>(m * cfg.n_head_kv * cfg.head_dim_v), rng);
      for (KvCache* c : cs) c->append(il, m, k.data(), v.data(), pos.data());
    }
    i += m;
  }
  for (KvCache* c : cs) c->advance(pos0 + static_cast<int32_t>(n));
}
inline void fill(KvCache& c, int64_t n, int32_t pos0, std::mt19937& rng) { fill(std::vector<KvCache*>{&c}, n, pos0, rng); }

// A random subset of [0, n) (sorted), each index kept with probability frac.
inline std::vector<int32_t> random_keep(int64_t n, double frac, std::mt19937& rng) {
  std::bernoulli_distribution keep(frac);
  std::vector<int32_t> r;
  for (int64_t i = 0; i < n; ++i)
    if (keep(rng)) r.push_back(static_cast<int32_t>(i));
  return r;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Attention of n_q queries (random, at positions q_pos0..) in every layer equals the reference
// over the cache's reconstruction within abs_tol + rel_tol · max(1, largest |reference output|).
inline void expect_attention_within(const KvCache& c, int n_head, int64_t n_q, int32_t q_pos0,
                                    ThreadPool* pool, std::mt19937& rng, double abs_tol,
                                    double rel_tol, const std::string& what) {
  const KvCacheConfig& cfg = c.config();
  AttnParams p;
  p.n_head = n_head;
  p.scale = 1.f / std::sqrt(static_cast<float>(cfg.head_dim_k));
  std::vector<int32_t> q_pos(static_cast<size_t>(n_q));
  for (int64_t i = 0; i < n_q; ++i)
    q_pos[static_cast<size_t>(i)] = static_cast<int32_t>(q_pos0 + i);
  const auto q = randn(static_cast<size_t>(n_q * n_head * cfg.head_dim_k), rng);
  std::vector<float> out(static_cast<size_t>(n_q * n_head * cfg.head_dim_v)), want(out.size());
  for (int il = 0; il < cfg.n_layer; ++il) {
    p.sliding_window = cfg.sliding_window[static_cast<size_t>(il)];
    c.attend(il, n_q, q.data(), q_pos.data(), p, out.data(), pool);
    attention_reference_cache(c, il, n_q, q.data(), q_pos.data(), p, want.data());
    double scale = 1;
    for (float x : want) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    EXPECT_LT(max_abs_diff(out, want), abs_tol + rel_tol * scale) << what << " layer " << il;
  }
}
// ... within an absolute tolerance.
inline void expect_attention_matches(const KvCache& c, int n_head, int64_t n_q, int32_t q_pos0,
                                     ThreadPool* pool, std::mt19937& rng, double tol,
                                     const std::string& what) {
  expect_attention_within(c, n_head, n_q, q_pos0, pool, rng, tol, 0, what);
}
// ... within 1e-4 · max(1, largest |reference output|).
inline void expect_attention_matches_scaled(const KvCache& c, int n_head, int64_t n_q,
                                            int32_t q_pos0, ThreadPool* pool, std::mt19937& rng,
                                            const std::string& what) {
  expect_attention_within(c, n_head, n_q, q_pos0, pool, rng, 0, 1e-4, what);
}

}  // namespace kvtrim::kvtest
