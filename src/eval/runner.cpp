#include "eval/runner.h"
#include "eval/jsonl.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "eval/rng.h"
#include "eval/scoring.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace kvtrim::eval {

using nlohmann::json;

namespace {
// Placeholders used to cut the rendered chat template around the context and the question.
constexpr const char* kCtxMark = "\x01KVTRIM_CONTEXT\x01";
constexpr const char* kQMark = "\x01KVTRIM_QUESTION\x01";
}  // namespace

const char* prompt_format_name(PromptFormat f) { return f == PromptFormat::kChat ? "chat" : "base"; }

PromptFormat resolve_prompt_format(const std::string& spec, const Model& model) {
  const bool has_template = !model.gguf().get_string("tokenizer.chat_template", "").empty();
  if (spec == "auto") return has_template ? PromptFormat::kChat : PromptFormat::kBase;
  if (spec == "base") return PromptFormat::kBase;
  if (spec == "chat") {
    // the built-in templates cover some families without a template string (Gemma, Qwen)
    (void)model.chat_template().render({{"user", "x"}}, true);
    return PromptFormat::kChat;
  }
  fail("unknown prompt format '%s' (auto, chat or base)", spec.c_str());
}

PromptBuilder::PromptBuilder(const Model& model, PromptFormat format) : model_(model), format_(format) {
  if (format_ != PromptFormat::kChat) return;
  const std::string r = model.chat_template().render({{"user", std::string(kCtxMark) + kQMark}}, true);
  const size_t c = r.find(kCtxMark), q = r.find(kQMark);
  KVTRIM_CHECK(c != std::string::npos && q != std::string::npos && q == c + std::string(kCtxMark).size(),
               "cannot split the chat template of %s around the user message", model.gguf().path().c_str());
  chat_pre_ = r.substr(0, c);
  chat_post_ = r.substr(q + std::string(kQMark).size());
}

