// The sweep (kvpress's test_presses_run): every registered press x ratios {0, 0.25, 0.5, 0.9}
// x wrappers (none, adakv, composed with streamingllm) runs prefill + compress + decode on
// the tiny model; the cache holds exactly the planned tokens, its bytes drop accordingly,
// n_past stays the uncompressed length and generation continues. A new press is covered by
// registering it. Plus: composition multiplies savings; decode-time compression.
#include <gtest/gtest.h>

#include "core/error.h"
#include "press_fixture.h"

namespace kvtrim {
namespace {

class PressSweep : public test::PressFixture {};

constexpr int kN = 40;

int64_t expected_tokens_after(const Session& s) {
  // From the plan itself (computed before apply), independently of the cache.
  PressContext ctx(s.cache(), s.model().hparams(), s.observations(), nullptr);
  const CompressionPlan plan = s.press()->plan(ctx);
  int64_t t = 0;
  for (int il = 0; il < plan.n_layer; ++il)
    for (int ih = 0; ih < plan.n_head_kv; ++ih) t += plan_kept(plan.at(il, ih), s.cache().n_tokens(il, ih));
  return t;
}

int64_t keep_of(double ratio) {
  Budget b;
  b.ratio = ratio;
  return b.keep_count(kN);
}

void run_one(const std::string& spec, double ratio, Model& model, const std::vector<int32_t>& prompt,
             const SessionParams& sp, bool with_question) {
  SCOPED_TRACE(spec);
  Session s(model, sp);
  s.set_press(make_press(spec));
  s.prefill(prompt);
  if (with_question) s.observe_question({1, 2, 3, 4, 5});
  s.prepare_compress();  // the re-feed passes (kvcompose, kvzip): the plan below reads them
  const int64_t before = total_tokens(s.cache());
  const size_t bytes_before = s.cache().bytes().total();
  const size_t keys_before = s.cache().bytes().keys;
  const int64_t planned = expected_tokens_after(s);
  const CompressStats st = s.compress();
  EXPECT_EQ(st.tokens_before, before);
  EXPECT_EQ(st.tokens_after, planned);
  EXPECT_EQ(total_tokens(s.cache()), planned);
  EXPECT_EQ(s.n_past(), kN);  // the uncompressed length
  const int nh = model.hparams().n_layer * model.hparams().n_head_kv;
  if (ratio == 0) {
    EXPECT_EQ(planned, before);
  } else if (spec.find('+') == std::string::npos && spec.find("pyramidkv") == std::string::npos &&
             spec.find("kvcompose") == std::string::npos && spec.find("kvzip") == std::string::npos) {
    // Every head keeps int(n (1 - ratio)) (adakv: the same total over a layer's heads).
    EXPECT_EQ(planned, nh * keep_of(ratio));
  } else if ((spec.find("pyramidkv") != std::string::npos || spec.find("kvcompose") != std::string::npos ||
              spec.find("kvzip") != std::string::npos) &&
             spec.find('+') == std::string::npos) {
    // Per-layer budgets (pyramid, or KVCompose's / KVzip's global budget) are rounded: within a token per head.
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
  EXPECT_EQ(s.n_past(), kN + 1);
  EXPECT_EQ(total_tokens(s.cache()), planned + nh);
  GenerateParams gp;
  gp.max_new_tokens = 3;
  gp.stop_at_eog = false;
  auto r = s.generate({}, gp);
  EXPECT_EQ(r.tokens.size(), 3u);
}

TEST_F(PressSweep, EveryPressEveryRatioEveryWrapper) {
  const auto prompt = tokens(kN);
  int n_runs = 0;
  for (const auto& info : press_registry()) {
    if (info.wrapper) continue;
    if (info.feature_axis) continue;  // keeps every token: swept by basis_sweep_test.cpp
    if (info.channel_axis) continue;  // keeps every token: swept by channel_press_test.cpp
    for (double ratio : {0.0, 0.25, 0.5, 0.9}) {
      const std::string base = info.name + strprintf(":ratio=%g", ratio);
      const bool qa = false;
      run_one(base, ratio, *model_, prompt, params(), qa);
      // adakv wraps scoring presses only (it says so otherwise: checked in the registry test).
      if (dynamic_cast<ScorerPress*>(make_press(base).get())) {
        run_one("adakv(" + base + ")", ratio, *model_, prompt, params(), qa);
        ++n_runs;
      }
      run_one(base + "+streamingllm:ratio=0.5", 0.5, *model_, prompt, params(), qa);
      n_runs += 2;
    }
  }
  EXPECT_GE(n_runs, 10 * 4 * 2 + 8 * 4);
}

// Every token press on every architecture added after the sweep's llama (QK-norm, MoE FFN,
// soft-capped and windowed attention, fused projections with LongRoPE): it plans, the cache
// applies the plan and frees the bytes, and generation continues with finite logits. (The sweep
// above checks the exact counts on llama; sliding-window layers hold fewer tokens to begin with.)
TEST(PressSweepArchs, EveryTokenPressRunsOnEveryArchitecture) {
  const std::string dir = test::temp_dir("press_archs");
  for (Arch a : {Arch::kQwen3, Arch::kQwen3Moe, Arch::kGemma2, Arch::kPhi3}) {
    test::TinyModelSpec spec = test::tiny_spec(a, 9);
    spec.t_embd = spec.t_attn = spec.t_v = spec.t_ffn = spec.t_down = spec.t_output = spec.t_exps = GgmlType::F32;
    auto model = Model::load(test::write_tiny_model(spec, dir));
    std::vector<int32_t> prompt;
    for (int i = 0; i < kN; ++i) prompt.push_back((i * 37 + 5) % 250);
    for (const auto& info : press_registry()) {
      if (info.wrapper || info.feature_axis || info.channel_axis) continue;
      const std::string press = info.name + ":ratio=0.5";
      SCOPED_TRACE(std::string(arch_name(a)) + " " + press);
      SessionParams sp;
      sp.n_ctx = 256;
      sp.n_threads = 1;
      sp.n_batch = 16;
      sp.kv_dtype = KvDtype::kF32;
      Session s(*model, sp);
      s.set_press(make_press(press));
      s.prefill(prompt);
      s.prepare_compress();
      const size_t bytes_before = s.cache().bytes().total();
      const CompressStats st = s.compress();
      EXPECT_LT(st.tokens_after, st.tokens_before);
      EXPECT_EQ(total_tokens(s.cache()), st.tokens_after);
      EXPECT_LT(s.cache().bytes().total(), bytes_before);
      const auto& lg = s.decode(7);
      for (float x : lg) ASSERT_TRUE(std::isfinite(x));
      GenerateParams gp;
      gp.max_new_tokens = 3;
      gp.stop_at_eog = false;
      EXPECT_EQ(s.generate({}, gp).tokens.size(), 3u);
    }
  }
}

TEST_F(PressSweep, QueryAwareVariantsRun) {
  for (const char* spec : {"snapkv:ratio=0.5,query_aware=true", "pyramidkv:ratio=0.5,query_aware=true",
                           "tova:ratio=0.5,query_aware=true", "expected_attention:ratio=0.5,query_aware=true",
                           "adakv(snapkv:ratio=0.5,query_aware=true)"})
    run_one(spec, 0.5, *model_, tokens(kN), params(), true);
}

TEST_F(PressSweep, CompositionMultipliesSavings) {
  Session s(*model_, params());
  s.set_press(make_press("knorm:ratio=0.5+streamingllm:ratio=0.5"));
  s.prefill(tokens(kN));
  s.compress();
  const int nh = model_->hparams().n_layer * model_->hparams().n_head_kv;
  EXPECT_EQ(total_tokens(s.cache()), nh * 10);  // 40 -> 20 -> 10: savings multiply
  // And the second press really ran on what the first left: its sinks are the first 4
  // tokens knorm kept, not positions 0..3.
  Session k(*model_, params());
  k.set_press(make_press("knorm:ratio=0.5"));
  k.prefill(tokens(kN));
  const CompressionPlan first = plan_of(k);
  std::vector<int32_t> spos;
  s.cache().read_head(1, 0, nullptr, nullptr, &spos);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(spos[j], first.at(1, 0).keep[j]);
  for (int j = 0; j < 6; ++j) EXPECT_EQ(spos[4 + j], first.at(1, 0).keep[14 + j]);
}

TEST_F(PressSweep, DecodeTimeCompressionHoldsTheTarget) {
  Session s(*model_, params());
  PressSchedule sched;
  sched.decode_every = 4;
  sched.decode_target = 24;
  s.set_press(make_press("h2o:ratio=0.5"), sched);
  GenerateParams gp;
  gp.max_new_tokens = 17;
  gp.stop_at_eog = false;
  auto r = s.generate(tokens(kN), gp);
  EXPECT_EQ(r.tokens.size(), 17u);
  EXPECT_EQ(s.n_past(), kN + 16);
  ASSERT_GE(s.compress_log().size(), 2u);  // after prefill, then during decoding
  for (int il = 0; il < model_->hparams().n_layer; ++il)
    for (int ih = 0; ih < model_->hparams().n_head_kv; ++ih) EXPECT_LE(s.cache().n_tokens(il, ih), 24);
}

TEST_F(PressSweep, MissingObservationsGiveClearErrors) {
  Session s(*model_, params());
  s.prefill(tokens(kN));  // no press installed: nothing captured
  PressContext ctx(s.cache(), model_->hparams(), nullptr, nullptr);
  try {
    make_press("snapkv")->plan(ctx);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("snapkv"), std::string::npos) << e.what();
  }
  Session q(*model_, params());
  q.set_press(make_press("tova:query_aware=true"));
  q.prefill(tokens(kN));
  try {
    q.compress();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no question queries"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvtrim
