// The sweep of the feature-axis (low-rank) presses, as press_sweep_test does for token presses:
// every registered press with PressInfo::feature_axis x ratios {0, 0.25, 0.5, 0.9} x variants
// (compressed during prefill, prefill=full, after snapkv, before streamingllm) runs prefill +
// compress + decode + generation on the tiny model with an in-memory calibration: every token
// is kept (or exactly the evicting press's selection), the K/V elements shrink with the rank,
// n_past stays the uncompressed length and generation continues with finite logits.
#include <gtest/gtest.h>

#include "basis_test_util.h"

namespace kvtrim {
namespace {

class BasisSweep : public test::PressFixture {};

constexpr int kN = 40;

void run_one(const std::string& spec, double ratio, bool evicts, Model& model,
             const SessionParams& sp, const std::vector<int32_t>& prompt) {
  SCOPED_TRACE(spec);
  Session s(model, sp);
  s.set_press(make_press(spec));
  s.prefill(prompt);
  const int nh = model.hparams().n_layer * model.hparams().n_head_kv;
  const int d = model.hparams().head_dim_k;
  s.compress();
  EXPECT_EQ(s.n_past(), kN);
  const int64_t kept = total_tokens(s.cache());
  if (!evicts) {
    EXPECT_EQ(kept, nh * kN);
  } else {
    EXPECT_EQ(kept, nh * kN / 2);
  }
  for (int il = 0; il < model.hparams().n_layer; ++il)
    for (int ih = 0; ih < model.hparams().n_head_kv; ++ih)
      EXPECT_GE(s.cache().head_layout(il, ih).current_epoch, 0);
  // K/V elements: at most the rank's share of the dense f32 bytes plus the full-rank anchors.
  const KvBytes b = s.cache().bytes();
  const size_t dense = static_cast<size_t>(kept) * static_cast<size_t>(d) * 4;
  const int r = LowRankPress::rank_for_removed_ratio(ratio, d);
  if (ratio > 0 && spec.find("ojakv") == std::string::npos) {  // no anchors by default
    EXPECT_EQ(b.keys, dense * static_cast<size_t>(r) / static_cast<size_t>(d));
  } else {
    EXPECT_LE(b.keys, dense);
  }
  EXPECT_GT(b.bases, 0u);
  const auto& lg = s.decode(7);
  for (float x : lg) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(s.n_past(), kN + 1);
  GenerateParams gp;
  gp.max_new_tokens = 6;
  gp.stop_at_eog = false;
  auto res = s.generate({}, gp);
  EXPECT_EQ(res.tokens.size(), 6u);
  EXPECT_EQ(s.n_past(), kN + 6);
  if (!evicts) {
    EXPECT_EQ(total_tokens(s.cache()), nh * (kN + 6));
  }
}

TEST_F(BasisSweep, EveryLowRankPressEveryRatioEveryVariant) {
  test::CalibrationScope scope(test::with_stief_fits(
      *model_, *test::tiny_calibration(*model_, capture(test::calib_tokens()))));
  int n_runs = 0;
  for (const auto& info : press_registry()) {
    if (!info.feature_axis) continue;
    const bool stief = info.name == "stiefattention";
    // stiefattention: fixed ranks must be trained candidates (4, 8, 12 of 16), and eps = 1 lets
    // every layer take the smallest pair (4, 4): ratio 0.75
    for (double ratio : stief ? std::vector<double>{0.25, 0.5, 0.75, -1}
                              : std::vector<double>{0.0, 0.25, 0.5, 0.9}) {
      const std::string base = ratio < 0 ? info.name + ":eps=1" : info.name + strprintf(":ratio=%g", ratio);
      if (ratio < 0) ratio = 0.75;
      const std::string t = info.name == "ojakv" ? ",T=2" : "";  // OjaKV updates during generation
      run_one(base + t, ratio, false, *model_, params(), tokens(kN));
      run_one(base + t + ",prefill=full", ratio, false, *model_, params(), tokens(kN));
      run_one("snapkv:ratio=0.5+" + base + t, ratio, true, *model_, params(), tokens(kN));
      run_one(base + t + "+streamingllm:ratio=0.5", ratio, true, *model_, params(), tokens(kN));
      n_runs += 4;
    }
  }
  EXPECT_EQ(n_runs, 7 * 4 * 4);  // ksvd, eigenattention, stiefattention, kqsvd, staticpca, ojakv, palu
}

}  // namespace
}  // namespace kvtrim
