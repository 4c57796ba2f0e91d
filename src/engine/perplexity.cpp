#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/timer.h"
#include "engine/session.h"

namespace kvtrim {

void NllAccumulator::add(const float* logits, size_t n_vocab, int32_t target) {
  const float mx = *std::max_element(logits, logits + n_vocab);
  double z = 0;
  for (size_t v = 0; v < n_vocab; ++v) z += std::exp(static_cast<double>(logits[v] - mx));
  const double nll = std::log(z) + mx - logits[target];
  sum_ += nll;
  sum2_ += nll * nll;
  ++n_;
}

double NllAccumulator::ppl_so_far() const { return n_ ? std::exp(sum_ / static_cast<double>(n_)) : 0.0; }

void NllAccumulator::finish(PplResult* r) const {
  KVTRIM_ASSERT(n_ > 0);
  r->n_scored = n_;
  r->mean_nll = sum_ / static_cast<double>(n_);
  r->ppl = std::exp(r->mean_nll);
  const double var = std::max(0.0, sum2_ / static_cast<double>(n_) - r->mean_nll * r->mean_nll);
  r->ppl_stderr = r->ppl * std::sqrt(var / static_cast<double>(std::max<int64_t>(1, n_ - 1)));
}

PplResult perplexity(Session& s, const std::vector<int32_t>& tokens, int64_t n_ctx, int64_t stride, int32_t bos,
                     const std::function<void(int64_t, int64_t, double)>& progress) {
  const int64_t C = n_ctx, S = stride > 0 ? stride : n_ctx;
  KVTRIM_CHECK(C >= 16, "perplexity window must be at least 16 tokens (got %lld)", static_cast<long long>(C));
  KVTRIM_CHECK(S <= C, "stride (%lld) must not exceed the window (%lld)", static_cast<long long>(S), static_cast<long long>(C));
  KVTRIM_CHECK(C <= s.n_ctx(), "perplexity window of %lld tokens exceeds the session's context limit of %lld",
               static_cast<long long>(C), static_cast<long long>(s.n_ctx()));
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  KVTRIM_CHECK(n_tok >= C, "the text has %lld tokens, fewer than one window of %lld",
               static_cast<long long>(n_tok), static_cast<long long>(C));
  PplResult r;
  r.n_windows = (n_tok - C) / S + 1;
  const int64_t first = S >= C ? C / 2 : C - S - 1;  // first scored logit row
  const size_t n_vocab = static_cast<size_t>(s.model().hparams().n_vocab);
  std::vector<float> logits(static_cast<size_t>(C) * n_vocab);
  std::vector<int32_t> win(static_cast<size_t>(C));
  NllAccumulator acc;
  const double t0 = now_seconds();
  for (int64_t w = 0; w < r.n_windows; ++w) {
    std::copy_n(tokens.begin() + w * S, C, win.begin());
    if (bos >= 0) win[0] = bos;
    s.reset();
    s.eval_all(win.data(), C, logits.data());
    for (int64_t j = first; j < C - 1; ++j)
      acc.add(logits.data() + static_cast<size_t>(j) * n_vocab, n_vocab, win[static_cast<size_t>(j + 1)]);
    if (progress) progress(w + 1, r.n_windows, acc.ppl_so_far());
  }
  r.seconds = now_seconds() - t0;
  acc.finish(&r);
  return r;
}

}  // namespace kvtrim
