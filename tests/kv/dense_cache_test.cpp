// The dense cache: attention against the scalar reference (GQA, causal, sliding window,
// soft-cap, f16 and f32, prefill and split decode with a thread pool), exact byte
// accounting, truncation, and the errors for bad appends.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"

namespace kvtrim {
namespace {

struct Case {
  int n_head = 4, n_head_kv = 2, hdk = 16, hdv = 16;
  int window = 0;
  float softcap = 0;
  KvDtype dtype = KvDtype::kF16;
};

using kvtest::randn;

// f16 round trip (what an f16 cache stores), identity for f32.
std::vector<float> stored(const std::vector<float>& v, KvDtype t) {
  if (t == KvDtype::kF32) return v;
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = fp16_to_fp32(fp32_to_fp16(v[i]));
  return r;
}

// Fills a 2-layer cache with n_ctx0 tokens by chunks, then checks attention of n_q new
// queries (after appending them) against the reference on the same (rounded) K/V.
void check_attention(const Case& c, int64_t n_prev, int64_t n_q, ThreadPool* pool,
                     int32_t pos_gap = 0) {
  std::mt19937 rng(42 + n_prev + n_q + c.window);
  KvCacheConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head_kv = c.n_head_kv;
  cfg.head_dim_k = c.hdk;
  cfg.head_dim_v = c.hdv;
  cfg.n_ctx = 100000;
  cfg.dtype = c.dtype;
  cfg.sliding_window = {c.window, 0};
  auto cache = make_dense_cache(cfg);
  const int64_t n_kv = n_prev + n_q;
  std::vector<float> k = randn(static_cast<size_t>(n_kv * c.n_head_kv * c.hdk), rng, 1.5f);
  std::vector<float> v = randn(static_cast<size_t>(n_kv * c.n_head_kv * c.hdv), rng);
  std::vector<int32_t> pos(static_cast<size_t>(n_kv));
  for (int64_t i = 0; i < n_kv; ++i)
    pos[i] = static_cast<int32_t>(i + (i >= n_prev / 2 ? pos_gap : 0));
  // append in uneven chunks to both layers
  for (int64_t i = 0; i < n_kv;) {
    const int64_t m = std::min<int64_t>(n_kv - i, 1 + (i * 7) % 300);
    for (int il = 0; il < 2; ++il) {
      cache->append(il, m, k.data() + i * c.n_head_kv * c.hdk, v.data() + i * c.n_head_kv * c.hdv,
                    pos.data() + i);
    }
    i += m;
  }
  ASSERT_EQ(cache->n_tokens(0, 0), n_kv);
  std::vector<float> q = randn(static_cast<size_t>(n_q * c.n_head * c.hdk), rng);
  const int32_t* q_pos = pos.data() + n_prev;
  AttnParams p;
  p.n_head = c.n_head;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.hdk));
  p.sliding_window = c.window;
  p.softcap = c.softcap;
  std::vector<float> out(static_cast<size_t>(n_q * c.n_head * c.hdv)), want(out.size());
  cache->attend(0, n_q, q.data(), q_pos, p, out.data(), pool);
  const std::vector<float> ks = stored(k, c.dtype), vs = stored(v, c.dtype);
  attention_reference(n_q, q.data(), q_pos, n_kv, ks.data(), vs.data(), pos.data(), c.n_head_kv,
                      c.hdk, c.hdv, p, want.data());
  double max_err = 0;
  for (size_t i = 0; i < out.size(); ++i)
    max_err = std::max(max_err, std::fabs(double(out[i]) - want[i]));
  EXPECT_LT(max_err, 2e-5) << "n_prev " << n_prev << " n_q " << n_q << " window " << c.window
                           << " dtype " << kv_dtype_name(c.dtype);
}

TEST(DenseCache, PrefillMatchesReferenceF16AndF32) {
  for (KvDtype t : {KvDtype::kF16, KvDtype::kF32}) {
    Case c;
    c.dtype = t;
    check_attention(c, 0, 37, nullptr);   // pure prefill: causal inside the chunk
    check_attention(c, 50, 20, nullptr);  // chunk after earlier tokens
  }
}

