// kvtrim eval sweep ruler|mc|ppl: a benchmark over presses x ratios (x models) into one
// resumable results file, with the summaries of src/eval/sweep.h and src/eval/sweep_ppl.h
// (docs/eval.md "Sweeps").
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <tuple>

#include "cli.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"
#include "eval/jsonl.h"
#include "eval/mc.h"
#include "eval/ppl.h"
#include "eval/rng.h"
#include "eval/ruler.h"
#include "eval/runner.h"
#include "eval/sweep.h"
#include "eval/sweep_ppl.h"
#include "model/tokenizer.h"
#include "press/press.h"

#include "cmd_eval.h"

namespace kvtrim::cli::evalcmd {

namespace fs = std::filesystem;

namespace {

// "-m smollm2" -> "smollm2"; "-m dir/x.gguf" -> "x".
std::string model_label(const std::string& arg) {
  std::error_code ec;
  if (fs::is_regular_file(arg, ec)) return fs::path(arg).stem().string();
  return arg;
}

// kvtrim eval sweep ruler|mc: the benchmark over presses x ratios (x models), one results
// file, resumable, with the summaries of src/eval/sweep.h (docs/eval.md "Sweeps").
// What both sweep commands check first (a bad press, ratio or model list fails before any model
// loads): the press entries, the ratios, the models (each once).
// One model of a sweep: its label, the model, the session that runs it, its cells.
struct SweepModel {
  std::string label;
  CommonOptions common;  // the command's options with -m set to this model
  std::unique_ptr<Model> model;
  std::unique_ptr<Session> session;
  std::vector<eval::SweepCell> cells;
};
// Loads model `m` of a sweep (the session is the caller's: its parameters differ per bench).
void load_sweep_model(const CommonOptions& common, const std::string& m, SweepModel* j) {
  j->label = model_label(m);
  j->common = common;
  j->common.model = m;
  j->model = load_model(j->common);
}

struct SweepSetup {
  std::vector<std::string> entries, models;
  std::vector<double> ratios;
};
SweepSetup sweep_setup(const EvalSweepOptions& o) {
  SweepSetup st;
  for (const std::string& p : o.presses)
    for (const std::string& e : eval::split_press_list(p)) st.entries.push_back(e);
  st.ratios = eval::parse_ratio_list(o.ratios);
  st.models = o.models.empty() ? std::vector<std::string>{o.common.model} : o.models;
  std::set<std::string> seen;
  for (const auto& m : st.models)
    KVTRIM_CHECK(seen.insert(model_label(m)).second, "-m %s is given twice", m.c_str());
  return st;
}

// Creates --out-dir (after every argument check, so a bad command line leaves nothing behind).
void make_out_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  KVTRIM_CHECK(!ec && fs::is_directory(dir), "cannot create --out-dir '%s'%s%s", dir.c_str(), ec ? ": " : "",
               ec ? ec.message().c_str() : "");
}

void print_results_status(const std::string& path, const char* unit, int64_t pending, size_t n_rows,
                          int64_t n_other) {
  std::fprintf(stderr, "results: %s: %lld %s to run, %zu already there%s\n", path.c_str(),
               static_cast<long long>(pending), unit, n_rows,
               n_other ? strprintf(", %lld lines of other configs kept", static_cast<long long>(n_other)).c_str() : "");
}

// Runs `run` (unless --summary-only) under a progress bar, writes the summaries (also when the
// run is interrupted: a rerun resumes), prints the markdown. run(bar, done) counts rows in done.
void run_then_summarize(const EvalSweepOptions& o, const char* bar_name, const char* unit, const char* what,
                        int64_t pending, const std::function<void(ProgressBar&, int64_t&)>& run,
                        const std::function<std::string()>& summarize) {
  if (!o.summary_only) {
    const double t0 = now_seconds();
    ProgressBar bar(bar_name, pending, unit);
    int64_t done = 0;
    try {
      run(bar, done);
    } catch (...) {
      bar.finish("interrupted");
      summarize();  // what is there so far; a rerun resumes
      throw;
    }
    bar.finish();
    std::fprintf(stderr, "ran %lld %s in %.1f s\n", static_cast<long long>(done), what, now_seconds() - t0);
  }
  const std::string md = summarize();
  std::fprintf(stderr, "wrote %s/{summary.md, summary.csv, curves.csv, plot.svg}\n", o.out_dir.c_str());
  std::fputs(md.c_str(), stdout);
  std::fflush(stdout);
}

// The y axis of a sweep's summaries: the benchmark's headline metric (bench: ruler, gsm8k, or the
// mc benchmark's name).
const char* score_label(const std::string& bench) {
  if (bench == "ruler") return "RULER score (0-100)";
  if (bench == "gsm8k") return "GSM8K accuracy (%)";
  return bench == "mmlu" ? "accuracy (%)" : "acc_norm (%)";
}

}  // namespace

