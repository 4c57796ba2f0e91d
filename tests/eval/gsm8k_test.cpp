// GSM8K-style evaluation (src/eval/gsm8k.h): reading test.jsonl, the few-shot samples, answer
// extraction and scoring, and the results plumbing the new metric and stop strings go through.
#include "eval/gsm8k.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/jsonl.h"
#include "eval/runner.h"
#include "eval/scoring.h"

namespace kvtrim::eval {
namespace {

const char* kThree =
    R"({"question": "Janet has 3 ducks. How many?", "answer": "She has <<1+2=3>>3 ducks.\n#### 3"})"
    "\n\n"
    R"({"question": "A robe takes 2 bolts. Total?", "answer": "It takes 2/2=<<2/2=1>>1 more\n2+1=<<2+1=3>>3\n#### 3"})"
    "\n"
    R"({"question": "How much money?", "answer": "The total is $<<1000*2=2000>>2,000.\n#### 2,000"})"
    "\n";

std::string gsm8k_error(const std::string& text) {
  try {
    parse_gsm8k(text, "test.jsonl");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Gsm8k, ParsesItemsAndStripsAnnotations) {
  const auto items = parse_gsm8k(kThree, "t");
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].index, 0);
  EXPECT_EQ(items[1].index, 1);  // blank lines do not count
  EXPECT_EQ(items[0].question, "Janet has 3 ducks. How many?");
  EXPECT_EQ(items[0].solution, "She has 3 ducks.\n#### 3");
  EXPECT_EQ(items[1].solution, "It takes 2/2=1 more\n2+1=3\n#### 3");
  EXPECT_EQ(items[2].answer, "2000");  // commas removed
  EXPECT_EQ(strip_calculator_annotations("a <<x"), "a <<x");  // unclosed: kept
  EXPECT_EQ(strip_calculator_annotations("<<1>><<2>>z"), "z");
}

TEST(Gsm8k, MalformedLinesNameTheLine) {
  EXPECT_NE(gsm8k_error("{\"question\": \"q\", \"answer\": \"a\\n#### 1\"}\nnot json\n").find("test.jsonl:2: not valid JSON"),
            std::string::npos);
  EXPECT_NE(gsm8k_error("[1]\n").find("test.jsonl:1: expected a JSON object"), std::string::npos);
  EXPECT_NE(gsm8k_error("{\"question\": \"q\"}\n").find("missing field 'answer'"), std::string::npos);
  EXPECT_NE(gsm8k_error("{\"question\": 3, \"answer\": \"x\"}\n").find("field 'question' must be a string"),
            std::string::npos);
  EXPECT_NE(gsm8k_error("{\"question\": \"q\", \"answer\": \"no final line\"}\n").find("no final '#### <number>'"),
            std::string::npos);
  EXPECT_NE(gsm8k_error("{\"question\": \"q\", \"answer\": \"x\\n#### many\"}\n").find("is not a number"),
            std::string::npos);
  EXPECT_NE(gsm8k_error("{\"question\": \"\", \"answer\": \"x\\n#### 1\"}\n").find("'question' is empty"),
            std::string::npos);
  EXPECT_THROW(load_gsm8k("/nonexistent/test.jsonl"), Error);
}

TEST(Gsm8k, ExtractsTheFinalAnswer) {
  // strict: the number after "####" (whatever comes later)
  EXPECT_EQ(gsm8k_extract_answer(" 3*4=12\n#### 12\nThen 99"), "12");
  EXPECT_EQ(gsm8k_extract_answer("#### $1,250.\n"), "1250");
  EXPECT_EQ(gsm8k_extract_answer("#### -7"), "-7");
  // flexible: the last number, ignoring an invented next question
  EXPECT_EQ(gsm8k_extract_answer(" She pays 5 + 6 = 11 dollars.\n\nQuestion: 1000 apples"), "11");
  EXPECT_EQ(gsm8k_extract_answer("The answer is 3.5."), "3.5");
  EXPECT_EQ(gsm8k_extract_answer("It is -4 or so"), "-4");
  EXPECT_EQ(gsm8k_extract_answer("####\nso 8"), "8");  // "####" without a number: flexible
  EXPECT_FALSE(gsm8k_extract_answer("no numbers here, - or . or $").has_value());
  EXPECT_FALSE(gsm8k_extract_answer("").has_value());
}

TEST(Gsm8k, NumberMatchIsNumeric) {
  EXPECT_DOUBLE_EQ(number_match("#### 18", {"18"}), 100);
  EXPECT_DOUBLE_EQ(number_match("so 18.00", {"18"}), 100);  // lm-eval's string compare: 0
  EXPECT_DOUBLE_EQ(number_match("#### 1,000", {"1000"}), 100);
  EXPECT_DOUBLE_EQ(number_match("#### 17", {"18"}), 0);
  EXPECT_DOUBLE_EQ(number_match("eighteen", {"18"}), 0);
  EXPECT_DOUBLE_EQ(number_match("#### 1.2.3", {"1.2"}), 0);  // not a number
  EXPECT_TRUE(same_final_answer("#### 18", "so 18.0"));
  EXPECT_FALSE(same_final_answer("#### 18", "#### 19"));
  EXPECT_TRUE(same_final_answer("no number", "none either"));
  EXPECT_FALSE(same_final_answer("no number", "3"));
  // through the metric
  EXPECT_DOUBLE_EQ(score(Metric::kNumber, "x = 5\n#### 5", {"5"}), 100);
  Metric m = Metric::kAll;
  EXPECT_TRUE(parse_metric("number", &m));
  EXPECT_EQ(m, Metric::kNumber);
  EXPECT_TRUE(parse_metric("string_match_part", &m));
  EXPECT_EQ(m, Metric::kPart);
  EXPECT_FALSE(parse_metric("exact", &m));
  EXPECT_STREQ(metric_name(Metric::kNumber), "number_match");
}

TEST(Gsm8k, SamplesAreShotsThenQuestions) {
  const auto items = parse_gsm8k(kThree, "t");
  Gsm8kConfig c;
  c.shots = 1;
  c.samples = 5;  // more than there are: what is there
  c.max_new_tokens = 64;
  const auto s = gsm8k_samples(items, c);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].id(), "gsm8k/1");
  EXPECT_EQ(s[1].id(), "gsm8k/2");
  EXPECT_EQ(s[0].context, "Question: Janet has 3 ducks. How many?\nAnswer: She has 3 ducks.\n#### 3\n\n");
  EXPECT_EQ(s[0].context, s[1].context);
  EXPECT_EQ(s[0].metric, Metric::kNumber);
  ASSERT_EQ(s[1].questions.size(), 1u);
  const EvalQuestion& q = s[1].questions[0];
  EXPECT_EQ(q.question, "Question: How much money?\nAnswer:");
  EXPECT_EQ(q.answer_prefix, "");
  EXPECT_EQ(q.answers, std::vector<std::string>{"2000"});
  EXPECT_EQ(q.max_new_tokens, 64);
  EXPECT_EQ(q.stop, std::vector<std::string>{"Question:"});
  c.shots = 3;  // nothing left to ask
  EXPECT_THROW(gsm8k_samples(items, c), Error);
  c.shots = 0;  // the shots are the context
  EXPECT_THROW(gsm8k_samples(items, c), Error);
}

