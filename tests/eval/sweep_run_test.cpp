// kvtrim eval sweep on a tiny random model (split from sweep_test.cpp, which checks the grid and
// the summary maths): a sweep cell equals the same press run alone through eval ruler's path (one
// shared prefill changes nothing), and an interrupted sweep resumes to exactly the rows of an
// uninterrupted one.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "eval/jsonl.h"
#include "eval/plot_svg.h"
#include "eval/sweep.h"
#include "eval_fixture.h"

namespace kvtrim::eval {
namespace {

using test_support::configs_of;
using test_support::fresh_path;
using test_support::tiny_model;
using test_support::tiny_prompts;
using test_support::tiny_session_params;

// ---------------------------------------------------------------- runs on a tiny model

// Three samples, one with two questions; contexts of a few hundred tokens (the tiny
// tokenizer spends about one token per byte) so that every press has something to evict.
std::vector<EvalSample> samples() {
  std::string text;
  for (int i = 0; i < 3; ++i) {
    std::string ctx;
    for (int k = 0; k < 12; ++k)
      ctx += "Line " + std::to_string(k) + " of context " + std::to_string(i) + ". ";
    ctx += "The key is " + std::to_string(1000 + i) + ".";
    const std::string task = i < 2 ? "niah_single_1" : "qa_1";
    text += R"({"task": ")" + task + R"(", "context": ")" + ctx +
            R"(", "question": " What is the key?", "answer_prefix": " The key is", "answers": [")" +
            std::to_string(1000 + i) + R"("], "max_new_tokens": 5})" + "\n";
    if (i == 1)
      text +=
          R"({"task": "niah_single_1", "context": ")" + ctx +
          R"(", "question": " And again?", "answer_prefix": " It is", "answers": ["1001"], "max_new_tokens": 4})" +
          "\n";
  }
  return parse_samples_jsonl(text, "sweep");
}

std::vector<SweepCell> cells(const std::vector<std::string>& presses,
                             const std::vector<double>& ratios) {
  auto c = sweep_cells(presses, ratios);
  set_cell_configs(&c, {"model=tiny", "test"}, "sweep-test");
  return c;
}

// Presses needing different things (window queries, cumulative attention, task attention,
// nothing): the shared observer captures their union.
const std::vector<std::string> kPresses = {"snapkv:window=8", "h2o", "kvcompose", "streamingllm",
                                           "knorm"};

TEST(Sweep, CellEqualsTheSinglePressRun) {
  const auto smp = samples();
  const auto cs = cells(kPresses, {0.5, 0.8});
  SweepResultsFile res(fresh_path("sweep", "equal.jsonl"), configs_of(cs));
  Session s(tiny_model(), tiny_session_params());
  SweepRunOptions opt;
  opt.model = "tiny";
  const int64_t n = sweep_ruler(s, tiny_prompts(), smp, cs, res, opt);
  ASSERT_EQ(n, static_cast<int64_t>(cs.size()) * 4);
  EXPECT_EQ(sweep_ruler_pending(smp, cs, res), 0);

  std::map<std::tuple<std::string, std::string, int>, const SweepRow*> by_key;
  for (const auto& r : res.rows()) by_key[{r.spec, r.id, r.q}] = &r;
  for (const SweepCell& c : cs) {
    // eval ruler's path: a session of its own with the press installed, compress after the context
    Session one(tiny_model(), tiny_session_params());
    RunnerOptions ro;
    if (!c.baseline()) {
      PressSchedule sched;
      sched.after_prefill = false;
      one.set_press(make_press(c.spec), sched);
      ro.after_context = [](Session& ss, const std::vector<int32_t>*) { ss.compress(); };
    }
    std::vector<QuestionResult> ref;
    run_samples(one, tiny_prompts(), smp, nullptr, ro, &ref);
    ASSERT_EQ(ref.size(), 4u);
    for (const QuestionResult& q : ref) {
      const SweepRow* r = by_key.at({c.spec, q.id(), q.q});
      const nlohmann::json e = nlohmann::json::parse(r->extra);
      EXPECT_EQ(e.at("output").get<std::string>(), q.output)
          << c.spec << " " << q.id() << " q" << q.q;
      EXPECT_EQ(r->score, q.score);
      EXPECT_EQ(r->kv_bytes, q.kv_bytes) << c.spec;
      EXPECT_EQ(r->kv_bytes_dense, q.kv_bytes_dense);
      EXPECT_EQ(e.at("n_generated").get<int64_t>(), q.n_generated);
      EXPECT_EQ(e.at("n_context").get<int64_t>(), q.n_context);
      EXPECT_TRUE(r->shared_prefill);
      EXPECT_EQ(r->press, c.press);
      EXPECT_EQ(r->ratio, c.ratio);
    }
    if (!c.baseline()) {
      // the press really compressed: fewer bytes than the baseline
      EXPECT_LT(by_key.at({c.spec, smp[0].id(), 0})->kv_bytes,
                by_key.at({"none", smp[0].id(), 0})->kv_bytes)
          << c.spec;
    }
  }
}

