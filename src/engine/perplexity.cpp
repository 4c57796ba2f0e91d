// Perplexity (perplexity.h): the window passes and the loop over a text's windows.
// Dependencies: perplexity -> session -> press_runner (never back).
#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/timer.h"
#include "engine/session.h"
#include "press/press.h"

namespace kvtrim {

double token_nll(const float* logits, size_t n_vocab, int32_t target) {
  const float mx = *std::max_element(logits, logits + n_vocab);
  double z = 0;
  for (size_t v = 0; v < n_vocab; ++v) z += std::exp(static_cast<double>(logits[v] - mx));
  return std::log(z) + mx - logits[target];
}

void NllAccumulator::add(double nll) {
  sum_ += nll;
  sum2_ += nll * nll;
  ++n_;
}

double NllAccumulator::ppl_so_far() const {
  return n_ ? std::exp(sum_ / static_cast<double>(n_)) : 0.0;
}

void NllAccumulator::finish(PplResult* r) const {
  KVTRIM_ASSERT(n_ > 0);
  r->n_scored = n_;
  r->mean_nll = sum_ / static_cast<double>(n_);
  r->ppl = std::exp(r->mean_nll);
  const double var = std::max(0.0, sum2_ / static_cast<double>(n_) - r->mean_nll * r->mean_nll);
  r->ppl_stderr = r->ppl * std::sqrt(var / static_cast<double>(std::max<int64_t>(1, n_ - 1)));
}

namespace {

// kFull: one eval_all of the whole window, the press's hooks as asked.
void full_pass(Session& s, const std::vector<int32_t>& win, const PplWindowOptions& o,
               PplWindowScores* r) {
  const int64_t C = static_cast<int64_t>(win.size());
  const size_t n_vocab = static_cast<size_t>(s.model().hparams().n_vocab);
  std::vector<float> logits(static_cast<size_t>(C) * n_vocab);
  s.reset();
  // without the hooks when asked, then as they were (also when eval_all throws)
  struct HooksOff {
    Session* s = nullptr;
    bool was = false;
    ~HooksOff() {
      if (s) s->set_press_hooks(was);
    }
  } off;
  if (!o.hooks) {
    off.was = s.press_hooks();
    off.s = &s;
    s.set_press_hooks(false);
  }
  s.eval_all(win.data(), C, logits.data());
  for (int64_t j = o.first; j < C - 1; ++j)
    r->nll.push_back(token_nll(logits.data() + static_cast<size_t>(j) * n_vocab, n_vocab,
                               win[static_cast<size_t>(j + 1)]));
}

// kPcc: prefill win[0, P), compress once with the session's press, run win[P, C) through the
// compressed cache.
void pcc_pass(Session& s, const std::vector<int32_t>& win, int64_t P, PplWindowScores* r) {
  const int64_t C = static_cast<int64_t>(win.size());
  const size_t n_vocab = static_cast<size_t>(s.model().hparams().n_vocab);
  std::vector<float> logits(static_cast<size_t>(C - P) * n_vocab);
  s.reset();
  s.prefill(std::vector<int32_t>(win.begin(), win.begin() + P));
  r->compress = s.compress();
  r->n_compress = 1;
  s.eval_all(win.data() + P, C - P, logits.data());
  const KvBytes end = s.cache().bytes();  // rows P..C-1 appended
  const double b_after = static_cast<double>(r->compress.bytes_after);
  const double per_tok = (static_cast<double>(end.total()) - b_after) / static_cast<double>(C - P);
  for (int64_t j = P; j < C - 1; ++j) {
    r->nll.push_back(token_nll(logits.data() + static_cast<size_t>(j - P) * n_vocab, n_vocab,
                               win[static_cast<size_t>(j + 1)]));
    // bytes while row j is evaluated: the compressed prefix plus rows P..j, linear in j
    r->kv_bytes.push_back(b_after + per_tok * static_cast<double>(j - P + 1));
    r->kv_bases.push_back(static_cast<double>(end.bases));  // fixed once compressed
    r->n_seen.push_back(j + 1);
  }
}

// kThroughout: the window in chunks of `chunk` tokens from an empty cache; after each chunk but
// the last, `budget` (nullptr: the press compresses by itself, after each append) is applied.
void throughout_pass(Session& s, const std::vector<int32_t>& win, int64_t P, int64_t chunk,
                     const Budget* budget, PplWindowScores* r) {
  const int64_t C = static_cast<int64_t>(win.size());
  const size_t n_vocab = static_cast<size_t>(s.model().hparams().n_vocab);
  std::vector<float> logits(static_cast<size_t>(chunk) * n_vocab);
  s.reset();
  for (int64_t i = 0; i < C; i += chunk) {
    const int64_t m = std::min<int64_t>(chunk, C - i);
    s.eval_all(win.data() + i, m, logits.data());
    if (!budget) ++r->n_compress;  // one prefill update of the press per chunk
    const KvBytes kb = s.cache().bytes();
    for (int64_t j = std::max(i, P); j < std::min(i + m, C - 1); ++j) {
      r->nll.push_back(token_nll(logits.data() + static_cast<size_t>(j - i) * n_vocab, n_vocab,
                                 win[static_cast<size_t>(j + 1)]));
      r->kv_bytes.push_back(static_cast<double>(kb.total()));
      r->kv_bases.push_back(static_cast<double>(kb.bases));
      r->n_seen.push_back(i + m);
    }
    if (!budget) continue;
    if (i + m >= C) break;  // nothing reads the cache after the last chunk
    Budget b;
    b.n_keep =
        std::max<int64_t>(1, budget->n_keep > 0 ? budget->n_keep : budget->keep_count(i + m));
    s.compress(b);
    ++r->n_compress;
  }
}

}  // namespace

PplWindowScores perplexity_window(Session& s, const std::vector<int32_t>& win,
                                  const PplWindowOptions& o) {
  const int64_t C = static_cast<int64_t>(win.size());
  const int64_t lo = o.pass == PplPass::kFull ? 0 : 1;
  KVTRIM_CHECK(o.first >= lo && o.first <= C - 2,
               "perplexity: first scored row %lld must be in [%lld, %lld]",
               static_cast<long long>(o.first), static_cast<long long>(lo),
               static_cast<long long>(C - 2));
  KVTRIM_CHECK(o.pass == PplPass::kFull || s.press() != nullptr,
               "perplexity: the session has no press");
  PplWindowScores r;
  r.nll.reserve(static_cast<size_t>(C - 1 - o.first));
  if (o.pass == PplPass::kFull) {
    full_pass(s, win, o, &r);
  } else if (o.pass == PplPass::kPcc) {
    pcc_pass(s, win, o.first, &r);
  } else if (s.press()->plans_after_append()) {
    // every token is written into the compressed cache before any attention reads it (exact
    // for every chunk size; a chunk is one prefill update of OjaKV)
    throughout_pass(s, win, o.first, s.params().n_batch, nullptr, &r);
  } else {
    const auto* sp = dynamic_cast<const ScorerPress*>(s.press());
    KVTRIM_CHECK(
        sp != nullptr,
        "perplexity throughout needs a single token-eviction (scorer) press; '%s' is not one",
        s.press()->spec().c_str());
    KVTRIM_CHECK(o.chunk >= 1, "perplexity: chunk must be positive (got %lld)",
                 static_cast<long long>(o.chunk));
    const Budget own = sp->budget();
    throughout_pass(s, win, o.first, o.chunk, &own, &r);
  }
  return r;
}

PplResult perplexity(Session& s, const std::vector<int32_t>& tokens, const PplOptions& o) {
  const int64_t C = o.n_ctx, S = o.stride > 0 ? o.stride : o.n_ctx;
  KVTRIM_CHECK(C >= 16, "perplexity window must be at least 16 tokens (got %lld)",
               static_cast<long long>(C));
  KVTRIM_CHECK(S <= C, "stride (%lld) must not exceed the window (%lld)", static_cast<long long>(S),
               static_cast<long long>(C));
  KVTRIM_CHECK(
      o.pass == PplPass::kFull || S == C,
      "perplexity through a press needs non-overlapping windows (stride %lld, window %lld)",
      static_cast<long long>(S), static_cast<long long>(C));
  KVTRIM_CHECK(C <= s.n_ctx(),
               "perplexity window of %lld tokens exceeds the session's context limit of %lld",
               static_cast<long long>(C), static_cast<long long>(s.n_ctx()));
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  KVTRIM_CHECK(n_tok >= C, "the text has %lld tokens, fewer than one window of %lld",
               static_cast<long long>(n_tok), static_cast<long long>(C));
  PplResult r;
  r.n_windows = (n_tok - C) / S + 1;
  PplWindowOptions wo;
  wo.pass = o.pass;
  wo.first = S >= C ? C / 2 : C - S - 1;  // first scored logit row
  wo.chunk = o.chunk;
  std::vector<int32_t> win(static_cast<size_t>(C));
  NllAccumulator acc;
  const double t0 = now_seconds();
  for (int64_t w = 0; w < r.n_windows; ++w) {
    std::copy_n(tokens.begin() + w * S, C, win.begin());
    if (o.bos >= 0) win[0] = o.bos;
    const PplWindowScores sc = perplexity_window(s, win, wo);
    if (o.last && o.pass == PplPass::kPcc) *o.last = sc.compress;
    for (double nll : sc.nll) acc.add(nll);
    if (o.progress) o.progress(w + 1, r.n_windows, acc.ppl_so_far());
  }
  r.seconds = now_seconds() - t0;
  acc.finish(&r);
  return r;
}

}  // namespace kvtrim
