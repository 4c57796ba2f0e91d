// RULER's scorers (RULER scripts/eval/synthetic/constants.py; kvpress
// benchmarks/ruler/calculate_metrics.py), case-insensitive substring matches, 0-100:
//   string_match_all(pred, refs)  = 100 * (#refs contained in pred) / #refs
//   string_match_part(pred, refs) = 100 * max over refs of [ref contained in pred]
// and GSM8K's number_match (src/eval/gsm8k.h).
// The prediction is post-processed first as RULER does: control characters become '\n' and
// surrounding whitespace is stripped.
#pragma once
#include <string>
#include <vector>

#include "eval/sample.h"

namespace kvtrim::eval {

std::string postprocess_prediction(const std::string& pred);
double string_match_all(const std::string& pred, const std::vector<std::string>& refs);
double string_match_part(const std::string& pred, const std::vector<std::string>& refs);
double score(Metric m, const std::string& pred, const std::vector<std::string>& refs);

}  // namespace kvtrim::eval