// With the loss estimate on (eval sweep's default), a shared cell's compression observes the
// sample's first question for the estimate: the rows say so, and every cell's answers and bytes
// are those of the sweep without the estimate (the presses, not query-aware, do not read it).
TEST(Sweep, LossOnTheFirstQuestionChangesNoCell) {
  const auto smp = samples();
  const auto cs = cells({"snapkv:window=8", "streamingllm", "tova"}, {0.5});
  SweepRunOptions opt;
  opt.model = "tiny";
  SweepResultsFile off(fresh_path("sweep", "loss_off.jsonl"), configs_of(cs));
  Session s(tiny_model(), tiny_session_params());
  ASSERT_EQ(sweep_ruler(s, tiny_prompts(), smp, cs, off, opt), 16);
  SessionParams p = tiny_session_params();
  p.press_loss = true;
  SweepResultsFile on(fresh_path("sweep", "loss_on.jsonl"), configs_of(cs));
  Session t(tiny_model(), p);
  ASSERT_EQ(sweep_ruler(t, tiny_prompts(), smp, cs, on, opt), 16);
  std::map<std::tuple<std::string, std::string, int>, const SweepRow*> by_key;
  for (const auto& r : off.rows()) by_key[{r.spec, r.id, r.q}] = &r;
  for (const auto& r : on.rows()) {
    const SweepRow* o = by_key.at({r.spec, r.id, r.q});
    const nlohmann::json e = nlohmann::json::parse(r.extra), eo = nlohmann::json::parse(o->extra);
    EXPECT_EQ(e.at("output"), eo.at("output")) << r.spec << " " << r.id;
    EXPECT_EQ(r.kv_bytes, o->kv_bytes) << r.spec;
    EXPECT_TRUE(r.shared_prefill);
    EXPECT_FALSE(eo.contains("press_loss"));
    if (r.press == "none") {
      EXPECT_FALSE(e.contains("press_loss"));
    } else {
      ASSERT_TRUE(e.contains("press_loss")) << r.spec;
      EXPECT_EQ(e.at("press_loss_queries"), "question") << r.spec;
    }
  }
}

TEST(Sweep, QueryAwareCellEqualsTheSinglePressRun) {
  const auto smp = samples();
  const auto cs = cells({"snapkv:window=8,query_aware=true"}, {0.5});
  SweepResultsFile res(fresh_path("sweep", "qa.jsonl"), configs_of(cs));
  Session s(tiny_model(), tiny_session_params());
  SweepRunOptions opt;
  opt.model = "tiny";
  opt.query_aware = true;
  ASSERT_EQ(sweep_ruler(s, tiny_prompts(), smp, cs, res, opt), 8);
  Session one(tiny_model(), tiny_session_params());
  PressSchedule sched;
  sched.after_prefill = false;
  one.set_press(make_press(cs[1].spec), sched);
  RunnerOptions ro;
  ro.query_aware = true;
  ro.after_context = [](Session& ss, const std::vector<int32_t>* q) {
    if (q) ss.observe_question(*q);
    ss.compress();
  };
  std::vector<QuestionResult> ref;
  run_samples(one, tiny_prompts(), smp, nullptr, ro, &ref);
  for (const QuestionResult& q : ref) {
    const SweepRow* r = nullptr;
    for (const auto& x : res.rows())
      if (x.spec == cs[1].spec && x.id == q.id() && x.q == q.q) r = &x;
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(nlohmann::json::parse(r->extra).at("output").get<std::string>(), q.output);
    EXPECT_EQ(r->kv_bytes, q.kv_bytes);
    EXPECT_FALSE(r->shared_prefill);
  }
}

