// The press observer, apply_plan and run_press (press_runner.h).
// Dependencies: session -> press_runner -> observation_stats, press, kv, model; never session.h.
#include "engine/press_runner.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/memory.h"
#include "core/timer.h"
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
