#include "eval/sweep.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/strings.h"
#include "core/timer.h"
#include "engine/context_question.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "eval/jsonl.h"
#include "model/model.h"
#include "press/press.h"
#include "press/press_spec.h"

namespace kvtrim::eval {

using nlohmann::json;

// ---------------------------------------------------------------------------------------
// The grid

namespace {

// Splits at `sep` outside parentheses.
std::vector<std::string> split_top(const std::string& s, char sep) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')') --depth;
    if (s[i] == sep && depth == 0) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

// "name=value" (an option continuing the previous entry), as opposed to a press entry.
bool is_option_piece(const std::string& piece) {
  const size_t eq = piece.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  for (size_t i = 0; i < eq; ++i) {
    const char c = piece[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> split_press_list(const std::string& list) {
  std::vector<std::string> out;
  for (const std::string& raw : split_top(list, ',')) {
    const std::string piece = trim_space(raw);
    KVTRIM_CHECK(!piece.empty(), "--presses '%s': empty entry (a stray ','?)", list.c_str());
    if (is_option_piece(piece)) {
      KVTRIM_CHECK(!out.empty(), "--presses '%s': option '%s' before any press", list.c_str(),
                   piece.c_str());
      out.back().append(out.back().find(':') == std::string::npos ? ":" : ",").append(piece);
    } else {
      out.push_back(piece);
    }
  }
  return out;
}

std::vector<double> parse_ratio_list(const std::string& list) {
  std::vector<double> out;
  for (const std::string& raw : split_top(list, ',')) {
    const std::string item = trim_space(raw);
    char* end = nullptr;
    errno = 0;
    const double r = item.empty() ? NAN : std::strtod(item.c_str(), &end);
    KVTRIM_CHECK(
        !item.empty() && end && *end == '\0' && errno == 0 && std::isfinite(r) && r >= 0 && r < 1,
        "--ratios '%s': '%s' is not a compression ratio in [0, 1) (the fraction of KV removed)",
        list.c_str(), item.c_str());
    if (r > 0) out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  KVTRIM_CHECK(!out.empty(),
               "--ratios '%s': no ratio above 0 (0, the uncompressed baseline, is always run)",
               list.c_str());
  return out;
}

std::string press_label(const std::string& entry) {
  PressSpec spec = parse_press_spec(entry);
  ratio_target(spec).erase("ratio");
  // The presses before the last in canonical form, the last as written (its options in the
  // order given): "snapkv:0.5+spark:0.3,recovery=zero" -> "snapkv:ratio=0.5+spark:recovery=zero".
  PressSpec last;
  last.items.push_back(std::move(spec.items.back()));
  spec.items.pop_back();
  const std::string head = spec.items.empty() ? "" : canonical_press_spec(spec) + "+";
  return head + written_press_spec(last);
}

std::string spec_with_ratio(const std::string& entry, double ratio) {
  PressSpec spec = parse_press_spec(entry);
  ratio_target(spec).set("ratio", strprintf("%g", ratio));
  return make_press(spec)->spec();
}

std::vector<SweepCell> sweep_cells(const std::vector<std::string>& entries,
                                   const std::vector<double>& ratios) {
  KVTRIM_CHECK(!entries.empty(), "a sweep needs at least one press");
  std::vector<SweepCell> cells(1);  // the baseline
  std::set<std::string> seen;
  for (const std::string& e : entries) {
    const std::string label = press_label(e);
    KVTRIM_CHECK(seen.insert(label).second, "--presses: '%s' is given twice", label.c_str());
    for (double r : ratios) {
      SweepCell c;
      c.press = label;
      c.ratio = r;
      c.spec = spec_with_ratio(e, r);
      cells.push_back(std::move(c));
    }
  }
  return cells;
}

void append_press_parts(std::vector<std::string>* parts, const std::string& press, const std::string& calib) {
  parts->push_back("press=" + press);
  if (!calib.empty()) parts->push_back("calib=" + calib);
}

void set_cell_configs(std::vector<SweepCell>* cells, const std::vector<std::string>& base_parts,
                      const std::string& protocol) {
  for (SweepCell& c : *cells) {
    std::vector<std::string> parts = base_parts;
    append_press_parts(&parts, c.spec, c.calib);
    parts.push_back("protocol=" + protocol);
    c.config = config_hash(parts);
  }
}


// ---------------------------------------------------------------------------------------
// Rows and the results file

namespace {

json row_to_json(const SweepRow& r) {
  json j = {{"config", r.config},
            {"model", r.model},
            {"bench", r.bench},
            {"press", r.press},
            {"ratio", r.ratio},
            {"spec", r.spec},
            {"group", r.group},
            {"id", r.id},
            {"q", r.q},
            {"unit_hash", r.unit_hash},
            {"score", r.score},
            {"kv_bytes", r.kv_bytes},
            {"kv_bytes_dense", r.kv_bytes_dense},
            {"kv_bases", r.kv_bases},
            {"decode_tps", r.decode_tps},
            {"prefill", r.shared_prefill ? "shared" : "fresh"}};
  if (!r.extra.empty()) {
    const json e = json::parse(r.extra);
    for (auto it = e.begin(); it != e.end(); ++it)
      if (!j.contains(it.key())) j[it.key()] = it.value();
  }
  return j;
}

SweepRow sweep_row_from_json(const json& j) {
  SweepRow r;
  r.config = j.at("config").get<std::string>();
  r.model = j.at("model").get<std::string>();
  r.bench = j.at("bench").get<std::string>();
  r.press = j.at("press").get<std::string>();
  r.ratio = j.at("ratio").get<double>();
  r.spec = j.at("spec").get<std::string>();
  r.group = j.at("group").get<std::string>();
  r.id = j.at("id").get<std::string>();
  r.q = j.at("q").get<int>();
  r.unit_hash = j.at("unit_hash").get<std::string>();
  r.score = j.at("score").get<double>();
  r.kv_bytes = j.at("kv_bytes").get<size_t>();
  r.kv_bytes_dense = j.at("kv_bytes_dense").get<size_t>();
  r.kv_bases = j.contains("kv_bases") ? j.at("kv_bases").get<int64_t>() : -1;
  r.decode_tps = j.at("decode_tps").get<double>();
  r.shared_prefill = j.at("prefill").get<std::string>() == "shared";
  json e = json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    static const std::set<std::string> common = {
        "config", "model",     "bench", "press",    "ratio",          "spec",       "group",  "id",
        "q",      "unit_hash", "score", "kv_bytes", "kv_bytes_dense", "decode_tps", "prefill", "kv_bases"};
    if (!common.count(it.key())) e[it.key()] = it.value();
  }
  r.extra = e.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

}  // namespace

namespace {
const ResultsFormat<SweepRow, std::tuple<std::string, std::string, int>> kSweepFormat = {
    "row", "sweep results line", "--out-dir", sweep_row_from_json,
    [](const SweepRow& r, const std::string&) {  // the row carries its config
      return row_to_json(r).dump(-1, ' ', false, json::error_handler_t::replace);
    },
    [](const SweepRow& r) { return std::make_tuple(r.config, r.id, r.q); },
    [](const SweepRow& r) -> const std::string& { return r.unit_hash; }};
}  // namespace

SweepResultsFile::SweepResultsFile(std::string path, std::set<std::string> configs, bool every_config)
    : ResultsFile(std::move(path), kSweepFormat, std::move(configs), every_config) {}

bool SweepResultsFile::done(const std::string& config, const std::string& id, int q,
                            const std::string& unit_hash) const {
  return ResultsFile::done({config, id, q}, unit_hash, strprintf("%s question %d", id.c_str(), q),
                           "was run on a different sample; the generator or data changed");
}

// ---------------------------------------------------------------------------------------
// Running

namespace {

SweepRow base_row(const SweepCell& c, const SweepRunOptions& opt, const std::string& bench) {
  SweepRow r;
  r.config = c.config;
  r.model = opt.model;
  r.bench = bench;
  r.press = c.press;
  r.ratio = c.ratio;
  r.spec = c.spec;
  return r;
}

SweepRow ruler_row(const SweepCell& c, const SweepRunOptions& opt, const QuestionResult& q,
                   bool shared) {
  SweepRow r = base_row(c, opt, opt.bench.c_str());
  r.group = q.task;
  r.id = q.id();
  r.q = q.q;
  r.unit_hash = q.sample_hash;
  r.score = q.score;
  r.kv_bytes = q.kv_bytes;
  r.kv_bytes_dense = q.kv_bytes_dense;
  r.kv_bases = q.kv_bases;
  r.decode_tps = q.decode_tps;
  r.shared_prefill = shared;
  json e = question_result_json(q);  // the row's own fields above are not repeated in extra
  for (const char* k : {"id", "q", "sample_hash", "score", "kv_bytes", "kv_bytes_dense", "kv_bases", "decode_tps"})
    e.erase(k);
  r.extra = e.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}


// A press whose whole work is one plan() of the prefilled context can share the prefill; one
// that plans during the prefill (plans_after_append) or while decoding (decode_interval) runs
// inside the session's loop and needs to be installed on it before the prefill.
bool shares_prefill(const Press& p) { return !p.plans_after_append() && p.decode_interval() == 0; }

std::vector<std::unique_ptr<Press>> make_presses(const std::vector<SweepCell>& cells) {
  std::vector<std::unique_ptr<Press>> out;
  for (const SweepCell& c : cells) out.push_back(c.baseline() ? nullptr : make_press(c.spec));
  return out;
}

// What the shared observer captures: the union of the needs of the presses that share it.
PressNeeds shared_needs(const std::vector<std::unique_ptr<Press>>& presses) {
  PressNeeds n;
  for (const auto& p : presses)
    if (p && shares_prefill(*p)) n.merge(p->needs());
  return n;
}

void check_cells(const std::vector<SweepCell>& cells) {
  KVTRIM_CHECK(!cells.empty() && cells.front().baseline(),
               "sweep: the cells must start with the baseline");
  for (const SweepCell& c : cells)
    KVTRIM_CHECK(!c.config.empty(), "sweep: cell %s has no config (set_cell_configs)",
                 c.spec.c_str());
}

}  // namespace


int64_t sweep_ruler_pending(const std::vector<EvalSample>& samples,
                            const std::vector<SweepCell>& cells, const SweepResultsFile& results) {
  int64_t n = 0;
  for (const EvalSample& smp : samples) {
    const std::string h = smp.content_hash();
    for (const SweepCell& c : cells)
      for (int q = 0; q < static_cast<int>(smp.questions.size()); ++q)
        n += !results.done(c.config, smp.id(), q, h);
  }
  return n;
}

int64_t sweep_ruler(Session& s, const PromptBuilder& pb, const std::vector<EvalSample>& samples,
                    const std::vector<SweepCell>& cells, SweepResultsFile& results,
                    const SweepRunOptions& opt) {
  check_cells(cells);
  const std::vector<std::unique_ptr<Press>> presses = make_presses(cells);
  const PressNeeds needs = shared_needs(presses);
  int64_t n_run = 0;
  for (const EvalSample& smp : samples) {
    const std::string h = smp.content_hash();
    std::unique_ptr<Session::State> saved;  // the sample's prefill, made for its first shared cell
    bool observer_set = false;               // the session holds the union observer
    for (size_t ci = 0; ci < cells.size(); ++ci) {
      const SweepCell& c = cells[ci];
      std::set<int> skip;
      for (int q = 0; q < static_cast<int>(smp.questions.size()); ++q)
        if (results.done(c.config, smp.id(), q, h)) skip.insert(q);
      if (skip.size() == smp.questions.size()) continue;
      RunnerOptions ro;
      const Press* press = presses[ci].get();
      const bool shared = !opt.query_aware && (!press || shares_prefill(*press));
      if (shared) {
        if (!observer_set) {  // the state below is saved and restored under this observer
          s.set_observer(needs);
          observer_set = true;
        }
        ro.prefill_context = [&](Session& ss, const std::vector<int32_t>& ctx) {
          if (!saved) {
            ss.reset();  // an empty cache without bases, as a new session's
            ss.prefill(ctx);
            ss.prepare_compress();  // a re-feed pass (kvcompose, kvzip) once per sample, shared
            saved = std::make_unique<Session::State>(ss.save_state());
          } else {
            ss.restore_state(*saved);
          }
        };
        if (press)
          ro.after_context = [press](Session& ss, const std::vector<int32_t>* question) {
            // the sample's first question, for the loss estimate only (RunnerOptions): observed
            // after the shared state's restore, and never for a press that would score with it
            if (question && !press->needs().question) ss.observe_question(*question);
            ss.compress_with(*press);
          };
      } else {
        // eval ruler's own path, with the press installed on the session: query-aware (the
        // press sees each question first), or a press that works inside the session's
        // prefill / decode loop. A fresh prefill per cell (and per question if query-aware).
        observer_set = false;
        if (press) {
          PressSchedule sched;
          sched.after_prefill = false;
          s.set_press(make_press(c.spec), sched);
          ro.query_aware = opt.query_aware;
          ro.after_context = [qa = opt.query_aware](Session& ss, const std::vector<int32_t>* question) {
            // query-aware: the press sees the question first (the path run, chat and serve
            // share); else the first question is there for the loss estimate only
            ContextCompressOptions co;
            co.min_tokens = 0;
            co.press_sees_question = qa;
            compress_context(ss, question ? *question : std::vector<int32_t>{}, co);
          };
        } else {
          s.set_press(nullptr);
        }
        s.reset();
      }
      for (const QuestionResult& q : run_sample(s, pb, smp, ro, skip)) {
        const SweepRow r = ruler_row(c, opt, q, shared);
        results.append(r);
        ++n_run;
        if (opt.on_row) opt.on_row(r);
      }
    }
  }
  return n_run;
}

std::string mc_row_id(const std::string& bench, const McItem& item) {
  return bench + "/" + std::to_string(item.index);
}

int64_t sweep_mc_pending(const std::string& bench, const std::vector<McItem>& items,
                         const std::vector<SweepCell>& cells, const SweepResultsFile& results) {
  int64_t n = 0;
  for (const McItem& it : items) {
    const std::string id = mc_row_id(bench, it), h = it.hash();
    for (const SweepCell& c : cells) n += !results.done(c.config, id, 0, h);
  }
  return n;
}

int64_t sweep_mc(Session& s, const std::string& bench, const std::vector<McItem>& items,
                 const std::vector<SweepCell>& cells, SweepResultsFile& results,
                 const SweepRunOptions& opt) {
  check_cells(cells);
  KVTRIM_CHECK(!opt.query_aware,
               "eval sweep mc: --query-aware does not apply (the press never sees the choices)");
  const std::vector<std::unique_ptr<Press>> presses = make_presses(cells);
  const PressNeeds needs = shared_needs(presses);
  const bool use_norm =
      bench != "mmlu";  // lm-eval's headline: acc_norm for hellaswag / piqa, acc for mmlu
  int64_t n_run = 0;
  for (const McItem& it : items) {
    const std::string id = mc_row_id(bench, it), h = it.hash();
    std::unique_ptr<McTokens> toks;
    for (size_t ci = 0; ci < cells.size(); ++ci) {
      const SweepCell& c = cells[ci];
      if (results.done(c.config, id, 0, h)) continue;
      if (!toks) toks = std::make_unique<McTokens>(tokenize_item(s.model(), it));
      const Press* press = presses[ci].get();
      std::function<void(Session&)> after;
      if (!press || shares_prefill(*press)) {
        s.set_observer(needs);
        if (press) after = [press](Session& ss) { ss.compress_with(*press); };
      } else {  // a press working inside the prefill / decode loop: installed on the session
        PressSchedule sched;
        sched.after_prefill = false;
        s.set_press(make_press(c.spec), sched);
        after = [](Session& ss) { ss.compress(); };
      }
      s.reset();
      const McResult m = score_item(s, *toks, it, bench, after);
      SweepRow r = base_row(c, opt, bench);
      r.group = bench;
      r.id = id;
      r.q = 0;
      r.unit_hash = h;
      r.score = 100.0 * ((use_norm ? m.acc_norm() : m.acc()) ? 1 : 0);
      r.kv_bytes = m.kv_bytes;
      r.kv_bytes_dense = m.kv_bytes_dense;
      r.shared_prefill = false;
      const json e = {
          {"index", m.index},         {"gold", m.gold},         {"pred", m.pred},
          {"pred_norm", m.pred_norm}, {"acc", m.acc() ? 1 : 0}, {"acc_norm", m.acc_norm() ? 1 : 0},
          {"loglik", m.loglik},       {"n_tokens", m.n_tokens}, {"n_bytes", m.n_bytes},
          {"n_context", m.n_context}, {"seconds", m.seconds}};
      r.extra = e.dump(-1, ' ', false, json::error_handler_t::replace);
      results.append(r);
      ++n_run;
      if (opt.on_row) opt.on_row(r);
    }
  }
  return n_run;
}

}  // namespace kvtrim::eval
