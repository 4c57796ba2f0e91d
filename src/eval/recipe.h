// What identifies an evaluation's results (its config hash) and where its data lives by
// default: one recipe per benchmark, used by the single-press commands (eval ruler / gsm8k /
// mc / ppl) and by the sweeps, so a results file resumes only under the same recipe.
//
// A config hash covers everything that decides a result row and nothing that only extends a
// run (--samples, --limit, --max-tokens, --tasks: more of them add rows). The part lists and
// their order are part of the file format: committed results files resume only while a
// recipe's hash is unchanged (tests/eval/recipe_test.cpp pins them).
#pragma once
#include <string>
#include <vector>

#include "eval/ppl.h"
#include "eval/runner.h"
#include "eval/sweep.h"

namespace kvtrim::eval {

// A file in a config hash: its name and size ("smollm2.gguf:98362432"; 0 if unreadable).
std::string file_identity(const std::string& path);

// <rel> under shared/data: $KVTRIM_SHARED_DATA, then the parents of the working directory,
// then those of the executable's. Error naming `option` (how to give the path) if not found.
std::string shared_data_path(const std::string& rel, const char* option);

// What every recipe starts from: the model file, the cache's storage and the prefill chunk.
struct RunIdentity {
  std::string model_file;  // the GGUF's path (file_identity is taken of it)
  std::string kv;          // storage tag: "f16", "k=q8_0,v=f16+hadamard", ...
  int64_t batch = 0;       // prefill chunk (tokens)
  std::string prefill;     // prefill precision: "" = f32 (--f32-prefill; the CLI's default before 2026-11-27,
                           // so older hashes stay valid), "int8" (the CLI's default since)
  std::string calib;       // single-press commands: the press's calibration (Press::calibration_id; ""
                           // = it reads none, and the hash is what it was before calibrations were
                           // identified). The sweeps carry it per cell (SweepCell::calib).
};

// The identity of a sample set (`source` in the recipes below).
// RULER samples from a JSONL file: a hash of its text.
std::string ruler_data_source(const std::string& file_text);
// GSM8K questions: the file, the shots and the answer length.
std::string gsm8k_source(const std::string& data_file, int shots, int max_new_tokens);
// Multiple-choice items of `bench` (hellaswag: the file; piqa: the directory's two files;
// mmlu: the directory, the item count, the shots and the item order).
std::string mc_source(const std::string& bench, const std::string& data, size_t n_items, int shots);

// eval ruler / eval gsm8k: one press (described as printed, "none" without one).
std::string generation_config(const RunIdentity& id, PromptFormat format, const std::string& press_desc,
                              const std::string& source);
// eval mc.
std::string mc_config(const RunIdentity& id, const std::string& bench, const std::string& press_desc,
                      const std::string& source);
// eval ppl.
std::string ppl_config(const RunIdentity& id, const std::string& data_file, const PplConfig& c,
                       const std::string& press_desc);

// The sweeps: each cell's config (SweepCell::config) from its spec.
// bench: "ruler" or "gsm8k".
void set_generation_sweep_configs(std::vector<SweepCell>* cells, const RunIdentity& id, PromptFormat format,
                                  const std::string& source, const std::string& bench, bool query_aware);
void set_mc_sweep_configs(std::vector<SweepCell>* cells, const RunIdentity& id, const std::string& bench,
                          const std::string& source);
void set_ppl_sweep_configs(std::vector<SweepCell>* cells, const RunIdentity& id, const std::string& data_file,
                           const PplConfig& c);

}  // namespace kvtrim::eval
