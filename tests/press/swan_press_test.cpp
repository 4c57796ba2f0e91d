// SWAN (src/press/channel/swan.cpp) on the tiny model against brute force: the calibrated
// rotations of each head, the kept coordinates of every pruned token (the top k_active of the
// rotated vector, computed here from the captured keys and values), the dense buffer through
// decode, the projection ablations, retention 1 = the uncompressed model, composition with token
// eviction, and clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "basis_test_util.h"
#include "press_fixture.h"

namespace kvtrim {
namespace {

class SwanPress : public test::PressFixture {};

constexpr int kSwanTokens = 40;

// c = Pᵀ x for a [d, d] row-major P.
std::vector<double> rotate(const std::vector<float>& P, const float* x, int d) {
  std::vector<double> c(static_cast<size_t>(d), 0.0);
  for (int j = 0; j < d; ++j)
    for (int i = 0; i < d; ++i) c[static_cast<size_t>(j)] += static_cast<double>(P[static_cast<size_t>(i * d + j)]) * x[i];
  return c;
}

std::vector<int32_t> nonzero(const std::vector<double>& c, double eps) {
  std::vector<int32_t> o;
  for (size_t j = 0; j < c.size(); ++j)
    if (std::fabs(c[j]) > eps) o.push_back(static_cast<int32_t>(j));
  return o;
}

// The magnitude top-k of c, as bf_topk does for scores.
std::vector<int32_t> top_abs(const std::vector<double>& c, int k) {
  std::vector<double> a(c.size());
  for (size_t j = 0; j < c.size(); ++j) a[j] = std::fabs(c[j]);
  return test::bf_topk(a, k);
}

TEST_F(SwanPress, PrunedTokensKeepTheirTopKRotatedCoordinates) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const HParams& hp = model_->hparams();
  const int d = hp.head_dim_k;
  const std::vector<int32_t> prompt = tokens(kSwanTokens);
  const test::CaptureAll c = capture(prompt);
  auto s = prefilled("swan:k=5,kv=9,buffer=8", prompt);
  s->compress();
  for (int il = 0; il < hp.n_layer; ++il)
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      const HeadFit& f = scope.cal->fit(BasisMethod::kSwan, il, ih);
      const KvCache::HeadLayout lay = s->cache().head_layout(il, ih);
      EXPECT_EQ(lay.basis_k, f.k.enc_cols(d));
      EXPECT_EQ(lay.basis_v, f.v.enc_cols(d));
      std::vector<float> k, v;
      s->cache().read_head(il, ih, &k, &v, nullptr);
      for (int t = 0; t < kSwanTokens; ++t) {
        ASSERT_EQ(lay.epoch[static_cast<size_t>(t)] < 0, t >= kSwanTokens - 8) << "buffer: the last 8 stay dense";
        if (t >= kSwanTokens - 8) continue;
        for (auto [P, got, orig, T] : {std::tuple{&f.k.enc, k.data() + t * d, c.krow(il, t, ih), 5},
                                       std::tuple{&f.v.enc, v.data() + t * d, c.vrow(il, t, ih), 9}}) {
          const std::vector<double> want = rotate(*P, orig, d), have = rotate(*P, got, d);
          EXPECT_EQ(nonzero(have, 1e-5), top_abs(want, T)) << "layer " << il << " head " << ih << " token " << t;
          for (int32_t j : top_abs(want, T))  // f16 entries
            EXPECT_NEAR(have[static_cast<size_t>(j)], want[static_cast<size_t>(j)], 1e-3 * std::fabs(want[static_cast<size_t>(j)]) + 1e-5);
        }
      }
    }
  // decode: every new token enters the buffer, the oldest leaves it pruned
  for (int i = 0; i < 5; ++i) s->decode(3 + i);
  for (int il = 0; il < hp.n_layer; ++il)
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      const KvCache::HeadLayout lay = s->cache().head_layout(il, ih);
      ASSERT_EQ(lay.epoch.size(), static_cast<size_t>(kSwanTokens + 5));
      for (int t = 0; t < kSwanTokens + 5; ++t) EXPECT_EQ(lay.epoch[static_cast<size_t>(t)] < 0, t >= kSwanTokens + 5 - 8);
    }
  const KvBytes b = s->cache().bytes();
  const size_t nh = static_cast<size_t>(hp.n_layer * hp.n_head_kv), mb = static_cast<size_t>(d + 7) / 8;
  EXPECT_EQ(b.indices, nh * (kSwanTokens + 5 - 8) * 2 * mb);  // auto: a bitmask is smaller than 5 or 9 indices
  EXPECT_EQ(b.keys, nh * ((kSwanTokens + 5 - 8) * 5 * 2 + 8 * static_cast<size_t>(d) * 4));  // f16 entries, f32 buffer
  // the paper's layout (a uint8 index per entry): other bytes, the same attention up to the order
  // of the float additions (the list and bitmask kernels sum the kept entries differently)
  auto l = prefilled("swan:k=5,kv=9,buffer=8,index=list", prompt);
  l->compress();
  for (int i = 0; i < 5; ++i) l->decode(3 + i);
  EXPECT_EQ(l->cache().bytes().indices, nh * (kSwanTokens + 5 - 8) * (5 + 9));
  const std::vector<float> a = l->decode(9), bm = s->decode(9);
  ASSERT_EQ(a.size(), bm.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], bm[i], 1e-4f * (1.f + std::fabs(a[i]))) << i;
}

