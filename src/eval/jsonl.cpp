#include "eval/jsonl.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "eval/text.h"

namespace kvtrim::eval {

using nlohmann::json;

namespace {

const json& field(const json& j, const char* name, const std::string& where) {
  auto it = j.find(name);
  if (it == j.end()) fail("%s: missing field '%s'", where.c_str(), name);
  return *it;
}

std::string string_field(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  if (!v.is_string()) fail("%s: field '%s' must be a string", where.c_str(), name);
  return v.get<std::string>();
}

}  // namespace

void for_each_json_object_line(const std::string& text, const std::string& source,
                               const std::function<void(const json&, const std::string&)>& fn) {
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = source + ":" + std::to_string(line_no);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past double
      fail("%s: not valid JSON (%s)", where.c_str(), e.what());
    }
    if (!j.is_object()) fail("%s: expected a JSON object", where.c_str());
    fn(j, where);
  }
}

std::vector<EvalSample> parse_samples_jsonl(const std::string& text, const std::string& source) {
  std::vector<EvalSample> out;
  std::map<std::string, int64_t> next_index;
  for_each_json_object_line(text, source, [&](const json& j, const std::string& where) {
    EvalQuestion q;
    const std::string task = string_field(j, "task", where);
    const std::string context = string_field(j, "context", where);
    q.question = string_field(j, "question", where);
    if (j.contains("answer_prefix")) q.answer_prefix = string_field(j, "answer_prefix", where);
    const json& a = field(j, "answers", where);
    if (a.is_string()) {
      q.answers.push_back(a.get<std::string>());
    } else if (a.is_array()) {
      for (const json& x : a) {
        if (!x.is_string()) fail("%s: field 'answers' must hold strings", where.c_str());
        q.answers.push_back(x.get<std::string>());
      }
    } else {
      fail("%s: field 'answers' must be a string or an array of strings", where.c_str());
    }
    if (q.answers.empty()) fail("%s: field 'answers' is empty", where.c_str());
    const json& m = field(j, "max_new_tokens", where);
    if (!m.is_number_integer() || m.get<int64_t>() <= 0 || m.get<int64_t>() > 1 << 20)
      fail("%s: field 'max_new_tokens' must be a positive integer", where.c_str());
    q.max_new_tokens = m.get<int>();
    if (j.contains("stop")) {
      const json& st = j.at("stop");
      if (!st.is_array()) fail("%s: field 'stop' must be an array of strings", where.c_str());
      for (const json& x : st) {
        if (!x.is_string() || x.get<std::string>().empty())
          fail("%s: field 'stop' must hold non-empty strings", where.c_str());
        q.stop.push_back(x.get<std::string>());
      }
    }
    if (task.empty()) fail("%s: field 'task' is empty", where.c_str());
    Metric metric = metric_for_task(task);
    if (j.contains("metric")) {
      const std::string ms = string_field(j, "metric", where);
      if (!parse_metric(ms, &metric)) fail("%s: unknown metric '%s' (all, part or number)", where.c_str(), ms.c_str());
    }
    if (!out.empty() && out.back().task == task && out.back().context == context && out.back().metric == metric) {
      out.back().questions.push_back(std::move(q));
      return;
    }
    EvalSample s;
    s.task = task;
    s.index = next_index[task]++;
    s.context = context;
    s.metric = metric;
    s.questions.push_back(std::move(q));
    out.push_back(std::move(s));
  });
  return out;
}

std::vector<EvalSample> load_samples_jsonl(const std::string& path) {
  auto out = parse_samples_jsonl(read_text_file(path, "samples file"), path);
  KVTRIM_CHECK(!out.empty(), "samples file '%s' has no samples", path.c_str());
  return out;
}

void write_samples_jsonl(const std::string& path, const std::vector<EvalSample>& samples) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  KVTRIM_CHECK(f.good(), "cannot write '%s'", path.c_str());
  for (const EvalSample& s : samples) {
    for (const EvalQuestion& q : s.questions) {
      json j = {{"task", s.task},          {"context", s.context},       {"question", q.question},
                {"answer_prefix", q.answer_prefix}, {"answers", q.answers}, {"max_new_tokens", q.max_new_tokens},
                {"metric", metric_short(s.metric)}};
      if (!q.stop.empty()) j["stop"] = q.stop;
      f << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
  }
  KVTRIM_CHECK(f.good(), "error writing '%s'", path.c_str());
}

std::string read_results_for_resume(const std::string& path, const char* what, bool* torn) {
  if (torn) *torn = false;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  std::string text = read_text_file(path, "results file");
  if (!text.empty() && text.back() != '\n') {
    const size_t nl = text.rfind('\n');
    const size_t keep = nl == std::string::npos ? 0 : nl + 1;
    std::filesystem::resize_file(path, keep, ec);
    KVTRIM_CHECK(!ec, "cannot cut the torn last line of '%s': %s", path.c_str(), ec.message().c_str());
    KVTRIM_LOG_WARN("%s: dropped an incomplete last line (an interrupted run); that %s runs again", path.c_str(), what);
    text.resize(keep);
    if (torn) *torn = true;
  }
  return text;
}

void read_results_rows(const std::string& path, const char* what, const char* kind,
                       const char* out_flag, const std::function<bool(const std::string&)>& mine,
                       const std::function<void(const json&)>& on_row, int64_t* n_other,
                       bool* torn) {
  const std::string text = read_results_for_resume(path, what, torn);
  std::istringstream in(text);
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const json j = json::parse(line);
      if (!mine(j.value("config", std::string()))) {
        ++*n_other;
        continue;
      }
      on_row(j);
    } catch (const json::exception& e) {
      fail("%s:%lld: not a %s (%s); use another %s or fix the file", path.c_str(),
           static_cast<long long>(line_no), kind, e.what(), out_flag);
    }
  }
}

}  // namespace kvtrim::eval
