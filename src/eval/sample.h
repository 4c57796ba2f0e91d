// One evaluation sample: a context and the questions asked about it (kvpress protocol: the
// context is prefilled, and compressed, once; each question follows it in turn).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvtrim::eval {

// string_match_all: the fraction of the references found in the output (niah, vt, cwe, fwe);
// string_match_part: 1 if any reference is found (qa). Both case-insensitive, 0-100.
// number_match: the output's final answer (the number after "####", else its last number) equals
// the reference number (GSM8K; src/eval/gsm8k.h), 0 or 100.
enum class Metric { kAll, kPart, kNumber };
const char* metric_name(Metric m);   // "string_match_all", "string_match_part", "number_match"
const char* metric_short(Metric m);  // "all", "part", "number" (the JSONL files' spelling)
// Either spelling; false for anything else.
bool parse_metric(const std::string& s, Metric* m);

struct EvalQuestion {
  std::string question;       // follows the context (positions continue its length)
  std::string answer_prefix;  // appended after the question (and after the chat template's
                              // assistant header in chat mode); generation continues it
  std::vector<std::string> answers;  // references
  int max_new_tokens = 128;
  std::vector<std::string> stop;  // generation also stops when the output ends with one of these
};

struct EvalSample {
  std::string task;   // "niah_single_1", ...
  int64_t index = 0;  // sample number within the task
  std::string context;
  std::vector<EvalQuestion> questions;
  Metric metric = Metric::kAll;
  std::vector<double> depths;  // needle / gold-document depths in percent (generated tasks)
  std::string id() const { return task + "/" + std::to_string(index); }
  // Hash of everything the model sees and is scored against (hex), stored with each result
  // so that a resumed run can tell a changed sample from a finished one.
  std::string content_hash() const;
};

// The metric of a task name: qa* -> part, everything else -> all.
Metric metric_for_task(const std::string& task);

}  // namespace kvtrim::eval