TEST(Sweep, PressWorkingInsideThePrefillGetsAFreshPrefill) {
  // ojakv (prefill=lowrank) compresses during the prefill and updates while decoding: its
  // cells run eval ruler's own path with the press installed, beside shared snapkv cells.
  const auto smp = samples();
  const auto cs = cells({"ojakv:init=prompt", "snapkv:window=8"}, {0.5});
  ASSERT_TRUE(make_press(cs[1].spec)->plans_after_append());
  SweepResultsFile res(fresh_path("sweep", "ojakv.jsonl"), configs_of(cs));
  Session s(tiny_model(), tiny_session_params());
  SweepRunOptions opt;
  opt.model = "tiny";
  ASSERT_EQ(sweep_ruler(s, tiny_prompts(), smp, cs, res, opt), 12);
  for (const SweepCell& c : cs) {
    Session one(tiny_model(), tiny_session_params());
    RunnerOptions ro;
    if (!c.baseline()) {
      PressSchedule sched;
      sched.after_prefill = false;
      one.set_press(make_press(c.spec), sched);
      ro.after_context = [](Session& ss, const std::vector<int32_t>*) { ss.compress(); };
    }
    std::vector<QuestionResult> ref;
    run_samples(one, tiny_prompts(), smp, nullptr, ro, &ref);
    for (const QuestionResult& q : ref) {
      const SweepRow* r = nullptr;
      for (const auto& x : res.rows())
        if (x.spec == c.spec && x.id == q.id() && x.q == q.q) r = &x;
      ASSERT_NE(r, nullptr);
      EXPECT_EQ(nlohmann::json::parse(r->extra).at("output").get<std::string>(), q.output)
          << c.spec;
      EXPECT_EQ(r->kv_bytes, q.kv_bytes) << c.spec;
      EXPECT_EQ(r->shared_prefill, c.press != "ojakv:init=prompt") << c.spec;
    }
  }
}

TEST(Sweep, McCellEqualsTheSinglePressRun) {
  std::vector<McItem> items(2);
  for (int i = 0; i < 2; ++i) {
    items[static_cast<size_t>(i)].index = i;
    for (int k = 0; k < 10; ++k)
      items[static_cast<size_t>(i)].context += "Step " + std::to_string(k + i) + " of the plan. ";
    items[static_cast<size_t>(i)].context += "Question: what comes next?\nAnswer:";
    items[static_cast<size_t>(i)].choices = {" more steps", " the end", " nothing at all"};
    items[static_cast<size_t>(i)].gold = i;
  }
  const auto cs = cells({"snapkv:window=8", "h2o", "knorm"}, {0.5});
  SweepResultsFile res(fresh_path("sweep", "mc.jsonl"), configs_of(cs));
  Session s(tiny_model(), tiny_session_params());
  SweepRunOptions opt;
  opt.model = "tiny";
  EXPECT_EQ(sweep_mc_pending("piqa", items, cs, res), 8);
  EXPECT_EQ(sweep_mc(s, "piqa", items, cs, res, opt), 8);
  EXPECT_EQ(sweep_mc_pending("piqa", items, cs, res), 0);
  for (const SweepRow& r : res.rows()) {
    Session one(tiny_model(), tiny_session_params());
    std::function<void(Session&)> after;
    if (r.spec != "none") {
      PressSchedule sched;
      sched.after_prefill = false;
      one.set_press(make_press(r.spec), sched);
      after = [](Session& ss) { ss.compress(); };
    }
    const McItem& it = items[r.id == "piqa/0" ? 0 : 1];
    const McResult m = score_item(one, tokenize_item(tiny_model(), it), it, "piqa", after);
    const nlohmann::json e = nlohmann::json::parse(r.extra);
    EXPECT_EQ(e.at("loglik").get<std::vector<double>>(), m.loglik) << r.spec << " " << r.id;
    EXPECT_EQ(r.kv_bytes, m.kv_bytes) << r.spec;
    EXPECT_EQ(r.score, m.acc_norm() ? 100.0 : 0.0);
    EXPECT_FALSE(r.shared_prefill);
  }
}

// Everything of a row but its timings.
std::string content(const SweepRow& r) {
  nlohmann::json e = nlohmann::json::parse(r.extra);
  e.erase("context_prefill_s");
  return r.config + "|" + r.id + "|" + std::to_string(r.q) + "|" + r.press + "|" +
         std::to_string(r.ratio) + "|" + std::to_string(r.score) + "|" +
         std::to_string(r.kv_bytes) + "|" + std::to_string(r.kv_bytes_dense) + "|" + e.dump();
}

std::multiset<std::string> contents(const std::vector<SweepRow>& rows) {
  std::multiset<std::string> out;
  for (const auto& r : rows) out.insert(content(r));
  return out;
}

