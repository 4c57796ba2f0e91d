#include "eval/mc.h"
#include "eval/jsonl.h"

#include <bzlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/strings.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/perplexity.h"
#include "engine/session.h"
#include "eval/rng.h"
#include "eval/text.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace kvtrim::eval {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    out.push_back(std::move(l));
  }
  return out;
}

// " " + s (spelled out: GCC 12's -Wrestrict misfires on operator+ with a literal here).
std::string with_space(const std::string& s) {
  std::string r;
  r.reserve(s.size() + 1);
  r.push_back(' ');
  r.append(s);
  return r;
}

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r") == std::string::npos; }

}  // namespace

std::string McItem::hash() const {
  uint64_t h = fnv1a64(context);
  for (const auto& c : choices) {
    h = fnv1a64("\x1f", h);
    h = fnv1a64(c, h);
  }
  h = fnv1a64("\x1e", h);
  h = fnv1a64(std::to_string(gold), h);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// ---------------------------------------------------------------- HellaSwag

std::string hellaswag_preprocess(const std::string& text) {
  std::string t = trim_space(text);
  // " [title]" -> ". "
  for (size_t p; (p = t.find(" [title]")) != std::string::npos;) t.replace(p, 8, ". ");
  // re.sub("\\[.*?\\]", "", t)
  std::string u;
  u.reserve(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '[') {
      const size_t e = t.find(']', i + 1);
      if (e != std::string::npos) {
        i = e;
        continue;
      }
    }
    u.push_back(t[i]);
  }
  // .replace("  ", " ") (one pass, as Python does)
  std::string v;
  v.reserve(u.size());
  for (size_t i = 0; i < u.size(); ++i) {
    v.push_back(u[i]);
    if (u[i] == ' ' && i + 1 < u.size() && u[i + 1] == ' ') ++i;
  }
  return v;
}

std::vector<McItem> parse_hellaswag(const std::string& text, const std::string& source) {
  std::vector<std::string> lines = split_lines(text);
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  KVTRIM_CHECK(!lines.empty(), "%s: no HellaSwag items", source.c_str());
  if (lines.size() % 6 != 0) {
    fail("%s:%zu: the file ends inside an item (%zu lines, not a multiple of 6: context, gold index, 4 endings)",
         source.c_str(), lines.size(), lines.size());
  }
  std::vector<McItem> out;
  for (size_t i = 0; i < lines.size(); i += 6) {
    McItem it;
    it.index = static_cast<int64_t>(i / 6);
    KVTRIM_CHECK(!blank(lines[i]), "%s:%zu: empty context line (item %zu)", source.c_str(), i + 1, i / 6);
    it.context = hellaswag_preprocess(lines[i]);
    const std::string g = trim_space(lines[i + 1]);
    if (g.size() != 1 || g[0] < '0' || g[0] > '3') {
      fail("%s:%zu: expected the gold index 0-3, got '%.40s' (6 lines per item: context, gold, 4 endings)",
           source.c_str(), i + 2, lines[i + 1].c_str());
    }
    it.gold = g[0] - '0';
    for (size_t k = 0; k < 4; ++k) {
      KVTRIM_CHECK(!blank(lines[i + 2 + k]), "%s:%zu: empty ending %zu of item %zu", source.c_str(), i + 3 + k, k,
                   i / 6);
      it.choices.push_back(with_space(hellaswag_preprocess(lines[i + 2 + k])));
    }
    out.push_back(std::move(it));
  }
  return out;
}

std::string read_bz2_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  KVTRIM_CHECK(f != nullptr, "cannot read '%s'", path.c_str());
  int bzerr = BZ_OK;
  BZFILE* bz = BZ2_bzReadOpen(&bzerr, f, 0, 0, nullptr, 0);
  if (bzerr != BZ_OK) {
    std::fclose(f);
    fail("%s: cannot open as bzip2 (libbz2 error %d)", path.c_str(), bzerr);
  }
  std::string out;
  char buf[1 << 16];
  while (bzerr == BZ_OK) {
    const int n = BZ2_bzRead(&bzerr, bz, buf, sizeof buf);
    if (bzerr == BZ_OK || bzerr == BZ_STREAM_END) out.append(buf, static_cast<size_t>(n));
  }
  const int err = bzerr;
  BZ2_bzReadClose(&bzerr, bz);
  std::fclose(f);
  KVTRIM_CHECK(err == BZ_STREAM_END, "%s: not a valid bzip2 file (libbz2 error %d after %zu bytes)", path.c_str(), err,
               out.size());
  return out;
}

