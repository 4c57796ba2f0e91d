// SWAN's cache (DESIGN.md §4.1): a rotation, then per-token top-k by magnitude chosen by the
// cache itself, with a dense buffer of the newest tokens that hands its oldest to the sparse store
// at every append. Checked against a brute-force mirror: which tokens are dense, the exact kept
// coordinates of every pruned token, attention against the dense reference over the reconstructed
// cache, and exact bytes; across every dense-row precision (the buffer's in-place moves), chunked
// and single-token appends, truncation, token selection on top, and clones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "kv/encoding.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"

// A namespace of its own: the generic names of its helpers (Setup, run, append, tol, kD, ...)
// stay out of the other files of a unity build.
namespace kvtrim::swan_cache_test {
namespace {

using kvtest::make_cfg;
using kvtest::max_abs_diff;
using kvtest::randn;
using kvtest::random_basis;
using kvtest::random_keep;

constexpr int kLayers = 2, kHeads = 2, kD = 32;

// The original vectors of every token ever appended, by (layer, head, position).
struct Mirror {
  std::map<int32_t, std::vector<float>> k[kLayers][kHeads], v[kLayers][kHeads];
};

// Appends n tokens at pos0.. to every layer (random data, recorded in m).
void append(KvCache& c, Mirror& m, int64_t n, int32_t pos0, std::mt19937& rng) {
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) pos[static_cast<size_t>(j)] = pos0 + static_cast<int32_t>(j);
  const int nl = c.config().n_layer, nh = c.config().n_head_kv;
  for (int il = 0; il < nl; ++il) {
    const auto k = randn(static_cast<size_t>(n * nh * kD), rng, 1.5f);
    const auto v = randn(static_cast<size_t>(n * nh * kD), rng);
    for (int ih = 0; ih < nh; ++ih)
      for (int64_t j = 0; j < n; ++j) {
        const size_t at = static_cast<size_t>((j * nh + ih) * kD);
        m.k[il][ih][pos[static_cast<size_t>(j)]].assign(k.begin() + at, k.begin() + at + kD);
        m.v[il][ih][pos[static_cast<size_t>(j)]].assign(v.begin() + at, v.begin() + at + kD);
      }
    c.append(il, n, k.data(), v.data(), pos.data());
  }
  c.advance(pos0 + static_cast<int32_t>(n));
}

// c = Uᵀ x for a [d, d] basis U.
std::vector<float> coords(const std::vector<float>& U, const std::vector<float>& x) {
  std::vector<float> c(kD, 0.f);
  for (int j = 0; j < kD; ++j) {
    double s = 0;
    for (int i = 0; i < kD; ++i) s += static_cast<double>(U[static_cast<size_t>(i * kD + j)]) * x[static_cast<size_t>(i)];
    c[static_cast<size_t>(j)] = static_cast<float>(s);
  }
  return c;
}

// The T coordinates of largest |c| (ties: lower index), by a full sort.
std::vector<int> brute_top(const std::vector<float>& c, int T) {
  std::vector<int> o(c.size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = static_cast<int>(i);
  std::stable_sort(o.begin(), o.end(), [&](int a, int b) { return std::fabs(c[a]) > std::fabs(c[b]); });
  o.resize(static_cast<size_t>(T));
  std::sort(o.begin(), o.end());
  return o;
}

struct Setup {
  KvDtype dense;   // the cache's type (the buffer's rows)
  KvDtype sparse;  // the pruned entries' type
  int tk, tv;      // k_active
  int64_t buffer;
  IndexLayout index = IndexLayout::kAuto;  // kAuto: a bitmask (4 bytes < tk, tv at kD = 32)
};

double tol(KvDtype t) {
  switch (t) {
    case KvDtype::kF32: return 1e-5;
    case KvDtype::kF16: return 2e-3;
    case KvDtype::kBF16: return 1e-2;
    case KvDtype::kQ8: return 2e-2;
    case KvDtype::kFP8: return 7e-2;
    case KvDtype::kQ4: return 2.5e-1;
    case KvDtype::kE5M2:
      return 1.3e-1;
  }
  return 1;
}

class SwanCache {
 public:
  SwanCache(const Setup& s, std::mt19937& rng) : s_(s), c_(make_kv_cache(make_cfg(kLayers, kHeads, kD, kD, s.dense))) {
    for (int il = 0; il < kLayers; ++il)
      for (int ih = 0; ih < kHeads; ++ih) {
        Uk_[il][ih] = random_basis(kD, kD, rng);
        Uv_[il][ih] = random_basis(kD, kD, rng);
      }
  }
  KvCache& cache() { return *c_; }
  Mirror& mirror() { return m_; }

  // The SWAN plan on every head; head (1, 1) also selects tokens first.
  void plan(std::mt19937& rng) {
    CompressionPlan p(kLayers, kHeads);
    for (int il = 0; il < kLayers; ++il)
      for (int ih = 0; ih < kHeads; ++ih) {
        HeadPlan& hp = p.at(il, ih);
        const int64_t n = c_->n_tokens(il, ih);
        if (il == 1 && ih == 1) {
          hp.keep_all = false;
          hp.keep = random_keep(n, 0.7, rng);
        }
        for (auto [sp, U, t] : {std::tuple{&hp.key, &Uk_[il][ih], s_.tk}, std::tuple{&hp.value, &Uv_[il][ih], s_.tv}}) {
          sp->rank = kD;
          sp->basis = *U;
          sp->channels = MagnitudeChannels{.topk = t, .index = s_.index};
          sp->dtype = s_.sparse;
        }
        hp.buffer = s_.buffer;
        const int64_t kept = hp.keep_all ? n : static_cast<int64_t>(hp.keep.size());
        buf_[il][ih] = std::min(s_.buffer, kept);
        drop_unkept(il, ih, hp);
      }
    c_->apply(p);
  }
  void append(int64_t n, std::mt19937& rng) {
    const int32_t p0 = c_->n_past();
    swan_cache_test::append(*c_, m_, n, p0, rng);
    // after n appended tokens the buffer holds b + n - 1 (exactly b at decode), or what it has
    for (auto& l : buf_)
      for (int64_t& b : l) b = s_.buffer == 0 ? 0 : std::min(s_.buffer + n - 1, b + n);
  }
  void truncate(int32_t pos) {
    for (int il = 0; il < kLayers; ++il)
      for (int ih = 0; ih < kHeads; ++ih) {
        std::vector<int32_t> p;
        c_->read_head(il, ih, nullptr, nullptr, &p);
        const int64_t removed = p.end() - std::lower_bound(p.begin(), p.end(), pos);
        buf_[il][ih] = std::max<int64_t>(0, buf_[il][ih] - removed);
        for (auto* mm : {&m_.k[il][ih], &m_.v[il][ih]}) mm->erase(mm->lower_bound(pos), mm->end());
      }
    c_->truncate(pos);
  }
  // A token-only plan (each head keeps a random subset): the buffer keeps what is kept of it.
  void select(std::mt19937& rng) {
    CompressionPlan p(kLayers, kHeads);
    for (int il = 0; il < kLayers; ++il)
      for (int ih = 0; ih < kHeads; ++ih) {
        HeadPlan& hp = p.at(il, ih);
        const int64_t n = c_->n_tokens(il, ih);
        hp.keep_all = false;
        hp.keep = random_keep(n, 0.8, rng);
        int64_t b = 0;
        for (int32_t j : hp.keep) b += j >= n - buf_[il][ih] ? 1 : 0;
        buf_[il][ih] = b;
        drop_unkept(il, ih, hp);
      }
    c_->apply(p);
  }

  // Every invariant, on every head.
  void check(const char* what, ThreadPool* pool) {
    size_t keys = 0, values = 0, idx = 0, scales = 0;
    for (int il = 0; il < kLayers; ++il)
      for (int ih = 0; ih < kHeads; ++ih) {
        std::vector<float> k, v;
        std::vector<int32_t> pos;
        c_->read_head(il, ih, &k, &v, &pos);
        const KvCache::HeadLayout lay = c_->head_layout(il, ih);
        const int64_t n = static_cast<int64_t>(pos.size());
        ASSERT_EQ(static_cast<int64_t>(m_.k[il][ih].size()), n) << what;
        for (int64_t t = 0; t < n; ++t) {
          const bool dense = lay.epoch[static_cast<size_t>(t)] < 0;
          ASSERT_EQ(dense, t >= n - buf_[il][ih]) << what << " (" << il << "," << ih << ") token " << t << " of " << n
                                                  << ", buffer " << buf_[il][ih];
          const std::vector<float>& ko = m_.k[il][ih].at(pos[static_cast<size_t>(t)]);
          const std::vector<float>& vo = m_.v[il][ih].at(pos[static_cast<size_t>(t)]);
          const std::vector<float> kr(k.begin() + t * kD, k.begin() + (t + 1) * kD);
          const std::vector<float> vr(v.begin() + t * kD, v.begin() + (t + 1) * kD);
          if (dense) {
            ASSERT_LT(max_abs_diff(kr, ko), tol(s_.dense) * 4) << what;
            ASSERT_LT(max_abs_diff(vr, vo), tol(s_.dense) * 4) << what;
            continue;
          }
          for (auto [U, orig, read, T] : {std::tuple{&Uk_[il][ih], &ko, &kr, s_.tk}, std::tuple{&Uv_[il][ih], &vo, &vr, s_.tv}}) {
            // The cache chose the top T of the coordinates of the row it stored dense (rounded
            // to the dense type): the kept set is a top T of the original's coordinates up to
            // that rounding, and every kept coordinate holds its value (to the sparse type).
            const std::vector<float> want = coords(*U, *orig), got = coords(*U, *read);
            double mx = 0;
            for (float x : want) mx = std::max(mx, std::fabs(static_cast<double>(x)));
            double min_kept = 1e30, max_pruned = 0;
            int n_kept = 0;
            for (int j = 0; j < kD; ++j) {
              const double g = got[static_cast<size_t>(j)], w = want[static_cast<size_t>(j)];
              if (std::fabs(g) > 1e-6 * mx) {
                ++n_kept;
                min_kept = std::min(min_kept, std::fabs(w));
                ASSERT_NEAR(g, w, (tol(s_.sparse) + tol(s_.dense)) * mx + 1e-5)
                    << what << " (" << il << "," << ih << ") token " << t << " coordinate " << j;
              } else {
                max_pruned = std::max(max_pruned, std::fabs(w));
              }
            }
            ASSERT_EQ(n_kept, T) << what << " (" << il << "," << ih << ") token " << t;
            ASSERT_GE(min_kept, max_pruned - 2 * tol(s_.dense) * mx - 1e-6) << what << " token " << t;
            if (s_.dense == KvDtype::kF32) {
              const std::vector<int> top = brute_top(want, T);
              for (int j : top) ASSERT_GT(std::fabs(got[static_cast<size_t>(j)]), 1e-6 * mx) << what;
            }
          }
        }
        const int64_t nb = buf_[il][ih], ns = n - nb;
        auto elem = [](KvDtype t, int64_t cnt) -> size_t {
          return t == KvDtype::kF32 ? cnt * 4 : t == KvDtype::kQ8 || t == KvDtype::kFP8 ? cnt : t == KvDtype::kQ4 ? (cnt + 1) / 2 : cnt * 2;
        };
        keys += elem(s_.sparse, ns * s_.tk);
        values += elem(s_.sparse, ns * s_.tv);
        idx += static_cast<size_t>(s_.index == IndexLayout::kList ? ns * (s_.tk + s_.tv) : ns * 2 * (kD / 8));
        if (s_.sparse == KvDtype::kFP8) scales += static_cast<size_t>(ns * 8);
        if (s_.dense == KvDtype::kF16 || s_.dense == KvDtype::kF32) {
          keys += elem(s_.dense, nb * kD);
          values += elem(s_.dense, nb * kD);
        }
      }
    const KvBytes b = c_->bytes();
    if (s_.dense == KvDtype::kF16 || s_.dense == KvDtype::kF32) {
      EXPECT_EQ(b.keys, keys) << what;
      EXPECT_EQ(b.values, values) << what;
      if (s_.sparse == KvDtype::kFP8) {
        EXPECT_EQ(b.scales, scales) << what;
      }
    }
    EXPECT_EQ(b.indices, idx) << what;
    // attention over the compressed cache = the dense reference over its reconstruction
    std::mt19937 rng(7);
    const int64_t n_q = 3;
    const auto q = randn(static_cast<size_t>(n_q * 4 * kD), rng);
    std::vector<int32_t> qp(n_q);
    for (int64_t i = 0; i < n_q; ++i) qp[static_cast<size_t>(i)] = c_->n_past() - 1 - static_cast<int32_t>(i * 7);
    std::sort(qp.begin(), qp.end());
    AttnParams p;
    p.n_head = 4;
    p.scale = 1.f / std::sqrt(static_cast<float>(kD));
    std::vector<float> out(static_cast<size_t>(n_q * 4 * kD)), want(out.size());
    for (int il = 0; il < kLayers; ++il) {
      c_->attend(il, n_q, q.data(), qp.data(), p, out.data(), pool);
      attention_reference_cache(*c_, il, n_q, q.data(), qp.data(), p, want.data());
      ASSERT_LT(max_abs_diff(out, want), 1e-4) << what << " layer " << il;
    }
  }

 private:
  void drop_unkept(int il, int ih, const HeadPlan& hp) {
    if (hp.keep_all) return;
    std::vector<int32_t> pos;
    c_->read_head(il, ih, nullptr, nullptr, &pos);
    for (size_t t = 0, j = 0; t < pos.size(); ++t) {
      if (j < hp.keep.size() && hp.keep[j] == static_cast<int32_t>(t)) {
        ++j;
        continue;
      }
      m_.k[il][ih].erase(pos[t]);
      m_.v[il][ih].erase(pos[t]);
    }
  }
  Setup s_;
  std::unique_ptr<KvCache> c_;
  Mirror m_;
  std::vector<float> Uk_[kLayers][kHeads], Uv_[kLayers][kHeads];
  int64_t buf_[kLayers][kHeads] = {};
};

void run(const Setup& s, ThreadPool* pool) {
  std::mt19937 rng(1234 + static_cast<int>(s.dense) * 7 + static_cast<int>(s.sparse) + static_cast<int>(s.buffer));
  SwanCache sc(s, rng);
  sc.append(137, rng);
  sc.plan(rng);
  sc.check("after the plan", pool);
  for (int i = 0; i < 23; ++i) sc.append(1, rng);  // decode: one token at a time
  sc.check("after single appends", pool);
  sc.append(45, rng);  // a chunk larger than the buffer in some setups
  sc.check("after a chunk", pool);
  sc.truncate(sc.cache().n_past() - 9);
  sc.check("after truncate", pool);
  sc.append(5, rng);
  sc.check("after appends past the truncation", pool);
  sc.select(rng);
  sc.check("after a token selection", pool);
  sc.append(30, rng);
  sc.check("after appends past the selection", pool);
  std::unique_ptr<KvCache> copy = sc.cache().clone();
  sc.append(3, rng);
  sc.check("the original after a clone", pool);
}

// magnitude_channels against a plain sort by the documented order (decreasing |c|, a NaN as an
// infinite magnitude, ties to the lower index): rows with ties, signed zeros, infinities and NaNs
// of both signs, every count T from 1 to the width.
TEST(SwanCache, MagnitudeChannelsAreTheTopTByMagnitudeTiesToTheLowerIndex) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> pick(0, 9);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int w : {1, 5, 64, 100}) {
    kv::SideEncoding e;
    e.d = w;
    e.channels = MagnitudeChannels{};
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> c(static_cast<size_t>(w));
      for (float& x : c) {  // few distinct magnitudes: many ties
        const int k = pick(rng);
        x = k == 0 ? 0.f : k == 1 ? -0.f : k == 2 ? -inf : k == 3 ? (rep % 2 ? -nan : nan) : (k % 2 ? -1.f : 1.f) * k;
      }
      std::vector<int32_t> order(static_cast<size_t>(w));
      for (int j = 0; j < w; ++j) order[static_cast<size_t>(j)] = j;
      auto mag = [&](int32_t j) { return std::isnan(c[j]) ? inf : std::fabs(c[j]); };
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return mag(a) > mag(b); });
      for (int T = 1; T <= w; ++T) {
        e.channels.get<MagnitudeChannels>()->topk = T;
        std::vector<int32_t> want(order.begin(), order.begin() + T), got(static_cast<size_t>(T), -1);
        std::sort(want.begin(), want.end());
        e.magnitude_channels(c.data(), got.data());
        ASSERT_EQ(got, want) << "width " << w << " T " << T << " rep " << rep;
      }
    }
  }
}

