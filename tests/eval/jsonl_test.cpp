// Loading samples from JSONL: the published field layout, grouping of questions on one
// context, and errors that name the line.
#include "eval/jsonl.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace kvtrim::eval {
namespace {

std::string jsonl_error(const std::string& text) {
  try {
    parse_samples_jsonl(text, "tasks.jsonl");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Jsonl, LoadsAndGroupsQuestionsOnOneContext) {
  const std::string text =
      R"({"task": "qa_1", "context": "C1", "question": "Q1", "answer_prefix": " A:", "answers": ["x", "y"], "max_new_tokens": 32})"
      "\n"
      R"({"task": "qa_1", "context": "C1", "question": "Q2", "answers": "z", "max_new_tokens": 16})"
      "\n\n"
      R"({"task": "niah_single_1", "context": "C2", "question": "Q3", "answer_prefix": "", "answers": ["7"], "max_new_tokens": 128})"
      "\n"
      R"({"task": "qa_1", "context": "C3", "question": "Q4", "answers": ["w"], "max_new_tokens": 8, "metric": "all"})"
      "\n";
  const auto s = parse_samples_jsonl(text, "t");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].id(), "qa_1/0");
  ASSERT_EQ(s[0].questions.size(), 2u);
  EXPECT_EQ(s[0].questions[0].answer_prefix, " A:");
  EXPECT_EQ(s[0].questions[0].answers, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(s[0].questions[1].answers, std::vector<std::string>{"z"});
  EXPECT_EQ(s[0].questions[1].answer_prefix, "");
  EXPECT_EQ(s[0].questions[1].max_new_tokens, 16);
  EXPECT_EQ(s[0].metric, Metric::kPart);
  EXPECT_EQ(s[1].id(), "niah_single_1/0");
  EXPECT_EQ(s[1].metric, Metric::kAll);
  EXPECT_EQ(s[2].id(), "qa_1/1");
  EXPECT_EQ(s[2].metric, Metric::kAll);
}

TEST(Jsonl, RoundTrip) {
  const std::string dir = test::temp_dir("eval_jsonl");
  EvalSample a;
  a.task = "vt";
  a.context = "line one\nline \"two\"";
  a.questions = {{"Q?", " Answer:", {"AB", "CD"}, 30, {"\n\n"}}, {"Q2?", "", {"EF"}, 5, {}}};
  write_samples_jsonl(dir + "/s.jsonl", {a});
  const auto b = load_samples_jsonl(dir + "/s.jsonl");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].content_hash(), a.content_hash());
  EXPECT_EQ(b[0].questions[0].stop, std::vector<std::string>{"\n\n"});
  EXPECT_TRUE(b[0].questions[1].stop.empty());
}

TEST(Jsonl, MalformedLinesNameTheLine) {
  const std::string good =
      R"({"task": "qa_1", "context": "C", "question": "Q", "answers": ["x"], "max_new_tokens": 4})"
      "\n";
  std::string e = jsonl_error(good + good + "{not json\n");
  EXPECT_NE(e.find("tasks.jsonl:3: not valid JSON"), std::string::npos) << e;
  e = jsonl_error(good + R"({"task": "qa_1", "question": "Q", "answers": ["x"], "max_new_tokens": 4})");
  EXPECT_NE(e.find("tasks.jsonl:2: missing field 'context'"), std::string::npos) << e;
  e = jsonl_error(R"({"task": "qa_1", "context": "C", "question": "Q", "answers": [1], "max_new_tokens": 4})");
  EXPECT_NE(e.find("tasks.jsonl:1: field 'answers' must hold strings"), std::string::npos) << e;
  e = jsonl_error(R"({"task": "qa_1", "context": "C", "question": "Q", "answers": [], "max_new_tokens": 4})");
  EXPECT_NE(e.find("tasks.jsonl:1: field 'answers' is empty"), std::string::npos) << e;
  e = jsonl_error(R"({"task": "qa_1", "context": "C", "question": "Q", "answers": ["x"], "max_new_tokens": -3})");
  EXPECT_NE(e.find("tasks.jsonl:1: field 'max_new_tokens' must be a positive integer"), std::string::npos) << e;
  e = jsonl_error(R"([1, 2])");
  EXPECT_NE(e.find("tasks.jsonl:1: expected a JSON object"), std::string::npos) << e;
  EXPECT_THROW(load_samples_jsonl("/nonexistent/tasks.jsonl"), Error);
}

}  // namespace
}  // namespace kvtrim::eval