std::vector<McItem> load_hellaswag(const std::string& path) {
  const bool bz = path.size() > 4 && path.compare(path.size() - 4, 4, ".bz2") == 0;
  return parse_hellaswag(bz ? read_bz2_file(path) : read_text_file(path, "HellaSwag file"), path);
}

// ---------------------------------------------------------------- PIQA

std::vector<McItem> parse_piqa(const std::string& jsonl, const std::string& jsonl_source, const std::string& labels,
                               const std::string& labels_source) {
  const std::vector<std::string> jl = split_lines(jsonl), ll = split_lines(labels);
  std::vector<McItem> out;
  size_t li = 0;  // next label line
  for (size_t i = 0; i < jl.size(); ++i) {
    if (blank(jl[i])) continue;
    const std::string where = jsonl_source + ":" + std::to_string(i + 1);
    json j;
    try {
      j = json::parse(jl[i]);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past double
      fail("%s: not valid JSON (%s)", where.c_str(), e.what());
    }
    if (!j.is_object()) fail("%s: expected a JSON object", where.c_str());
    std::string f[3];
    const char* names[3] = {"goal", "sol1", "sol2"};
    for (int k = 0; k < 3; ++k) {
      auto it = j.find(names[k]);
      if (it == j.end() || !it->is_string()) fail("%s: missing string field '%s'", where.c_str(), names[k]);
      f[k] = it->get<std::string>();
    }
    while (li < ll.size() && blank(ll[li])) ++li;
    if (li >= ll.size()) {
      fail("%s: has more items than labels in %s (%zu labels)", where.c_str(), labels_source.c_str(), li);
    }
    const std::string lab = trim_space(ll[li]);
    if (lab != "0" && lab != "1") fail("%s:%zu: expected a label 0 or 1, got '%.40s'", labels_source.c_str(), li + 1, lab.c_str());
    ++li;
    McItem it;
    it.index = static_cast<int64_t>(out.size());
    it.context = "Question: " + f[0] + "\nAnswer:";
    it.choices = {with_space(f[1]), with_space(f[2])};
    it.gold = lab[0] - '0';
    out.push_back(std::move(it));
  }
  while (li < ll.size() && blank(ll[li])) ++li;
  KVTRIM_CHECK(li == ll.size(), "%s:%zu: more labels than items in %s (%zu)", labels_source.c_str(), li + 1,
               jsonl_source.c_str(), out.size());
  KVTRIM_CHECK(!out.empty(), "%s: no PIQA items", jsonl_source.c_str());
  return out;
}

std::vector<McItem> load_piqa(const std::string& dir) {
  const std::string j = (fs::path(dir) / "valid.jsonl").string(), l = (fs::path(dir) / "valid-labels.lst").string();
  return parse_piqa(read_text_file(j, "PIQA file"), j, read_text_file(l, "PIQA labels file"), l);
}

// ---------------------------------------------------------------- MMLU

