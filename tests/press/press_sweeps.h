// The generic sweeps, one per press axis (PressAxis), driven by the registry: which presses run
// (PressInfo::axis), with which settings (PressInfo::test_easy / test_hard) and what is expected
// of them (PressInfo::per_layer_budget) come from each press's PressInfo, never from its name.
// press_sweep_test, channel_press_test and basis_sweep_test run them over every registered press
// of their axis; press_axes_test over toy presses it registers, to show a new press is picked up.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "press/basis/lowrank_press.h"
#include "press/press_spec.h"
#include "press_fixture.h"

namespace kvtrim::test {

// The registered presses of an axis (wrappers left out: the sweeps wrap presses in them).
inline std::vector<const PressInfo*> presses_of(PressAxis axis) {
  std::vector<const PressInfo*> out;
  for (const PressInfo& info : press_registry())
    if (!info.wrapper && info.axis == axis) out.push_back(&info);
  return out;
}

inline bool declares(const PressInfo& info, const std::string& option) {
  return std::any_of(info.options.begin(), info.options.end(),
                     [&](const PressOption& o) { return o.name == option; });
}

// The ratio a press string compresses with (its ratio option, as given or by default; -1: none).
inline double spec_ratio(const std::string& spec) {
  return press_spec_ratio(parse_press_spec(spec));
}

// `spec` with one more option: "snapkv:ratio=0.5" + "window=8" -> "snapkv:ratio=0.5,window=8".
inline std::string with_option(const std::string& spec, const std::string& option) {
  return spec + (spec.find(':') == std::string::npos ? ":" : ",") + option;
}

// The settings a sweep runs for a press: its easy and hard ones, after `name:ratio=0` (nothing
// removed) when with_noop and the press has a ratio.
inline std::vector<std::string> sweep_specs(const PressInfo& info, bool with_noop) {
  std::vector<std::string> v;
  if (with_noop && declares(info, "ratio")) v.push_back(info.name + ":ratio=0");
  EXPECT_FALSE(info.test_easy.empty() || info.test_hard.empty())
      << info.name << ": no test settings";
  if (!info.test_easy.empty()) v.push_back(info.test_easy);
  if (!info.test_hard.empty()) v.push_back(info.test_hard);
  return v;
}

constexpr int kSweepTokens = 40;  // prompt length of every sweep

// ---------------------------------------------------------------------------------------
// Token axis: prefill + compress + decode; the cache holds exactly the planned tokens, its bytes
// drop accordingly, n_past stays the uncompressed length and generation continues.

enum class TokenCount {
  kExact,      // every head keeps int(n (1 - ratio)) (adakv: the same total over a layer's heads)
  kWithinOne,  // per-layer budgets (PressInfo::per_layer_budget) are rounded: within a token per
               // head
  kAtMost,     // a composition: at most the last press's count
};

inline int64_t keep_of(double ratio) {
  Budget b;
  b.ratio = ratio;
  return b.keep_count(kSweepTokens);
}

inline void sweep_token_run(const std::string& spec, double ratio, TokenCount count, Model& model,
                            const std::vector<int32_t>& prompt, const SessionParams& sp,
                            bool with_question) {
  SCOPED_TRACE(spec);
  Session s(model, sp);
  s.set_press(make_press(spec));
  s.prefill(prompt);
  if (with_question) s.observe_question({1, 2, 3, 4, 5});
  s.prepare_compress();  // the re-feed passes (kvcompose, kvzip): the plan below reads them
  const int64_t before = total_tokens(s.cache());
  const size_t bytes_before = s.cache().bytes().total();
  const size_t keys_before = s.cache().bytes().keys;
  int64_t planned = 0;  // from the plan itself (computed before apply), independently of the cache
  {
    PressContext ctx(s.cache(), s.model().hparams(), s.observations(), nullptr);
    const CompressionPlan plan = s.press()->plan(ctx);
    for (int il = 0; il < plan.n_layer; ++il)
      for (int ih = 0; ih < plan.n_head_kv; ++ih)
        planned += plan_kept(plan.at(il, ih), s.cache().n_tokens(il, ih));
  }
  const CompressStats st = s.compress();
  EXPECT_EQ(st.tokens_before, before);
  EXPECT_EQ(st.tokens_after, planned);
  EXPECT_EQ(total_tokens(s.cache()), planned);
  EXPECT_EQ(s.n_past(), kSweepTokens);  // the uncompressed length
  const int nh = model.hparams().n_layer * model.hparams().n_head_kv;
  if (ratio == 0) {
    EXPECT_EQ(planned, before);
  } else if (count == TokenCount::kExact) {
    EXPECT_EQ(planned, nh * keep_of(ratio));
  } else if (count == TokenCount::kWithinOne) {
    EXPECT_LE(planned, nh * (keep_of(ratio) + 1));
    EXPECT_GE(planned, nh * (keep_of(ratio) - 1));
  } else {
    EXPECT_LE(planned, nh * keep_of(ratio));
  }
  if (planned < before) {
    EXPECT_LT(s.cache().bytes().total(), bytes_before);
    // K and V bytes scale with the tokens held.
    const KvBytes b = s.cache().bytes();
    EXPECT_EQ(b.keys * static_cast<size_t>(before), keys_before * static_cast<size_t>(planned));
  }
  // Generation continues through the compressed cache, at the right positions.
  const auto& lg = s.decode(7);
  for (float x : lg) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(s.n_past(), kSweepTokens + 1);
  EXPECT_EQ(total_tokens(s.cache()), planned + nh);
  GenerateParams gp;
  gp.max_new_tokens = 3;
  gp.stop_at_eog = false;
  auto r = s.generate({}, gp);
  EXPECT_EQ(r.tokens.size(), 3u);
}

// Every setting of a token press x (alone, wrapped in adakv when it scores, composed with
// streamingllm). Returns the runs made.
inline int sweep_token_press(const PressInfo& info, Model& model,
                             const std::vector<int32_t>& prompt, const SessionParams& sp) {
  SCOPED_TRACE(info.name);
  int n = 0;
  const TokenCount count = info.per_layer_budget ? TokenCount::kWithinOne : TokenCount::kExact;
  for (const std::string& spec : sweep_specs(info, true)) {
    const double ratio = spec_ratio(spec);
    EXPECT_GE(ratio, 0) << spec << ": a token setting needs a ratio";
    sweep_token_run(spec, ratio, count, model, prompt, sp, false);
    // adakv wraps scoring presses only (it says so otherwise: checked in the registry test).
    if (dynamic_cast<ScorerPress*>(make_press(spec).get())) {
      sweep_token_run("adakv(" + spec + ")", ratio, count, model, prompt, sp, false);
      ++n;
    }
    sweep_token_run(spec + "+streamingllm:ratio=0.5", 0.5, TokenCount::kAtMost, model, prompt, sp,
                    false);
    n += 2;
  }
  return n;
}

// ---------------------------------------------------------------------------------------
// Channel axis: every setting x (alone, after snapkv, before streamingllm, after adakv(snapkv))
// x (f32, q8 cache) runs prefill, compression, decode and generation.

inline int sweep_channel_press(const PressInfo& info, Model& model,
                               const std::vector<int32_t>& prompt, SessionParams sp) {
  SCOPED_TRACE(info.name);
  int n = 0;
  for (const std::string& base : sweep_specs(info, true)) {
    for (const std::string& spec : {base, "snapkv:0.5+" + base, base + "+streamingllm:ratio=0.5",
                                    "adakv(snapkv:ratio=0.5)+" + base}) {
      for (KvDtype t : {KvDtype::kF32, KvDtype::kQ8}) {
        SCOPED_TRACE(spec + " " + kv_dtype_name(t));
        sp.kv_dtype = t;
        Session s(model, sp);
        s.set_press(make_press(spec));
        s.prefill(prompt);
        s.compress();
        EXPECT_EQ(s.n_past(), static_cast<int32_t>(prompt.size()));
        GenerateParams gp;
        gp.max_new_tokens = 4;
        gp.stop_at_eog = false;
        auto r = s.generate({}, gp);
        EXPECT_EQ(r.tokens.size(), 4u);
        ++n;
      }
    }
  }
  return n;
}

// ---------------------------------------------------------------------------------------
// Basis axis: every setting x (as given, prefill=full where the press has that option, after
// snapkv, before streamingllm) runs prefill + compress + decode + generation with the calibration
// in scope: every token is kept (or exactly the evicting press's selection), the K/V elements
// shrink with the rank, n_past stays the uncompressed length and generation continues.

// The ratio the tests' StiefAttention fits give a press that picks its ranks under eps = 1
// (per_layer_budget, no ratio): every layer takes the smallest trained pair (4, 4) of 16.
constexpr double kSmallestTrainedRatio = 0.75;

inline void sweep_basis_run(const std::string& spec, double ratio, bool anchors, bool evicts,
                            Model& model, const SessionParams& sp,
                            const std::vector<int32_t>& prompt) {
  SCOPED_TRACE(spec);
  const int n_tok = static_cast<int>(prompt.size());
  Session s(model, sp);
  s.set_press(make_press(spec));
  s.prefill(prompt);
  const int nh = model.hparams().n_layer * model.hparams().n_head_kv;
  const int d = model.hparams().head_dim_k;
  s.compress();
  EXPECT_EQ(s.n_past(), n_tok);
  const int64_t kept = total_tokens(s.cache());
  EXPECT_EQ(kept, evicts ? nh * n_tok / 2 : nh * n_tok);
  for (int il = 0; il < model.hparams().n_layer; ++il)
    for (int ih = 0; ih < model.hparams().n_head_kv; ++ih)
      EXPECT_GE(s.cache().head_layout(il, ih).current_epoch, 0);
  // K/V elements: at most the rank's share of the dense f32 bytes plus the full-rank anchors.
  const KvBytes b = s.cache().bytes();
  const size_t dense = static_cast<size_t>(kept) * static_cast<size_t>(d) * 4;
  const int r = LowRankPress::rank_for_removed_ratio(ratio, d);
  if (ratio > 0 && !anchors) {
    EXPECT_EQ(b.keys, dense * static_cast<size_t>(r) / static_cast<size_t>(d));
  } else {
    EXPECT_LE(b.keys, dense);
  }
  EXPECT_GT(b.bases, 0u);
  const auto& lg = s.decode(7);
  for (float x : lg) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(s.n_past(), n_tok + 1);
  GenerateParams gp;
  gp.max_new_tokens = 6;
  gp.stop_at_eog = false;
  auto res = s.generate({}, gp);
  EXPECT_EQ(res.tokens.size(), 6u);
  EXPECT_EQ(s.n_past(), n_tok + 6);
  if (!evicts) {
    EXPECT_EQ(total_tokens(s.cache()), nh * (n_tok + 6));
  }
}

inline int sweep_basis_press(const PressInfo& info, Model& model,
                             const std::vector<int32_t>& prompt, const SessionParams& sp) {
  SCOPED_TRACE(info.name);
  int n = 0;
  for (const std::string& base : sweep_specs(info, false)) {
    double ratio = spec_ratio(base);
    if (ratio < 0) {  // ranks chosen per layer under an error budget
      EXPECT_TRUE(info.per_layer_budget) << base << ": a basis setting without a ratio";
      ratio = kSmallestTrainedRatio;
    }
    const std::unique_ptr<Press> press = make_press(base);
    const auto* lowrank = dynamic_cast<const LowRankPress*>(press.get());
    const bool anchors =
        lowrank != nullptr && lowrank->config().has_anchors();  // OjaKV's by default
    sweep_basis_run(base, ratio, anchors, false, model, sp, prompt);
    if (declares(info, "prefill")) {
      sweep_basis_run(with_option(base, "prefill=full"), ratio, anchors, false, model, sp, prompt);
      ++n;
    }
    sweep_basis_run("snapkv:ratio=0.5+" + base, ratio, anchors, true, model, sp, prompt);
    sweep_basis_run(base + "+streamingllm:ratio=0.5", ratio, anchors, true, model, sp, prompt);
    n += 3;
  }
  return n;
}

}  // namespace kvtrim::test