// Long prefill chunks go through attend.cpp's tiles (about 48 query rows each, several per
// call): every tile's rows must see their own causal and sliding-window runs, including rows
// whose run starts or ends inside a block of the tile's span, on 1 and 3 threads.
TEST(DenseCache, PrefillTilesMatchReference) {
  ThreadPool pool(3);
  for (KvDtype t : {KvDtype::kF16, KvDtype::kF32}) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      Case c;
      c.dtype = t;
      check_attention(c, 0, 300, p);    // one chunk from position 0: 13 tiles of 24 queries
      check_attention(c, 600, 130, p);  // a chunk after 600 tokens (spans of several blocks)
      c.window = 50;                    // window shorter than a tile's span
      check_attention(c, 400, 90, p);
      c.window = 0;
      c.n_head = 12;  // qwen-like group of 6: tiles of 8 queries
      c.n_head_kv = 2;
      c.hdk = c.hdv = 128;
      check_attention(c, 300, 77, p);
    }
  }
}

TEST(DenseCache, GqaGroupsAndHeadDims) {
  Case c;
  c.n_head = 9;  // smollm2-like: 3 groups of 3
  c.n_head_kv = 3;
  c.hdk = 64;
  c.hdv = 64;
  check_attention(c, 30, 5, nullptr);
  Case g;  // gemma3-like: 1 kv head, head_dim 256, odd dims not needed
  g.n_head = 4;
  g.n_head_kv = 1;
  g.hdk = 256;
  g.hdv = 256;
  check_attention(g, 10, 3, nullptr);
  Case o;  // a head dim that is not a multiple of any SIMD width
  o.hdk = 20;
  o.hdv = 12;
  check_attention(o, 9, 4, nullptr);
}

TEST(DenseCache, SlidingWindowAndSoftcap) {
  Case c;
  c.window = 5;
  check_attention(c, 40, 12, nullptr);
  c.window = 300;
  check_attention(c, 1000, 3, nullptr);
  Case s;
  s.softcap = 5.f;
  check_attention(s, 20, 6, nullptr);
}

TEST(DenseCache, DecodeWithSplitsAndThreads) {
  ThreadPool pool(4);
  for (KvDtype t : {KvDtype::kF16, KvDtype::kF32}) {
    Case c;
    c.dtype = t;
    check_attention(c, 5000, 1, &pool);  // one query: the run is split across threads
    check_attention(c, 3000, 2, &pool);
    c.window = 700;
    check_attention(c, 4000, 1, &pool);
    check_attention(c, 100, 64, &pool);  // prefill on the pool
  }
}

TEST(DenseCache, GapsInPositions) {
  // positions need not be contiguous (a compressed prefix, or a resumed sequence)
  Case c;
  check_attention(c, 60, 4, nullptr, /*pos_gap=*/1000);
  c.window = 40;
  check_attention(c, 60, 4, nullptr, /*pos_gap=*/20);
}

TEST(DenseCache, BytesAreExactAndTruncateDropsTokens) {
  KvCacheConfig cfg;
  cfg.n_layer = 3;
  cfg.n_head_kv = 2;
  cfg.head_dim_k = 16;
  cfg.head_dim_v = 8;
  cfg.n_ctx = 1000;
  for (KvDtype t : {KvDtype::kF16, KvDtype::kF32}) {
    cfg.dtype = t;
    auto cache = make_dense_cache(cfg);
    EXPECT_EQ(cache->bytes().total(), 0u);
    const size_t es = t == KvDtype::kF16 ? 2 : 4;
    std::vector<float> k(300 * 2 * 16, 0.5f), v(300 * 2 * 8, -0.5f);
    std::vector<int32_t> pos(300);
    for (int i = 0; i < 300; ++i) pos[i] = i;
    for (int il = 0; il < 3; ++il) cache->append(il, 300, k.data(), v.data(), pos.data());
    cache->advance(300);
    KvBytes b = cache->bytes();
    EXPECT_EQ(b.keys, 3u * 300 * 2 * 16 * es);
    EXPECT_EQ(b.values, 3u * 300 * 2 * 8 * es);
    EXPECT_EQ(b.positions, 3u * 300 * 4);
    EXPECT_EQ(b.other, 0u);
    ASSERT_EQ(b.per_layer.size(), 3u);
    EXPECT_EQ(b.per_layer[1], 300u * (2 * 16 * es + 2 * 8 * es + 4));
    EXPECT_EQ(cache->dense_bytes_f16(), 3u * 300 * 2 * (16 + 8) * 2);
    EXPECT_EQ(cache->n_past(), 300);

    cache->truncate(120);
    EXPECT_EQ(cache->n_past(), 120);
    for (int il = 0; il < 3; ++il) EXPECT_EQ(cache->n_tokens(il, 1), 120);
    b = cache->bytes();
    EXPECT_EQ(b.keys, 3u * 120 * 2 * 16 * es);
    // positions continue from the truncation point
    for (int il = 0; il < 3; ++il) cache->append(il, 10, k.data(), v.data(), pos.data() + 120);
    EXPECT_EQ(cache->n_tokens(2, 0), 130);
    cache->clear();
    EXPECT_EQ(cache->n_past(), 0);
    EXPECT_EQ(cache->bytes().total(), 0u);
    EXPECT_FALSE(cache->describe().empty());
  }
}

