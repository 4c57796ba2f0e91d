// The protocol and resume on a tiny random model (scores are ~0; what matters is which
// questions run, what is written, and that reusing one cache for several questions gives
// the same answers as a fresh prefill).
#include "eval/runner.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "engine/context_question.h"
#include "engine/press_runner.h"
#include "press/press.h"
#include "engine/session.h"
#include "eval/jsonl.h"
#include "eval_fixture.h"

namespace kvtrim::eval {
namespace {

using test_support::tiny_model;
using test_support::tiny_prompts;
using test_support::tiny_session_params;

std::vector<EvalSample> small_samples() {
  std::string text;
  for (int i = 0; i < 5; ++i) {
    const std::string ctx = "Context number " + std::to_string(i) + ". The sky is blue. The key is " +
                            std::to_string(1000 + i) + ".";
    const std::string task = i < 3 ? "niah_single_1" : "qa_1";
    text += R"({"task": ")" + task + R"(", "context": ")" + ctx +
            R"(", "question": " What is the key?", "answer_prefix": " The key is", "answers": [")" +
            std::to_string(1000 + i) + R"("], "max_new_tokens": 6})" + "\n";
    if (i == 1) {  // a second question on the same context
      text += R"({"task": "niah_single_1", "context": ")" + ctx +
              R"(", "question": " What colour is the sky?", "answer_prefix": " It is", "answers": ["blue"], "max_new_tokens": 4})" +
              "\n";
    }
  }
  return parse_samples_jsonl(text, "small");
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

TEST(Runner, ReusedCacheMatchesFreshPrefill) {
  Session s(tiny_model(), tiny_session_params());
  const auto samples = small_samples();
  ASSERT_EQ(samples[1].questions.size(), 2u);
  const auto both = run_sample(s, tiny_prompts(), samples[1], {});
  ASSERT_EQ(both.size(), 2u);
  const auto second_only = run_sample(s, tiny_prompts(), samples[1], {}, {0});
  ASSERT_EQ(second_only.size(), 1u);
  EXPECT_EQ(second_only[0].q, 1);
  EXPECT_EQ(second_only[0].output, both[1].output);
  EXPECT_EQ(second_only[0].n_context, both[1].n_context);
  EXPECT_GT(both[0].kv_bytes, 0u);
  EXPECT_EQ(both[0].n_context, static_cast<int64_t>(tiny_prompts().context_tokens(samples[1].context).size()));
}

TEST(Runner, AfterContextHookSeesOnlyTheContext) {
  Session s(tiny_model(), tiny_session_params());
  const auto samples = small_samples();
  int calls = 0;
  int32_t seen = -1;
  RunnerOptions o;
  o.after_context = [&](Session& ss, const std::vector<int32_t>* q) {
    ++calls;
    seen = ss.n_past();
    EXPECT_EQ(q, nullptr);
  };
  const auto r = run_sample(s, tiny_prompts(), samples[1], o);
  EXPECT_EQ(calls, 1);  // once for both questions
  EXPECT_EQ(seen, r[0].n_context);
  o.query_aware = true;
  o.after_context = [&](Session&, const std::vector<int32_t>* q) {
    ++calls;
    EXPECT_NE(q, nullptr);
  };
  run_sample(s, tiny_prompts(), samples[1], o);
  EXPECT_EQ(calls, 3);  // query-aware: once per question
}

