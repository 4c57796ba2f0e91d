// The RULER generator: determinism, validity (answers in the context, needle depth, token
// budget), per-task structure, and clear errors for missing inputs.
#include "eval/ruler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "eval/text.h"
#include "eval_fixture.h"

namespace kvtrim::eval {
namespace {

using test_support::ruler_config;
using test_support::approx_counter;
using test_support::tiny_counter;

const RulerGenerator& gen2k() {
  static RulerGenerator g(ruler_config(2048, 42), approx_counter());
  return g;
}

int64_t budget_used(const EvalSample& s, const TokenCounter& count) {
  const EvalQuestion& q = s.questions.at(0);
  return count(s.context, true) + count(q.question + q.answer_prefix, false) + q.max_new_tokens;
}

TEST(RulerGenerator, ThirteenTasks) {
  EXPECT_EQ(ruler_tasks().size(), 13u);
  EXPECT_EQ(parse_task_list("all").size(), 13u);
  EXPECT_EQ(parse_task_list("vt, cwe,vt"), (std::vector<std::string>{"vt", "cwe"}));
  try {
    parse_task_list("niah_single_1,nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown RULER task 'nope'"), std::string::npos) << e.what();
  }
}

TEST(RulerGenerator, SameSeedSameSamples) {
  const RulerGenerator other(ruler_config(2048, 42), approx_counter());
  for (const auto& t : ruler_tasks()) {
    const EvalSample a = gen2k().generate(t.name, 1), b = other.generate(t.name, 1);
    EXPECT_EQ(a.context, b.context) << t.name;
    EXPECT_EQ(a.questions[0].question, b.questions[0].question) << t.name;
    EXPECT_EQ(a.questions[0].answers, b.questions[0].answers) << t.name;
    EXPECT_EQ(a.content_hash(), b.content_hash()) << t.name;
  }
  EXPECT_EQ(gen2k().fingerprint(), other.fingerprint());
}

TEST(RulerGenerator, DifferentSeedOrIndexDiffers) {
  const RulerGenerator other(ruler_config(2048, 43), approx_counter());
  for (const auto& t : ruler_tasks()) {
    const EvalSample a = gen2k().generate(t.name, 0);
    EXPECT_NE(a.content_hash(), other.generate(t.name, 0).content_hash()) << t.name;
    EXPECT_NE(a.content_hash(), gen2k().generate(t.name, 1).content_hash()) << t.name;
    EXPECT_NE(a.questions[0].answers, other.generate(t.name, 0).questions[0].answers) << t.name;
  }
  EXPECT_NE(gen2k().fingerprint(), other.fingerprint());
}

TEST(RulerGenerator, AnswersInContextAndBudgetFilled) {
  // The tiny model's real tokenizer (one token per byte: 2048 is too small for qa_2) and the
  // approximate counter at a small and at RULER's 4096 budget (cwe's larger setting).
  const std::vector<std::pair<int64_t, TokenCounter>> cases = {
      {2048, tiny_counter()}, {1024, approx_counter()}, {4096, approx_counter()}};
  for (const auto& [ctx_len, count] : cases) {
    const RulerGenerator g(ruler_config(ctx_len, 5), count);
    for (const auto& t : ruler_tasks()) {
      if (ctx_len == 2048 && std::string(t.name) == "qa_2") continue;
      for (int i = 0; i < 3; ++i) {
        const EvalSample s = g.generate(t.name, i);
        ASSERT_EQ(s.questions.size(), 1u);
        EXPECT_EQ(s.questions[0].max_new_tokens, t.max_new_tokens);
        EXPECT_EQ(s.metric, t.metric);
        for (const auto& a : s.questions[0].answers) {
          EXPECT_NE(s.context.find(a), std::string::npos) << t.name << " answer " << a;
        }
        const int64_t used = budget_used(s, count);
        EXPECT_LE(used, ctx_len) << t.name;
        EXPECT_GE(used, ctx_len * 9 / 10) << t.name << " leaves too much of the budget unused";
      }
    }
  }
}

TEST(RulerGenerator, TooSmallBudgetIsAnError) {
  try {
    RulerGenerator g(ruler_config(300, 1), tiny_counter());
    g.generate("fwe", 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too small for task fwe"), std::string::npos) << e.what();
  }
}

// The haystack between the niah header line and the end.
std::string niah_body(const std::string& context) {
  const size_t nl = context.find('\n');
  return context.substr(nl + 1, context.size() - nl - 2);
}

TEST(RulerGenerator, NeedleAtRequestedDepth) {
  for (double depth : {0.0, 25.0, 50.0, 80.0, 100.0}) {
    RulerConfig c = ruler_config(2048, 9);
    c.depths = {depth};
    const RulerGenerator g(c, approx_counter());
    // Essay haystack: depth in sentences.
    for (const char* task : {"niah_single_2", "niah_single_3"}) {
      const EvalSample s = g.generate(task, 0);
      const auto sents = split_sentences(niah_body(s.context));
      int64_t at = -1;
      for (size_t i = 0; i < sents.size(); ++i) {
        if (sents[i].rfind("One of the special magic", 0) == 0) at = static_cast<int64_t>(i);
      }
      ASSERT_GE(at, 0) << task << " depth " << depth << "\n" << s.context.substr(0, 400);
      const double expect = depth / 100.0 * static_cast<double>(sents.size() - 1);
      EXPECT_LE(std::abs(static_cast<double>(at) - expect), 1.0) << task << " depth " << depth << ": sentence " << at
                                                                  << " of " << sents.size();
      EXPECT_EQ(s.depths, std::vector<double>{depth});
    }
    // Noise haystack: depth in lines.
    const EvalSample s = g.generate("niah_single_1", 0);
    std::vector<std::string> lines;
    std::istringstream in(niah_body(s.context));
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    const auto it = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("One of", 0) == 0; });
    ASSERT_NE(it, lines.end());
    const double expect = depth / 100.0 * static_cast<double>(lines.size() - 1);
    EXPECT_LE(std::abs(static_cast<double>(it - lines.begin()) - expect), 1.0) << "depth " << depth;
  }
}

