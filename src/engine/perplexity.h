// Perplexity: the one way the engine scores a text (`kvtrim ppl`, `kvtrim eval ppl`, `kvtrim
// eval sweep ppl`). A window of tokens is scored by perplexity_window in one of three passes
// (full cache; prefill–compress–continue; compressed throughout), and perplexity() cuts a text
// into windows with llama.cpp-compatible placement and sums their NLL.
// Windows of n_ctx tokens start every `stride` tokens; each is evaluated from an empty cache
// with its first token replaced by BOS (when bos >= 0).
//  - stride == n_ctx: non-overlapping windows scoring their second half (llama.cpp's
//    perplexity tool), so the numbers compare with llama.cpp's;
//  - stride < n_ctx: each window scores its last `stride` tokens (full-cache pass only).
// Dependencies: perplexity -> session -> press_runner (never back).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/press_runner.h"

namespace kvtrim {

class Session;

struct PplResult {
  double ppl = 0;
  double ppl_stderr = 0;  // standard error of ppl (delta method on the mean NLL)
  double mean_nll = 0;
  int64_t n_scored = 0;
  int64_t n_windows = 0;
  double seconds = 0;
};

// -log softmax(logits)[target], in double; logits: [n_vocab].
double token_nll(const float* logits, size_t n_vocab, int32_t target);

// Running negative log-likelihood of scored tokens (log-softmax in double).
class NllAccumulator {
 public:
  // Adds -log softmax(logits)[target] (token_nll); logits: [n_vocab].
  void add(const float* logits, size_t n_vocab, int32_t target) {
    add(token_nll(logits, n_vocab, target));
  }
  void add(double nll);
  int64_t n() const { return n_; }
  double ppl_so_far() const;
  // Fills n_scored, mean_nll, ppl and ppl_stderr.
  void finish(PplResult* r) const;

 private:
  double sum_ = 0, sum2_ = 0;
  int64_t n_ = 0;
};

// How a window's tokens run through the session (DESIGN.md §5).
enum class PplPass {
  // one eval_all of the whole window from an empty cache
  kFull,
  // prefill–compress–continue: prefill [0, first), compress once with the session's press,
  // run [first, n) through the compressed cache (its own tokens appended uncompressed)
  kPcc,
  // compressed throughout, from an empty cache: a press that plans after each append
  // (low-rank) runs the window in the session's batches with its hooks on; a single scorer
  // (token-eviction) press runs it in chunks of `chunk` tokens and compresses after each chunk
  // to its budget of the tokens seen so far (ratio r: keep int(n_seen * (1 - r)) per (layer,
  // kv head); budget=N: keep N), as a budget override. chunk = 1 is exact; with chunk > 1 the
  // tokens of a chunk also see each other uncompressed (an approximation).
  kThroughout,
};

struct PplWindowOptions {
  PplPass pass = PplPass::kFull;
  int64_t first = 0;  // the first scored logit row (row j predicts token j+1); kPcc: the prefix
  // kFull: false turns the press's own hooks off for the pass (the full-cache reference of a
  // press that compresses during the forward pass); true leaves them as they are
  bool hooks = true;
  int64_t chunk = 1;  // kThroughout with a scorer press: tokens per forward call
};

// One window's scores, one entry per scored row j in [first, n - 1).
struct PplWindowScores {
  std::vector<double> nll;  // -log p(win[j + 1]) (token_nll)
  // kPcc and kThroughout: the cache while row j was evaluated: its bytes (KvBytes::total; kPcc:
  // linear between the compressed cache plus one token and the cache at the end, exact for an
  // uncompressed tail; kThroughout: measured after the row's chunk), the part of them held by
  // shared bases, and the positions run so far (the uncompressed size's).
  std::vector<double> kv_bytes, kv_bases;
  std::vector<int64_t> n_seen;
  int64_t n_compress = 0;  // compressions of the pass (kPcc: 1; kThroughout: per chunk)
  CompressStats compress;  // kPcc: the compress step's stats
};

// Scores one window (its first token already replaced by BOS where wanted) with `o.pass`; the
// session's cache is reset first and left holding the window. kPcc and kThroughout need the
// session's press (Error otherwise; kThroughout: a press planning after each append or a single
// scorer press). Throws Error unless 0 < first < n - 1 (first may be 0 for kFull).
PplWindowScores perplexity_window(Session& s, const std::vector<int32_t>& win,
                                  const PplWindowOptions& o);

struct PplOptions {
  int64_t n_ctx = 0;   // window length in tokens (>= 16, within the session's context)
  int64_t stride = 0;  // tokens between window starts; 0 = n_ctx (kPcc / kThroughout: only n_ctx)
  int32_t bos = -1;    // replaces each window's first token when >= 0
  PplPass pass = PplPass::kFull;  // kPcc / kThroughout: the session's press in every window
  int64_t chunk = 1;              // kThroughout (PplWindowOptions::chunk)
  // progress(done, total, ppl_so_far) after each window
  std::function<void(int64_t, int64_t, double)> progress;
  CompressStats* last = nullptr;  // kPcc: gets the last window's compress stats
};

// tokens: the whole text (BOS first if the model adds one). The scored rows are the same for
// every pass (stride == n_ctx: n_ctx/2 .. n_ctx-2, predicting tokens n_ctx/2+1 .. n_ctx-1), so
// the perplexities compare directly. The session's cache is left holding the last window.
// Throws Error if tokens.size() < n_ctx or stride is out of range.
PplResult perplexity(Session& s, const std::vector<int32_t>& tokens, const PplOptions& o);

}  // namespace kvtrim