TEST(SwanCache, BufferAndMagnitudeTopKOverEveryPrecision) {
  ThreadPool pool(2);
  for (KvDtype dense : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8, KvDtype::kFP8, KvDtype::kQ4})
    for (KvDtype sparse : {KvDtype::kF16, KvDtype::kFP8}) {
      SCOPED_TRACE(std::string("dense ") + kv_dtype_name(dense) + ", sparse " + kv_dtype_name(sparse));
      run({dense, sparse, 12, 9, 20}, &pool);
      run({dense, sparse, 12, 9, 20, IndexLayout::kList}, &pool);
    }
}

TEST(SwanCache, BufferSizes) {
  for (int64_t b : {0, 1, 16, 17, 64, 500}) {
    SCOPED_TRACE("buffer " + std::to_string(b));
    run({KvDtype::kF16, KvDtype::kF16, 16, 16, b}, nullptr);
  }
}

TEST(SwanCache, PlanOnAnEmptyCacheEncodesThroughout) {
  std::mt19937 rng(5);
  auto c = make_kv_cache(make_cfg(1, 1, kD, kD, KvDtype::kF16));
  CompressionPlan p(1, 1);
  HeadPlan& hp = p.at(0, 0);
  hp.key.channels = MagnitudeChannels{.topk = 5};
  hp.buffer = 8;
  c->apply(p);
  Mirror m;
  append(*c, m, 20, 0, rng);  // a chunk stays dense for its own attention
  EXPECT_EQ(c->bytes().indices, 0u);
  for (int32_t p = 20; p < 30; ++p) append(*c, m, 1, p, rng);  // decode: the buffer shrinks to 8
  const KvCache::HeadLayout lay = c->head_layout(0, 0);
  int dense = 0;
  for (int32_t e : lay.epoch) dense += e < 0 ? 1 : 0;
  EXPECT_EQ(dense, 8);
  EXPECT_EQ(c->bytes().indices, static_cast<size_t>(22 * (kD / 8)));  // bitmask rows
}

