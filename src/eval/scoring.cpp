#include "eval/scoring.h"

#include <algorithm>
#include <cstdio>

#include "eval/gsm8k.h"
#include "eval/rng.h"
#include "eval/text.h"

namespace kvtrim::eval {

namespace {
struct MetricNames {
  Metric m;
  const char* name;   // the scorer's name
  const char* brief;  // the JSONL files' spelling
};
constexpr MetricNames kMetricNames[] = {{Metric::kAll, "string_match_all", "all"},
                                        {Metric::kPart, "string_match_part", "part"},
                                        {Metric::kNumber, "number_match", "number"}};
const MetricNames& names_of(Metric m) {
  for (const MetricNames& n : kMetricNames)
    if (n.m == m) return n;
  return kMetricNames[0];
}
}  // namespace

const char* metric_name(Metric m) { return names_of(m).name; }
const char* metric_short(Metric m) { return names_of(m).brief; }

bool parse_metric(const std::string& s, Metric* m) {
  for (const MetricNames& n : kMetricNames) {
    if (s == n.name || s == n.brief) {
      *m = n.m;
      return true;
    }
  }
  return false;
}

Metric metric_for_task(const std::string& task) {
  return task.rfind("qa", 0) == 0 ? Metric::kPart : Metric::kAll;
}

std::string EvalSample::content_hash() const {
  uint64_t h = fnv1a64(task);
  h = fnv1a64("\x1f" + context, h);
  for (const auto& q : questions) {
    h = fnv1a64("\x1e" + q.question + "\x1f" + q.answer_prefix + "\x1f" + std::to_string(q.max_new_tokens), h);
    for (const auto& st : q.stop) h = fnv1a64("\x1c" + st, h);  // (no stop strings: the hash of before)
    for (const auto& a : q.answers) h = fnv1a64("\x1d" + a, h);
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string postprocess_prediction(const std::string& pred) {
  std::string s = pred;
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  }
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  size_t b = 0, e = s.size();
  while (b < e && ws(s[b])) ++b;
  while (e > b && ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

double string_match_all(const std::string& pred, const std::vector<std::string>& refs) {
  if (refs.empty()) return 0;
  const std::string p = to_lower(postprocess_prediction(pred));
  size_t found = 0;
  for (const auto& r : refs) found += p.find(to_lower(r)) != std::string::npos;
  return 100.0 * static_cast<double>(found) / static_cast<double>(refs.size());
}

double string_match_part(const std::string& pred, const std::vector<std::string>& refs) {
  const std::string p = to_lower(postprocess_prediction(pred));
  for (const auto& r : refs) {
    if (p.find(to_lower(r)) != std::string::npos) return 100.0;
  }
  return 0.0;
}

double score(Metric m, const std::string& pred, const std::vector<std::string>& refs) {
  switch (m) {
    case Metric::kPart:
      return string_match_part(pred, refs);
    case Metric::kNumber:
      return number_match(pred, refs);
    case Metric::kAll:
      break;
  }
  return string_match_all(pred, refs);
}

}  // namespace kvtrim::eval
