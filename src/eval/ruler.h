// RULER-style synthetic long-context tasks (Hsieh et al. 2024, "RULER: What's the Real
// Context Size of Your Long-Context Language Models?"), generated deterministically from a
// seed, a haystack corpus and word lists, and fitted to a token budget with the model's
// tokenizer. Templates, needle formats and task parameters follow NVIDIA's RULER
// (scripts/data/synthetic/{constants.py,niah.py,variable_tracking.py,
// common_words_extraction.py,freq_words_extraction.py}, scripts/synthetic.yaml); the split
// into context / question / answer prefix follows kvpress's RULER dataset. qa_1 / qa_2 are
// built from synthetic fact documents among essay documents (no SQuAD / HotpotQA here): see
// docs/eval.md.
//
// Budget: tokens(context) + tokens(question + answer_prefix) + reserve_tokens +
// max_new_tokens <= ctx_len (RULER's max_seq_length includes the generated tokens). Each task
// has one size parameter (haystack words, noise lines, list words, filler sentences); the
// largest value that fits is found by exponential + binary search, re-generating the sample
// from its seed for every probe.
//
// Determinism: sample i of task t is generated from seed_of(seed, t, i) alone, so it does not
// depend on --samples, on which other tasks run, or on the order they run in.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "eval/sample.h"
#include "eval/words.h"

namespace kvtrim::eval {

// Number of tokens of a text as the model will see it (the runner's tokenisation: BOS
// included for the context when the model adds one).
using TokenCounter = std::function<int64_t(const std::string& text, bool is_context)>;

struct RulerTaskInfo {
  const char* name;
  const char* description;  // one line
  Metric metric;
  int max_new_tokens;
};
// The 13 tasks, in RULER's order.
const std::vector<RulerTaskInfo>& ruler_tasks();
const RulerTaskInfo& ruler_task(const std::string& name);  // throws Error listing the names
// "all" or a comma-separated list -> task names (validated, in the given order).
std::vector<std::string> parse_task_list(const std::string& spec);

struct RulerConfig {
  int64_t ctx_len = 4096;  // token budget of one sample, generation included
  uint64_t seed = 42;
  int64_t reserve_tokens = 0;  // tokens the prompt format adds (chat template); kept free
  // Depths in percent (0 = start, 100 = end) for needles and gold documents, used in turn;
  // empty = RULER's choice: distinct depths drawn from 40 evenly spaced ones in [0, 100].
  std::vector<double> depths;
  std::string haystack_dir;  // *.txt files (the Paul Graham essays by default)
  std::string wordnet_dir = kDefaultWordnetDir;
  std::string scowl_dir = kDefaultScowlDir;
};

// Derived per-sample seed.
uint64_t sample_seed(uint64_t seed, const std::string& task, int64_t index);

class RulerGenerator {
 public:
  // Loads the haystack and the word lists; throws Error naming whatever is missing.
  RulerGenerator(RulerConfig cfg, TokenCounter count);
  ~RulerGenerator();
  // Sample `index` of `task` (one question). Throws Error if the budget cannot hold even the
  // smallest instance of the task.
  EvalSample generate(const std::string& task, int64_t index) const;
  // Hash of the generator's version and inputs (corpus, word lists, config): part of the
  // results' config hash.
  std::string fingerprint() const;
  const RulerConfig& config() const { return cfg_; }

  struct Impl;

 private:
  RulerConfig cfg_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtrim::eval