std::vector<int32_t> PromptBuilder::context_tokens(const std::string& context) const {
  const Tokenizer& tok = model_.tokenizer();
  if (format_ == PromptFormat::kBase) return tok.encode(context, tok.add_bos(), false);
  // Template text may hold special tokens; the user's text never is parsed for them.
  std::vector<int32_t> out = encode_prompt(tok, chat_pre_);
  const std::vector<int32_t> body = tok.encode(context, false, false);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

std::vector<int32_t> PromptBuilder::question_tokens(const std::string& question, const std::string& answer_prefix) const {
  const Tokenizer& tok = model_.tokenizer();
  if (format_ == PromptFormat::kBase) return tok.encode(question + answer_prefix, false, false);
  std::vector<int32_t> out = tok.encode(question, false, false);
  const std::vector<int32_t> post = tok.encode(chat_post_, false, true);
  out.insert(out.end(), post.begin(), post.end());
  // The prefix opens the assistant's answer; its leading space would follow a newline.
  const size_t b = answer_prefix.find_first_not_of(' ');
  if (b != std::string::npos) {
    const std::vector<int32_t> pre = tok.encode(answer_prefix.substr(b), false, false);
    out.insert(out.end(), pre.begin(), pre.end());
  }
  return out;
}

int64_t PromptBuilder::count(const std::string& text, bool is_context) const {
  if (is_context) return static_cast<int64_t>(context_tokens(text).size());
  // The generator passes question + answer prefix joined; count them as the runner will.
  return static_cast<int64_t>(question_tokens(text, "").size());
}

std::vector<QuestionResult> run_sample(Session& s, const PromptBuilder& pb, const EvalSample& sample,
                                       const RunnerOptions& opt, const std::set<int>& skip) {
  std::vector<QuestionResult> out;
  const std::vector<int32_t> ctx = pb.context_tokens(sample.context);
  KVTRIM_CHECK(!ctx.empty(), "sample %s has an empty context", sample.id().c_str());
  const std::string hash = sample.content_hash();
  bool have_context = false;
  double prefill_s = 0;
  int32_t n_context = 0;
  size_t kv_bytes = 0, kv_dense = 0, kv_bases = 0;
  PressLoss loss;
  // Prefills the context alone (and compresses it through the hook).
  auto prepare = [&](const std::vector<int32_t>* question) {
    const double t0 = now_seconds();
    if (opt.prefill_context) {
      opt.prefill_context(s, ctx);
    } else {
      s.reset();
      s.prefill(ctx);
    }
    prefill_s = now_seconds() - t0;
    if (opt.after_context) opt.after_context(s, question);
    // the log starts at the prefill (reset, restore_state): its last entry is the context's
    loss = s.compress_log().empty() ? PressLoss{} : s.compress_log().back().loss;
    n_context = s.n_past();
    const KvBytes kb = s.cache().bytes();
    kv_bytes = kb.total();
    kv_bases = kb.bases;
    kv_dense = s.cache().dense_bytes_f16();
    have_context = true;
  };
  // The shared compression's loss estimate is measured on the sample's first question (not the
  // first one run: the estimate must not depend on which questions a resumed run skips).
  std::vector<int32_t> first;
  if (!opt.query_aware && s.params().press_loss && !sample.questions.empty())
    first = pb.question_tokens(sample.questions[0].question, sample.questions[0].answer_prefix);
  for (int qi = 0; qi < static_cast<int>(sample.questions.size()); ++qi) {
    if (skip.count(qi)) continue;
    const EvalQuestion& q = sample.questions[static_cast<size_t>(qi)];
    const std::vector<int32_t> qt = pb.question_tokens(q.question, q.answer_prefix);
    KVTRIM_CHECK(!qt.empty(), "sample %s question %d is empty", sample.id().c_str(), qi);
    if (opt.query_aware) {
      prepare(&qt);
    } else if (!have_context) {
      prepare(first.empty() ? nullptr : &first);
    } else {
      s.truncate(n_context);  // back to the (compressed) context for the next question
    }
    GenerateParams gp;
    gp.max_new_tokens = q.max_new_tokens;
    gp.sampling.temperature = 0;  // greedy
    gp.stop_at_eog = true;
    gp.stop_strings = q.stop;
    const GenerateResult g = s.generate(qt, gp);
    QuestionResult r;
    r.task = sample.task;
    r.index = sample.index;
    r.q = qi;
    r.sample_hash = hash;
    r.metric = sample.metric;
    r.output = g.text;
    r.answers = q.answers;
    r.score = score(sample.metric, g.text, q.answers);
    r.n_context = n_context;
    r.n_question = static_cast<int64_t>(qt.size());
    r.n_generated = static_cast<int64_t>(g.tokens.size());
    r.kv_bytes = kv_bytes;
    r.kv_bytes_dense = kv_dense;
    r.kv_bases = static_cast<int64_t>(kv_bases);
    r.context_prefill_s = prefill_s;
    r.decode_tps = g.decode_tps();
    r.stop = stop_reason_name(g.stop);
    if (loss.measured) {
      r.press_loss = loss.rel_err;
      r.press_evicted_mass = loss.evicted_mass;
      r.press_loss_queries = loss_queries_name(loss.queries);
    }
    out.push_back(std::move(r));
  }
  return out;
}

json question_result_json(const QuestionResult& r) {
  json j{{"id", r.id()},
         {"task", r.task},
         {"index", r.index},
         {"q", r.q},
         {"sample_hash", r.sample_hash},
         {"metric", metric_short(r.metric)},
         {"score", r.score},
         {"output", r.output},
         {"answers", r.answers},
         {"n_context", r.n_context},
         {"n_question", r.n_question},
         {"n_generated", r.n_generated},
         {"kv_bytes", r.kv_bytes},
         {"kv_bytes_dense", r.kv_bytes_dense},
         {"kv_bases", r.kv_bases},
         {"context_prefill_s", r.context_prefill_s},
         {"decode_tps", r.decode_tps},
         {"stop", r.stop}};
  if (r.press_loss >= 0) {
    j["press_loss"] = r.press_loss;
    j["press_evicted_mass"] = r.press_evicted_mass;
    if (!r.press_loss_queries.empty()) j["press_loss_queries"] = r.press_loss_queries;
  }
  return j;
}

namespace {

QuestionResult from_json(const json& j) {
  QuestionResult r;
  r.task = j.at("task").get<std::string>();
  r.index = j.at("index").get<int64_t>();
  r.q = j.at("q").get<int>();
  r.sample_hash = j.at("sample_hash").get<std::string>();
  if (!parse_metric(j.at("metric").get<std::string>(), &r.metric))
    throw json::other_error::create(501, "unknown metric '" + j.at("metric").get<std::string>() + "'", &j);
  r.score = j.at("score").get<double>();
  r.output = j.at("output").get<std::string>();
  r.answers = j.at("answers").get<std::vector<std::string>>();
  r.n_context = j.at("n_context").get<int64_t>();
  r.n_question = j.at("n_question").get<int64_t>();
  r.n_generated = j.at("n_generated").get<int64_t>();
  r.kv_bytes = j.at("kv_bytes").get<size_t>();
  r.kv_bytes_dense = j.at("kv_bytes_dense").get<size_t>();
  r.kv_bases = j.contains("kv_bases") ? j.at("kv_bases").get<int64_t>() : -1;
  r.context_prefill_s = j.at("context_prefill_s").get<double>();
  r.decode_tps = j.at("decode_tps").get<double>();
  r.stop = j.at("stop").get<std::string>();
  r.press_loss = j.contains("press_loss") ? j.at("press_loss").get<double>() : -1;
  r.press_evicted_mass = j.contains("press_evicted_mass") ? j.at("press_evicted_mass").get<double>() : -1;
  r.press_loss_queries = j.contains("press_loss_queries") ? j.at("press_loss_queries").get<std::string>() : "";
  return r;
}

}  // namespace

namespace {
const ResultsFormat<QuestionResult, std::pair<std::string, int>> kQuestionFormat = {
    "question", "results line", "--out", from_json,
    [](const QuestionResult& r, const std::string& config) {
      json j = question_result_json(r);
      j["config"] = config;
      return j.dump(-1, ' ', false, json::error_handler_t::replace);
    },
    [](const QuestionResult& r) { return std::make_pair(r.id(), r.q); },
    [](const QuestionResult& r) -> const std::string& { return r.sample_hash; }};
}  // namespace

QuestionResultsFile::QuestionResultsFile(std::string path, std::string config_hash)
    : ResultsFile(std::move(path), kQuestionFormat, {std::move(config_hash)}) {}

bool QuestionResultsFile::done(const EvalSample& s, int q) const {
  return ResultsFile::done({s.id(), q}, s.content_hash(), strprintf("%s question %d", s.id().c_str(), q),
                           "was run on different sample text; the generator or data changed");
}

int64_t count_pending(const std::vector<EvalSample>& samples, const QuestionResultsFile* results) {
  int64_t n = 0;
  for (const auto& smp : samples) {
    for (int q = 0; q < static_cast<int>(smp.questions.size()); ++q) n += !(results && results->done(smp, q));
  }
  return n;
}

RunStats run_samples(Session& s, const PromptBuilder& pb, const std::vector<EvalSample>& samples,
                     QuestionResultsFile* results, const RunnerOptions& opt, std::vector<QuestionResult>* rows,
                     const std::function<void(const QuestionResult&, int64_t, int64_t)>& on_result) {
  RunStats st;
  const int64_t pending = count_pending(samples, results);
  std::map<std::pair<std::string, int>, const QuestionResult*> old;
  if (results) {
    for (const auto& r : results->rows()) old[{r.id(), r.q}] = &r;
  }
  std::vector<QuestionResult> earlier;
  for (const auto& smp : samples) {
    std::set<int> skip;
    for (int q = 0; q < static_cast<int>(smp.questions.size()); ++q) {
      if (results && results->done(smp, q)) {
        skip.insert(q);
        ++st.reused;
        if (rows) earlier.push_back(*old.at({smp.id(), q}));
      }
    }
    if (skip.size() == smp.questions.size()) continue;
    for (auto& r : run_sample(s, pb, smp, opt, skip)) {
      if (results) results->append(r);
      ++st.run;
      if (on_result) on_result(r, st.run, pending);
      if (rows) rows->push_back(std::move(r));
    }
  }
  if (rows) rows->insert(rows->begin(), earlier.begin(), earlier.end());
  return st;
}

std::string config_hash(const std::vector<std::string>& parts) {
  uint64_t h = fnv1a64("kvtrim-eval-config-v1");
  for (const auto& p : parts) h = fnv1a64("\x1f" + p, h);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {
struct TaskAgg {
  int64_t n = 0;
  double score = 0, ctx = 0, kv = 0, kv_dense = 0, tps = 0;
  int64_t n_tps = 0;
};

std::map<std::string, TaskAgg> aggregate(const std::vector<QuestionResult>& rows) {
  std::map<std::string, TaskAgg> m;
  for (const auto& r : rows) {
    TaskAgg& a = m[r.task];
    ++a.n;
    a.score += r.score;
    a.ctx += static_cast<double>(r.n_context);
    a.kv += static_cast<double>(r.kv_bytes);
    a.kv_dense += static_cast<double>(r.kv_bytes_dense);
    if (r.decode_tps > 0) {
      a.tps += r.decode_tps;
      ++a.n_tps;
    }
  }
  return m;
}
}  // namespace

double average_over_tasks(const std::vector<QuestionResult>& rows) {
  const auto m = aggregate(rows);
  if (m.empty()) return 0;
  double sum = 0;
  for (const auto& [task, a] : m) sum += a.score / static_cast<double>(a.n);
  return sum / static_cast<double>(m.size());
}

std::string summary_table(const std::vector<QuestionResult>& rows, const std::vector<std::string>& task_order) {
  const auto m = aggregate(rows);
  std::vector<std::string> order;
  for (const auto& t : task_order) {
    if (m.count(t)) order.push_back(t);
  }
  for (const auto& [t, a] : m) {
    if (std::find(order.begin(), order.end(), t) == order.end()) order.push_back(t);
  }
  std::string out = "| task | n | score | context tokens | KV MiB held | KV / f16 | decode tok/s |\n"
                    "|---|---:|---:|---:|---:|---:|---:|\n";
  TaskAgg all;
  for (const auto& t : order) {
    const TaskAgg& a = m.at(t);
    const double n = static_cast<double>(a.n);
    out += strprintf("| %s | %lld | %.1f | %.0f | %.2f | %.3f | %.1f |\n", t.c_str(), static_cast<long long>(a.n),
                     a.score / n, a.ctx / n, a.kv / n / (1024.0 * 1024.0), a.kv_dense > 0 ? a.kv / a.kv_dense : 0.0,
                     a.n_tps ? a.tps / static_cast<double>(a.n_tps) : 0.0);
    all.n += a.n;
    all.ctx += a.ctx;
    all.kv += a.kv;
    all.kv_dense += a.kv_dense;
    all.tps += a.tps;
    all.n_tps += a.n_tps;
  }
  if (!order.empty()) {
    const double n = static_cast<double>(all.n);
    out += strprintf("| **average** (over tasks) | %lld | **%.1f** | %.0f | %.2f | %.3f | %.1f |\n",
                     static_cast<long long>(all.n), average_over_tasks(rows), all.ctx / n,
                     all.kv / n / (1024.0 * 1024.0), all.kv_dense > 0 ? all.kv / all.kv_dense : 0.0,
                     all.n_tps ? all.tps / static_cast<double>(all.n_tps) : 0.0);
  }
  return out;
}

}  // namespace kvtrim::eval
