// The RULER generator with SmolLM2's real tokenizer: every sample fits the budget exactly as
// the runner tokenises it (both prompt formats) and fills it closely.
#include <gtest/gtest.h>

#include "eval/ruler.h"
#include "eval/runner.h"
#include "model/model.h"
#include "test_util.h"

namespace kvtrim::eval {
namespace {

TEST(RulerModel, Smollm2SamplesFitTheBudget) {
  const std::string path = test::require_model("smollm2");
  auto model = Model::load(path);
  for (PromptFormat f : {PromptFormat::kBase, PromptFormat::kChat}) {
    const PromptBuilder pb(*model, f);
    for (int64_t ctx_len : {1024, 2048}) {
      RulerConfig c;
      c.ctx_len = ctx_len;
      c.seed = 11;
      c.haystack_dir = test::shared_data_dir() + "/haystack/paul_graham";
      const RulerGenerator g(c, [&pb](const std::string& t, bool is_ctx) { return pb.count(t, is_ctx); });
      for (const auto& t : ruler_tasks()) {
        for (int i = 0; i < 2; ++i) {
          const EvalSample s = g.generate(t.name, i);
          const EvalQuestion& q = s.questions[0];
          const int64_t used = static_cast<int64_t>(pb.context_tokens(s.context).size() +
                                                    pb.question_tokens(q.question, q.answer_prefix).size()) +
                               q.max_new_tokens;
          EXPECT_LE(used, ctx_len) << t.name << " " << prompt_format_name(f);
          EXPECT_GE(used, ctx_len * 9 / 10) << t.name << " " << prompt_format_name(f);
          for (const auto& a : q.answers) EXPECT_NE(s.context.find(a), std::string::npos) << t.name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtrim::eval
