// GSM8K-style grade-school maths with a compressed cache (issue 11: SWAN vs Lexico on
// GSM8K-style answers; docs/eval.md "gsm8k"). The data: GSM8K's test.jsonl, one object per line
// {"question": ..., "answer": "<worked solution>\n#### <number>"} (../shared/data/gsm8k).
//
// Protocol (lm-evaluation-harness's `gsm8k` task, few-shot, greedy, with two differences said
// here and in the docs):
//  - the context is `shots` worked examples, "Question: <q>\nAnswer: <solution>\n\n" each; the
//    question that follows it is "Question: <q>\nAnswer:"; the model writes its own worked
//    solution, stopping at "Question:" (the next example it would invent), at end-of-generation
//    or after max_new_tokens;
//  - the shots are the first `shots` items of the file and the evaluated items are the next
//    `samples` (lm-eval draws its shots from the train split, which ../shared/data does not
//    have); the shots' calculator annotations "<<3*4=12>>" are removed;
//  - scoring (number_match): the prediction is the number after the first "####" of the output
//    (lm-eval's strict match), else the last number in it (its flexible extract), read after
//    removing "," and "$"; it matches when it equals the reference number (numerically: "18.00"
//    matches "18", where lm-eval's string compare would not). 0 or 100 per item.
// Each test item is one EvalSample (task "gsm8k", one question), run by eval::run_sample: the
// press compresses the shots once, before the question (query-agnostic); the question and the
// answer being written go through the cache as any decode does (SWAN / Lexico code them as they
// leave the dense buffer).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "eval/sample.h"

namespace kvtrim::eval {

struct Gsm8kItem {
  int64_t index = 0;     // line order among the items (0-based)
  std::string question;  // as given
  std::string solution;  // the worked solution without calculator annotations, ending "#### <n>"
  std::string answer;    // the reference number as written after "####" ("18", "1,000" -> "1000")
};

// One item per non-blank line. Throws Error "<source>:<line>: <problem>" for a line that is not
// a JSON object with string fields question and answer, or whose answer has no "#### <number>".
std::vector<Gsm8kItem> parse_gsm8k(const std::string& text, const std::string& source);
std::vector<Gsm8kItem> load_gsm8k(const std::string& path);

// "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs" -> "Janet sells 16 - 3 - 4 = 9 duck eggs".
std::string strip_calculator_annotations(const std::string& s);

// The prediction's answer per the rules above, normalised ("," and "$" removed, a trailing "."
// dropped); nullopt when the output holds no number.
std::optional<std::string> gsm8k_extract_answer(const std::string& output);
// 100 when the extracted answer equals one of refs numerically, else 0.
double number_match(const std::string& pred, const std::vector<std::string>& refs);
// Whether two outputs give the same final answer (numerically, as number_match compares; two
// outputs without a number count as the same): the sweeps' "same as none" for gsm8k.
bool same_final_answer(const std::string& out_a, const std::string& out_b);

struct Gsm8kConfig {
  int shots = 5;             // worked examples in the context (the first items of the file; >= 1)
  int samples = 50;          // evaluated items: the `samples` after the shots
  int max_new_tokens = 256;  // per answer
};
// The evaluation samples (task "gsm8k", index = the item's index in the file). Throws Error when
// the file has fewer than shots + 1 items.
std::vector<EvalSample> gsm8k_samples(const std::vector<Gsm8kItem>& items, const Gsm8kConfig& c);

}  // namespace kvtrim::eval