std::vector<CsvRow> parse_csv(const std::string& text, const std::string& source) {
  std::vector<CsvRow> rows;
  int64_t line = 1;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    CsvRow row;
    row.line = line;
    std::string field;
    bool end_row = false;
    while (!end_row) {
      field.clear();
      if (i < n && text[i] == '"') {
        const int64_t open_line = line;
        ++i;
        for (;;) {
          if (i >= n) fail("%s:%lld: unterminated quoted field", source.c_str(), static_cast<long long>(open_line));
          if (text[i] == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              field.push_back('"');
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (text[i] == '\n') ++line;
          field.push_back(text[i++]);
        }
        if (i < n && text[i] != ',' && text[i] != '\n' && text[i] != '\r') {
          fail("%s:%lld: unexpected character '%c' after a quoted field", source.c_str(), static_cast<long long>(line),
               text[i]);
        }
      } else {
        while (i < n && text[i] != ',' && text[i] != '\n') {
          if (text[i] != '\r') field.push_back(text[i]);
          ++i;
        }
      }
      if (i < n && text[i] == '\r') ++i;
      row.fields.push_back(field);
      if (i >= n) {
        end_row = true;
      } else if (text[i] == ',') {
        ++i;
      } else {  // '\n'
        ++i;
        ++line;
        end_row = true;
      }
    }
    if (row.fields.size() == 1 && blank(row.fields[0])) continue;  // blank line
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<MmluQuestion> parse_mmlu_csv(const std::string& text, const std::string& source) {
  std::vector<MmluQuestion> out;
  for (const CsvRow& r : parse_csv(text, source)) {
    if (r.fields.size() != 6) {
      fail("%s:%lld: expected 6 fields (question, A, B, C, D, answer), got %zu", source.c_str(),
           static_cast<long long>(r.line), r.fields.size());
    }
    MmluQuestion q;
    q.question = r.fields[0];
    for (int k = 0; k < 4; ++k) q.options[k] = r.fields[static_cast<size_t>(k) + 1];
    const std::string a = trim_space(r.fields[5]);
    if (a.size() != 1 || a[0] < 'A' || a[0] > 'D') {
      fail("%s:%lld: the answer must be A, B, C or D, got '%.40s'", source.c_str(), static_cast<long long>(r.line),
           r.fields[5].c_str());
    }
    q.answer = a[0] - 'A';
    out.push_back(std::move(q));
  }
  KVTRIM_CHECK(!out.empty(), "%s: no MMLU questions", source.c_str());
  return out;
}

namespace {
std::string mmlu_block(const MmluQuestion& q) {
  std::string s = trim_space(q.question);
  for (int k = 0; k < 4; ++k) s += strprintf("\n%c. %s", 'A' + k, q.options[k].c_str());
  return s + "\nAnswer:";
}
}  // namespace

std::string mmlu_prompt(const std::string& subject, const std::vector<MmluQuestion>& dev, int shots,
                        const MmluQuestion& q) {
  std::string name = subject;
  std::replace(name.begin(), name.end(), '_', ' ');
  std::string s = "The following are multiple choice questions (with answers) about " + name + ".\n\n";
  KVTRIM_CHECK(shots >= 0 && static_cast<size_t>(shots) <= dev.size(), "--shots %d: the %s dev set has %zu questions",
               shots, subject.c_str(), dev.size());
  for (int i = 0; i < shots; ++i) {
    const MmluQuestion& d = dev[static_cast<size_t>(i)];
    s += mmlu_block(d) + " " + std::string(1, static_cast<char>('A' + d.answer)) + "\n\n";
  }
  return s + mmlu_block(q);
}

std::vector<McItem> load_mmlu(const std::string& dir, int shots, std::vector<std::string>* subjects) {
  const fs::path test_dir = fs::path(dir) / "test", dev_dir = fs::path(dir) / "dev";
  KVTRIM_CHECK(fs::is_directory(test_dir), "no MMLU test directory '%s'", test_dir.string().c_str());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(test_dir)) {
    const std::string f = e.path().filename().string();
    const std::string suf = "_test.csv";
    if (f.size() > suf.size() && f.compare(f.size() - suf.size(), suf.size(), suf) == 0)
      names.push_back(f.substr(0, f.size() - suf.size()));
  }
  std::sort(names.begin(), names.end());
  KVTRIM_CHECK(!names.empty(), "no <subject>_test.csv files in '%s'", test_dir.string().c_str());
  // per subject (sorted by name), its items in file order
  std::vector<std::vector<McItem>> per(names.size());
  size_t total = 0;
  for (size_t si = 0; si < names.size(); ++si) {
    const std::string& sub = names[si];
    std::vector<MmluQuestion> dev;
    if (shots > 0) {
      const std::string dp = (dev_dir / (sub + "_dev.csv")).string();
      dev = parse_mmlu_csv(read_text_file(dp, "MMLU dev file"), dp);
    }
    const std::string tp = (test_dir / (sub + "_test.csv")).string();
    for (const auto& q : parse_mmlu_csv(read_text_file(tp, "MMLU test file"), tp)) {
      McItem it;
      it.context = mmlu_prompt(sub, dev, shots, q);
      it.choices = {" A", " B", " C", " D"};
      it.gold = q.answer;
      per[si].push_back(std::move(it));
    }
    total += per[si].size();
  }
  // round robin over the subjects (question r of every subject that has one, then r + 1), so
  // that the first N items (--limit) cover the subjects evenly instead of the first one or two
  std::vector<McItem> out;
  out.reserve(total);
  for (size_t r = 0; out.size() < total; ++r)
    for (size_t si = 0; si < names.size(); ++si) {
      if (r >= per[si].size()) continue;
      McItem it = std::move(per[si][r]);
      it.index = static_cast<int64_t>(out.size());
      out.push_back(std::move(it));
      if (subjects) subjects->push_back(names[si]);
    }
  return out;
}

// ---------------------------------------------------------------- scoring

McTokens tokenize_item(const Model& model, const McItem& item) {
  const Tokenizer& tok = model.tokenizer();
  McTokens t;
  // lm-eval moves trailing spaces of the context onto the continuation.
  std::string ctx = item.context;
  std::string moved;
  while (!ctx.empty() && ctx.back() == ' ') {
    ctx.pop_back();
    moved += ' ';
  }
  t.context = tok.encode(ctx, tok.add_bos(), false);
  KVTRIM_CHECK(!t.context.empty(), "item %lld has an empty context", static_cast<long long>(item.index));
  for (const auto& c : item.choices) {
    const std::vector<int32_t> whole = tok.encode(ctx + moved + c, tok.add_bos(), false);
    std::vector<int32_t> cont;
    if (whole.size() > t.context.size() && std::equal(t.context.begin(), t.context.end(), whole.begin())) {
      cont.assign(whole.begin() + static_cast<std::ptrdiff_t>(t.context.size()), whole.end());
    } else {
      cont = tok.encode(moved + c, false, false);
    }
    KVTRIM_CHECK(!cont.empty(), "item %lld has an empty choice", static_cast<long long>(item.index));
    t.choices.push_back(std::move(cont));
  }
  return t;
}

namespace {
double logprob(const float* logits, size_t n_vocab, int32_t target) {
  NllAccumulator acc;
  acc.add(logits, n_vocab, target);
  PplResult r;
  acc.finish(&r);
  return -r.mean_nll;
}

int argmax(const std::vector<double>& v) {
  int best = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] > v[static_cast<size_t>(best)]) best = static_cast<int>(i);
  }
  return best;
}
}  // namespace

