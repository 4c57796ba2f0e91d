// kvtrim eval ruler / mc / ppl and the `eval` command line (the sweeps: cmd_eval_sweep.cpp).
// kvtrim eval ruler: RULER-style long-context tasks with kvpress's protocol (docs/eval.md).
// Generates the samples (or loads them from --data), runs each through a session (context
// prefilled alone, then each question), appends one JSON line per question to --out as it
// finishes, skips questions already in --out for the same configuration (resume), and prints
// a markdown table per task.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "cli.h"
#include "cmd_eval.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"
#include "engine/context_question.h"
#include "eval/gsm8k.h"
#include "eval/jsonl.h"
#include "eval/mc.h"
#include "eval/ppl.h"
#include "eval/recipe.h"
#include "eval/rng.h"
#include "eval/ruler.h"
#include "eval/runner.h"
#include "eval/sweep.h"
#include "eval/sweep_ppl.h"
#include "model/tokenizer.h"
#include "press/press.h"

namespace kvtrim::cli {

namespace fs = std::filesystem;

namespace evalcmd {

// The Paul Graham essays.
std::string default_haystack_dir() { return eval::shared_data_path("haystack/paul_graham", "--haystack DIR"); }

eval::RunIdentity run_identity(const CommonOptions& common, const Model& model) {
  return {model.gguf().path(), kv_tag(common, model.hparams()), common.batch, prefill_tag(common), ""};
}

void set_cell_calibrations(std::vector<eval::SweepCell>* cells, const Model& model) {
  for (eval::SweepCell& c : *cells) c.calib = c.baseline() ? "" : make_press(c.spec)->calibration_id(model);
}

std::string calibration_note(const std::string& calib) {
  return calib.empty() ? "" : " (calibration " + calib + ")";
}

// The samples of `eval ruler` (and `eval sweep ruler`): generated with the model's token
// counts, or loaded from --data and filtered by --tasks / --samples. *source: what identifies
// them in a config hash.
std::vector<eval::EvalSample> ruler_samples(const EvalRulerOptions& o, const eval::PromptBuilder& pb, int64_t n_ctx,
                                            std::vector<std::string>* task_order_out, std::string* source_out) {
  std::vector<eval::EvalSample> samples;
  std::vector<std::string>& task_order = *task_order_out;
  std::string& source = *source_out;
  const double t_gen = now_seconds();
  if (!o.data.empty()) {
    samples = eval::load_samples_jsonl(o.data);
    const std::string text = read_file(o.data);
    source = eval::ruler_data_source(text);
    std::set<std::string> wanted;
    if (o.tasks != "all") {
      for (size_t b = 0; b <= o.tasks.size();) {
        size_t e = o.tasks.find(',', b);
        if (e == std::string::npos) e = o.tasks.size();
        wanted.insert(o.tasks.substr(b, e - b));
        b = e + 1;
      }
    }
    std::vector<eval::EvalSample> kept;
    std::map<std::string, int> per_task;
    for (auto& smp : samples) {
      if (!wanted.empty() && !wanted.count(smp.task)) continue;
      if (per_task[smp.task]++ >= o.samples) continue;
      if (std::find(task_order.begin(), task_order.end(), smp.task) == task_order.end()) task_order.push_back(smp.task);
      kept.push_back(std::move(smp));
    }
    samples = std::move(kept);
    KVTRIM_CHECK(!samples.empty(), "no samples of the tasks '%s' in '%s'", o.tasks.c_str(), o.data.c_str());
  } else {
    task_order = eval::parse_task_list(o.tasks);
    eval::RulerConfig rc;
    rc.ctx_len = o.ctx_len;
    rc.seed = o.seed;
    rc.depths = o.depths;
    rc.haystack_dir = o.haystack.empty() ? default_haystack_dir() : o.haystack;
    rc.wordnet_dir = o.wordnet_dir;
    rc.scowl_dir = o.scowl_dir;
    KVTRIM_CHECK(o.ctx_len <= n_ctx, "--ctx-len %lld exceeds the session's context limit of %lld (see -c)",
                 static_cast<long long>(o.ctx_len), static_cast<long long>(n_ctx));
    const eval::RulerGenerator gen(rc, [&pb](const std::string& t, bool is_ctx) { return pb.count(t, is_ctx); });
    source = gen.fingerprint();
    ProgressBar bar("generate", static_cast<int64_t>(task_order.size()) * o.samples, "samples");
    for (const auto& t : task_order) {
      for (int i = 0; i < o.samples; ++i) {
        samples.push_back(gen.generate(t, i));
        bar.update(static_cast<int64_t>(samples.size()));
      }
    }
    bar.finish();
  }
  std::fprintf(stderr, "samples: %zu from %s in %.1f s; prompt format: %s\n", samples.size(),
               o.data.empty() ? "the RULER generator" : o.data.c_str(), now_seconds() - t_gen,
               eval::prompt_format_name(pb.format()));
  return samples;
}

std::vector<eval::EvalSample> gsm8k_samples(const EvalGsm8kOptions& o, std::vector<std::string>* task_order_out,
                                            std::string* source_out) {
  const double t0 = now_seconds();
  const std::string data = o.data.empty() ? eval::shared_data_path("gsm8k/test.jsonl", "--data FILE") : o.data;
  const std::vector<eval::Gsm8kItem> items = eval::load_gsm8k(data);
  eval::Gsm8kConfig c;
  c.shots = o.shots;
  c.samples = o.samples;
  c.max_new_tokens = o.max_new_tokens;
  std::vector<eval::EvalSample> samples = eval::gsm8k_samples(items, c);
  *task_order_out = {"gsm8k"};
  *source_out = eval::gsm8k_source(data, o.shots, o.max_new_tokens);
  std::fprintf(stderr, "gsm8k: %zu questions (items %d..%lld of %s, %d shots) in %.1f s\n", samples.size(), o.shots,
               static_cast<long long>(samples.back().index), data.c_str(), o.shots, now_seconds() - t0);
  return samples;
}

// kvtrim eval ruler / eval gsm8k: generated answers scored per question (g: the gsm8k options,
// nullptr for ruler).
void run_generation(const EvalRulerOptions& o, const EvalGsm8kOptions* g) {
  KVTRIM_CHECK(g || o.samples > 0, "--samples must be positive");
  std::vector<std::string> task_order;
  std::string source;
  std::vector<eval::EvalSample> samples;
  if (g) samples = gsm8k_samples(*g, &task_order, &source);  // before the model: a bad file fails fast
  auto model = load_model(o.common);
  const eval::PromptFormat format = eval::resolve_prompt_format(o.format, *model);
  const eval::PromptBuilder pb(*model, format);
  SessionParams sp = session_params(o.common);
  sp.press_loss = true;  // each row records the compression's loss estimate (press_loss)
  Session s(*model, sp);
  // The press compresses once after the context (not after each question's prefill).
  eval::RunnerOptions ro;
  ro.query_aware = o.query_aware;
  KVTRIM_CHECK(!o.query_aware || !o.press.spec.empty(), "--query-aware needs --press");
  std::string press_desc = "none", calib;
  if (!o.press.spec.empty()) {
    PressSchedule sched;
    sched.after_prefill = false;
    sched.decode_every = o.press.decode_every;
    sched.decode_target = o.press.decode_target;
    auto p = make_press(o.press.spec);
    press_desc = p->spec() + (o.query_aware ? " (query-aware)" : "") +
                 (sched.decode_every ? strprintf(" every=%d target=%lld", sched.decode_every,
                                                 static_cast<long long>(sched.decode_target))
                                     : "");
    calib = p->calibration_id(*model);
    std::fprintf(stderr, "press: %s%s\n", press_desc.c_str(), calibration_note(calib).c_str());
    s.set_press(std::move(p), sched);
    ro.after_context = [qa = o.query_aware](Session& ss, const std::vector<int32_t>* question) {
      // query-aware: the press sees the question first (the path run, chat and serve share);
      // else the sample's first question is there for the loss estimate only (RunnerOptions)
      ContextCompressOptions co;
      co.min_tokens = 0;
      co.press_sees_question = qa;
      compress_context(ss, question ? *question : std::vector<int32_t>{}, co);
    };
  }

  // Samples: RULER-style generated with the model's tokenizer, or from a JSONL file.
  if (!g) samples = ruler_samples(o, pb, s.n_ctx(), &task_order, &source);
  if (!o.dump_samples.empty()) {
    eval::write_samples_jsonl(o.dump_samples, samples);
    std::fprintf(stderr, "wrote the samples to %s\n", o.dump_samples.c_str());
  }
  if (o.dry_run) return;

  // Everything that determines a result (not --samples / --tasks: more samples extend a run).
  eval::RunIdentity id = run_identity(o.common, *model);
  id.calib = calib;
  const std::string cfg = eval::generation_config(id, format, press_desc, source);
  std::unique_ptr<eval::QuestionResultsFile> results;
  if (!o.out.empty()) results = std::make_unique<eval::QuestionResultsFile>(o.out, cfg);
  const int64_t pending = eval::count_pending(samples, results.get());
  if (results) {
    std::fprintf(stderr, "results: %s (config %s): %lld questions to run%s\n", o.out.c_str(), cfg.c_str(),
                 static_cast<long long>(pending),
                 results->n_other_config() ? strprintf(", %lld lines of other configs kept",
                                                       static_cast<long long>(results->n_other_config())).c_str()
                                           : "");
  }
  const double t0 = now_seconds();
  ProgressBar bar(g ? "gsm8k" : "ruler", pending, "q");
  double score_sum = 0;
  std::vector<eval::QuestionResult> rows;
  const eval::RunStats st = eval::run_samples(
      s, pb, samples, results.get(), ro, &rows, [&](const eval::QuestionResult& r, int64_t done, int64_t) {
        score_sum += r.score;
        bar.update(done, strprintf("%s | mean %.1f", r.task.c_str(), score_sum / static_cast<double>(done)));
      });
  bar.finish();
  std::fprintf(stderr, "ran %lld questions in %.1f s (%lld already in %s)\n", static_cast<long long>(st.run),
               now_seconds() - t0, static_cast<long long>(st.reused), o.out.empty() ? "-" : o.out.c_str());
  const std::string what =
      g ? strprintf("GSM8K-style evaluation (%d shots, number_match)", g->shots) : std::string("RULER-style evaluation");
  std::printf("%s: %s, %s, format %s, press %s, config %s\n\n", what.c_str(), model->hparams().name.c_str(),
              g ? source.c_str()
                : o.data.empty() ? strprintf("ctx-len %lld, seed %llu", static_cast<long long>(o.ctx_len),
                                             static_cast<unsigned long long>(o.seed)).c_str()
                                 : o.data.c_str(),
              eval::prompt_format_name(format), press_desc.c_str(), cfg.c_str());
  std::fputs(eval::summary_table(rows, task_order).c_str(), stdout);
  std::fflush(stdout);
}


// The items of `eval mc` (and `eval sweep mc`): --bench from --data (default shared/data),
// the first --limit. *source: what identifies them in a config hash.
std::vector<eval::McItem> mc_items(const EvalMcOptions& o, std::string* source_out) {
  const double t_load = now_seconds();
  std::vector<eval::McItem> items;
  std::string data = o.data;
  std::string& source = *source_out;
  if (o.bench == "hellaswag") {
    if (data.empty()) data = eval::shared_data_path("hellaswag/hellaswag_val_full.txt.bz2", "--data FILE");
    items = eval::load_hellaswag(data);
  } else if (o.bench == "piqa") {
    if (data.empty()) data = eval::shared_data_path("piqa", "--data DIR");
    items = eval::load_piqa(data);
  } else {
    if (data.empty()) data = eval::shared_data_path("mmlu", "--data DIR");
    items = eval::load_mmlu(data, o.shots);
  }
  source = eval::mc_source(o.bench, data, items.size(), o.shots);
  if (o.limit > 0 && static_cast<int64_t>(items.size()) > o.limit) items.resize(static_cast<size_t>(o.limit));
  std::fprintf(stderr, "%s: %zu items from %s in %.1f s\n", o.bench.c_str(), items.size(), data.c_str(),
               now_seconds() - t_load);
  return items;
}

// kvtrim eval mc: multiple choice by log-likelihood, context compressed once (src/eval/mc.h).
void run_mc(const EvalMcOptions& o) {
  std::string source;
  const std::vector<eval::McItem> items = mc_items(o, &source);

  auto model = load_model(o.common);
  Session s(*model, session_params(o.common));
  std::string press_desc = "none", calib;
  std::function<void(Session&)> after_context;
  if (!o.press.spec.empty()) {
    KVTRIM_CHECK(o.press.decode_every == 0, "eval mc scores without decoding: --press-every does not apply");
    PressSchedule sched;
    sched.after_prefill = false;
    auto p = make_press(o.press.spec);
    press_desc = p->spec();
    calib = p->calibration_id(*model);
    std::fprintf(stderr, "press: %s%s\n", press_desc.c_str(), calibration_note(calib).c_str());
    s.set_press(std::move(p), sched);
    after_context = [](Session& ss) { ss.compress(); };
  }
  // Everything that determines a result (not --limit: more items extend a run).
  eval::RunIdentity id = run_identity(o.common, *model);
  id.calib = calib;
  const std::string cfg = eval::mc_config(id, o.bench, press_desc, source);
  std::unique_ptr<eval::McResultsFile> results;
  if (!o.out.empty()) results = std::make_unique<eval::McResultsFile>(o.out, cfg);
  std::vector<eval::McResult> rows;
  std::vector<const eval::McItem*> todo;
  std::map<int64_t, const eval::McResult*> old;
  if (results) {
    for (const auto& r : results->rows()) {
      if (r.bench == o.bench) old[r.index] = &r;
    }
  }
  for (const auto& it : items) {
    if (results && results->done(o.bench, it)) {
      rows.push_back(*old.at(it.index));
    } else {
      todo.push_back(&it);
    }
  }
  if (results) {
    std::fprintf(stderr, "results: %s (config %s): %zu items to run, %zu already there\n", o.out.c_str(), cfg.c_str(),
                 todo.size(), rows.size());
  }
  const double t0 = now_seconds();
  ProgressBar bar(o.bench, static_cast<int64_t>(todo.size()), "items");
  int64_t done = 0, hits = 0, hits_norm = 0;
  for (const eval::McItem* it : todo) {
    const eval::McTokens toks = eval::tokenize_item(*model, *it);
    eval::McResult r = eval::score_item(s, toks, *it, o.bench, after_context);
    if (results) results->append(r);
    ++done;
    hits += r.acc();
    hits_norm += r.acc_norm();
    bar.update(done, strprintf("acc %.3f acc_norm %.3f", static_cast<double>(hits) / static_cast<double>(done),
                               static_cast<double>(hits_norm) / static_cast<double>(done)));
    rows.push_back(std::move(r));
  }
  bar.finish();
  std::sort(rows.begin(), rows.end(), [](const eval::McResult& a, const eval::McResult& b) { return a.index < b.index; });
  std::fprintf(stderr, "scored %lld items in %.1f s\n", static_cast<long long>(done), now_seconds() - t0);
  std::printf("Multiple choice (log-likelihood): %s, %s, press %s, config %s\n\n", o.bench.c_str(),
              model->hparams().name.c_str(), press_desc.c_str(), cfg.c_str());
  std::fputs(eval::mc_summary_table(o.bench, rows).c_str(), stdout);
  std::fflush(stdout);
}


// kvtrim eval ppl: PPL through the compressed cache and ΔPPL against the full cache on the
// same tokens, both computed here (src/eval/ppl.h).
void run_ppl(const EvalPplOptions& o) {
  const std::string text = read_file(o.file);
  make_press(o.press);  // a bad --press fails before the model loads
  auto model = load_model(o.common);
  const Tokenizer& tok = model->tokenizer();
  std::vector<int32_t> tokens = tok.encode(text, tok.add_bos(), false);
  const size_t n_text = tokens.size();
  if (o.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > o.max_tokens) tokens.resize(static_cast<size_t>(o.max_tokens));
  eval::PplConfig c;
  c.ctx = o.ctx;
  c.mode = eval::parse_ppl_mode(o.mode);
  c.prefix = o.prefix;
  c.chunk = o.chunk;
  c.bos = tok.add_bos() ? tok.bos() : -1;
  KVTRIM_CHECK(c.mode == eval::PplMode::kThroughout || o.chunk == 1, "--chunk applies to --mode throughout only");
  KVTRIM_CHECK(o.ctx <= model->hparams().n_ctx_train, "--ctx %lld exceeds the model's context limit of %d tokens",
               static_cast<long long>(o.ctx), model->hparams().n_ctx_train);
  SessionParams sp = session_params(o.common);
  sp.n_ctx = o.ctx;
  Session s(*model, sp);
  PressSchedule sched;
  sched.after_prefill = false;
  auto p = make_press(o.press);
  const std::string press_desc = p->spec();
  eval::RunIdentity id = run_identity(o.common, *model);
  id.calib = p->calibration_id(*model);
  s.set_press(std::move(p), sched);
  eval::check_ppl_config(s, c);
  const int64_t n_win = eval::ppl_window_count(static_cast<int64_t>(tokens.size()), c.ctx);
  std::fprintf(stderr, "%s: %zu tokens (%zu used), %lld windows of %lld, scored rows [%lld, %lld), press %s, mode %s%s\n",
               o.file.c_str(), n_text, tokens.size(), static_cast<long long>(n_win), static_cast<long long>(c.ctx),
               static_cast<long long>(c.first_row()), static_cast<long long>(c.ctx - 1), press_desc.c_str(),
               eval::ppl_mode_name(c.mode),
               c.mode == eval::PplMode::kThroughout
                   ? strprintf(" (chunk %lld%s)", static_cast<long long>(c.chunk),
                               c.chunk > 1 ? ": APPROXIMATE, tokens of a chunk see each other uncompressed" : ": exact")
                         .c_str()
                   : "");
  // Everything that determines a window's numbers (not --max-tokens: more tokens extend a run).
  const std::string cfg = eval::ppl_config(id, o.file, c, press_desc);
  std::unique_ptr<eval::PplResultsFile> results;
  if (!o.out.empty()) results = std::make_unique<eval::PplResultsFile>(o.out, cfg);
  std::vector<eval::PplWindow> rows;
  std::vector<int64_t> todo;
  for (int64_t w = 0; w < n_win; ++w) {
    const std::vector<int32_t> win = eval::ppl_window_tokens(tokens, c.ctx, w, c.bos);
    if (results && results->done(w, eval::ppl_tokens_hash(win))) {
      rows.push_back(results->row(w));
    } else {
      todo.push_back(w);
    }
  }
  if (results) {
    std::fprintf(stderr, "results: %s (config %s): %zu windows to run, %zu already there%s\n", o.out.c_str(), cfg.c_str(),
                 todo.size(), rows.size(),
                 results->n_other_config()
                     ? strprintf(", %lld lines of other configs kept", static_cast<long long>(results->n_other_config())).c_str()
                     : "");
  }
  const double t0 = now_seconds();
  ProgressBar bar("ppl", static_cast<int64_t>(todo.size()), "win");
  int64_t done = 0;
  for (int64_t w : todo) {
    eval::PplWindow r = eval::score_ppl_window(s, eval::ppl_window_tokens(tokens, c.ctx, w, c.bos), w, c);
    if (results) results->append(r);
    rows.push_back(std::move(r));
    ++done;
    const eval::PplSummary sm = eval::summarize_ppl(rows);
    bar.update(done, strprintf("ppl %.4f full %.4f delta %+.4f", sm.ppl_press, sm.ppl_full, sm.delta));
  }
  bar.finish();
  std::sort(rows.begin(), rows.end(), [](const eval::PplWindow& a, const eval::PplWindow& b) { return a.index < b.index; });
  std::fprintf(stderr, "scored %lld windows in %.1f s\n", static_cast<long long>(done), now_seconds() - t0);
  const eval::PplSummary sm = eval::summarize_ppl(rows);
  std::printf("Perplexity through the compressed cache: %s, %s, press %s, mode %s, config %s\n\n", o.file.c_str(),
              model->hparams().name.c_str(), press_desc.c_str(), eval::ppl_mode_name(c.mode), cfg.c_str());
  std::fputs(eval::ppl_summary_table(rows, c, press_desc).c_str(), stdout);
  std::printf("\nmean KV held at scoring time: %s of %s uncompressed f16 (%.3f)\n",
              human_bytes(static_cast<size_t>(sm.mean_kv_bytes)).c_str(),
              human_bytes(static_cast<size_t>(sm.kv_ratio > 0 ? sm.mean_kv_bytes / sm.kv_ratio : 0)).c_str(), sm.kv_ratio);
  std::fflush(stdout);
}


// The benchmark's own options, shared by `eval ruler` and `eval sweep ruler` (declared once).
void add_ruler_options(CLI::App* c, EvalRulerOptions& o) {
  c->add_option("--ctx-len", o.ctx_len, "token budget of one sample (context + question + generation)")
      ->capture_default_str()->check(CLI::Range(int64_t{256}, int64_t{1} << 24));
  c->add_option("--samples", o.samples, "samples per task")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--tasks", o.tasks, "'all' or a comma-separated list of tasks")->capture_default_str();
  c->add_option("--seed", o.seed, "generator seed (same seed: same samples and results)")->capture_default_str();
  c->add_option("--data", o.data, "load samples from a JSONL file (task, context, question, answer_prefix, answers, max_new_tokens) instead of generating");
  c->add_option("--format", o.format, "prompt format: auto (chat if the model has a chat template), chat, base")
      ->capture_default_str()->check(CLI::IsMember({"auto", "chat", "base"}));
  c->add_option("--haystack", o.haystack, "directory of .txt essays for the haystacks (default: shared/data/haystack/paul_graham)");
  c->add_option("--wordnet-dir", o.wordnet_dir, "WordNet index files (Debian wordnet-base)")->capture_default_str();
  c->add_option("--scowl-dir", o.scowl_dir, "SCOWL word lists (Debian scowl)")->capture_default_str();
  c->add_option("--depth", o.depths, "needle depth in percent, repeatable (default: RULER's random depths)")
      ->check(CLI::Range(0.0, 100.0));
  c->add_flag("--query-aware", o.query_aware, "let the press see the question (context prefilled again per question)");
}

// The same for `eval gsm8k` and `eval sweep gsm8k`.
void add_gsm8k_options(CLI::App* c, EvalGsm8kOptions& g, std::string& format) {
  c->add_option("--data", g.data, "GSM8K test.jsonl (question, answer ending '#### <n>'); default: shared/data/gsm8k/test.jsonl");
  c->add_option("--shots", g.shots, "worked examples before each question (the file's first items; the questions follow them)")
      ->capture_default_str()->check(CLI::Range(1, 16));
  c->add_option("--samples", g.samples, "questions (the items after the shots)")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--max-new-tokens", g.max_new_tokens, "tokens per answer at most")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  c->add_option("--format", format, "prompt format: base (lm-eval's few-shot text), chat, auto")
      ->capture_default_str()->check(CLI::IsMember({"auto", "chat", "base"}));
}

// The same for `eval mc` and `eval sweep mc`.
void add_mc_options(CLI::App* mc, EvalMcOptions& m) {
  mc->add_option("--bench", m.bench, "hellaswag, piqa or mmlu")->required()->check(CLI::IsMember({"hellaswag", "piqa", "mmlu"}));
  mc->add_option("--limit", m.limit, "score the first N items only (0 = all)")->capture_default_str()->check(CLI::NonNegativeNumber);
  mc->add_option("--shots", m.shots, "mmlu: examples from the subject's dev set before each question")
      ->capture_default_str()->check(CLI::Range(0, 5));
  mc->add_option("--data", m.data, "data file (hellaswag) or directory (piqa, mmlu); default: shared/data/<bench>");
}

}  // namespace evalcmd

void register_eval(CLI::App& app) {
  using namespace evalcmd;
  CLI::App* e = app.add_subcommand("eval", "evaluation harness (RULER-style long-context tasks, multiple choice)");
  e->require_subcommand(1);
  auto o = std::make_shared<EvalRulerOptions>();
  CLI::App* c = e->add_subcommand("ruler", "RULER-style tasks, kvpress protocol: context prefilled alone, then each question");
  add_common_options(c, o->common);
  add_ruler_options(c, *o);
  c->add_option("--out", o->out, "results JSONL: one line per question, appended as it finishes; rerun to resume");
  add_press_options(c, o->press);
  c->add_flag("--dry-run", o->dry_run, "generate (and --dump-samples) only; run nothing");
  c->add_option("--dump-samples", o->dump_samples, "also write the samples as JSONL (the --data format)");
  c->callback([o] { run_generation(*o, nullptr); });

  auto go = std::make_shared<EvalRulerOptions>();
  auto gg = std::make_shared<EvalGsm8kOptions>();
  go->format = "base";
  CLI::App* gc = e->add_subcommand("gsm8k", "GSM8K-style maths: few-shot worked examples compressed, then each question answered greedily");
  add_common_options(gc, go->common);
  add_gsm8k_options(gc, *gg, go->format);
  gc->add_option("--out", go->out, "results JSONL: one line per question, appended as it finishes; rerun to resume");
  add_press_options(gc, go->press);
  gc->add_flag("--query-aware", go->query_aware, "let the press see the question (context prefilled again per question)");
  gc->add_flag("--dry-run", go->dry_run, "build (and --dump-samples) the samples only; run nothing");
  gc->add_option("--dump-samples", go->dump_samples, "also write the samples as JSONL (eval ruler's --data format)");
  gc->callback([go, gg] { run_generation(*go, gg.get()); });

  auto m = std::make_shared<EvalMcOptions>();
  CLI::App* mc = e->add_subcommand("mc", "multiple choice by log-likelihood (HellaSwag, PIQA, MMLU), context compressed once");
  add_common_options(mc, m->common);
  add_mc_options(mc, *m);
  mc->add_option("--out", m->out, "results JSONL: one line per item, appended as it finishes; rerun to resume");
  add_press_options(mc, m->press);
  mc->callback([m] { run_mc(*m); });

  auto pp = std::make_shared<EvalPplOptions>();
  CLI::App* pc = e->add_subcommand("ppl", "perplexity through the compressed cache and ΔPPL vs the full cache on the same tokens");
  add_common_options(pc, pp->common);
  pc->remove_option(pc->get_option("--ctx"));
  pc->add_option("-f,--file", pp->file, "text file (e.g. WikiText-2 test)")->required();
  pc->add_option("-c,--ctx", pp->ctx, "window length in tokens")->capture_default_str()->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  pc->add_option("--max-tokens", pp->max_tokens, "use only the first N tokens of the text (0 = all)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  pc->add_option("--press", pp->press, "press spec, e.g. snapkv:ratio=0.5 (kvtrim presses)")->required();
  pc->add_option("--mode", pp->mode, "pcc (prefill-compress-continue) or throughout (compressed throughout)")
      ->required()->check(CLI::IsMember({"pcc", "throughout"}));
  pc->add_option("--prefix", pp->prefix, "first scored row; pcc: tokens prefilled before compressing (0 = ctx/2)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  pc->add_option("--chunk", pp->chunk, "throughout: tokens per forward between compressions (1 = exact; more = approximate)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  pc->add_option("--out", pp->out, "results JSONL: one line per window, appended as it finishes; rerun to resume");
  pc->callback([pp] { run_ppl(*pp); });

  CLI::App* sw = e->add_subcommand(
      "sweep", "a benchmark over presses x compression ratios (x models): results, summary table, plot, AUC");
  sw->require_subcommand(1);
  auto sr = std::make_shared<EvalSweepOptions>();
  CLI::App* swr = add_sweep_command(sw, "ruler", sr, "RULER-style tasks; one context prefill per sample shared by every cell");
  add_ruler_options(swr, sr->ruler);
  swr->callback([sr] { run_sweep(*sr, "ruler"); });
  auto sg = std::make_shared<EvalSweepOptions>();
  sg->ruler.format = "base";
  CLI::App* swg = add_sweep_command(sw, "gsm8k", sg, "GSM8K-style maths; one prefill of the shots per question shared by every cell");
  add_gsm8k_options(swg, sg->gsm8k, sg->ruler.format);
  swg->add_flag("--query-aware", sg->ruler.query_aware, "let the press see the question (fresh prefill per cell and question)");
  swg->callback([sg] { run_sweep(*sg, "gsm8k"); });
  auto sm = std::make_shared<EvalSweepOptions>();
  CLI::App* swm = add_sweep_command(sw, "mc", sm, "multiple choice by log-likelihood (HellaSwag, PIQA, MMLU)");
  add_mc_options(swm, sm->mc);
  swm->callback([sm] { run_sweep(*sm, "mc"); });
  auto spp = std::make_shared<EvalSweepOptions>();
  spp->ratios = "0.25,0.5,0.75";
  CLI::App* swp = add_sweep_command(
      sw, "ppl", spp, "perplexity through the compressed cache (eval ppl's two passes per window) and ΔPPL vs the full cache");
  swp->remove_option(swp->get_option("--ctx"));
  swp->add_option("-f,--file", spp->ppl.file, "text file (e.g. WikiText-2 test)")->required();
  swp->add_option("-c,--ctx", spp->ppl.ctx, "window length in tokens")
      ->capture_default_str()->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  swp->add_option("--max-tokens", spp->ppl.max_tokens, "use only the first N tokens of the text (0 = all)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  swp->add_option("--mode", spp->ppl.mode, "pcc (prefill-compress-continue) or throughout (compressed throughout)")
      ->required()->check(CLI::IsMember({"pcc", "throughout"}));
  swp->add_option("--prefix", spp->ppl.prefix, "first scored row; pcc: tokens prefilled before compressing (0 = ctx/2)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  swp->add_option("--chunk", spp->ppl.chunk, "throughout: tokens per forward between compressions (1 = exact; more = approximate)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  swp->callback([spp] { run_sweep_ppl(*spp); });
  auto sum_dir = std::make_shared<std::string>(), sum_title = std::make_shared<std::string>();
  CLI::App* sws = sw->add_subcommand(
      "summary", "rewrite a sweep's summaries (summary.md/.csv, curves.csv, plot.svg) from every row of its results.jsonl");
  sws->add_option("--out-dir", *sum_dir, "the sweep's directory (holding results.jsonl)")->required();
  sws->add_option("--title", *sum_title, "title (default: the first line of the summary.md there)");
  sws->callback([sum_dir, sum_title] { run_sweep_summary(*sum_dir, *sum_title); });
}

}  // namespace kvtrim::cli