TEST(Gsm8k, StopStringsAndMetricSurviveJsonlAndHash) {
  const auto items = parse_gsm8k(kThree, "t");
  Gsm8kConfig c;
  c.shots = 2;
  c.samples = 1;
  const auto s = gsm8k_samples(items, c);
  ASSERT_EQ(s.size(), 1u);
  // the samples file round trip keeps the metric and the stop strings
  const std::string path = ::testing::TempDir() + "/gsm8k_samples.jsonl";
  write_samples_jsonl(path, s);
  const auto back = load_samples_jsonl(path);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].metric, Metric::kNumber);
  EXPECT_EQ(back[0].questions[0].stop, s[0].questions[0].stop);
  EXPECT_EQ(back[0].content_hash(), s[0].content_hash());
  // stop strings change what is generated: they are in the hash; none leaves the old hash
  EvalSample t = s[0];
  t.questions[0].stop.clear();
  EXPECT_NE(t.content_hash(), s[0].content_hash());
  EvalSample u = t;
  u.questions[0].stop = {"Question:"};
  EXPECT_EQ(u.content_hash(), s[0].content_hash());
  // a malformed "stop" names the line
  try {
    parse_samples_jsonl(R"({"task": "t", "context": "c", "question": "q", "answers": ["1"], "max_new_tokens": 4, "stop": "x"})",
                        "s.jsonl");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s.jsonl:1: field 'stop' must be an array"), std::string::npos) << e.what();
  }
  // a results row with the number metric and kv_bases reads back
  QuestionResult r;
  r.task = "gsm8k";
  r.metric = Metric::kNumber;
  r.kv_bases = 4096;
  const nlohmann::json j = question_result_json(r);
  EXPECT_EQ(j.at("metric"), "number");
  EXPECT_EQ(j.at("kv_bases"), 4096);
  const std::string rpath = ::testing::TempDir() + "/gsm8k_results.jsonl";
  std::remove(rpath.c_str());
  {
    QuestionResultsFile f(rpath, "cfg");
    f.append(r);
  }
  const QuestionResultsFile f(rpath, "cfg");
  ASSERT_EQ(f.rows().size(), 1u);
  EXPECT_EQ(f.rows()[0].metric, Metric::kNumber);
  EXPECT_EQ(f.rows()[0].kv_bases, 4096);
}

}  // namespace
}  // namespace kvtrim::eval