McResult score_item(Session& s, const McTokens& toks, const McItem& item, const std::string& bench,
                    const std::function<void(Session&)>& after_context) {
  const double t0 = now_seconds();
  const size_t n_vocab = static_cast<size_t>(s.model().hparams().n_vocab);
  McResult r;
  r.bench = bench;
  r.index = item.index;
  r.item_hash = item.hash();
  r.gold = item.gold;
  s.reset();
  const std::vector<float> last = s.prefill(toks.context);  // predicts each choice's first token
  if (after_context) after_context(s);
  const int32_t n_ctx = s.n_past();
  r.n_context = n_ctx;
  const KvBytes held = s.cache().bytes();
  r.kv_bytes = held.total();
  r.kv_bases = static_cast<int64_t>(held.bases);
  r.kv_bytes_dense = s.cache().dense_bytes_f16();
  std::vector<float> logits;
  for (size_t c = 0; c < toks.choices.size(); ++c) {
    const std::vector<int32_t>& ct = toks.choices[c];
    s.truncate(n_ctx);
    double ll = logprob(last.data(), n_vocab, ct[0]);
    if (ct.size() > 1) {
      const int64_t n = static_cast<int64_t>(ct.size()) - 1;  // the last token predicts nothing we score
      logits.resize(static_cast<size_t>(n) * n_vocab);
      s.eval_all(ct.data(), n, logits.data());
      for (int64_t i = 0; i < n; ++i) ll += logprob(logits.data() + static_cast<size_t>(i) * n_vocab, n_vocab, ct[static_cast<size_t>(i) + 1]);
    }
    r.loglik.push_back(ll);
    r.n_tokens.push_back(static_cast<int64_t>(ct.size()));
    const std::string& text = item.choices[c];
    r.n_bytes.push_back(static_cast<int64_t>(text.size()) - (!text.empty() && text[0] == ' ' ? 1 : 0));
  }
  s.truncate(n_ctx);
  r.pred = argmax(r.loglik);
  std::vector<double> norm;
  for (size_t c = 0; c < r.loglik.size(); ++c) norm.push_back(r.loglik[c] / static_cast<double>(std::max<int64_t>(1, r.n_bytes[c])));
  r.pred_norm = argmax(norm);
  r.seconds = now_seconds() - t0;
  return r;
}

double loglik_full(Session& s, const std::vector<int32_t>& tokens, size_t from) {
  KVTRIM_CHECK(from >= 1 && from < tokens.size(), "loglik_full: nothing to score");
  const size_t n_vocab = static_cast<size_t>(s.model().hparams().n_vocab);
  s.reset();
  std::vector<float> logits(tokens.size() * n_vocab);
  s.eval_all(tokens.data(), static_cast<int64_t>(tokens.size()), logits.data());
  double ll = 0;
  for (size_t i = from; i < tokens.size(); ++i) ll += logprob(logits.data() + (i - 1) * n_vocab, n_vocab, tokens[i]);
  return ll;
}

// ---------------------------------------------------------------- results

