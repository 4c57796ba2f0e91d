#include "eval/gsm8k.h"

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/jsonl.h"
#include "eval/text.h"

namespace kvtrim::eval {

using json = nlohmann::json;

namespace {

bool is_num_char(char c) { return (c >= '0' && c <= '9') || c == '.' || c == ',' || c == '$'; }
bool has_digit(const std::string& s) {
  for (char c : s)
    if (c >= '0' && c <= '9') return true;
  return false;
}

// "," and "$" removed, trailing "." dropped.
std::string normalize_number(std::string s) {
  std::string out;
  for (char c : s)
    if (c != ',' && c != '$') out += c;
  while (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

// The whole of s as a number.
bool to_number(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*v);
}

// Two normalised answers as the same number (relative 1e-9); as strings when either is not one.
bool same_number(const std::string& a, const std::string& b) {
  double x = 0, y = 0;
  if (!to_number(a, &x) || !to_number(b, &y)) return a == b;
  return std::fabs(x - y) <= 1e-9 * std::max(1.0, std::fabs(y));
}

// The run of number characters starting at i (with a leading '-' if there is one).
std::string number_at(const std::string& s, size_t i) {
  size_t e = i;
  if (e < s.size() && s[e] == '-') ++e;
  while (e < s.size() && is_num_char(s[e])) ++e;
  return s.substr(i, e - i);
}

}  // namespace

std::string strip_calculator_annotations(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t b = s.find("<<", i);
    if (b == std::string::npos) break;
    const size_t e = s.find(">>", b + 2);
    if (e == std::string::npos) break;  // an unclosed "<<" stays as written
    out.append(s, i, b - i);
    i = e + 2;
  }
  out.append(s, i, std::string::npos);
  return out;
}

std::vector<Gsm8kItem> parse_gsm8k(const std::string& text, const std::string& source) {
  std::vector<Gsm8kItem> out;
  for_each_json_object_line(text, source, [&](const json& j, const std::string& where) {
    for (const char* f : {"question", "answer"}) {
      if (!j.contains(f)) fail("%s: missing field '%s'", where.c_str(), f);
      if (!j.at(f).is_string()) fail("%s: field '%s' must be a string", where.c_str(), f);
    }
    Gsm8kItem it;
    it.index = static_cast<int64_t>(out.size());
    it.question = j.at("question").get<std::string>();
    const std::string answer = j.at("answer").get<std::string>();
    if (it.question.empty()) fail("%s: field 'question' is empty", where.c_str());
    const size_t h = answer.rfind("####");
    if (h == std::string::npos) fail("%s: the answer has no final '#### <number>'", where.c_str());
    size_t p = h + 4;
    while (p < answer.size() && answer[p] == ' ') ++p;
    std::string tail = answer.substr(p);
    while (!tail.empty() && (tail.back() == ' ' || tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
    double v = 0;
    it.answer = normalize_number(tail);
    if (!to_number(it.answer, &v))
      fail("%s: the answer's final '#### %s' is not a number", where.c_str(), tail.c_str());
    it.solution = strip_calculator_annotations(answer);
    out.push_back(std::move(it));
  });
  return out;
}

std::vector<Gsm8kItem> load_gsm8k(const std::string& path) {
  auto items = parse_gsm8k(read_text_file(path, "GSM8K file"), path);
  KVTRIM_CHECK(!items.empty(), "GSM8K file '%s' has no items", path.c_str());
  return items;
}

std::optional<std::string> gsm8k_extract_answer(const std::string& output) {
  std::string s = output;
  const size_t q = s.find("Question:");
  if (q != std::string::npos) s.resize(q);  // the start of an invented next example
  // strict: the number after the first "####"
  const size_t h = s.find("####");
  if (h != std::string::npos) {
    size_t p = h + 4;
    while (p < s.size() && (s[p] == ' ' || s[p] == '\t')) ++p;
    const std::string n = number_at(s, p);
    if (has_digit(n)) return normalize_number(n);
  }
  // flexible: the last number of the output
  std::optional<std::string> last;
  for (size_t i = 0; i < s.size();) {
    const bool starts = is_num_char(s[i]) || (s[i] == '-' && i + 1 < s.size() && is_num_char(s[i + 1]));
    if (!starts) {
      ++i;
      continue;
    }
    const std::string n = number_at(s, i);
    if (has_digit(n)) last = normalize_number(n);
    i += n.size();
  }
  return last;
}

double number_match(const std::string& pred, const std::vector<std::string>& refs) {
  const std::optional<std::string> a = gsm8k_extract_answer(pred);
  double v = 0;
  if (!a || !to_number(*a, &v)) return 0;
  for (const std::string& r : refs)
    if (same_number(*a, normalize_number(r))) return 100;
  return 0;
}

bool same_final_answer(const std::string& out_a, const std::string& out_b) {
  const std::optional<std::string> a = gsm8k_extract_answer(out_a), b = gsm8k_extract_answer(out_b);
  if (!a || !b) return !a && !b;
  return same_number(*a, *b);
}

std::vector<EvalSample> gsm8k_samples(const std::vector<Gsm8kItem>& items, const Gsm8kConfig& c) {
  KVTRIM_CHECK(c.shots >= 1 && c.samples > 0 && c.max_new_tokens > 0,
               "GSM8K: shots, samples and max_new_tokens must be positive (the shots are the context)");
  KVTRIM_CHECK(static_cast<int64_t>(items.size()) > c.shots,
               "GSM8K: %zu items cannot give %d shots and at least one question", items.size(), c.shots);
  std::string context;
  for (int i = 0; i < c.shots; ++i)
    context += "Question: " + items[i].question + "\nAnswer: " + items[i].solution + "\n\n";
  std::vector<EvalSample> out;
  for (size_t i = static_cast<size_t>(c.shots); i < items.size() && out.size() < static_cast<size_t>(c.samples); ++i) {
    EvalSample s;
    s.task = "gsm8k";
    s.index = items[i].index;
    s.context = context;
    s.metric = Metric::kNumber;
    EvalQuestion q;
    q.question = "Question: " + items[i].question + "\nAnswer:";
    q.answers = {items[i].answer};
    q.max_new_tokens = c.max_new_tokens;
    q.stop = {"Question:"};
    s.questions.push_back(std::move(q));
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace kvtrim::eval