// KvCacheConfig::dense_bytes_per_token (Session's memory check) equals what a cache holds per
// uncompressed token, for every precision on each side and head dims with partial q4 blocks.
TEST(DenseCache, DenseBytesPerTokenEqualsWhatTheCacheHolds) {
  for (const KvTypeInfo& ik : kv_types()) {
    for (const KvTypeInfo& iv : kv_types()) {
      const KvDtype tk = ik.type, tv = iv.type;
      for (int d : {64, 48}) {
        KvCacheConfig cfg;
        cfg.n_layer = 2;
        cfg.n_head_kv = 3;
        cfg.head_dim_k = d;
        cfg.head_dim_v = d / 2;
        cfg.n_ctx = 100;
        cfg.dtype_k = tk;
        cfg.dtype_v = tv;
        auto cache = make_kv_cache(cfg);
        const int n = 40;
        std::vector<float> k(static_cast<size_t>(n) * 3 * d, 0.25f), v(static_cast<size_t>(n) * 3 * d / 2, -1.f);
        std::vector<int32_t> pos(n);
        for (int i = 0; i < n; ++i) pos[i] = i;
        for (int il = 0; il < 2; ++il) cache->append(il, n, k.data(), v.data(), pos.data());
        cache->advance(n);
        const KvBytes b = cache->bytes();
        EXPECT_EQ(b.total() - b.bases, static_cast<size_t>(n) * cfg.dense_bytes_per_token())
            << kv_dtype_name(tk) << " / " << kv_dtype_name(tv) << " d " << d;
      }
    }
  }
}

TEST(DenseCache, RejectsBadAppends) {
  KvCacheConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head_kv = 1;
  cfg.head_dim_k = 4;
  cfg.head_dim_v = 4;
  cfg.n_ctx = 8;
  auto cache = make_dense_cache(cfg);
  std::vector<float> k(16 * 4, 1.f);
  const int32_t p0[2] = {3, 4};
  cache->append(0, 2, k.data(), k.data(), p0);
  const int32_t again[1] = {4};
  EXPECT_THROW(cache->append(0, 1, k.data(), k.data(), again), Error);  // not increasing
  const int32_t beyond[1] = {8};
  EXPECT_THROW(cache->append(0, 1, k.data(), k.data(), beyond), Error);  // past n_ctx
  EXPECT_THROW(cache->append(1, 1, k.data(), k.data(), beyond), Error);  // no such layer
  AttnParams p;
  p.n_head = 0;  // no query heads
  std::vector<float> out(16);
  EXPECT_THROW(cache->attend(0, 1, k.data(), p0, p, out.data(), nullptr), Error);
}

}  // namespace
}  // namespace kvtrim

namespace kvtrim {
TEST(DenseCacheReadHead, ReturnsWhatWasAppendedAndAcceptsPlans) {
  KvCacheConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head_kv = 2;
  cfg.head_dim_k = 8;
  cfg.head_dim_v = 4;
  cfg.n_ctx = 64;
  cfg.dtype = KvDtype::kF32;
  auto c = make_dense_cache(cfg);
  const int n = 21;  // crosses a key tile
  std::vector<float> k(n * 2 * 8), v(n * 2 * 4);
  std::vector<int32_t> pos(n);
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i) * 0.5f;
  for (size_t i = 0; i < v.size(); ++i) v[i] = -static_cast<float>(i);
  for (int i = 0; i < n; ++i) pos[i] = 3 * i;
  c->append(1, n, k.data(), v.data(), pos.data());
  std::vector<float> hk, hv;
  std::vector<int32_t> hp;
  c->read_head(1, 1, &hk, &hv, &hp);
  ASSERT_EQ(hk.size(), size_t{n * 8});
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < 8; ++i) EXPECT_EQ(hk[t * 8 + i], k[(t * 2 + 1) * 8 + i]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(hv[t * 4 + i], v[(t * 2 + 1) * 4 + i]);
    EXPECT_EQ(hp[t], 3 * t);
  }
  // the dense cache is the token cache: an all-keep_all plan leaves it as it was
  const size_t held = c->bytes().total();
  c->apply(CompressionPlan(2, 2));
  EXPECT_EQ(c->bytes().total(), held);
  EXPECT_THROW(c->apply(CompressionPlan(2, 3)), Error);  // wrong shape
}
}  // namespace kvtrim
