// Lexico (src/press/channel/lexico.cpp) on the tiny model against brute force: every token older
// than the buffer holds the OMP code (computed here by the double-precision reference from the
// captured keys and values) over its layer's dictionary, through prefill and decode; the ratio
// sets s from the bytes; composition with eviction multiplies the bytes; clear errors.
#include <gtest/gtest.h>

#include <cmath>

#include "basis_test_util.h"
#include "kv/sparse_code.h"
#include "press_fixture.h"

namespace kvtrim {
namespace {

class LexicoPress : public test::PressFixture {};

constexpr int kLexicoTokens = 40;

// D·c of the reference OMP code of x over the dictionary D [d, N].
std::vector<double> omp_reconstruction(const std::vector<float>& D, int d, int N, const float* x, int s) {
  std::vector<float> A(D.size());
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < N; ++j) A[static_cast<size_t>(j) * d + i] = D[static_cast<size_t>(i) * N + j];
  std::vector<int32_t> idx(static_cast<size_t>(s));
  std::vector<float> c(static_cast<size_t>(s));
  kv::omp_encode_reference(D.data(), d, N, x, 1, d, s, idx.data(), c.data());
  std::vector<double> y(static_cast<size_t>(d), 0.0);
  for (int e = 0; e < s; ++e)
    for (int i = 0; i < d; ++i) y[static_cast<size_t>(i)] += static_cast<double>(c[static_cast<size_t>(e)]) * A[static_cast<size_t>(idx[static_cast<size_t>(e)]) * d + i];
  return y;
}

TEST_F(LexicoPress, TokensOlderThanTheBufferHoldTheirOmpCodes) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const HParams& hp = model_->hparams();
  const int d = hp.head_dim_k, N = test::kTinyAtoms;
  const std::vector<int32_t> prompt = tokens(kLexicoTokens);
  auto s = prefilled("lexico:s=3,sv=5,buffer=8,values=f16", prompt);
  s->compress();
  for (int step = 0; step < 6; ++step) s->decode(3 + step);
  // the keys / values every position was computed with (decode tokens included)
  std::vector<int32_t> all = prompt;
  for (int step = 0; step < 6; ++step) all.push_back(3 + step);
  const test::CaptureAll c = capture(all);
  const LexicoDicts& dict = scope.cal->lexico();
  const int n = kLexicoTokens + 6;
  for (int il = 0; il < hp.n_layer; ++il)
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      const KvCache::HeadLayout lay = s->cache().head_layout(il, ih);
      ASSERT_EQ(lay.epoch.size(), static_cast<size_t>(n));
      std::vector<float> k, v;
      s->cache().read_head(il, ih, &k, &v, nullptr);
      for (int t = 0; t < n; ++t) {
        ASSERT_EQ(lay.epoch[static_cast<size_t>(t)] < 0, t >= n - 8) << "the newest 8 stay dense";
        if (t >= n - 8) continue;
        for (auto [D, orig, got, S] : {std::tuple{&dict.k[static_cast<size_t>(il)], c.krow(il, t, ih), k.data() + t * d, 3},
                                       std::tuple{&dict.v[static_cast<size_t>(il)], c.vrow(il, t, ih), v.data() + t * d, 5}}) {
          const std::vector<double> want = omp_reconstruction(*D, d, N, orig, S);
          double scale = 0;
          for (int i = 0; i < d; ++i) scale = std::max(scale, std::fabs(static_cast<double>(orig[i])));
          for (int i = 0; i < d; ++i)
            ASSERT_NEAR(got[i], want[static_cast<size_t>(i)], 3e-3 * scale + 1e-5)
                << "layer " << il << " head " << ih << " token " << t << " component " << i;
        }
      }
    }
}

