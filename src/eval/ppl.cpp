#include "eval/ppl.h"
#include "eval/jsonl.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/perplexity.h"
#include "engine/session.h"
#include "eval/rng.h"
#include "press/press.h"

namespace kvtrim::eval {

using nlohmann::json;
namespace fs = std::filesystem;

const char* ppl_mode_name(PplMode m) { return m == PplMode::kPcc ? "pcc" : "throughout"; }

PplMode parse_ppl_mode(const std::string& s) {
  if (s == "pcc") return PplMode::kPcc;
  if (s == "throughout") return PplMode::kThroughout;
  fail("unknown ppl mode '%s' (pcc or throughout)", s.c_str());
}

int64_t ppl_window_count(int64_t n_tokens, int64_t ctx) {
  KVTRIM_CHECK(ctx >= 16, "perplexity window must be at least 16 tokens (got %lld)", static_cast<long long>(ctx));
  KVTRIM_CHECK(n_tokens >= ctx, "the text has %lld tokens, fewer than one window of %lld",
               static_cast<long long>(n_tokens), static_cast<long long>(ctx));
  return n_tokens / ctx;
}

std::vector<int32_t> ppl_window_tokens(const std::vector<int32_t>& tokens, int64_t ctx, int64_t w, int32_t bos) {
  KVTRIM_CHECK((w + 1) * ctx <= static_cast<int64_t>(tokens.size()), "window %lld is past the text", static_cast<long long>(w));
  std::vector<int32_t> win(tokens.begin() + w * ctx, tokens.begin() + (w + 1) * ctx);
  if (bos >= 0) win[0] = bos;
  return win;
}

std::string ppl_tokens_hash(const std::vector<int32_t>& t) {
  const uint64_t h = fnv1a64(std::string_view(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(int32_t)));
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {

// The budget of the (single scorer) press.
const ScorerPress& scorer_of(const Session& s) {
  const auto* sp = dynamic_cast<const ScorerPress*>(s.press());
  KVTRIM_CHECK(sp != nullptr,
               "ppl --mode throughout needs a single token-eviction (scorer) press with a ratio or budget; '%s' is not one",
               s.press() ? s.press()->spec().c_str() : "none");
  return *sp;
}

}  // namespace

void check_ppl_config(const Session& s, const PplConfig& c) {
  KVTRIM_CHECK(s.press() != nullptr, "eval ppl needs a press (--press)");
  KVTRIM_CHECK(c.ctx >= 16, "--ctx must be at least 16 (got %lld)", static_cast<long long>(c.ctx));
  KVTRIM_CHECK(c.ctx <= s.n_ctx(), "--ctx %lld exceeds the session's context limit of %lld", static_cast<long long>(c.ctx),
               static_cast<long long>(s.n_ctx()));
  const int64_t p = c.first_row();
  KVTRIM_CHECK(p >= 1 && p <= c.ctx - 2, "--prefix %lld must be in [1, %lld]", static_cast<long long>(p),
               static_cast<long long>(c.ctx - 2));
  KVTRIM_CHECK(c.chunk >= 1, "--chunk must be positive (got %lld)", static_cast<long long>(c.chunk));
  if (c.mode == PplMode::kThroughout) {
    if (s.press()->plans_after_append()) {
      // Low-rank presses compress throughout by themselves (after-append plans); token eviction
      // composed with them would only act at a compress() that this mode never calls.
      if (const auto* cp = dynamic_cast<const ComposedPress*>(s.press()))
        for (const auto& p : cp->presses())
          KVTRIM_CHECK(p->plans_after_append(),
                       "ppl --mode throughout: '%s' composes '%s', which does not compress during the forward pass, "
                       "with a low-rank press; use --mode pcc",
                       s.press()->spec().c_str(), p->spec().c_str());
    } else {
      scorer_of(s);
    }
  }
}

PplWindow score_ppl_window(Session& s, const std::vector<int32_t>& win, int64_t index, const PplConfig& c) {
  check_ppl_config(s, c);
  const double t0 = now_seconds();
  const int64_t C = static_cast<int64_t>(win.size()), P = c.first_row();
  KVTRIM_CHECK(C == c.ctx, "window of %lld tokens, expected %lld", static_cast<long long>(C), static_cast<long long>(c.ctx));
  PplWindow r;
  r.index = index;
  r.tokens_hash = ppl_tokens_hash(win);
  r.n_scored = C - 1 - P;

  // Full cache (the press's own hooks off: low-rank presses would compress during eval_all).
  PplWindowOptions o;
  o.first = P;
  o.hooks = false;
  const PplWindowScores full = perplexity_window(s, win, o);
  const double dense_per_token = [&] {
    const size_t d = s.cache().dense_bytes_f16();
    return static_cast<double>(d) / static_cast<double>(C);
  }();

  o.pass = c.mode == PplMode::kPcc ? PplPass::kPcc : PplPass::kThroughout;
  o.hooks = true;
  o.chunk = c.chunk;
  const PplWindowScores press = perplexity_window(s, win, o);
  r.n_compress = press.n_compress;
  for (size_t k = 0; k < press.nll.size(); ++k) {
    r.kv_bytes += press.kv_bytes[k];
    r.kv_dense += dense_per_token * static_cast<double>(press.n_seen[k]);
    r.kv_bases += press.kv_bases[k];
  }
  for (size_t k = 0; k < full.nll.size(); ++k) {
    r.nll_full += full.nll[k];
    r.nll2_full += full.nll[k] * full.nll[k];
    r.nll_press += press.nll[k];
    r.nll2_press += press.nll[k] * press.nll[k];
    r.nll_cross += press.nll[k] * full.nll[k];
  }
  r.seconds = now_seconds() - t0;
  return r;
}

// ---------------------------------------------------------------- results

json ppl_window_json(const PplWindow& r) {
  return json{{"window", r.index},         {"tokens_hash", r.tokens_hash}, {"n_scored", r.n_scored},
              {"nll_press", r.nll_press},  {"nll2_press", r.nll2_press},   {"nll_full", r.nll_full},
              {"nll2_full", r.nll2_full},  {"nll_cross", r.nll_cross},     {"kv_bytes", r.kv_bytes},
              {"kv_dense", r.kv_dense},    {"kv_bases", r.kv_bases},       {"n_compress", r.n_compress},
              {"seconds", r.seconds}};
}

PplWindow ppl_window_from_json(const json& j) {
  PplWindow r;
  r.index = j.at("window").get<int64_t>();
  r.tokens_hash = j.at("tokens_hash").get<std::string>();
  r.n_scored = j.at("n_scored").get<int64_t>();
  r.nll_press = j.at("nll_press").get<double>();
  r.nll2_press = j.at("nll2_press").get<double>();
  r.nll_full = j.at("nll_full").get<double>();
  r.nll2_full = j.at("nll2_full").get<double>();
  r.nll_cross = j.at("nll_cross").get<double>();
  r.kv_bytes = j.at("kv_bytes").get<double>();
  r.kv_dense = j.at("kv_dense").get<double>();
  r.kv_bases = j.contains("kv_bases") ? j.at("kv_bases").get<double>() : -1.0;
  r.n_compress = j.at("n_compress").get<int64_t>();
  r.seconds = j.at("seconds").get<double>();
  return r;
}

namespace {
const ResultsFormat<PplWindow, int64_t> kPplFormat = {
    "window", "results line", "--out", ppl_window_from_json,
    [](const PplWindow& r, const std::string& config) {
      json j = ppl_window_json(r);
      j["config"] = config;
      return j.dump();
    },
    [](const PplWindow& r) { return r.index; },
    [](const PplWindow& r) -> const std::string& { return r.tokens_hash; }};
}  // namespace

PplResultsFile::PplResultsFile(std::string path, std::string config_hash)
    : ResultsFile(std::move(path), kPplFormat, {std::move(config_hash)}) {}

bool PplResultsFile::done(int64_t index, const std::string& tokens_hash) const {
  return ResultsFile::done(index, tokens_hash, strprintf("window %lld", static_cast<long long>(index)),
                           "was scored on other tokens");
}

const PplWindow& PplResultsFile::row(int64_t index) const {
  const PplWindow* r = find(index);
  KVTRIM_CHECK(r, "%s: no window %lld", path().c_str(), static_cast<long long>(index));
  return *r;
}

PplSummary summarize_ppl(const std::vector<PplWindow>& rows) {
  PplSummary s;
  double sp = 0, sp2 = 0, sf = 0, sf2 = 0, spf = 0, kb = 0, kd = 0, kbase = 0;
  bool bases_known = true;
  for (const auto& r : rows) {
    ++s.n_windows;
    s.n_scored += r.n_scored;
    sp += r.nll_press, sp2 += r.nll2_press, sf += r.nll_full, sf2 += r.nll2_full, spf += r.nll_cross;
    kb += r.kv_bytes, kd += r.kv_dense;
    bases_known = bases_known && r.kv_bases >= 0;
    kbase += r.kv_bases;
  }
  if (s.n_scored == 0) return s;
  const double n = static_cast<double>(s.n_scored), dof = static_cast<double>(std::max<int64_t>(1, s.n_scored - 1));
  const double mp = sp / n, mf = sf / n;
  const double vp = std::max(0.0, sp2 / n - mp * mp) / dof, vf = std::max(0.0, sf2 / n - mf * mf) / dof;
  const double cpf = (spf / n - mp * mf) / dof;  // covariance of the two means
  s.ppl_press = std::exp(mp);
  s.ppl_full = std::exp(mf);
  s.se_press = s.ppl_press * std::sqrt(vp);
  s.se_full = s.ppl_full * std::sqrt(vf);
  s.delta = s.ppl_press - s.ppl_full;
  s.se_delta = std::sqrt(std::max(0.0, s.ppl_press * s.ppl_press * vp + s.ppl_full * s.ppl_full * vf -
                                           2 * s.ppl_press * s.ppl_full * cpf));
  s.kv_ratio = kd > 0 ? kb / kd : 0;
  if (bases_known) s.kv_ratio_rows = kd > 0 ? (kb - kbase) / kd : 0;
  s.mean_kv_bytes = kb / n;
  return s;
}

std::string ppl_summary_table(const std::vector<PplWindow>& rows, const PplConfig& c, const std::string& press) {
  const PplSummary s = summarize_ppl(rows);
  std::string mode = ppl_mode_name(c.mode);
  if (c.mode == PplMode::kThroughout) mode += strprintf(" (chunk %lld%s)", static_cast<long long>(c.chunk), c.chunk > 1 ? ", approximate" : "");
  std::string out = "| mode | press | ctx | windows | tokens | PPL full | PPL press | ΔPPL | KV / f16 |\n"
                    "|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  out += strprintf("| %s | %s | %lld | %lld | %lld | %.4f ± %.4f | %.4f ± %.4f | **%+.4f ± %.4f** | %.3f |\n", mode.c_str(),
                   press.c_str(), static_cast<long long>(c.ctx), static_cast<long long>(s.n_windows),
                   static_cast<long long>(s.n_scored), s.ppl_full, s.se_full, s.ppl_press, s.se_press, s.delta, s.se_delta,
                   s.kv_ratio);
  return out;
}

}  // namespace kvtrim::eval
