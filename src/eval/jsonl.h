// Evaluation samples as JSONL, one question per line, in the field layout of kvpress's
// published RULER data:
//   {"task": "niah_single_1", "context": "...", "question": "...", "answer_prefix": "...",
//    "answers": ["..."], "max_new_tokens": 128}
// answer_prefix may be absent (""), answers may be one string; "metric" ("all" / "part" /
// "number") overrides the task's default (qa* -> part); "stop" (optional): strings that end the
// generation (GSM8K's "Question:"). Consecutive lines with the same task and
// context form one sample with several questions (one prefill, one cache).
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "eval/sample.h"

namespace kvtrim::eval {

// Throws Error "<path>:<line>: <problem>" for a malformed line; blank lines are skipped.
std::vector<EvalSample> load_samples_jsonl(const std::string& path);

// The complete lines of a results JSONL being resumed ("" if the file does not exist). A last
// line without '\n' is a torn write from an interrupted run: it is cut off the file (and a
// warning names `what` runs again); *torn (may be nullptr) tells whether that happened.
std::string read_results_for_resume(const std::string& path, const char* what, bool* torn = nullptr);
// The rows of a results JSONL being resumed (read_results_for_resume, then line by line): a
// blank line is skipped; a line whose "config" is not `mine` is counted in *n_other; every
// other line goes to on_row. A line that is not JSON, or whose fields on_row cannot read
// (json::exception), is an Error "<path>:<line>: not a <kind> (<why>); use another <out_flag>
// or fix the file". One reader for every results file (ruler, mc, ppl, the sweeps).
void read_results_rows(const std::string& path, const char* what, const char* kind,
                       const char* out_flag, const std::function<bool(const std::string&)>& mine,
                       const std::function<void(const nlohmann::json&)>& on_row, int64_t* n_other,
                       bool* torn = nullptr);
std::vector<EvalSample> parse_samples_jsonl(const std::string& text, const std::string& source);
// Calls fn(object, "<source>:<line>") for every non-blank line of a JSONL text, in order; a line
// that is not a JSON object is an Error "<source>:<line>: not valid JSON (...)" / "expected a
// JSON object". The data readers' shared loop (samples, GSM8K).
void for_each_json_object_line(const std::string& text, const std::string& source,
                               const std::function<void(const nlohmann::json&, const std::string&)>& fn);
// Writes samples in the same format (to reproduce a generated set elsewhere).
void write_samples_jsonl(const std::string& path, const std::vector<EvalSample>& samples);

}  // namespace kvtrim::eval
