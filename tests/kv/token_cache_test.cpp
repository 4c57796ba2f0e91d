// The token cache after compression plans (apply): attention over variable-length per-head
// caches against the dense reference (every dtype, GQA 9/3, 4/1 and 12/2, sliding window,
// decode splits on a pool), exact byte accounting by part and layer, apply's errors,
// truncate / read_head / append after apply, q8 encoding, and the process's RSS shrinking
// when a large cache is compressed (real freeing, measured from /proc/self/statm).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "core/memory.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"

namespace kvtrim {
namespace {

using kvtest::esize;
using kvtest::fill;
using kvtest::kAllDtypes;
using kvtest::make_cfg;
using kvtest::max_abs_diff;
using kvtest::randn;
using kvtest::random_keep;

// Layer 0: different tokens per head (one head may be emptied); layer 1: the same tokens in
// every head (structured); layer 2 (if any): untouched; further layers: per-head, one head
// keep_all.
CompressionPlan random_plan(const KvCache& c, std::mt19937& rng, bool allow_empty) {
  const KvCacheConfig& cfg = c.config();
  CompressionPlan plan(cfg.n_layer, cfg.n_head_kv);
  std::uniform_real_distribution<double> frac(0.1, 0.9);
  for (int il = 0; il < cfg.n_layer; ++il) {
    const int mode = il < 3 ? il : 3;
    if (mode == 2) continue;
    const std::vector<int32_t> shared = random_keep(c.n_tokens(il, 0), frac(rng), rng);
    for (int ih = 0; ih < cfg.n_head_kv; ++ih) {
      HeadPlan& hp = plan.at(il, ih);
      if (mode == 3 && ih == 0) continue;  // keep_all inside an otherwise planned layer
      hp.keep_all = false;
      if (mode == 1) {
        hp.keep = shared;
      } else if (allow_empty && ih == cfg.n_head_kv - 1 && mode == 0) {
        hp.keep.clear();  // a head emptied completely
      } else {
        hp.keep = random_keep(c.n_tokens(il, ih), frac(rng), rng);
      }
    }
  }
  return plan;
}

struct Shape {
  int n_head, n_head_kv, hdk, hdv;
};

// Fills a cache, applies a random plan, appends n_q new tokens (positions continue from
// n_past) and compares attention of those queries in every layer with the reference over the
// reconstructed kept tokens.
void check_after_plan(const Shape& s, KvDtype t, int64_t n_prev, int64_t n_q, int window,
                      ThreadPool* pool, uint32_t seed) {
  std::mt19937 rng(seed);
  auto c = make_kv_cache(make_cfg(4, s.n_head_kv, s.hdk, s.hdv, t, window));
  fill(*c, n_prev, 0, rng);
  c->apply(random_plan(*c, rng, /*allow_empty=*/true));
  EXPECT_EQ(c->n_past(), n_prev);  // apply never changes the uncompressed length
  fill(*c, n_q, c->n_past(), rng);
  std::vector<int32_t> q_pos(static_cast<size_t>(n_q));
  for (int64_t i = 0; i < n_q; ++i) q_pos[i] = static_cast<int32_t>(n_prev + i);
  AttnParams p;
  p.n_head = s.n_head;
  p.scale = 1.f / std::sqrt(static_cast<float>(s.hdk));
  const auto q = randn(static_cast<size_t>(n_q * s.n_head * s.hdk), rng);
  std::vector<float> out(static_cast<size_t>(n_q * s.n_head * s.hdv)), want(out.size());
  for (int il = 0; il < 4; ++il) {
    p.sliding_window = c->config().sliding_window[il];
    c->attend(il, n_q, q.data(), q_pos.data(), p, out.data(), pool);
    attention_reference_cache(*c, il, n_q, q.data(), q_pos.data(), p, want.data());
    EXPECT_LT(max_abs_diff(out, want), 3e-5)
        << "layer " << il << " dtype " << kv_dtype_name(t) << " heads " << s.n_head << "/"
        << s.n_head_kv << " n_prev " << n_prev << " n_q " << n_q << " window " << window;
  }
}

TEST(TokenCache, AttentionAfterRandomPlansEveryDtype) {
  const Shape shapes[] = {{9, 3, 64, 64}, {4, 1, 256, 256}, {4, 2, 20, 12}};
  uint32_t seed = 1;
  for (KvDtype t : kAllDtypes) {
    for (const Shape& s : shapes) {
      check_after_plan(s, t, 300, 1, 0, nullptr, seed++);   // decode
      check_after_plan(s, t, 200, 17, 0, nullptr, seed++);  // a prefill chunk after compression
    }
  }
}

TEST(TokenCache, AttentionAfterPlansSlidingWindowAndSplits) {
  ThreadPool pool(2);  // 2 threads: fewer (query, kv head) pairs than 2 x threads still split
  uint32_t seed = 100;
  for (KvDtype t : kAllDtypes) {
    check_after_plan({9, 3, 64, 64}, t, 2000, 1, 0, &pool, seed++);  // decode split on the pool
    check_after_plan({12, 2, 128, 128}, t, 1800, 1, 0, &pool, seed++);
    check_after_plan({4, 1, 256, 256}, t, 1500, 2, 700, &pool, seed++);  // window on layer 0
    check_after_plan({9, 3, 64, 64}, t, 400, 5, 37, nullptr, seed++);
    check_after_plan({4, 2, 16, 16}, t, 150, 40, 0, &pool, seed++);  // prefill on the pool
  }
}

TEST(TokenCache, UncompressedMatchesReferenceEveryDtype) {
  ThreadPool pool(3);
  for (KvDtype t : kAllDtypes) {
    std::mt19937 rng(7);
    auto c = make_kv_cache(make_cfg(1, 3, 64, 64, t, 0));
    fill(*c, 1500, 0, rng);
    AttnParams p;
    p.n_head = 9;
    p.scale = 0.125f;
    p.softcap = 30.f;
    const auto q = randn(9 * 64, rng);
    const int32_t q_pos = 1499;
    std::vector<float> out(9 * 64), want(9 * 64);
    c->attend(0, 1, q.data(), &q_pos, p, out.data(), &pool);
    attention_reference_cache(*c, 0, 1, q.data(), &q_pos, p, want.data());
    EXPECT_LT(max_abs_diff(out, want), 2e-5) << kv_dtype_name(t);
  }
}

TEST(TokenCache, BytesExactAfterApply) {
  for (KvDtype t : kAllDtypes) {
    std::mt19937 rng(11);
    const int nl = 4, nkv = 3, dk = 32, dv = 16;
    auto c = make_kv_cache(make_cfg(nl, nkv, dk, dv, t));
    fill(*c, 333, 0, rng);
    const size_t es = esize(t), sc = t == KvDtype::kQ8 ? 8 : 0;
    KvBytes b = c->bytes();
    EXPECT_EQ(b.keys, size_t{nl} * 333 * nkv * dk * es);
    EXPECT_EQ(b.values, size_t{nl} * 333 * nkv * dv * es);
    EXPECT_EQ(b.positions, size_t{nl} * 333 * 4);  // shared by the heads of a layer
    EXPECT_EQ(b.scales, size_t{nl} * 333 * nkv * sc);
    EXPECT_EQ(b.other, 0u);

    const CompressionPlan plan = random_plan(*c, rng, /*allow_empty=*/true);
    c->apply(plan);
    b = c->bytes();
    size_t keys = 0, values = 0, positions = 0, scales = 0;
    ASSERT_EQ(b.per_layer.size(), size_t{nl});
    for (int il = 0; il < nl; ++il) {
      // layer 1 was planned alike in every head and layer 2 not at all: positions stay shared
      const bool shared = il == 1 || il == 2;
      size_t layer = 0;
      for (int ih = 0; ih < nkv; ++ih) {
        const size_t n = static_cast<size_t>(c->n_tokens(il, ih));
        const HeadPlan& hp = plan.at(il, ih);
        EXPECT_EQ(n, hp.keep_all ? 333u : hp.keep.size());
        ASSERT_EQ(b.per_head.size(), size_t{nl} * nkv);
        EXPECT_EQ(b.per_head[il * nkv + ih], n * ((dk + dv) * es + sc + (shared ? 0 : 4)))
            << "layer " << il << " head " << ih << " " << kv_dtype_name(t);
        keys += n * dk * es;
        values += n * dv * es;
        scales += n * sc;
        layer += n * ((dk + dv) * es + sc);
        if (!shared) {
          positions += n * 4;
          layer += n * 4;
        }
      }
      if (shared) {
        positions += static_cast<size_t>(c->n_tokens(il, 0)) * 4;
        layer += static_cast<size_t>(c->n_tokens(il, 0)) * 4;
      }
      EXPECT_EQ(b.per_layer[il], layer) << "layer " << il << " " << kv_dtype_name(t);
    }
    EXPECT_EQ(b.keys, keys);
    EXPECT_EQ(b.values, values);
    EXPECT_EQ(b.positions, positions);
    EXPECT_EQ(b.scales, scales);
    EXPECT_EQ(b.total(), keys + values + positions + scales);
    EXPECT_EQ(c->dense_bytes_f16(), size_t{nl} * 333 * nkv * (dk + dv) * 2);  // by n_past
  }
}

TEST(TokenCache, ApplyRejectsBadPlansAndLeavesTheCacheUnchanged) {
  std::mt19937 rng(5);
  auto c = make_kv_cache(make_cfg(2, 2, 8, 8, KvDtype::kF16));
  fill(*c, 20, 0, rng);
  const size_t before = c->bytes().total();
  auto expect_error = [&](const CompressionPlan& plan, const char* what) {
    try {
      c->apply(plan);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error(CompressionPlan(3, 2), "3 layers x 2 kv heads");
  expect_error(CompressionPlan(2, 1), "2 layers x 1 kv heads");
  CompressionPlan short_plan(2, 2);
  short_plan.heads.pop_back();
  expect_error(short_plan, "3 head plans");
  CompressionPlan p(2, 2);
  p.at(1, 1).keep_all = false;
  p.at(1, 1).keep = {0, 5, 20};
  expect_error(p, "keep[2] = 20 is out of range [0, 20)");
  p.at(1, 1).keep = {-1, 3};
  expect_error(p, "keep[0] = -1 is out of range");
  p.at(1, 1).keep = {1, 4, 4};
  expect_error(p, "keep[2] = 4 after 4");
  p.at(1, 1).keep = {1, 6, 2};
  expect_error(p, "strictly increasing");
  // an error in a later head leaves earlier (valid) heads untouched too
  p.at(0, 0).keep_all = false;
  p.at(0, 0).keep = {0, 1};
  expect_error(p, "(layer 1, kv head 1)");
  EXPECT_EQ(c->n_tokens(0, 0), 20);
  EXPECT_EQ(c->bytes().total(), before);
  // an all-keep_all plan is a no-op; an empty keep list empties the head
  c->apply(CompressionPlan(2, 2));
  EXPECT_EQ(c->bytes().total(), before);
  CompressionPlan empty(2, 2);
  empty.at(0, 1).keep_all = false;
  c->apply(empty);
  EXPECT_EQ(c->n_tokens(0, 1), 0);
  EXPECT_EQ(c->n_tokens(0, 0), 20);
}

// Expected contents of one head after plans: the f32 rows and positions it keeps.
TEST(TokenCache, ReadHeadAfterApplyReturnsKeptRows) {
  std::mt19937 rng(9);
  auto c = make_kv_cache(make_cfg(2, 3, 24, 8, KvDtype::kF32));
  fill(*c, 70, 0, rng);
  std::vector<std::vector<float>> k0(3), v0(3);
  std::vector<std::vector<int32_t>> p0(3);
  for (int ih = 0; ih < 3; ++ih) c->read_head(1, ih, &k0[ih], &v0[ih], &p0[ih]);
  CompressionPlan plan(2, 3);
  plan.at(1, 0).keep_all = false;
  plan.at(1, 0).keep = {0, 15, 16, 17, 33, 69};  // crosses key tiles
  plan.at(1, 2).keep_all = false;
  plan.at(1, 2).keep = random_keep(70, 0.4, rng);
  c->apply(plan);
  for (int ih = 0; ih < 3; ++ih) {
    std::vector<float> k, v;
    std::vector<int32_t> pos;
    c->read_head(1, ih, &k, &v, &pos);
    const HeadPlan& hp = plan.at(1, ih);
    const size_t n = hp.keep_all ? 70 : hp.keep.size();
    ASSERT_EQ(pos.size(), n);
    ASSERT_EQ(k.size(), n * 24);
    ASSERT_EQ(v.size(), n * 8);
    for (size_t r = 0; r < n; ++r) {
      const size_t j = hp.keep_all ? r : static_cast<size_t>(hp.keep[r]);
      EXPECT_EQ(pos[r], p0[ih][j]);
      for (int i = 0; i < 24; ++i) ASSERT_EQ(k[r * 24 + i], k0[ih][j * 24 + i]);
      for (int i = 0; i < 8; ++i) ASSERT_EQ(v[r * 8 + i], v0[ih][j * 8 + i]);
    }
  }
  // a second plan on the compressed head indexes its current tokens
  CompressionPlan again(2, 3);
  again.at(1, 0).keep_all = false;
  again.at(1, 0).keep = {1, 5};
  c->apply(again);
  std::vector<int32_t> pos;
  c->read_head(1, 0, nullptr, nullptr, &pos);
  EXPECT_EQ(pos, (std::vector<int32_t>{15, 69}));
}

TEST(TokenCache, TruncateAndAppendAfterApply) {
  for (KvDtype t : {KvDtype::kF16, KvDtype::kQ8}) {
    std::mt19937 rng(21);
    auto c = make_kv_cache(make_cfg(4, 3, 16, 16, t));
    fill(*c, 400, 0, rng);
    c->apply(random_plan(*c, rng, /*allow_empty=*/false));
    std::vector<std::vector<int32_t>> before(12);
    for (int il = 0; il < 4; ++il)
      for (int ih = 0; ih < 3; ++ih) c->read_head(il, ih, nullptr, nullptr, &before[il * 3 + ih]);
    c->truncate(250);
    EXPECT_EQ(c->n_past(), 250);
    for (int il = 0; il < 4; ++il) {
      for (int ih = 0; ih < 3; ++ih) {
        std::vector<int32_t> pos;
        c->read_head(il, ih, nullptr, nullptr, &pos);
        std::vector<int32_t> want;
        for (int32_t x : before[il * 3 + ih])
          if (x < 250) want.push_back(x);
        EXPECT_EQ(pos, want) << "layer " << il << " head " << ih;
      }
    }
    // new tokens continue from the truncation point and attention still matches
    fill(*c, 30, 250, rng);
    EXPECT_EQ(c->n_past(), 280);
    AttnParams p;
    p.n_head = 6;
    p.scale = 0.25f;
    const auto q = randn(6 * 16, rng);
    const int32_t q_pos = 279;
    std::vector<float> out(6 * 16), want(6 * 16);
    for (int il = 0; il < 4; ++il) {
      c->attend(il, 1, q.data(), &q_pos, p, out.data(), nullptr);
      attention_reference_cache(*c, il, 1, q.data(), &q_pos, p, want.data());
      EXPECT_LT(max_abs_diff(out, want), 2e-5);
    }
    // positions must still increase past every head's last position
    const int32_t stale = 260;
    std::vector<float> kv(3 * 16, 0.f);
    EXPECT_THROW(c->append(0, 1, kv.data(), kv.data(), &stale), Error);
    c->clear();
    EXPECT_EQ(c->bytes().total(), 0u);
    // a new context after clear() is stored like the first one (positions shared again)
    auto fresh = make_kv_cache(make_cfg(4, 3, 16, 16, t));
    std::mt19937 r1(5), r2(5);
    fill(*c, 100, 0, r1);
    fill(*fresh, 100, 0, r2);
    EXPECT_EQ(c->bytes().positions, fresh->bytes().positions);
    EXPECT_EQ(c->bytes().total(), fresh->bytes().total());
  }
}

TEST(TokenCache, Q8StoresSymmetricRoundToNearestWithOneScalePerVector) {
  auto c = make_kv_cache(make_cfg(1, 2, 8, 4, KvDtype::kQ8));
  // k: [1, 2, 8], v: [1, 2, 4]
  const float k[16] = {1, -2, 0.5f, 0.25f, 0, 3.f, -1.5f, 0.1f, 0, 0, 0, 0, 0, 0, 0, 0};
  const float v[8] = {127, -63.5f, 1, 0, 0.2f, 0.4f, -0.6f, 0.8f};
  const int32_t pos = 0;
  c->append(0, 1, k, v, &pos);
  std::vector<float> hk, hv;
  c->read_head(0, 0, &hk, &hv, nullptr);
  const float ks = 3.f / 127;
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(hk[i], std::nearbyint(k[i] / ks) * ks);
  EXPECT_FLOAT_EQ(hv[0], 127.f);
  EXPECT_FLOAT_EQ(hv[1], -64.f);  // -63.5 rounds to even
  c->read_head(0, 1, &hk, &hv, nullptr);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(hk[i], 0.f);  // an all-zero vector stays zero
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(hv[i], v[4 + i], 0.8f / 127 / 2 + 1e-7f);
  EXPECT_EQ(c->bytes().scales, 2u * 2 * 4);
  EXPECT_EQ(c->bytes().keys, 2u * 8);
}

size_t rss_bytes() { return process_rss_bytes(); }

#if defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang's spelling of gcc's __SANITIZE_ADDRESS__
#define KVTRIM_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVTRIM_TEST_ASAN 1
#endif

TEST(TokenCache, ApplyReleasesMemoryToTheOs) {
#if defined(KVTRIM_TEST_ASAN)
  GTEST_SKIP() << "AddressSanitizer quarantines freed memory: RSS does not drop";
#endif
  // 4 layers x 4 kv heads x 128/128 dims, f16: 8 KiB a token, 16384 tokens = 128 MiB,
  // appended in prefill-sized chunks (the buffers grow by steps, as in real use).
  const int nl = 4, nkv = 4, d = 128;
  const int64_t n = 16384, chunk = 512;
  KvCacheConfig cfg = make_cfg(nl, nkv, d, d, KvDtype::kF16);
  cfg.n_ctx = n;
  auto c = make_kv_cache(cfg);
  std::vector<float> k(static_cast<size_t>(chunk * nkv * d)), v(k.size());  // [chunk, nkv, d]
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i % 97) * 0.01f;
    v[i] = -k[i];
  }
  std::vector<int32_t> pos(static_cast<size_t>(chunk));
  for (int64_t i = 0; i < n; i += chunk) {
    for (int64_t j = 0; j < chunk; ++j) pos[j] = static_cast<int32_t>(i + j);
    for (int il = 0; il < nl; ++il) c->append(il, chunk, k.data(), v.data(), pos.data());
  }
  c->advance(static_cast<int32_t>(n));
  ASSERT_GE(c->bytes().total(), size_t{128} << 20);
  // Keep every other token (50%), a different half in odd heads; then again on the result
  // (25%, 12.5%): later rounds free buffers the allocator placed on the heap (its mmap
  // threshold rose when the first large buffers were freed), which only malloc_trim returns.
  for (int round = 0; round < 3; ++round) {
    const size_t held_before = c->bytes().total();
    CompressionPlan plan(nl, nkv);
    for (int il = 0; il < nl; ++il) {
      for (int ih = 0; ih < nkv; ++ih) {
        HeadPlan& hp = plan.at(il, ih);
        hp.keep_all = false;
        for (int64_t t = ih % 2; t < c->n_tokens(il, ih); t += 2)
          hp.keep.push_back(static_cast<int32_t>(t));
      }
    }
    const size_t rss_before = rss_bytes();
    c->apply(plan);
    const size_t rss_after = rss_bytes();
    const size_t held_after = c->bytes().total();
    const size_t freed = held_before - held_after;
    EXPECT_NEAR(static_cast<double>(held_after), held_before / 2.0, held_before * 0.01);
    const double dropped = static_cast<double>(rss_before) - static_cast<double>(rss_after);
    std::printf(
        "round %d: KV held %.1f -> %.1f MiB (freed %.1f MiB); RSS %.1f -> %.1f MiB (dropped "
        "%.1f MiB, %.0f%% of freed)\n",
        round, held_before / 1048576.0, held_after / 1048576.0, freed / 1048576.0,
        rss_before / 1048576.0, rss_after / 1048576.0, dropped / 1048576.0,
        100.0 * dropped / static_cast<double>(freed));
    EXPECT_GE(dropped, 0.4 * static_cast<double>(freed)) << "round " << round;
  }
}

}  // namespace
}  // namespace kvtrim

#undef KVTRIM_TEST_ASAN  // not into the next file of a unity build
