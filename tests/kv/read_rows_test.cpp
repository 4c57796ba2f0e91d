// KvCache::read_head_rows: selected tokens of a head, the same values read_head gives for them
// (every dtype; a dense head, and a head with two basis epochs, anchors and dense appends);
// bad rows are errors.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"

namespace kvtrim {
namespace {

using kvtest::fill;
using kvtest::kAllDtypes;
using kvtest::make_cfg;
using kvtest::random_basis;
using kvtest::random_keep;
using kvtest::set_basis;

// read_head_rows(rows) against the same rows of read_head, bit for bit (also k or v alone).
void expect_rows_match(const KvCache& c, int il, int ih, const std::vector<int32_t>& rows,
                       const std::string& what) {
  const int dk = c.config().head_dim_k, dv = c.config().head_dim_v;
  std::vector<float> k, v, rk, rv, rk2, rv2;
  c.read_head(il, ih, &k, &v, nullptr);
  c.read_head_rows(il, ih, rows, &rk, &rv);
  ASSERT_EQ(rk.size(), rows.size() * dk) << what;
  ASSERT_EQ(rv.size(), rows.size() * dv) << what;
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t t = static_cast<size_t>(rows[r]);
    for (int i = 0; i < dk; ++i) ASSERT_EQ(rk[r * dk + i], k[t * dk + i]) << what << " row " << t;
    for (int i = 0; i < dv; ++i) ASSERT_EQ(rv[r * dv + i], v[t * dv + i]) << what << " row " << t;
  }
  c.read_head_rows(il, ih, rows, &rk2, nullptr);
  EXPECT_EQ(rk2, rk) << what;
  c.read_head_rows(il, ih, rows, nullptr, &rv2);
  EXPECT_EQ(rv2, rv) << what;
}

TEST(ReadHeadRows, MatchesReadHeadAcrossEpochsAnchorsAndDtypes) {
  for (KvDtype t : kAllDtypes) {
    const std::string what = kv_dtype_name(t);
    std::mt19937 rng(5);
    const int nkv = 2, dk = 32, dv = 24;
    auto c = make_kv_cache(make_cfg(1, nkv, dk, dv, t));
    fill(*c, 150, 0, rng);
    // head 1: epoch 1 drops some tokens, keeps anchors dense, buffers new tokens dense
    CompressionPlan p1(1, nkv);
    HeadPlan& h1 = p1.at(0, 1);
    set_basis(h1, dk, 8, dv, 6, rng);
    h1.keep_all = false;
    h1.keep = random_keep(150, 0.8, rng);
    h1.anchors = {h1.keep[0], h1.keep[1], h1.keep[h1.keep.size() / 2], h1.keep.back()};
    h1.appends_dense = true;
    c->apply(p1);
    fill(*c, 60, 150, rng);  // dense buffer of head 1
    CompressionPlan p2(1, nkv);
    HeadPlan& h2 = p2.at(0, 1);
    set_basis(h2, dk, 5, dv, 7, rng);
    const int64_t n1 = c->n_tokens(0, 1);
    h2.anchors = {0, static_cast<int32_t>(n1 - 3), static_cast<int32_t>(n1 - 1)};
    h2.appends_dense = true;
    c->apply(p2);
    fill(*c, 25, 210, rng);
    const KvCache::HeadLayout lay = c->head_layout(0, 1);
    int n_dense = 0, n_ep = 0;
    for (int32_t e : lay.epoch) n_dense += e < 0, n_ep += e >= 0 && e != lay.current_epoch;
    ASSERT_GT(n_dense, 25) << what;  // the buffer and anchors
    ASSERT_GT(n_ep, 0) << what;      // tokens still in the first epoch
    for (int ih = 0; ih < nkv; ++ih) {
      const int64_t n = c->n_tokens(0, ih);
      std::vector<int32_t> all(static_cast<size_t>(n)), dense;
      for (int32_t j = 0; j < n; ++j) all[static_cast<size_t>(j)] = j;
      expect_rows_match(*c, 0, ih, all, what + " all");
      expect_rows_match(*c, 0, ih, {}, what + " none");
      expect_rows_match(*c, 0, ih, {0, static_cast<int32_t>(n - 1)}, what + " ends");
      for (double frac : {0.05, 0.3, 0.7})
        expect_rows_match(*c, 0, ih, random_keep(n, frac, rng), what + " subset");
      if (ih == 1) {
        for (int32_t j = 0; j < n; ++j)
          if (lay.epoch[static_cast<size_t>(j)] < 0) dense.push_back(j);
        expect_rows_match(*c, 0, ih, dense, what + " dense");
      }
    }
    // bad rows: unsorted, repeated, negative, past the end; bad head
    std::vector<float> k, v;
    const int32_t n = static_cast<int32_t>(c->n_tokens(0, 1));
    EXPECT_THROW(c->read_head_rows(0, 1, {3, 2}, &k, &v), Error) << what;
    EXPECT_THROW(c->read_head_rows(0, 1, {2, 2}, &k, &v), Error) << what;
    EXPECT_THROW(c->read_head_rows(0, 1, {-1}, &k, &v), Error) << what;
    EXPECT_THROW(c->read_head_rows(0, 1, {0, n}, &k, &v), Error) << what;
    EXPECT_THROW(c->read_head_rows(0, 0, {static_cast<int32_t>(c->n_tokens(0, 0))}, &k, nullptr),
                 Error)
        << what;  // the dense head
    EXPECT_THROW(c->read_head_rows(1, 0, {0}, &k, &v), Error) << what;
    EXPECT_THROW(c->read_head_rows(0, nkv, {0}, &k, &v), Error) << what;
  }
}

}  // namespace
}  // namespace kvtrim
