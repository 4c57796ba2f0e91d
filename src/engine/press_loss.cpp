#include "engine/press_loss.h"

#include <algorithm>
#include <cmath>

#include "core/timer.h"
#include "engine/observation_stats.h"
#include "press/attention_stats.h"

namespace kvtrim {

const char* loss_queries_name(LossQueries q) { return q == LossQueries::kQuestion ? "question" : "window"; }

namespace {

// Every layer has queries, all after the cache's stored positions (a question observed for this
// compression; one from before the last prefill or decode is stale).
bool usable(const std::vector<ObservedQueries>& qs, int n_layer, int32_t n_past, bool after_stored) {
  if (static_cast<int>(qs.size()) != n_layer) return false;
  for (const ObservedQueries& q : qs) {
    if (q.n <= 0) return false;
    if (after_stored && q.pos.front() < n_past) return false;
  }
  return true;
}

}  // namespace

AttnParams PressLossProbe::layer_params(int il) const {
  const HParams& hp = model_.hparams();
  AttnParams p;
  p.n_head = hp.n_head;
  p.scale = attention_scale(hp);
  p.sliding_window = layer_window(hp, il);
  p.softcap = hp.attn_softcap;
  return p;
}

PressLossProbe::PressLossProbe(const Model& model, const KvCache& cache, const Observations* obs,
                               ThreadPool* pool)
    : model_(model), pool_(pool) {
  const KvCacheConfig& c = cache.config();
  if (!obs) return;
  const std::vector<ObservedQueries>* src = nullptr;
  if (usable(obs->question, c.n_layer, cache.n_past(), true)) {
    src = &obs->question;
    which_ = LossQueries::kQuestion;
  } else if (usable(obs->window, c.n_layer, cache.n_past(), false)) {
    src = &obs->window;
  } else {
    return;
  }
  const double t0 = now_seconds();
  const int n_head = model.hparams().n_head, group = n_head / c.n_head_kv;
  q_.resize(static_cast<size_t>(c.n_layer));
  o_full_.resize(static_cast<size_t>(c.n_layer));
  pos_.resize(static_cast<size_t>(c.n_layer * c.n_head_kv));
  mass_.resize(pos_.size());
  std::vector<float> k, acc;
  for (int il = 0; il < c.n_layer; ++il) {
    ObservedQueries& q = q_[static_cast<size_t>(il)];
    q = last_queries((*src)[static_cast<size_t>(il)], kLossWindow);
    const AttnParams p = layer_params(il);
    // o_full: the cache's own attention over what it holds before the plan
    std::vector<float>& o = o_full_[static_cast<size_t>(il)];
    o.assign(static_cast<size_t>(q.n * n_head * c.head_dim_v), 0.f);
    cache.attend(il, q.n, q.q.data(), q.pos.data(), p, o.data(), pool);
    // each stored token's attention mass: A[h, t, m] summed over the probe queries m and the
    // group's query heads h (softcap not applied: the models with one keep every token's rank)
    for (int ih = 0; ih < c.n_head_kv; ++ih) {
      const size_t hi = static_cast<size_t>(il * c.n_head_kv + ih);
      std::vector<int32_t>& pos = pos_[hi];
      cache.read_head(il, ih, &k, nullptr, &pos);
      const int64_t n = static_cast<int64_t>(pos.size());
      acc.assign(static_cast<size_t>(n * group), 0.f);
      attention_max_sum(q.q.data(), q.pos.data(), q.n, n_head, ih, group, c.head_dim_k, k.data(),
                        pos.data(), n, p.scale, p.sliding_window, nullptr, acc.data(), pool);
      std::vector<float>& m = mass_[hi];
      m.assign(static_cast<size_t>(n), 0.f);
      for (int64_t t = 0; t < n; ++t)
        for (int g = 0; g < group; ++g)
          m[static_cast<size_t>(t)] += acc[static_cast<size_t>(t * group + g)];
    }
    mass_total_ += static_cast<double>(q.n) * n_head;
  }
  seconds_ = now_seconds() - t0;
  active_ = true;
}

PressLoss PressLossProbe::finish(const KvCache& cache) const {
  PressLoss r;
  if (!active_) return r;
  const double t0 = now_seconds();
  const KvCacheConfig& c = cache.config();
  const int n_head = model_.hparams().n_head;
  r.measured = true;
  r.queries = which_;
  r.n_queries = q_.empty() ? 0 : q_[0].n;
  std::vector<float> o;
  std::vector<int32_t> after;
  double evicted = 0;
  for (int il = 0; il < c.n_layer; ++il) {
    const ObservedQueries& q = q_[static_cast<size_t>(il)];
    const std::vector<float>& full = o_full_[static_cast<size_t>(il)];
    o.assign(static_cast<size_t>(q.n * n_head * c.head_dim_v), 0.f);
    cache.attend(il, q.n, q.q.data(), q.pos.data(), layer_params(il), o.data(), pool_);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < full.size(); ++i) {
      const double d = static_cast<double>(full[i]) - o[i];
      diff += d * d;
      norm += static_cast<double>(full[i]) * full[i];
    }
    const double e = norm > 0 ? std::sqrt(diff / norm) : 0.0;
    r.rel_err += e;
    if (r.max_layer < 0 || e > r.rel_err_max) {
      r.rel_err_max = e;
      r.max_layer = il;
    }
    // the mass on positions stored before and not after (both in position order)
    for (int ih = 0; ih < c.n_head_kv; ++ih) {
      const size_t hi = static_cast<size_t>(il * c.n_head_kv + ih);
      const std::vector<int32_t>& before = pos_[hi];
      cache.read_head(il, ih, nullptr, nullptr, &after);
      size_t j = 0;
      for (size_t t = 0; t < before.size(); ++t) {
        while (j < after.size() && after[j] < before[t]) ++j;
        if (j < after.size() && after[j] == before[t]) continue;
        evicted += mass_[hi][t];
        ++r.tokens_removed;
      }
    }
  }
  r.rel_err /= std::max(1, c.n_layer);
  r.evicted_mass = mass_total_ > 0 ? std::min(1.0, evicted / mass_total_) : 0.0;
  r.seconds = seconds_ + (now_seconds() - t0);
  return r;
}

}  // namespace kvtrim