namespace {
json to_json(const McResult& r, const std::string& config) {
  return json{{"config", config},     {"bench", r.bench},       {"index", r.index},
              {"item_hash", r.item_hash}, {"gold", r.gold},      {"pred", r.pred},
              {"pred_norm", r.pred_norm}, {"acc", r.acc() ? 1 : 0}, {"acc_norm", r.acc_norm() ? 1 : 0},
              {"loglik", r.loglik},   {"n_tokens", r.n_tokens}, {"n_bytes", r.n_bytes},
              {"n_context", r.n_context}, {"kv_bytes", r.kv_bytes}, {"kv_bytes_dense", r.kv_bytes_dense},
              {"kv_bases", r.kv_bases},   {"seconds", r.seconds}};
}

McResult from_json(const json& j) {
  McResult r;
  r.bench = j.at("bench").get<std::string>();
  r.index = j.at("index").get<int64_t>();
  r.item_hash = j.at("item_hash").get<std::string>();
  r.gold = j.at("gold").get<int>();
  r.pred = j.at("pred").get<int>();
  r.pred_norm = j.at("pred_norm").get<int>();
  r.loglik = j.at("loglik").get<std::vector<double>>();
  r.n_tokens = j.at("n_tokens").get<std::vector<int64_t>>();
  r.n_bytes = j.at("n_bytes").get<std::vector<int64_t>>();
  r.n_context = j.at("n_context").get<int64_t>();
  r.kv_bytes = j.at("kv_bytes").get<size_t>();
  r.kv_bytes_dense = j.at("kv_bytes_dense").get<size_t>();
  r.kv_bases = j.value("kv_bases", int64_t{-1});
  r.seconds = j.at("seconds").get<double>();
  return r;
}
}  // namespace

namespace {
const ResultsFormat<McResult, std::pair<std::string, int64_t>> kMcFormat = {
    "item", "results line", "--out", from_json,
    [](const McResult& r, const std::string& config) {
      return to_json(r, config).dump(-1, ' ', false, json::error_handler_t::replace);
    },
    [](const McResult& r) { return std::make_pair(r.bench, r.index); },
    [](const McResult& r) -> const std::string& { return r.item_hash; }};
}  // namespace

McResultsFile::McResultsFile(std::string path, std::string config_hash)
    : ResultsFile(std::move(path), kMcFormat, {std::move(config_hash)}) {}

bool McResultsFile::done(const std::string& bench, const McItem& item) const {
  return ResultsFile::done({bench, item.index}, item.hash(),
                           strprintf("%s item %lld", bench.c_str(), static_cast<long long>(item.index)),
                           "was scored on different data");
}

McSummary summarize(const std::vector<McResult>& rows) {
  McSummary s;
  double wo_bases = 0;
  for (const auto& r : rows) {
    ++s.n;
    s.acc += r.acc();
    s.acc_norm += r.acc_norm();
    s.kv_ratio += r.kv_bytes_dense ? static_cast<double>(r.kv_bytes) / static_cast<double>(r.kv_bytes_dense) : 0.0;
    if (r.kv_bases >= 0 && r.kv_bytes_dense) {
      wo_bases += static_cast<double>(r.kv_bytes - static_cast<size_t>(r.kv_bases)) /
                  static_cast<double>(r.kv_bytes_dense);
      ++s.n_with_bases;
    }
  }
  if (s.n) {
    const double n = static_cast<double>(s.n);
    s.acc /= n;
    s.acc_norm /= n;
    s.kv_ratio /= n;
  }
  if (s.n_with_bases) s.kv_ratio_wo_bases = wo_bases / static_cast<double>(s.n_with_bases);
  return s;
}

std::string mc_summary_table(const std::string& bench, const std::vector<McResult>& rows) {
  const McSummary s = summarize(rows);
  const bool norm_std = bench != "mmlu";  // lm-eval's headline metric
  const double se_a = s.n > 1 ? std::sqrt(s.acc * (1 - s.acc) / static_cast<double>(s.n - 1)) : 0.0;
  const double se_n = s.n > 1 ? std::sqrt(s.acc_norm * (1 - s.acc_norm) / static_cast<double>(s.n - 1)) : 0.0;
  const std::string wo = s.n_with_bases == s.n && s.n > 0 ? strprintf("%.3f", s.kv_ratio_wo_bases) : "—";
  std::string out = "| bench | n | acc | acc_norm | KV / f16 | KV / f16 w/o bases |\n|---|---:|---:|---:|---:|---:|\n";
  out += strprintf("| %s | %lld | %s%.4f ± %.4f%s | %s%.4f ± %.4f%s | %.3f | %s |\n", bench.c_str(),
                   static_cast<long long>(s.n), norm_std ? "" : "**", s.acc, se_a, norm_std ? "" : "**",
                   norm_std ? "**" : "", s.acc_norm, se_n, norm_std ? "**" : "", s.kv_ratio, wo.c_str());
  return out;
}

}  // namespace kvtrim::eval