// key -> values of every "One of the special magic X for KEY is: VALUE." in the context.
std::multimap<std::string, std::string> needles(const std::string& context) {
  std::multimap<std::string, std::string> out;
  static const std::regex re("One of the special magic \\w+ for (\\S+) is: (\\S+)\\.");
  for (auto it = std::sregex_iterator(context.begin(), context.end(), re); it != std::sregex_iterator(); ++it) {
    out.emplace((*it)[1], (*it)[2]);
  }
  return out;
}

std::string queried_key(const EvalSample& s) {
  static const std::regex re("for (\\S+) mentioned");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(s.questions[0].question, m, re)) << s.questions[0].question;
  return m[1];
}

TEST(RulerGenerator, MultikeyDistractorKeysDiffer) {
  for (const char* task : {"niah_multikey_1", "niah_multikey_2", "niah_multikey_3"}) {
    for (int i = 0; i < 3; ++i) {
      const EvalSample s = gen2k().generate(task, i);
      const auto n = needles(s.context);
      std::set<std::string> keys;
      for (const auto& [k, v] : n) keys.insert(k);
      EXPECT_EQ(keys.size(), n.size()) << task << ": a key repeats";
      EXPECT_GE(n.size(), 4u) << task;
      const std::string key = queried_key(s);
      ASSERT_EQ(n.count(key), 1u) << task << " key " << key;
      EXPECT_EQ(s.questions[0].answers, std::vector<std::string>{n.find(key)->second}) << task;
    }
  }
  const EvalSample mv = gen2k().generate("niah_multivalue", 0);
  const auto n = needles(mv.context);
  const std::string key = queried_key(mv);
  EXPECT_EQ(n.count(key), 4u);
  const EvalSample mq = gen2k().generate("niah_multiquery", 0);
  EXPECT_EQ(mq.questions[0].answers.size(), 4u);
  for (const auto& a : mq.questions[0].answers) EXPECT_NE(mq.context.find("is: " + a + "."), std::string::npos);
}

TEST(RulerGenerator, VariableTrackingChainsResolve) {
  static const std::regex assign_value("VAR ([A-Z]+) = (\\d+)");
  static const std::regex assign_var("VAR ([A-Z]+) = VAR ([A-Z]+)");
  for (int i = 0; i < 4; ++i) {
    const EvalSample s = gen2k().generate("vt", i);
    std::map<std::string, std::string> value, parent;
    for (auto it = std::sregex_iterator(s.context.begin(), s.context.end(), assign_value); it != std::sregex_iterator(); ++it)
      value[(*it)[1]] = (*it)[2];
    for (auto it = std::sregex_iterator(s.context.begin(), s.context.end(), assign_var); it != std::sregex_iterator(); ++it)
      parent[(*it)[1]] = (*it)[2];
    std::smatch m;
    ASSERT_TRUE(std::regex_search(s.questions[0].question, m, std::regex("value (\\d+)")));
    const std::string target = m[1];
    std::vector<std::string> resolved;
    std::set<std::string> all(s.questions[0].answers.begin(), s.questions[0].answers.end());
    for (const auto& [v, p] : parent) all.insert(v);
    for (const auto& [v, x] : value) all.insert(v);
    for (const auto& v : all) {
      std::string cur = v;
      for (int hop = 0; hop < 10 && !value.count(cur); ++hop) cur = parent.count(cur) ? parent[cur] : "";
      if (value.count(cur) && value[cur] == target) resolved.push_back(v);
    }
    std::vector<std::string> expect = s.questions[0].answers;
    std::sort(expect.begin(), expect.end());
    EXPECT_EQ(resolved, expect);  // `all` is sorted
    EXPECT_EQ(expect.size(), 5u);
  }
}

