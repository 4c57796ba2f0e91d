// Running evaluation samples through a Session with kvpress's protocol:
//  1. the context alone is prefilled (BOS first when the model adds one);
//  2. `after_context` runs once: the place where a press compresses the cache. It sees
//     the context only, never the question (query-agnostic compression; with the loss
//     estimate on, the sample's first question is observed for the estimate alone: the
//     press's plan does not read it). With query_aware, the context is prefilled again for
//     every question and the hook also gets the question's tokens (kvpress's query-aware
//     mode; no cache reuse then);
//  3. for each question: the question + answer prefix are prefilled at positions continuing
//     the context (after compression too: n_past() is the uncompressed length), then greedy
//     decoding up to the question's max_new_tokens (stopping at end-of-generation);
//  4. between questions the cache is truncated back to the context length, so several
//     questions on one context reuse one (compressed) cache.
// Prompt format: "base" puts the question right after the context and the answer prefix
// right after the question (RULER's base-model template); "chat" wraps context + question in
// one user turn of the model's chat template and puts the answer prefix at the start of the
// assistant turn (kvpress's pipeline). "auto" = chat when the GGUF has a chat template.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "eval/results_file.h"
#include "eval/sample.h"

namespace kvtrim {
class Model;
class Session;
}  // namespace kvtrim

namespace kvtrim::eval {

enum class PromptFormat { kBase, kChat };
const char* prompt_format_name(PromptFormat f);
// "auto" | "chat" | "base"; throws Error otherwise (and for "chat" without a template).
PromptFormat resolve_prompt_format(const std::string& spec, const Model& model);

// Turns context / question text into the tokens the session sees.
class PromptBuilder {
 public:
  PromptBuilder(const Model& model, PromptFormat format);
  PromptFormat format() const { return format_; }
  std::vector<int32_t> context_tokens(const std::string& context) const;
  std::vector<int32_t> question_tokens(const std::string& question, const std::string& answer_prefix) const;
  // Token count with the same tokenisation (the generator's TokenCounter).
  int64_t count(const std::string& text, bool is_context) const;

 private:
  const Model& model_;
  PromptFormat format_;
  std::string chat_pre_, chat_post_;  // template text before the context / after the question
};

// One scored question.
struct QuestionResult {
  std::string task;
  int64_t index = 0;  // sample index within the task
  int q = 0;          // question index within the sample
  std::string sample_hash;
  Metric metric = Metric::kAll;
  double score = 0;  // 0-100
  std::string output;
  std::vector<std::string> answers;
  int64_t n_context = 0, n_question = 0, n_generated = 0;  // tokens
  size_t kv_bytes = 0;        // cache().bytes().total() after the context (and its compression)
  size_t kv_bytes_dense = 0;  // the uncompressed f16 size of the same positions
  int64_t kv_bases = -1;      // of kv_bytes: bases, rotations, dictionaries (-1: a row written before)
  double context_prefill_s = 0, decode_tps = 0;
  std::string stop;
  // The context's compression's loss estimate (src/engine/press_loss.h: the attention output
  // error of the question's queries or the window's, the evicted attention mass); -1: none (no
  // press, not measured, or a row written before the estimate existed).
  double press_loss = -1, press_evicted_mass = -1;
  // The queries it was measured on: "question" (with query_aware this question, else the
  // sample's first: the compression is shared) | "window" | "" (none, or a row written before).
  std::string press_loss_queries;
  std::string id() const { return task + "/" + std::to_string(index); }
};

struct RunnerOptions {
  // Runs after the context prefill, before any question (compress here). `question`: with
  // query_aware the question the press sees; otherwise, when the session's press_loss is on,
  // the sample's first question, for the loss estimate only (the hook must not let a press score
  // with it: ContextCompressOptions::press_sees_question = false); else nullptr. Empty = no
  // compression.
  std::function<void(Session&, const std::vector<int32_t>* question)> after_context;
  bool query_aware = false;
  // Replaces "reset, then prefill the context tokens" (a sweep restores a saved prefill of
  // the same tokens instead: src/eval/sweep.h). Empty = prefill.
  std::function<void(Session&, const std::vector<int32_t>& context)> prefill_context;
};

// Runs every question of `sample` not in `skip` (question indices). The session is reset first.
std::vector<QuestionResult> run_sample(Session& s, const PromptBuilder& pb, const EvalSample& sample,
                                       const RunnerOptions& opt, const std::set<int>& skip = {});

// One scored question as JSON (every field of QuestionResult plus "id"; no "config"): the line
// of a results file, also the per-question fields of a sweep row.
nlohmann::json question_result_json(const QuestionResult& r);

// The results file of `kvtrim eval ruler / gsm8k` (results_file.h): one QuestionResult a line,
// keyed by (sample id, question), with the sample's content hash; one config per file.
class QuestionResultsFile : public ResultsFile<QuestionResult, std::pair<std::string, int>> {
 public:
  QuestionResultsFile(std::string path, std::string config_hash);
  // True if question q of the sample is already in the file for this config. Throws Error if
  // it is there with a different sample hash (the samples changed under the same config).
  bool done(const EvalSample& s, int q) const;
};

// Runs every question of `samples` not already in `results` (nullptr: run all), appending
// each result to `results` as it finishes. `rows` receives this run's view: the earlier rows
// of these samples, then the new ones. on_result(r, done, pending) after each question.
struct RunStats {
  int64_t run = 0, reused = 0;
};
RunStats run_samples(Session& s, const PromptBuilder& pb, const std::vector<EvalSample>& samples,
                     QuestionResultsFile* results, const RunnerOptions& opt, std::vector<QuestionResult>* rows,
                     const std::function<void(const QuestionResult&, int64_t, int64_t)>& on_result = {});
// Questions of `samples` not yet in `results`.
int64_t count_pending(const std::vector<EvalSample>& samples, const QuestionResultsFile* results);

// Hash (hex) of the parts that identify a configuration.
std::string config_hash(const std::vector<std::string>& parts);

// Markdown table: one row per task (in `task_order`, then any others), with n, mean score,
// mean context tokens, mean KV bytes, mean decode tokens/s; then the average over tasks.
std::string summary_table(const std::vector<QuestionResult>& rows, const std::vector<std::string>& task_order);
// Mean over tasks of the per-task mean score (RULER's average).
double average_over_tasks(const std::vector<QuestionResult>& rows);

}  // namespace kvtrim::eval
