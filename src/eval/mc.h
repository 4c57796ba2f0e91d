// Multiple choice by log-likelihood (HellaSwag, PIQA, MMLU) with the context compressed
// (DESIGN.md §5, docs/eval.md "mc"). Prompts follow EleutherAI's lm-evaluation-harness:
//  - hellaswag: context = preprocess(context line), choices = " " + preprocess(ending);
//  - piqa:      context = "Question: <goal>\nAnswer:", choices = " " + sol;
//  - mmlu:      "The following are multiple choice questions (with answers) about <subject>.\n\n"
//               + k dev shots "<q>\nA. ..\nB. ..\nC. ..\nD. ..\nAnswer: <X>\n\n" + the test
//               question ending in "Answer:", choices " A" / " B" / " C" / " D".
// Protocol per item: prefill the context alone (BOS first when the model adds one), compress
// it once (the press never sees the choices), then for each choice truncate back to the
// context and score the choice's tokens with eval_all at positions continuing the context.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "eval/results_file.h"

namespace kvtrim {
class Model;
class Session;
}  // namespace kvtrim

namespace kvtrim::eval {

struct McItem {
  int64_t index = 0;            // position in the data set (0-based)
  std::string context;          // the shared prompt
  std::vector<std::string> choices;  // continuations, with their leading space
  int gold = 0;
  std::string hash() const;     // of context, choices and gold
};

// ---- readers (throw Error "<file>:<line>: <problem>" for malformed input) ----

// lm-eval's hellaswag preprocess: strip, " [title]" -> ". ", drop "[...]", "  " -> " ".
std::string hellaswag_preprocess(const std::string& text);
// The 6-lines-per-item text format: context, gold index (0-3), 4 endings.
std::vector<McItem> parse_hellaswag(const std::string& text, const std::string& source);
// Reads a .bz2 (libbz2) or a plain text file.
std::vector<McItem> load_hellaswag(const std::string& path);
// Decompresses a whole .bz2 file; throws Error naming the file if it is not valid bzip2.
std::string read_bz2_file(const std::string& path);

// valid.jsonl ({"goal", "sol1", "sol2"}) and valid-labels.lst (0/1, one per line).
std::vector<McItem> parse_piqa(const std::string& jsonl, const std::string& jsonl_source, const std::string& labels,
                               const std::string& labels_source);
std::vector<McItem> load_piqa(const std::string& dir);

// RFC 4180 CSV (quoted fields may hold commas, quotes "" and newlines). Each row carries the
// line its record starts on.
struct CsvRow {
  int64_t line = 0;
  std::vector<std::string> fields;
};
std::vector<CsvRow> parse_csv(const std::string& text, const std::string& source);
// One MMLU subject: rows question, A, B, C, D, answer (A-D).
struct MmluQuestion {
  std::string question;
  std::string options[4];
  int answer = 0;
};
std::vector<MmluQuestion> parse_mmlu_csv(const std::string& text, const std::string& source);
// "high_school_biology" -> the item prompt with `shots` dev examples (the first ones).
std::string mmlu_prompt(const std::string& subject, const std::vector<MmluQuestion>& dev, int shots,
                        const MmluQuestion& q);
// Every subject of <dir>/test (sorted by name) with `shots` examples from <dir>/dev, in round
// robin over the subjects (each subject's first question, then each one's second, ...), so the
// first N items sample every subject evenly; subjects[i] names item i's subject.
std::vector<McItem> load_mmlu(const std::string& dir, int shots, std::vector<std::string>* subjects = nullptr);

// ---- scoring ----

struct McResult {
  std::string bench;
  int64_t index = 0;
  std::string item_hash;
  int gold = 0;
  std::vector<double> loglik;        // per choice, natural log
  std::vector<int64_t> n_tokens;     // per choice
  std::vector<int64_t> n_bytes;      // per choice: UTF-8 bytes without the leading space (acc_norm)
  int pred = 0, pred_norm = 0;       // argmax loglik, argmax loglik / bytes (first wins ties)
  int64_t n_context = 0;
  size_t kv_bytes = 0, kv_bytes_dense = 0;  // after the context's compression
  // of kv_bytes: bases / rotations / dictionaries, fixed per press and calibration however long
  // the context (-1: a row written before this was recorded)
  int64_t kv_bases = -1;
  double seconds = 0;
  bool acc() const { return pred == gold; }
  bool acc_norm() const { return pred_norm == gold; }
};

// Tokens of one item: the context (BOS first when the model adds one) and each choice's
// continuation, split as lm-eval does (encode context+choice, the choice is what follows the
// context's tokens; separately encoded when the joint tokens do not start with them).
struct McTokens {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> choices;
};
McTokens tokenize_item(const Model& model, const McItem& item);

// The protocol above. after_context (may be empty) runs once after the context's prefill:
// where the press compresses.
McResult score_item(Session& s, const McTokens& toks, const McItem& item, const std::string& bench,
                    const std::function<void(Session&)>& after_context);
// Sum of log p(tokens[i] | tokens[<i]) for i >= from, by one full prefill from an empty cache
// (no truncation, no compression): the reference the cache path must match.
double loglik_full(Session& s, const std::vector<int32_t>& tokens, size_t from);

// ---- results ----

// The results file of `kvtrim eval mc` (results_file.h): one McResult a line, keyed by
// (bench, item index), with the item's hash; one config per file.
class McResultsFile : public ResultsFile<McResult, std::pair<std::string, int64_t>> {
 public:
  McResultsFile(std::string path, std::string config_hash);
  // Throws Error if the item is there with a different hash (the data changed).
  bool done(const std::string& bench, const McItem& item) const;
};

struct McSummary {
  int64_t n = 0;
  double acc = 0, acc_norm = 0;  // fractions
  double kv_ratio = 0;           // mean kv_bytes / kv_bytes_dense
  // mean (kv_bytes - kv_bases) / kv_bytes_dense over the rows that recorded kv_bases (-1: none
  // did), and how many did: the per-token cost once shared matrices are set apart
  double kv_ratio_wo_bases = -1;
  int64_t n_with_bases = 0;
};
McSummary summarize(const std::vector<McResult>& rows);
// "| bench | n | acc | acc_norm | KV / f16 | KV / f16 w/o bases |" with the standard metric in
// bold (the last column "—" unless every row recorded its bases).
std::string mc_summary_table(const std::string& bench, const std::vector<McResult>& rows);

}  // namespace kvtrim::eval
