// The loss estimate and the quality guard on SmolLM2 (a real model, a ~600-token context): for a
// token press, a channel press and StreamingLLM the estimate lies in [0, 1] and grows with the
// ratio; the guard at 0 leaves the context uncompressed, at 1 changes nothing.
#include <gtest/gtest.h>

#include <fstream>

#include "engine/context_question.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "test_util.h"

namespace kvtrim {
namespace {

std::vector<int32_t> context_tokens(const Model& m) {
  std::ifstream f(test::data_dir() + "/facts_context.txt");
  const std::string facts((std::istreambuf_iterator<char>(f)), {});
  std::string text;
  for (int i = 0; i < 4; ++i) text += facts + "\n";
  return m.tokenizer().encode(text, m.tokenizer().add_bos(), false);
}

SessionParams params() {
  SessionParams p;
  p.n_ctx = 2048;
  p.n_threads = 2;
  p.press_loss = true;
  return p;
}

TEST(PressLossModel, GrowsWithTheRatioForEveryAxis) {
  auto model = Model::load(test::require_model("smollm2"));
  const std::vector<int32_t> ctx = context_tokens(*model);
  ASSERT_GT(ctx.size(), 300u);
  const std::vector<std::string> presses = {"snapkv", "streamingllm", "think"};
  PressNeeds needs;
  for (const std::string& p : presses) needs.merge(make_press(p)->needs());
  Session s(*model, params());
  s.set_observer(needs);
  s.prefill(ctx);
  const Session::State st = s.save_state();  // one prefill, compressed every way
  for (const std::string& p : presses) {
    double last = -1;
    for (double ratio : {0.25, 0.5, 0.75}) {
      s.restore_state(st);
      const auto press = make_press(p + ":ratio=" + std::to_string(ratio));
      const PressLoss l = s.compress_with(*press).loss;
      ASSERT_TRUE(l.measured) << p;
      EXPECT_EQ(l.n_queries, kLossWindow);
      EXPECT_GT(l.rel_err, last) << p << " at " << ratio;
      EXPECT_LE(l.rel_err, 1.0) << p << " at " << ratio;
      EXPECT_GE(l.evicted_mass, 0.0);
      EXPECT_LE(l.evicted_mass, 1.0);
      last = l.rel_err;
    }
  }
}

TEST(PressLossModel, GuardAtZeroAndOne) {
  auto model = Model::load(test::require_model("smollm2"));
  const std::vector<int32_t> ctx = context_tokens(*model);
  PressSchedule sched;
  sched.after_prefill = false;
  Session s(*model, params());
  s.set_press(make_press("snapkv:0.5"), sched);
  s.prefill(ctx);
  const Session::State st = s.save_state();
  const int64_t before = total_tokens(s.cache());
  ContextCompressOptions co;
  co.max_loss = 0;
  const ContextCompression zero = compress_context(s, {}, co);
  EXPECT_FALSE(zero.ran);
  EXPECT_EQ(zero.attempts.size(), 1u + kMaxLossRetries);
  EXPECT_EQ(total_tokens(s.cache()), before);
  s.restore_state(st);
  co.max_loss = 1;
  const ContextCompression one = compress_context(s, {}, co);
  s.restore_state(st);
  const ContextCompression plain = compress_context(s, {}, ContextCompressOptions{});
  ASSERT_TRUE(one.ran);
  EXPECT_EQ(one.attempts.size(), 1u);
  EXPECT_EQ(one.stats.tokens_after, plain.stats.tokens_after);
  EXPECT_EQ(one.stats.loss.rel_err, plain.stats.loss.rel_err);
}

}  // namespace
}  // namespace kvtrim