TEST_F(LexicoPress, RatioSetsTheAtomsFromTheBytes) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const HParams& hp = model_->hparams();
  const size_t nh = static_cast<size_t>(hp.n_layer * hp.n_head_kv), coded = kLexicoTokens - 4;
  // d = 16, N = 40 (uint8 indices): fp8 rows (the default) cost 2s + 4 bytes, f16 rows 3s, of 2d = 32
  for (auto [spec, s_each] : {std::pair{"lexico:buffer=4", 6},                         // (16 - 4) / 2
                              std::pair{"lexico:ratio=0.75,buffer=4", 2},              // (8 - 4) / 2
                              std::pair{"lexico:ratio=0,buffer=4", 14},                // (32 - 4) / 2
                              std::pair{"lexico:ratio=0.5,values=f16,buffer=4", 5},    // 16 / 3
                              std::pair{"lexico:ratio=0.75,values=f16,buffer=4", 2}}) {  // 8 / 3
    SCOPED_TRACE(spec);
    auto s = prefilled(spec, tokens(kLexicoTokens));
    s->compress();
    EXPECT_EQ(s->cache().bytes().indices, nh * coded * 2 * static_cast<size_t>(s_each));
  }
}

TEST_F(LexicoPress, ComposesWithEvictionAndBytesMultiply) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const HParams& hp = model_->hparams();
  auto a = prefilled("lexico:s=4,buffer=0", tokens(kLexicoTokens));
  a->compress();
  auto b = prefilled("snapkv:0.5+lexico:s=4,buffer=0", tokens(kLexicoTokens));
  b->compress();
  const size_t nh = static_cast<size_t>(hp.n_layer * hp.n_head_kv);
  EXPECT_EQ(a->cache().bytes().indices, nh * kLexicoTokens * 8);
  EXPECT_EQ(b->cache().bytes().indices, nh * (kLexicoTokens / 2) * 8) << "half the tokens, each coded";
  const std::vector<float> x = b->decode(5);
  for (float v : x) ASSERT_TRUE(std::isfinite(v));
}

// prefill=throughout: each layer starts its epoch after the first forward call, so the prompt's
// own later chunks already read coded tokens; the buffer keeps the newest dense.
TEST_F(LexicoPress, ThroughoutCodesDuringThePrefill) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const HParams& hp = model_->hparams();
  auto s = prefilled("lexico:s=4,buffer=4,prefill=throughout", tokens(kLexicoTokens));  // chunks of 16
  for (int il = 0; il < hp.n_layer; ++il)
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      const KvCache::HeadLayout lay = s->cache().head_layout(il, ih);
      ASSERT_EQ(lay.epoch.size(), static_cast<size_t>(kLexicoTokens));
      // after the last chunk (8 tokens) the buffer holds 4 + 8 - 1: the rest is coded already
      for (int t = 0; t < kLexicoTokens; ++t) EXPECT_EQ(lay.epoch[static_cast<size_t>(t)] < 0, t >= kLexicoTokens - 11) << t;
    }
  const std::vector<float> x = s->decode(7);
  for (float v : x) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(LexicoPress, ClearErrors) {
  const HParams& hp = model_->hparams();
  {
    auto cal = test::tiny_calibration(*model_, capture(test::calib_tokens()));
    cal->set_lexico(nullptr);
    test::CalibrationScope scope(cal);
    auto s = prefilled("lexico", tokens(kLexicoTokens));
    EXPECT_NE(test::error_of([&] { s->compress(); }).find("kvtrim calibrate --lexico"), std::string::npos);
  }
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  auto s = prefilled("lexico:s=" + std::to_string(hp.head_dim_k + 1), tokens(kLexicoTokens));
  EXPECT_NE(test::error_of([&] { s->compress(); }).find("more than min(head size"), std::string::npos);
  EXPECT_NE(test::error_of([] { make_press("lexico:values=q4"); }), "");
  EXPECT_NE(test::error_of([] { make_press("lexico:ratio=1"); }), "");
  EXPECT_NE(test::error_of([] { make_press("lexico:atoms=3"); }), "") << "unknown option";
}

}  // namespace
}  // namespace kvtrim