void run_sweep(const EvalSweepOptions& o, const std::string& bench) {
  // ruler and gsm8k: generated answers (eval::sweep_ruler over EvalSamples); mc: log-likelihoods
  const bool gsm8k = bench == "gsm8k";
  const bool ruler = bench == "ruler" || gsm8k;
  // The grid first: a bad press or ratio fails before any model loads.
  if (ruler) KVTRIM_CHECK(o.ruler.samples > 0, "--samples must be positive");
  const SweepSetup st = sweep_setup(o);
  const std::vector<std::string>& entries = st.entries;
  const std::vector<double>& ratios = st.ratios;
  const std::vector<std::string>& models = st.models;
  const std::vector<eval::SweepCell> grid = eval::sweep_cells(entries, ratios);
  make_out_dir(o.out_dir);
  std::fprintf(stderr, "sweep: %zu presses x %zu ratios + the uncompressed baseline = %zu cells per sample, %zu model(s)\n",
               entries.size(), ratios.size(), grid.size(), models.size());

  struct Job : SweepModel {
    std::unique_ptr<eval::PromptBuilder> pb;
    std::vector<eval::EvalSample> samples;
  };
  std::vector<Job> jobs;
  std::vector<eval::McItem> items;
  std::string mc_source;
  if (!ruler) items = mc_items(o.mc, &mc_source);
  std::vector<eval::EvalSample> gsm8k_set;  // the same for every model; read before any loads
  std::vector<std::string> gsm8k_tasks;
  std::string gsm8k_source;
  if (gsm8k) gsm8k_set = gsm8k_samples(o.gsm8k, &gsm8k_tasks, &gsm8k_source);
  std::vector<std::string> task_order;
  std::set<std::string> configs;
  for (const std::string& m : models) {
    Job j;
    load_sweep_model(o.common, m, &j);
    SessionParams sp = session_params(j.common);
    sp.press_loss = true;  // ruler / gsm8k rows record each compression's loss estimate (press_loss)
    j.session = std::make_unique<Session>(*j.model, sp);
    j.cells = grid;
    set_cell_calibrations(&j.cells, *j.model);
    const eval::RunIdentity id = run_identity(o.common, *j.model);
    if (ruler) {
      const eval::PromptFormat format = eval::resolve_prompt_format(o.ruler.format, *j.model);
      j.pb = std::make_unique<eval::PromptBuilder>(*j.model, format);
      std::string source;
      task_order.clear();
      if (gsm8k) {
        j.samples = gsm8k_set;
        task_order = gsm8k_tasks;
        source = gsm8k_source;
      } else {
        j.samples = ruler_samples(o.ruler, *j.pb, j.session->n_ctx(), &task_order, &source);
      }
      eval::set_generation_sweep_configs(&j.cells, id, format, source, gsm8k ? "gsm8k" : "ruler",
                                         o.ruler.query_aware);
    } else {
      eval::set_mc_sweep_configs(&j.cells, id, o.mc.bench, mc_source);
    }
    for (const auto& c : j.cells) configs.insert(c.config);
    jobs.push_back(std::move(j));
  }

  const std::string results_path = (fs::path(o.out_dir) / "results.jsonl").string();
  eval::SweepResultsFile results(results_path, configs);
  int64_t pending = 0;
  for (const Job& j : jobs)
    pending += ruler ? eval::sweep_ruler_pending(j.samples, j.cells, results)
                     : eval::sweep_mc_pending(o.mc.bench, items, j.cells, results);
  print_results_status(results_path, "rows", pending, results.rows().size(), results.n_other_config());
  if (ruler)
    std::fprintf(stderr, "prefill: %s\n",
                 o.ruler.query_aware ? "fresh per cell and question (--query-aware: the press sees the question)"
                                     : "one per sample, shared by every cell (the observer captures every press's needs)");
  else
    std::fprintf(stderr, "prefill: fresh per cell (mc scores each item through eval mc's own path)\n");

  // The rows this command's summaries cover: its cells on its samples / items.
  auto summarize = [&]() {
    std::set<std::string> ids;
    if (ruler) {
      for (const Job& j : jobs)
        for (const auto& smp : j.samples) ids.insert(smp.id());
    } else {
      for (const auto& it : items) ids.insert(eval::mc_row_id(o.mc.bench, it));
    }
    std::vector<eval::SweepRow> rows;
    for (const auto& r : results.rows())
      if (ids.count(r.id)) rows.push_back(r);
    const std::string title =
        gsm8k ? strprintf("GSM8K-style sweep: %d questions after %d shots, number_match%s", o.gsm8k.samples,
                          o.gsm8k.shots, o.ruler.query_aware ? ", query-aware" : "")
        : ruler ? (o.ruler.data.empty()
                     ? strprintf("RULER sweep: ctx-len %lld, seed %llu, tasks %s, %d sample(s) per task%s",
                                 static_cast<long long>(o.ruler.ctx_len), static_cast<unsigned long long>(o.ruler.seed),
                                 o.ruler.tasks.c_str(), o.ruler.samples, o.ruler.query_aware ? ", query-aware" : "")
                     : strprintf("RULER sweep: %s, tasks %s", o.ruler.data.c_str(), o.ruler.tasks.c_str()))
              : strprintf("%s sweep: %zu items (%s)", o.mc.bench.c_str(), items.size(),
                          o.mc.bench == "mmlu" ? "acc" : "acc_norm");
    return eval::write_sweep_summaries(o.out_dir, rows, title, score_label(ruler ? bench : o.mc.bench));
  };

  run_then_summarize(
      o, "sweep", "rows", "rows", pending,
      [&](ProgressBar& bar, int64_t& done) {
        for (const Job& j : jobs) {
          eval::SweepRunOptions ro;
          ro.model = j.label;
          ro.query_aware = ruler && o.ruler.query_aware;
          ro.bench = bench;
          ro.on_row = [&](const eval::SweepRow& r) {
            ++done;
            bar.update(done, strprintf("%s %s@%g %s", r.model.c_str(), r.press.c_str(), r.ratio, r.id.c_str()));
          };
          if (ruler) {
            eval::sweep_ruler(*j.session, *j.pb, j.samples, j.cells, results, ro);
          } else {
            eval::sweep_mc(*j.session, o.mc.bench, items, j.cells, results, ro);
          }
        }
      },
      summarize);
}