// Each row records the context compression's loss estimate (press_loss, press_evicted_mass);
// rows without a press have none, and a row written without the fields loads with -1.
TEST(Runner, RowsRecordTheLossEstimate) {
  SessionParams p = tiny_session_params();
  p.press_loss = true;
  Session s(tiny_model(), p);
  PressSchedule sched;
  sched.after_prefill = false;
  s.set_press(make_press("knorm:0.5"), sched);
  RunnerOptions o;
  o.after_context = [](Session& ss, const std::vector<int32_t>*) { ss.compress(); };
  const auto samples = small_samples();
  const auto r = run_sample(s, tiny_prompts(), samples[1], o);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_GT(r[0].press_loss, 0.0);
  EXPECT_GT(r[0].press_evicted_mass, 0.0);
  EXPECT_EQ(r[1].press_loss, r[0].press_loss);  // one compression for both questions
  EXPECT_TRUE(question_result_json(r[0]).contains("press_loss"));
  s.set_press(nullptr);
  const auto n = run_sample(s, tiny_prompts(), samples[0], {});
  EXPECT_EQ(n[0].press_loss, -1.0);
  EXPECT_FALSE(question_result_json(n[0]).contains("press_loss"));
  const std::string out = test::temp_dir("eval_loss") + "/results.jsonl";
  std::filesystem::remove(out);
  {
    QuestionResultsFile f(out, "cfg");
    f.append(r[0]);
    f.append(n[0]);  // as an older row: no press_loss field
  }
  const QuestionResultsFile back(out, "cfg");
  ASSERT_EQ(back.rows().size(), 2u);
  EXPECT_DOUBLE_EQ(back.rows()[0].press_loss, r[0].press_loss);
  EXPECT_DOUBLE_EQ(back.rows()[0].press_evicted_mass, r[0].press_evicted_mass);
  EXPECT_EQ(back.rows()[1].press_loss, -1.0);
  EXPECT_EQ(back.rows()[1].press_evicted_mass, -1.0);
}

// The shared compression (one per sample, before its questions) with the loss estimate on: the
// hook gets the sample's first question for the estimate only — whichever questions run, so a
// resumed run records the same estimate — and the rows say it was measured on the question.
TEST(Runner, SharedCompressionsLossIsMeasuredOnTheFirstQuestion) {
  SessionParams p = tiny_session_params();
  p.press_loss = true;
  Session s(tiny_model(), p);
  PressSchedule sched;
  sched.after_prefill = false;
  s.set_press(make_press("knorm:0.5"), sched);
  const auto samples = small_samples();
  const std::vector<int32_t> first =
      tiny_prompts().question_tokens(samples[1].questions[0].question, samples[1].questions[0].answer_prefix);
  RunnerOptions o;
  o.after_context = [&](Session& ss, const std::vector<int32_t>* q) {
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(*q, first);
    ContextCompressOptions co;
    co.min_tokens = 0;
    co.press_sees_question = false;
    compress_context(ss, *q, co);
  };
  const auto r = run_sample(s, tiny_prompts(), samples[1], o);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_GT(r[0].press_loss, 0.0);
  EXPECT_EQ(r[0].press_loss_queries, "question");
  EXPECT_EQ(r[1].press_loss, r[0].press_loss);
  const auto second = run_sample(s, tiny_prompts(), samples[1], o, {0});  // a resume
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].press_loss, r[0].press_loss);
  EXPECT_EQ(question_result_json(r[0]).at("press_loss_queries"), "question");
  // a hook that ignores the question: measured on the window
  o.after_context = [](Session& ss, const std::vector<int32_t>*) { ss.compress(); };
  const auto w = run_sample(s, tiny_prompts(), samples[1], o);
  EXPECT_EQ(w[0].press_loss_queries, "window");
  const std::string out = test::temp_dir("eval_loss_q") + "/results.jsonl";
  std::filesystem::remove(out);
  {
    QuestionResultsFile f(out, "cfg");
    f.append(r[0]);
  }
  const QuestionResultsFile back(out, "cfg");
  ASSERT_EQ(back.rows().size(), 1u);
  EXPECT_EQ(back.rows()[0].press_loss_queries, "question");
}