TEST(SwanCache, BadPlans) {
  auto c = make_kv_cache(make_cfg(1, 1, kD, kD, KvDtype::kF16));
  std::mt19937 rng(3);
  Mirror m;
  append(*c, m, 10, 0, rng);
  auto refused = [&](const HeadPlan& hp, const char* needle) {
    CompressionPlan p(1, 1);
    p.at(0, 0) = hp;
    try {
      c->apply(p);
      ADD_FAILURE() << "accepted; expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  HeadPlan a;
  a.key.channels = MagnitudeChannels{.topk = kD + 1};
  refused(a, "out of range");
  HeadPlan b;
  b.key.channels = MagnitudeChannels{.topk = 3};
  b.key.rows.channels = {0, 1, 2};
  refused(b, "by magnitude");
  HeadPlan d;
  d.buffer = 4;
  refused(d, "without a basis or channels");
  HeadPlan e;
  e.key.channels = TokenChannels{.topk = 2};
  e.key.rows.channels.assign(20, 0);
  for (int t = 0; t < 10; ++t) e.key.rows.channels[static_cast<size_t>(2 * t + 1)] = 1;
  e.buffer = 4;
  refused(e, "encodes tokens by itself");
  HeadPlan f = b;
  f.key.rows.channels.clear();
  f.buffer = -1;
  refused(f, "negative");
  HeadPlan g = f;
  g.buffer = 2;
  g.appends_dense = true;
  refused(g, "appends_dense");
  // (a bitmask index on a per-head subset is unrepresentable: only per-token kinds have an index)
  EXPECT_EQ(c->n_tokens(0, 0), 10);
  EXPECT_EQ(c->head_layout(0, 0).current_epoch, -1);
}

}  // namespace
}  // namespace kvtrim::swan_cache_test