// kvtrim eval sweep ppl: eval ppl over presses x ratios (x models) into one results file,
// resumable per (cell, window), with the summaries of src/eval/sweep_ppl.h.
void run_sweep_ppl(const EvalSweepOptions& o) {
  const EvalPplOptions& po = o.ppl;
  const SweepSetup st = sweep_setup(o);
  const std::vector<std::string>& entries = st.entries;
  const std::vector<double>& ratios = st.ratios;
  const std::vector<std::string>& models = st.models;
  const std::vector<eval::SweepCell> grid = eval::ppl_sweep_cells(eval::sweep_cells(entries, ratios));
  const eval::PplMode mode = eval::parse_ppl_mode(po.mode);
  KVTRIM_CHECK(mode == eval::PplMode::kThroughout || po.chunk == 1, "--chunk applies to --mode throughout only");
  const std::string text = read_file(po.file);
  make_out_dir(o.out_dir);
  std::fprintf(stderr, "sweep ppl: %zu presses x %zu ratios = %zu cells per window (each with its full-cache pass), %zu model(s)\n",
               entries.size(), ratios.size(), grid.size(), models.size());

  struct Job : SweepModel {
    std::vector<int32_t> tokens;
    eval::PplConfig c;
    int64_t n_win = 0;
  };

  std::vector<Job> jobs;
  std::set<std::string> configs;
  std::map<std::string, int64_t> n_win_of;  // config -> the model's windows in this run
  std::map<std::string, size_t> cell_pos;   // config -> position in the grid over the models
  for (const std::string& m : models) {
    Job j;
    load_sweep_model(o.common, m, &j);
    const Tokenizer& tok = j.model->tokenizer();
    j.tokens = tok.encode(text, tok.add_bos(), false);
    const size_t n_text = j.tokens.size();
    if (po.max_tokens > 0 && static_cast<int64_t>(j.tokens.size()) > po.max_tokens)
      j.tokens.resize(static_cast<size_t>(po.max_tokens));
    j.c.ctx = po.ctx;
    j.c.mode = mode;
    j.c.prefix = po.prefix;
    j.c.chunk = po.chunk;
    j.c.bos = tok.add_bos() ? tok.bos() : -1;
    KVTRIM_CHECK(po.ctx <= j.model->hparams().n_ctx_train, "--ctx %lld exceeds %s's context limit of %d tokens",
                 static_cast<long long>(po.ctx), j.label.c_str(), j.model->hparams().n_ctx_train);
    SessionParams sp = session_params(j.common);
    sp.n_ctx = po.ctx;
    j.session = std::make_unique<Session>(*j.model, sp);
    j.n_win = eval::ppl_window_count(static_cast<int64_t>(j.tokens.size()), j.c.ctx);
    std::fprintf(stderr, "%s: %s: %zu tokens (%zu used), %lld windows of %lld, scored rows [%lld, %lld), mode %s%s\n",
                 j.label.c_str(), po.file.c_str(), n_text, j.tokens.size(), static_cast<long long>(j.n_win),
                 static_cast<long long>(j.c.ctx), static_cast<long long>(j.c.first_row()),
                 static_cast<long long>(j.c.ctx - 1), eval::ppl_mode_name(mode),
                 mode == eval::PplMode::kThroughout
                     ? strprintf(" (chunk %lld%s)", static_cast<long long>(j.c.chunk),
                                 j.c.chunk > 1 ? ": APPROXIMATE, tokens of a chunk see each other uncompressed" : ": exact")
                           .c_str()
                     : "");
    // eval ppl's config parts (not --max-tokens: more tokens extend a run), the press added per cell.
    j.cells = grid;
    set_cell_calibrations(&j.cells, *j.model);
    eval::set_ppl_sweep_configs(&j.cells, run_identity(o.common, *j.model), po.file, j.c);
    for (const auto& c : j.cells) {
      configs.insert(c.config);
      n_win_of[c.config] = j.n_win;
      cell_pos[c.config] = cell_pos.size();
    }
    jobs.push_back(std::move(j));
  }

  const std::string results_path = (fs::path(o.out_dir) / "results.jsonl").string();
  eval::PplSweepResultsFile results(results_path, configs);
  int64_t pending = 0;
  for (const Job& j : jobs) pending += eval::sweep_ppl_pending(j.tokens, j.cells, results, j.c);
  print_results_status(results_path, "(cell, window) rows", pending, results.rows().size(), results.n_other_config());

  // The rows this command's summaries cover: its cells on its windows (a longer earlier run's
  // windows beyond --max-tokens stay in the file, out of the summary).
  auto summarize = [&]() {
    std::vector<eval::PplSweepRow> rows;
    for (const auto& r : results.rows())
      if (r.w.index < n_win_of.at(r.config)) rows.push_back(r);
    // grid order (models as given, presses as given, ratios ascending), windows ascending
    std::sort(rows.begin(), rows.end(), [&](const eval::PplSweepRow& a, const eval::PplSweepRow& b) {
      return std::make_tuple(cell_pos.at(a.config), a.w.index) < std::make_tuple(cell_pos.at(b.config), b.w.index);
    });
    const std::string title =
        strprintf("Perplexity sweep: %s, ctx %lld, scored from row %lld, mode %s", fs::path(po.file).filename().c_str(),
                  static_cast<long long>(po.ctx), static_cast<long long>(jobs.front().c.first_row()),
                  eval::ppl_mode_name(mode)) +
        (mode == eval::PplMode::kThroughout ? strprintf(" (chunk %lld)", static_cast<long long>(po.chunk)) : "");
    return eval::write_sweep_ppl_summaries(o.out_dir, rows, title);
  };

  run_then_summarize(
      o, "sweep ppl", "win", "(cell, window) rows", pending,
      [&](ProgressBar& bar, int64_t& done) {
        for (const Job& j : jobs) {
          eval::PplSweepRunOptions ro;
          ro.model = j.label;
          ro.ppl = j.c;
          ro.on_row = [&](const eval::PplSweepRow& r) {
            ++done;
            bar.update(done, strprintf("%s %s@%g win %lld", r.model.c_str(), r.press.c_str(), r.ratio,
                                       static_cast<long long>(r.w.index)));
          };
          eval::sweep_ppl(*j.session, j.tokens, j.cells, results, ro);
        }
      },
      summarize);
}