TEST(Runner, ResumeRunsOnlyMissingQuestions) {
  const std::string dir = test::temp_dir("eval_resume");
  const std::string out = dir + "/results.jsonl";
  const auto samples = small_samples();  // 5 samples, 6 questions
  Session s(tiny_model(), tiny_session_params());
  std::vector<QuestionResult> full_rows;
  {
    QuestionResultsFile rf(out, "cfgA");
    const RunStats st = run_samples(s, tiny_prompts(), samples, &rf, {}, &full_rows);
    EXPECT_EQ(st.run, 6);
    EXPECT_EQ(st.reused, 0);
  }
  const auto lines = read_lines(out);
  ASSERT_EQ(lines.size(), 6u);
  // An interrupted run: 3 complete lines and half of the 4th.
  {
    std::ofstream f(out, std::ios::trunc);
    for (int i = 0; i < 3; ++i) f << lines[static_cast<size_t>(i)] << "\n";
    f << lines[3].substr(0, lines[3].size() / 2);
  }
  std::vector<QuestionResult> rows;
  {
    QuestionResultsFile rf(out, "cfgA");
    EXPECT_EQ(rf.n_dropped_torn(), 1);
    EXPECT_EQ(rf.rows().size(), 3u);
    EXPECT_EQ(count_pending(samples, &rf), 3);
    const RunStats st = run_samples(s, tiny_prompts(), samples, &rf, {}, &rows);
    EXPECT_EQ(st.run, 3);
    EXPECT_EQ(st.reused, 3);
  }
  const auto after = read_lines(out);
  ASSERT_EQ(after.size(), 6u);
  // Same results in the same order (timings aside).
  const auto untimed = [](const std::string& line) {
    auto j = nlohmann::json::parse(line);
    j.erase("context_prefill_s");
    j.erase("decode_tps");
    return j.dump();
  };
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(untimed(after[i]), untimed(lines[i])) << "line " << i;
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(rows[i].id(), full_rows[i].id());
    EXPECT_EQ(rows[i].q, full_rows[i].q);
    EXPECT_EQ(rows[i].output, full_rows[i].output);
  }
  EXPECT_EQ(average_over_tasks(rows), average_over_tasks(full_rows));
  // Nothing left: a third run runs nothing.
  {
    QuestionResultsFile rf(out, "cfgA");
    EXPECT_EQ(run_samples(s, tiny_prompts(), samples, &rf, {}, nullptr).run, 0);
  }
  // Another configuration runs everything again and keeps the old lines.
  {
    QuestionResultsFile rf(out, "cfgB");
    EXPECT_EQ(rf.n_other_config(), 6);
    EXPECT_EQ(run_samples(s, tiny_prompts(), samples, &rf, {}, nullptr).run, 6);
  }
  EXPECT_EQ(read_lines(out).size(), 12u);
}

TEST(Runner, ChangedSampleUnderSameConfigIsAnError) {
  const std::string dir = test::temp_dir("eval_changed");
  const std::string out = dir + "/results.jsonl";
  auto samples = small_samples();
  samples.resize(1);
  Session s(tiny_model(), tiny_session_params());
  {
    QuestionResultsFile rf(out, "cfg");
    run_samples(s, tiny_prompts(), samples, &rf, {}, nullptr);
  }
  samples[0].context += " Changed.";
  QuestionResultsFile rf(out, "cfg");
  EXPECT_THROW(rf.done(samples[0], 0), Error);
}

TEST(Runner, MalformedResultsLineNamesTheLine) {
  const std::string dir = test::temp_dir("eval_badresults");
  const std::string out = dir + "/results.jsonl";
  {
    std::ofstream f(out);
    f << "{\"config\": \"cfg\", \"task\": \"vt\"}\n";
  }
  try {
    QuestionResultsFile rf(out, "cfg");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("results.jsonl:1: not a results line"), std::string::npos) << e.what();
  }
}

TEST(Runner, DeterministicAndGeneratedSamplesRun) {
  // Generated samples at a small budget, run twice: identical outputs.
  RulerGenerator g(test_support::ruler_config(2048, 3), test_support::tiny_counter());
  std::vector<EvalSample> samples = {g.generate("niah_single_1", 0), g.generate("vt", 0)};
  Session s(tiny_model(), tiny_session_params());
  std::vector<QuestionResult> a, b;
  run_samples(s, tiny_prompts(), samples, nullptr, {}, &a);
  run_samples(s, tiny_prompts(), samples, nullptr, {}, &b);
  ASSERT_EQ(a.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].output, b[i].output);
    EXPECT_EQ(a[i].score, b[i].score);
    EXPECT_LE(a[i].n_context + a[i].n_question + samples[i].questions[0].max_new_tokens, 2048);
  }
  const std::string table = summary_table(a, {"niah_single_1", "vt"});
  EXPECT_NE(table.find("| niah_single_1 | 1 |"), std::string::npos) << table;
  EXPECT_NE(table.find("**average**"), std::string::npos) << table;
}

TEST(Runner, ConfigHashAndFormats) {
  EXPECT_EQ(config_hash({"a", "b"}), config_hash({"a", "b"}));
  EXPECT_NE(config_hash({"a", "b"}), config_hash({"ab"}));
  EXPECT_EQ(resolve_prompt_format("base", tiny_model()), PromptFormat::kBase);
  EXPECT_THROW(resolve_prompt_format("fancy", tiny_model()), Error);
}

}  // namespace
}  // namespace kvtrim::eval