// Retention 1 rotates without pruning: the same logits as the uncompressed cache (the rotation is
// lossless, Lemmas A.1 / A.2), here through decode steps that read the rotated cache.
TEST_F(SwanPress, RetentionOneIsLossless) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const std::vector<int32_t> prompt = tokens(kSwanTokens);
  SessionParams sp = params();
  Session plain(*model_, sp);
  plain.prefill(prompt);
  auto s = prefilled("swan:ratio=0,buffer=4,values=f16", prompt);
  s->compress();
  for (int i = 0; i < 6; ++i) {
    const std::vector<float> a = plain.decode(11 + i), b = s->decode(11 + i);
    double mx = 0, scale = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      mx = std::max(mx, std::fabs(static_cast<double>(a[j]) - b[j]));
      scale = std::max(scale, std::fabs(static_cast<double>(a[j])));
    }
    EXPECT_LT(mx, 2e-3 * scale) << "step " << i;  // f16 rounding of the rotated coordinates only
  }
  EXPECT_EQ(s->cache().bytes().indices, 0u);
}

TEST_F(SwanPress, ProjectionAblations) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const HParams& hp = model_->hparams();
  const int d = hp.head_dim_k, nl = hp.n_layer, nkv = hp.n_head_kv;
  auto layouts = [&](const std::string& spec) {
    auto s = prefilled(spec, tokens(kSwanTokens));
    s->compress();
    std::vector<KvCache::HeadLayout> out;
    for (int il = 0; il < nl; ++il)
      for (int ih = 0; ih < nkv; ++ih) out.push_back(s->cache().head_layout(il, ih));
    return out;
  };
  auto fit = [&](int il, int ih) { return scope.cal->fit(BasisMethod::kSwan, il, ih); };
  // swap: keys take P_VO, values P_QK
  auto sw = layouts("swan:proj=swap");
  for (int il = 0; il < nl; ++il)
    for (int ih = 0; ih < nkv; ++ih) {
      EXPECT_EQ(sw[static_cast<size_t>(il * nkv + ih)].basis_k, fit(il, ih).v.enc_cols(d));
      EXPECT_EQ(sw[static_cast<size_t>(il * nkv + ih)].basis_v, fit(il, ih).k.enc_cols(d));
    }
  // layer-shuffle: each layer's heads take one other layer's matrices, a permutation of layers
  for (uint32_t seed : {0u, 1u, 2u}) {
    auto ls = layouts("swan:proj=layer-shuffle,seed=" + std::to_string(seed));
    std::set<int> used;
    for (int il = 0; il < nl; ++il) {
      int src = -1;
      for (int jl = 0; jl < nl; ++jl)
        if (ls[static_cast<size_t>(il * nkv)].basis_k == fit(jl, 0).k.enc_cols(d)) src = jl;
      ASSERT_GE(src, 0) << "layer " << il << " uses no layer's P_QK";
      used.insert(src);
      for (int ih = 0; ih < nkv; ++ih) EXPECT_EQ(ls[static_cast<size_t>(il * nkv + ih)].basis_v, fit(src, ih).v.enc_cols(d));
    }
    EXPECT_EQ(used.size(), static_cast<size_t>(nl));
  }
  // head-shuffle: within a layer, a permutation of its kv heads
  auto hs = layouts("swan:proj=head-shuffle,seed=5");
  for (int il = 0; il < nl; ++il) {
    std::set<int> used;
    for (int ih = 0; ih < nkv; ++ih)
      for (int jh = 0; jh < nkv; ++jh)
        if (hs[static_cast<size_t>(il * nkv + ih)].basis_k == fit(il, jh).k.enc_cols(d)) used.insert(jh);
    EXPECT_EQ(used.size(), static_cast<size_t>(nkv));
  }
  // random: orthonormal, seeded, not the calibration's; identity: no basis
  auto r1 = layouts("swan:proj=random,seed=3"), r2 = layouts("swan:proj=random,seed=3"),
       r3 = layouts("swan:proj=random,seed=4");
  EXPECT_EQ(r1[0].basis_k, r2[0].basis_k);
  EXPECT_NE(r1[0].basis_k, r3[0].basis_k);
  EXPECT_NE(r1[0].basis_k, fit(0, 0).k.enc_cols(d));
  EXPECT_NE(r1[0].basis_k, r1[1].basis_k);
  for (int a = 0; a < d; ++a)
    for (int b2 = 0; b2 < d; ++b2) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += double(r1[0].basis_k[i * d + a]) * r1[0].basis_k[i * d + b2];
      EXPECT_NEAR(dot, a == b2 ? 1.0 : 0.0, 1e-5);
    }
  auto id = layouts("swan:proj=identity");
  EXPECT_TRUE(id[0].basis_k.empty());
  EXPECT_GE(id[0].current_epoch, 0);
}