// kvtrim eval sweep summary: the summaries of a results file as it stands (every row, whatever
// its config), e.g. after the summary maths changed; the title is kept from the summary.md
// there unless --title gives one.
void run_sweep_summary(const std::string& out_dir, const std::string& title_arg) {
  const std::string path = (fs::path(out_dir) / "results.jsonl").string();
  KVTRIM_CHECK(fs::is_regular_file(path), "eval sweep summary: no results file '%s'", path.c_str());
  std::string title = title_arg;
  if (title.empty()) {
    std::ifstream md((fs::path(out_dir) / "summary.md").string());
    std::string first;
    if (md && std::getline(md, first) && first.rfind("# ", 0) == 0) title = first.substr(2);
  }
  if (title.empty()) title = "Sweep: " + fs::path(out_dir).filename().string();
  // ppl rows carry a window; ruler / mc rows a bench and a group
  std::string bench;
  {
    std::ifstream f(path);
    std::string line;
    while (bench.empty() && std::getline(f, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        const nlohmann::json j = nlohmann::json::parse(line);
        bench = j.contains("window") ? "ppl" : j.value("bench", std::string("?"));
      } catch (const nlohmann::json::exception& e) {
        throw Error(strprintf("%s: the first row is not JSON (%s)", path.c_str(), e.what()));
      }
    }
  }
  KVTRIM_CHECK(!bench.empty(), "eval sweep summary: '%s' holds no rows", path.c_str());
  // A cell must come from one config: a directory holding two runs of the same grid (another
  // KV type, ctx-len, format ...) would average them into one row.
  auto one_config = [&](const auto& rows) {
    std::map<std::tuple<std::string, std::string, double>, std::string> seen;
    for (const auto& r : rows) {
      auto [it, fresh] = seen.emplace(std::make_tuple(r.model, r.press, r.ratio), r.config);
      KVTRIM_CHECK(fresh || it->second == r.config,
                   "eval sweep summary: '%s' holds %s at ratio %g from two configs (%s, %s): rows of different runs; "
                   "rewrite the summaries with the sweep's own command and --summary-only",
                   path.c_str(), r.press.c_str(), r.ratio, it->second.c_str(), r.config.c_str());
    }
  };
  std::string md;
  if (bench == "ppl") {
    eval::PplSweepResultsFile results(path, {}, true);
    one_config(results.rows());
    md = eval::write_sweep_ppl_summaries(out_dir, results.rows(), title);
  } else {
    eval::SweepResultsFile results(path, {}, true);
    one_config(results.rows());
    md = eval::write_sweep_summaries(out_dir, results.rows(), title, score_label(bench));
  }
  std::fprintf(stderr, "wrote %s/{summary.md, summary.csv, curves.csv, plot.svg}\n", out_dir.c_str());
  std::fputs(md.c_str(), stdout);
}

