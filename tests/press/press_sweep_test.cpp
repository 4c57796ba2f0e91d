// The sweep (kvpress's test_presses_run): every registered token press x its settings (ratio 0,
// PressInfo::test_easy, test_hard) x wrappers (none, adakv, composed with streamingllm) runs
// prefill + compress + decode on the tiny model (press_sweeps.h); the cache holds exactly the
// planned tokens, its bytes drop accordingly, n_past stays the uncompressed length and
// generation continues. A new press is covered by registering it. Plus: every token press on
// every architecture, composition multiplies savings; decode-time compression.
#include <gtest/gtest.h>

#include "core/error.h"
#include "press_sweeps.h"

namespace kvtrim {
namespace {

class PressSweep : public test::PressFixture {};

TEST_F(PressSweep, EveryPressEveryRatioEveryWrapper) {
  const auto prompt = tokens(test::kSweepTokens);
  const std::vector<const PressInfo*> presses = test::presses_of(PressAxis::kToken);
  EXPECT_FALSE(presses.empty());  // which presses must be there: press_registry_test
  for (const PressInfo* info : presses) {
    // ratio 0, easy, hard x (alone, composed): at least 6 runs per press
    EXPECT_GE(test::sweep_token_press(*info, *model_, prompt, params()), 6) << info->name;
  }
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
    for (int i = 0; i < test::kSweepTokens; ++i) prompt.push_back((i * 37 + 5) % 250);
    for (const auto& info : press_registry()) {
      if (info.wrapper || info.axis != PressAxis::kToken) continue;
      const std::string& press = info.test_easy;
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

// Every token press with a query_aware option scores with the question's queries (and in adakv).
TEST_F(PressSweep, QueryAwareVariantsRun) {
  int n = 0;
  for (const PressInfo* info : test::presses_of(PressAxis::kToken)) {
    if (!test::declares(*info, "query_aware")) continue;
    const std::string spec = test::with_option(info->name + ":ratio=0.5", "query_aware=true");
    const test::TokenCount count =
        info->per_layer_budget ? test::TokenCount::kWithinOne : test::TokenCount::kExact;
    test::sweep_token_run(spec, 0.5, count, *model_, tokens(test::kSweepTokens), params(), true);
    if (dynamic_cast<ScorerPress*>(make_press(spec).get()))
      test::sweep_token_run("adakv(" + spec + ")", 0.5, count, *model_, tokens(test::kSweepTokens), params(), true);
    ++n;
  }
  EXPECT_GE(n, 1);
}

TEST_F(PressSweep, CompositionMultipliesSavings) {
  Session s(*model_, params());
  s.set_press(make_press("knorm:ratio=0.5+streamingllm:ratio=0.5"));
  s.prefill(tokens(test::kSweepTokens));
  s.compress();
  const int nh = model_->hparams().n_layer * model_->hparams().n_head_kv;
  EXPECT_EQ(total_tokens(s.cache()), nh * 10);  // 40 -> 20 -> 10: savings multiply
  // And the second press really ran on what the first left: its sinks are the first 4
  // tokens knorm kept, not positions 0..3.
  Session k(*model_, params());
  k.set_press(make_press("knorm:ratio=0.5"));
  k.prefill(tokens(test::kSweepTokens));
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
  auto r = s.generate(tokens(test::kSweepTokens), gp);
  EXPECT_EQ(r.tokens.size(), 17u);
  EXPECT_EQ(s.n_past(), test::kSweepTokens + 16);
  ASSERT_GE(s.compress_log().size(), 2u);  // after prefill, then during decoding
  for (int il = 0; il < model_->hparams().n_layer; ++il)
    for (int ih = 0; ih < model_->hparams().n_head_kv; ++ih) EXPECT_LE(s.cache().n_tokens(il, ih), 24);
}

TEST_F(PressSweep, MissingObservationsGiveClearErrors) {
  Session s(*model_, params());
  s.prefill(tokens(test::kSweepTokens));  // no press installed: nothing captured
  PressContext ctx(s.cache(), model_->hparams(), nullptr, nullptr);
  try {
    make_press("snapkv")->plan(ctx);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("snapkv"), std::string::npos) << e.what();
  }
  Session q(*model_, params());
  q.set_press(make_press("tova:query_aware=true"));
  q.prefill(tokens(test::kSweepTokens));
  try {
    q.compress();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no question queries"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvtrim
