// kvtrim eval: the options of each subcommand and the pieces the evaluation commands share
// (cmd_eval.cpp: ruler / mc / ppl and the command line; cmd_eval_sweep.cpp: the sweeps).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "eval/mc.h"
#include "eval/recipe.h"
#include "eval/ruler.h"
#include "eval/runner.h"

namespace kvtrim::cli::evalcmd {

struct EvalRulerOptions {
  CommonOptions common;
  int64_t ctx_len = 4096;
  int samples = 5;
  std::string tasks = "all";
  uint64_t seed = 42;
  std::string out;
  std::string data;
  std::string format = "auto";
  std::string haystack;
  std::string wordnet_dir = eval::kDefaultWordnetDir;
  std::string scowl_dir = eval::kDefaultScowlDir;
  std::vector<double> depths;
  std::string dump_samples;
  PressOptions press;
  bool query_aware = false;
  bool dry_run = false;
};

// kvtrim eval gsm8k (src/eval/gsm8k.h); the rest of its options are EvalRulerOptions' (format,
// press, out, query-aware, dump-samples, dry-run).
struct EvalGsm8kOptions {
  std::string data;  // default: shared/data/gsm8k/test.jsonl
  int shots = 5;
  int samples = 50;
  int max_new_tokens = 256;
};

struct EvalMcOptions {
  CommonOptions common;
  std::string bench;
  int64_t limit = 0;
  int shots = 0;
  std::string data;
  std::string out;
  PressOptions press;
};

struct EvalPplOptions {
  CommonOptions common;
  std::string file;
  int64_t ctx = 512;
  int64_t max_tokens = 0;
  std::string press;
  std::string mode;
  int64_t prefix = 0;
  int64_t chunk = 1;
  std::string out;
};

struct EvalSweepOptions {
  CommonOptions common;  // its model is replaced by `models`
  std::vector<std::string> models;
  std::vector<std::string> presses;  // each a comma-separated list (repeatable)
  std::string ratios = "0.25,0.5,0.75,0.9";
  std::string out_dir;
  bool summary_only = false;
  EvalRulerOptions ruler;  // the benchmark's own options (their common / press / out unused)
  EvalGsm8kOptions gsm8k;  // gsm8k: with ruler.format / ruler.query_aware
  EvalMcOptions mc;
  EvalPplOptions ppl;
};
// The Paul Graham essays (the default haystack).
std::string default_haystack_dir();
// The model, cache storage and prefill chunk of a run (the start of every config recipe).
eval::RunIdentity run_identity(const CommonOptions& common, const Model& model);
// Each sweep cell's SweepCell::calib: the calibration its press reads with `model` (loading and
// checking each file once per press; an Error for a missing file or one made for another
// model, before any cell runs). Call before the set_*_sweep_configs.
void set_cell_calibrations(std::vector<eval::SweepCell>* cells, const Model& model);
// The samples of `eval ruler` (and `eval sweep ruler`): generated with the model's token
// counts, or loaded from --data and filtered by --tasks / --samples. *source: what identifies
// them in a config hash.
std::vector<eval::EvalSample> ruler_samples(const EvalRulerOptions& o, const eval::PromptBuilder& pb, int64_t n_ctx,
                                            std::vector<std::string>* task_order_out, std::string* source_out);
// The samples of `eval gsm8k` (and `eval sweep gsm8k`); *task_order_out = {"gsm8k"}.
std::vector<eval::EvalSample> gsm8k_samples(const EvalGsm8kOptions& o, std::vector<std::string>* task_order_out,
                                            std::string* source_out);
// The items of `eval mc` (and `eval sweep mc`): --bench from --data, the first --limit.
std::vector<eval::McItem> mc_items(const EvalMcOptions& o, std::string* source_out);

// cmd_eval_sweep.cpp
void run_sweep(const EvalSweepOptions& o, const std::string& bench);
void run_sweep_ppl(const EvalSweepOptions& o);
void run_sweep_summary(const std::string& out_dir, const std::string& title);
CLI::App* add_sweep_command(CLI::App* sw, const std::string& bench, const std::shared_ptr<EvalSweepOptions>& o,
                            const std::string& help);

}  // namespace kvtrim::cli::evalcmd