// Adds `eval sweep <bench>`'s options: the common ones with -m repeatable, the grid, and the
// benchmark's own (shared with `eval <bench>`).
CLI::App* add_sweep_command(CLI::App* sw, const std::string& bench, const std::shared_ptr<EvalSweepOptions>& o,
                            const std::string& help) {
  CLI::App* c = sw->add_subcommand(bench, help);
  add_common_options(c, o->common);
  c->remove_option(c->get_option("--model"));
  c->add_option("-m,--model", o->models,
                "model(s): installed name (smollm2, qwen2.5-coder-1.5b, gemma3-270m) or a .gguf path; repeat for "
                "several (default smollm2)");
  c->add_option("--presses", o->presses,
                "press entries, comma-separated (repeatable); each gets ratio set per cell, e.g. "
                "snapkv,streamingllm or snapkv:window=16,tova (`kvtrim presses` lists them)")
      ->required();
  c->add_option("--ratios", o->ratios, "compression ratios in (0, 1), comma-separated; 0 (uncompressed) is always run")
      ->capture_default_str();
  c->add_option("--out-dir", o->out_dir, "directory for results.jsonl (appended per row; rerun to resume), summary.md, "
                                         "summary.csv, curves.csv and plot.svg")
      ->required();
  c->add_flag("--summary-only", o->summary_only, "run nothing: rewrite the summaries from results.jsonl");
  return c;
}

}  // namespace kvtrim::cli::evalcmd
