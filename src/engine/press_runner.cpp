#include "engine/press_runner.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/memory.h"
#include "core/timer.h"
#include "engine/perplexity.h"
#include "engine/session.h"
#include "press/attention_stats.h"

namespace kvtrim {

PressObserver::PressObserver(const Model& model, const KvCache& cache, PressNeeds needs)
    : model_(model), cache_(cache), needs_(needs) {
  if (needs_.window > 0) stats_.push_back(std::make_unique<RecentQueries>(needs_.window));
  if (needs_.cum_attn) stats_.push_back(std::make_unique<CumulativeAttention>());
  if (needs_.task_attn) stats_.push_back(std::make_unique<TaskAttention>());
  reset();
}

void PressObserver::reset() {
  obs_ = Observations{};
  StatContext c = stat_context();
  for (auto& st : stats_) st->reset(c);
  if (needs_.question) obs_.question.assign(static_cast<size_t>(model_.hparams().n_layer), {});
  question_mode_ = false;
  reset_refeed();
}

void PressObserver::reset_refeed() {
  StatContext c = stat_context();
  RefeedScores::clear(c);
}

void PressObserver::start_refeed(bool context, bool kvzip, int kvzip_sinks) {
  StatContext c = stat_context();
  refeed_.start(c, context, kvzip, kvzip_sinks);
}

void PressObserver::finish_refeed() { obs_.refeed_current = true; }

void PressObserver::begin_refeed(RefeedMode mode, int32_t lo, int32_t hi) {
  StatContext c = stat_context();
  refeed_.begin(c, mode, lo, hi);
}

void PressObserver::begin_question() {
  question_mode_ = true;
  StatContext c = stat_context();
  question_.begin(c);
}

void PressObserver::end_question() {
  question_mode_ = false;
  question_.end();
}

void PressObserver::clear_question() {
  StatContext c = stat_context();
  QuestionQueries::clear(c);
}

void PressObserver::on_qkv(int il, int64_t n, const float* q, const float* k, const float*, const int32_t* pos) {
  StatContext c = stat_context();
  if (refeed_.active()) {
    refeed_.on_chunk(c, il, n, q, k, pos);
    return;
  }
  if (question_mode_) {
    question_.on_chunk(c, il, n, q, k, pos);
    return;
  }
  refeed_.on_context(c, il);
  for (auto& st : stats_) st->on_context(c, il, n, q, k, pos, accumulate_);
}

void PressObserver::after_append(int il, KvCache& cache) {
  if (!hook_press_ || !hooks_ || question_mode_ || refeed_.active()) return;
  PressContext ctx(cache, model_.hparams(), &obs_, pool_);
  ctx.set_model(&model_);
  ctx.set_new_from(cache.n_past());  // the engine advances n_past only after the whole forward call
  apply_plan(hook_press_->plan_after_append(ctx, il), cache, this);
}

void PressObserver::on_apply(const CompressionPlan& plan) {
  StatContext c = stat_context();
  for (auto& st : stats_) st->on_apply(c, plan);
  refeed_.on_apply(c, plan);
}

void PressObserver::on_truncate(int32_t pos) {
  StatContext c = stat_context();
  for (auto& st : stats_) st->on_truncate(c, pos);
  refeed_.on_truncate(c, pos);
}

bool apply_plan(const CompressionPlan& plan, KvCache& cache, PressObserver* obs) {
  if (!plan_is_planned(plan)) return false;  // token selections, and basis / channel plans
  cache.apply(plan);                          // that keep every token, are planned
  if (obs) obs->on_apply(plan);
  return true;
}

int64_t total_tokens(const KvCache& cache) {
  int64_t t = 0;
  for (int il = 0; il < cache.config().n_layer; ++il)
    for (int ih = 0; ih < cache.config().n_head_kv; ++ih) t += cache.n_tokens(il, ih);
  return t;
}

CompressStats run_press(const Press& press, KvCache& cache, const Model& model, PressObserver* obs, ThreadPool* pool,
                        const Budget* budget_override) {
  CompressStats st;
  const double t0 = now_seconds();
  st.tokens_before = total_tokens(cache);
  st.bytes_before = cache.bytes().total();
  st.rss_before = process_rss_bytes();  // before planning: what the process held when asked to compress
  PressContext ctx(cache, model.hparams(), obs ? &obs->observations() : nullptr, pool);
  ctx.set_model(&model);
  if (budget_override) ctx.set_budget_override(*budget_override);
  apply_plan(press.plan(ctx), cache, obs);
  st.rss_after = process_rss_bytes();
  st.tokens_after = total_tokens(cache);
  st.bytes_after = cache.bytes().total();
  st.seconds = now_seconds() - t0;
  return st;
}

}  // namespace kvtrim

namespace kvtrim {

PplResult perplexity_press(Session& s, const std::vector<int32_t>& tokens, int64_t n_ctx, int32_t bos,
                           const std::function<void(int64_t, int64_t, double)>& progress, CompressStats* last) {
  KVTRIM_CHECK(s.press() != nullptr, "perplexity_press: the session has no press");
  const int64_t C = n_ctx;
  KVTRIM_CHECK(C >= 16, "perplexity window must be at least 16 tokens (got %lld)", static_cast<long long>(C));
  KVTRIM_CHECK(C <= s.n_ctx(), "perplexity window of %lld tokens exceeds the session's context limit of %lld",
               static_cast<long long>(C), static_cast<long long>(s.n_ctx()));
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  KVTRIM_CHECK(n_tok >= C, "the text has %lld tokens, fewer than one window of %lld", static_cast<long long>(n_tok),
               static_cast<long long>(C));
  PplResult r;
  r.n_windows = n_tok / C;
  const int64_t h = C / 2;
  const size_t n_vocab = static_cast<size_t>(s.model().hparams().n_vocab);
  std::vector<float> logits(static_cast<size_t>(C - h) * n_vocab);
  NllAccumulator acc;
  const double t0 = now_seconds();
  for (int64_t w = 0; w < r.n_windows; ++w) {
    std::vector<int32_t> win(tokens.begin() + w * C, tokens.begin() + (w + 1) * C);
    if (bos >= 0) win[0] = bos;
    const CompressStats st = prefill_compress_continue(s, win, h, logits.data());
    if (last) *last = st;
    for (int64_t j = h; j < C - 1; ++j)
      acc.add(logits.data() + static_cast<size_t>(j - h) * n_vocab, n_vocab, win[static_cast<size_t>(j + 1)]);
    if (progress) progress(w + 1, r.n_windows, acc.ppl_so_far());
  }
  r.seconds = now_seconds() - t0;
  acc.finish(&r);
  return r;
}

CompressStats prefill_compress_continue(Session& s, const std::vector<int32_t>& win, int64_t prefix, float* logits) {
  KVTRIM_CHECK(s.press() != nullptr, "prefill_compress_continue: the session has no press");
  const int64_t n = static_cast<int64_t>(win.size());
  KVTRIM_CHECK(prefix > 0 && prefix < n, "prefill_compress_continue: prefix %lld must be in (0, %lld)",
               static_cast<long long>(prefix), static_cast<long long>(n));
  s.reset();
  s.prefill(std::vector<int32_t>(win.begin(), win.begin() + prefix));
  const CompressStats st = s.compress();
  s.eval_all(win.data() + prefix, n - prefix, logits);
  return st;
}

}  // namespace kvtrim