TEST(Sweep, InterruptedSweepResumesToTheSameRows) {
  const auto smp = samples();
  const auto cs = cells({"snapkv", "streamingllm"}, {0.5, 0.75});
  const int64_t total = static_cast<int64_t>(cs.size()) * 4;
  SweepRunOptions opt;
  opt.model = "tiny";

  // uninterrupted
  const std::string full_path = fresh_path("sweep", "full.jsonl");
  std::multiset<std::string> full;
  {
    SweepResultsFile res(full_path, configs_of(cs));
    Session s(tiny_model(), tiny_session_params());
    EXPECT_EQ(sweep_ruler(s, tiny_prompts(), smp, cs, res, opt), total);
    full = contents(res.rows());
    ASSERT_EQ(static_cast<int64_t>(full.size()), total);
  }

  // interrupted after 7 rows (mid-sample: the second sample's cells are half done), then resumed
  const std::string path = fresh_path("sweep", "resumed.jsonl");
  {
    SweepResultsFile res(path, configs_of(cs));
    Session s(tiny_model(), tiny_session_params());
    SweepRunOptions stop = opt;
    int n = 0;
    stop.on_row = [&n](const SweepRow&) {
      if (++n == 7) throw std::runtime_error("interrupted");
    };
    EXPECT_THROW(sweep_ruler(s, tiny_prompts(), smp, cs, res, stop), std::runtime_error);
  }
  {
    // an interrupted write: a torn last line is cut off and its row runs again
    std::ofstream f(path, std::ios::app | std::ios::binary);
    f << R"({"config": ")" << cs[1].config << R"(", "model": "tiny", "id": "qa_1/0", "q": 0, "sco)";
  }
  {
    SweepResultsFile res(path, configs_of(cs));
    EXPECT_EQ(res.rows().size(), 7u);
    EXPECT_EQ(sweep_ruler_pending(smp, cs, res), total - 7);
    Session s(tiny_model(), tiny_session_params());
    EXPECT_EQ(sweep_ruler(s, tiny_prompts(), smp, cs, res, opt), total - 7);
    EXPECT_EQ(contents(res.rows()), full);
  }
  {
    // reopened: every row there once, nothing left to run
    SweepResultsFile res(path, configs_of(cs));
    EXPECT_EQ(contents(res.rows()), full);
    EXPECT_EQ(sweep_ruler_pending(smp, cs, res), 0);
    // a cell of another config is not this run's (kept in the file, ignored)
    SweepResultsFile other(path, {cs[0].config});
    EXPECT_EQ(other.rows().size(), 4u);
    EXPECT_EQ(other.n_other_config(), total - 4);
  }
  {
    // the summaries are written from the rows
    const std::string dir = kvtrim::test::temp_dir("sweep_out");
    SweepResultsFile res(path, configs_of(cs));
    const std::string md = write_sweep_summaries(dir, res.rows(), "tiny", "score");
    EXPECT_NE(md.find("| snapkv | 0.75 |"), std::string::npos) << md;
    for (const char* f : {"summary.md", "summary.csv", "curves.csv", "plot.svg"})
      EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dir) / f)) << f;
  }
}

TEST(Sweep, ChangedSampleUnderTheSameConfigIsAnError) {
  auto smp = samples();
  const auto cs = cells({"streamingllm"}, {0.5});
  const std::string path = fresh_path("sweep", "changed.jsonl");
  SweepRunOptions opt;
  opt.model = "tiny";
  {
    SweepResultsFile res(path, configs_of(cs));
    Session s(tiny_model(), tiny_session_params());
    sweep_ruler(s, tiny_prompts(), {smp[0]}, cs, res, opt);
  }
  smp[0].context += " Changed.";
  SweepResultsFile res(path, configs_of(cs));
  EXPECT_THROW(sweep_ruler_pending({smp[0]}, cs, res), Error);
}

TEST(Sweep, StateRestoreKeepsTheObserverOnTheLiveCache) {
  // After restore, the observer must refer to the session's (new) cache: decoding on and
  // compressing again works and gives what the original cache gives.
  Session a(tiny_model(), tiny_session_params()), b(tiny_model(), tiny_session_params());
  PressNeeds needs;
  needs.window = 8;
  needs.cum_attn = true;
  a.set_observer(needs);
  b.set_observer(needs);
  std::vector<int32_t> toks;
  for (int i = 0; i < 120; ++i) toks.push_back(40 + i % 50);
  a.prefill(toks);
  b.prefill(toks);
  const Session::State st = a.save_state();
  auto h2o = make_press("h2o:ratio=0.5");
  a.compress_with(*h2o);
  a.restore_state(st);
  EXPECT_EQ(a.cache().bytes().total(), b.cache().bytes().total());
  const std::vector<float> la = a.decode(7), lb = b.decode(7);
  EXPECT_EQ(la, lb);
  a.compress_with(*h2o);
  b.compress_with(*h2o);
  EXPECT_EQ(a.cache().bytes().total(), b.cache().bytes().total());
  EXPECT_EQ(a.decode(9), b.decode(9));
}

}  // namespace
}  // namespace kvtrim::eval
