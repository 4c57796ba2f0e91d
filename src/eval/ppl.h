// kvtrim eval ppl: perplexity through a compressed cache and its ΔPPL against the full cache
// on the same tokens (DESIGN.md §5, docs/eval.md "ppl"). The text is cut into non-overlapping
// windows of `ctx` tokens (first token replaced by BOS when the model uses one); in every
// window the logit rows [prefix, ctx-1) are scored (they predict tokens prefix+1 .. ctx-1),
// prefix defaulting to ctx/2 (llama.cpp's scored half). Per window, two passes:
//  - full: one eval_all of the whole window from an empty cache (the baseline);
//  - press, mode pcc (prefill–compress–continue): prefill [0, prefix), compress once with the
//    press, run [prefix, ctx) through the compressed cache;
//  - press, mode throughout (compressed throughout): the whole window is run in chunks of
//    `chunk` tokens from an empty cache; after each chunk the cache is compressed to the
//    press's budget of the tokens seen so far (ratio r: keep int(n_seen * (1 - r)) per
//    (layer, kv head); budget=N: keep N), as a budget override. With chunk = 1 every token
//    attends only to what the press kept of the earlier tokens plus itself (exact); with
//    chunk > 1 the tokens of a chunk also see each other uncompressed (an approximation).
//    Needs a single scorer (token-eviction) press.
// KV bytes "at scoring time": cache bytes() while each scored token is evaluated, summed over
// the scored tokens (pcc: linear between the cache right after compression plus one token
// and the cache at the end, exact for an uncompressed tail; throughout: measured after each
// chunk's forward), divided by the uncompressed f16 size of the same positions.
// Both passes are the engine's perplexity_window (src/engine/perplexity.h), the one scorer of
// `kvtrim ppl`, `kvtrim eval ppl` and `kvtrim eval sweep ppl`.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "eval/results_file.h"

namespace kvtrim {
class Session;
}  // namespace kvtrim

namespace kvtrim::eval {

enum class PplMode { kPcc, kThroughout };
const char* ppl_mode_name(PplMode m);
PplMode parse_ppl_mode(const std::string& s);  // "pcc" | "throughout"; throws Error otherwise

struct PplConfig {
  int64_t ctx = 512;
  PplMode mode = PplMode::kPcc;
  int64_t prefix = 0;  // first scored logit row; 0 = ctx / 2
  int64_t chunk = 1;   // throughout only
  int32_t bos = -1;    // replaces each window's first token when >= 0
  int64_t first_row() const { return prefix > 0 ? prefix : ctx / 2; }
};

// One window: sums over its scored tokens (nll = -log p, natural log).
struct PplWindow {
  int64_t index = 0;
  std::string tokens_hash;
  int64_t n_scored = 0;
  double nll_press = 0, nll2_press = 0, nll_full = 0, nll2_full = 0, nll_cross = 0;  // cross: sum nll_press * nll_full
  double kv_bytes = 0, kv_dense = 0;  // summed over the scored tokens
  // the part of kv_bytes held by shared bases (rotations, dictionaries, low-rank bases), summed
  // likewise; -1 = not recorded (rows written before it was)
  double kv_bases = 0;
  int64_t n_compress = 0;             // compress calls in the press pass
  double seconds = 0;
};

// Number of windows of `ctx` in n_tokens tokens; throws Error if there is none.
int64_t ppl_window_count(int64_t n_tokens, int64_t ctx);
// Window w's tokens (first replaced by bos when >= 0).
std::vector<int32_t> ppl_window_tokens(const std::vector<int32_t>& tokens, int64_t ctx, int64_t w, int32_t bos);
// fnv1a64 (hex) of the window's token ids: what a results line is checked against.
std::string ppl_tokens_hash(const std::vector<int32_t>& win);
// Checks the config against the session (ctx limit, prefix range, press kind for throughout).
void check_ppl_config(const Session& s, const PplConfig& c);
// Both passes of one window. The session must hold the press; its cache is reset.
PplWindow score_ppl_window(Session& s, const std::vector<int32_t>& win, int64_t index, const PplConfig& c);

// A window's fields as JSON ("window", "tokens_hash", the nll sums, "kv_bytes", ...) and back
// (throws json::exception for a missing or mistyped field): the ppl and the sweep ppl results
// files share them.
nlohmann::json ppl_window_json(const PplWindow& w);
PplWindow ppl_window_from_json(const nlohmann::json& j);

// The results file of `kvtrim eval ppl` (results_file.h): one window a line, keyed by its
// index, with its tokens' hash; one config per file.
class PplResultsFile : public ResultsFile<PplWindow, int64_t> {
 public:
  PplResultsFile(std::string path, std::string config_hash);
  // Throws Error if the window is there with other tokens under the same config.
  bool done(int64_t index, const std::string& tokens_hash) const;
  // The stored window `index` (Error if it is not there).
  const PplWindow& row(int64_t index) const;
};

struct PplSummary {
  int64_t n_windows = 0, n_scored = 0;
  double ppl_press = 0, se_press = 0, ppl_full = 0, se_full = 0;
  double delta = 0, se_delta = 0;  // paired (same tokens), delta method
  double kv_ratio = 0;             // sum kv_bytes / sum kv_dense
  double kv_ratio_rows = -1;       // the same without the shared bases (-1: not recorded)
  double mean_kv_bytes = 0;        // per scored token
};
PplSummary summarize_ppl(const std::vector<PplWindow>& rows);
// "| mode | press | windows | tokens | PPL full | PPL press | ΔPPL | KV / f16 |"
std::string ppl_summary_table(const std::vector<PplWindow>& rows, const PplConfig& c, const std::string& press);

}  // namespace kvtrim::eval