std::map<std::string, int> word_counts(const std::vector<std::string>& words) {
  std::map<std::string, int> c;
  for (const auto& w : words) ++c[w];
  return c;
}

TEST(RulerGenerator, CommonWordsAreTheMostCommon) {
  for (int i = 0; i < 3; ++i) {
    const EvalSample s = gen2k().generate("cwe", i);
    // The task's list follows the last header (an example with its own words comes first).
    const std::string list = s.context.substr(s.context.rfind("most often.\n") + 12);
    std::vector<std::string> words;
    static const std::regex item("\\d+\\. ([a-z]+)");
    for (auto it = std::sregex_iterator(list.begin(), list.end(), item); it != std::sregex_iterator(); ++it) words.push_back((*it)[1]);
    const auto c = word_counts(words);
    const auto& ans = s.questions[0].answers;
    ASSERT_EQ(ans.size(), 10u);
    int min_ans = 1 << 30, max_other = 0;
    for (const auto& [w, n] : c) {
      if (std::find(ans.begin(), ans.end(), w) != ans.end()) min_ans = std::min(min_ans, n);
      else max_other = std::max(max_other, n);
    }
    EXPECT_GT(min_ans, max_other);
    for (const auto& a : ans) EXPECT_TRUE(c.count(a)) << a;
  }
}

TEST(RulerGenerator, FrequentWordsAreTheMostFrequent) {
  for (int i = 0; i < 3; ++i) {
    const EvalSample s = gen2k().generate("fwe", i);
    const std::string body = s.context.substr(s.context.find("coded words. ") + 13);
    auto c = word_counts(split_words(normalize_space(body)));
    c.erase("...");
    std::vector<std::pair<int, std::string>> ranked;
    for (const auto& [w, n] : c) ranked.emplace_back(n, w);
    std::sort(ranked.rbegin(), ranked.rend());
    ASSERT_GE(ranked.size(), 4u);
    const auto& ans = s.questions[0].answers;
    std::set<std::string> top = {ranked[0].second, ranked[1].second, ranked[2].second};
    EXPECT_EQ(top, std::set<std::string>(ans.begin(), ans.end()));
    EXPECT_GT(ranked[2].first, ranked[3].first);
  }
}

TEST(RulerGenerator, QaGoldDocuments) {
  for (int i = 0; i < 4; ++i) {
    const EvalSample s1 = gen2k().generate("qa_1", i);
    EXPECT_EQ(s1.metric, Metric::kPart);
    // The question names a person whose profile holds the answer.
    std::smatch m;
    const std::string& q = s1.questions[0].question;
    ASSERT_TRUE(std::regex_search(q, m, std::regex("([A-Z][a-z]+ [A-Z][a-z]+)")));
    const std::string who = m[1];
    const size_t doc = s1.context.find(who + " was born");
    ASSERT_NE(doc, std::string::npos) << who;
    const size_t end = s1.context.find("\n\n", doc);
    EXPECT_NE(s1.context.substr(doc, end - doc).find(s1.questions[0].answers[0]), std::string::npos);
    EXPECT_EQ(s1.depths.size(), 1u);

    const EvalSample s2 = gen2k().generate("qa_2", i);
    ASSERT_TRUE(std::regex_search(s2.questions[0].question, m, std::regex("company that ([A-Z][a-z]+ [A-Z][a-z]+) works")));
    const std::string person = m[1];
    ASSERT_TRUE(std::regex_search(s2.context, m, std::regex(person + " joined ([A-Z][a-z]+ [A-Z][a-z]+ [A-Z][a-z]+) as")));
    const std::string company = m[1];
    const size_t cdoc = s2.context.find(company + " is a ");
    ASSERT_NE(cdoc, std::string::npos);
    EXPECT_NE(s2.context.substr(cdoc, s2.context.find("\n\n", cdoc) - cdoc).find(s2.questions[0].answers[0]),
              std::string::npos);
    EXPECT_EQ(s2.depths.size(), 2u);
    EXPECT_EQ(s2.context.find(s2.questions[0].answers[0] + " "), s2.context.rfind(s2.questions[0].answers[0] + " "))
        << "the answer should appear once";
  }
}

TEST(RulerGenerator, MissingInputsAreClearErrors) {
  RulerConfig c = ruler_config();
  c.wordnet_dir = "/nonexistent/wordnet";
  try {
    RulerGenerator g(c, tiny_counter());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/wordnet/index.noun"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("wordnet-base"), std::string::npos) << e.what();
  }
  c = ruler_config();
  c.scowl_dir = "/nonexistent/scowl";
  EXPECT_THROW(RulerGenerator(c, tiny_counter()), Error);
  c = ruler_config();
  c.haystack_dir = "/nonexistent/haystack";
  try {
    RulerGenerator g(c, tiny_counter());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("haystack directory '/nonexistent/haystack' does not exist"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kvtrim::eval