TEST_F(SwanPress, ComposesWithEvictionAndBytesMultiply) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const HParams& hp = model_->hparams();
  const size_t nh = static_cast<size_t>(hp.n_layer * hp.n_head_kv), d = static_cast<size_t>(hp.head_dim_k);
  auto s = prefilled("snapkv:0.5+swan:ratio=0.75,buffer=4,values=fp8", tokens(kSwanTokens));
  s->compress();
  EXPECT_EQ(total_tokens(s->cache()), static_cast<int64_t>(nh * kSwanTokens / 2));
  const KvBytes b = s->cache().bytes();
  const size_t T = d / 4, pruned = kSwanTokens / 2 - 4;
  EXPECT_EQ(b.indices, nh * pruned * 2 * ((d + 7) / 8));  // bitmask rows
  EXPECT_EQ(b.keys, nh * (pruned * T + 4 * d * 4));  // fp8 entries + the f32 buffer
  EXPECT_EQ(b.scales, nh * pruned * 2 * 4);         // one f32 per fp8 row, keys and values
  GenerateParams gp;
  gp.max_new_tokens = 5;
  gp.stop_at_eog = false;
  EXPECT_EQ(s->generate({}, gp).tokens.size(), 5u);
}

// prefill=throughout: the epoch starts after the first forward call; the prompt's later chunks
// pass through the buffer (b + n - 1 stay dense after a chunk of n: 16 + 16 + 8 tokens, b = 8 ->
// 8, then 23, then 15 dense), and the prompt's logits read the pruned cache.
TEST_F(SwanPress, PrefillThroughout) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const HParams& hp = model_->hparams();
  auto s = prefilled("swan:k=5,buffer=8,prefill=throughout", tokens(kSwanTokens), 16);
  for (int il = 0; il < hp.n_layer; ++il)
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      const KvCache::HeadLayout lay = s->cache().head_layout(il, ih);
      int dense = 0;
      for (int32_t e : lay.epoch) dense += e < 0 ? 1 : 0;
      EXPECT_EQ(dense, 15) << il << "," << ih;
    }
  Session plain(*model_, params(16));
  const std::vector<float> a = plain.prefill(tokens(kSwanTokens));
  const std::vector<float> b = s->decode(3), a2 = plain.decode(3);
  double diff = 0;
  for (size_t j = 0; j < b.size(); ++j) diff = std::max(diff, std::fabs(static_cast<double>(b[j]) - a2[j]));
  EXPECT_GT(diff, 1e-3);  // pruned keys and values change the logits
  EXPECT_THROW(make_press("swan:prefill=during"), Error);
}

TEST_F(SwanPress, ClearErrors) {
  for (const char* bad : {"swan:ratio=1", "swan:values=q8", "swan:index=u16", "swan:proj=pca", "swan:buffer=-1", "swan:k=-2",
                          "swan:seed=-1", "swan:nosuch=1"})
    EXPECT_THROW(make_press(bad), Error) << bad;
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  auto s = prefilled("swan:k=1000", tokens(kSwanTokens));
  test::expect_error([&] { s->compress(); }, "head size");
  set_calibration_override(nullptr);
  auto m = prefilled("swan", tokens(kSwanTokens));
  test::expect_error([&] { m->compress(); }, "kvtrim calibrate");
}

}  // namespace
}  // namespace kvtrim
