// The press framework: budgets, the context a press sees (with composition views), the
// score -> top-k base, the composed press and the attention helper. The registry and the
// press-string parser are in registry.cpp.
#include "press/press.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/matmul.h"
#include "ops/nn.h"

namespace kvtrim {

// ---------------------------------------------------------------------------------------
// Budget

int64_t Budget::keep_count(int64_t n_tok) const {
  if (n_tok <= 0) return 0;
  int64_t k;
  if (n_keep > 0) {
    k = std::min(n_keep, n_tok);
  } else {
    // kvpress: n_kept = int(k_len * (1 - compression_ratio))
    k = static_cast<int64_t>(static_cast<double>(n_tok) * (1.0 - ratio));
  }
  return std::clamp<int64_t>(k, 1, n_tok);
}

std::string Budget::describe() const {
  if (n_keep > 0) return strprintf("budget=%lld", static_cast<long long>(n_keep));
  return strprintf("ratio=%g", ratio);
}

void PressNeeds::merge(const PressNeeds& o) {
  window = std::max(window, o.window);
  cum_attn = cum_attn || o.cum_attn;
  question = question || o.question;
  task_attn = task_attn || o.task_attn;
  if (o.refeed.context) {
    KVTRIM_CHECK(!refeed.context || refeed.context_chunk == o.refeed.context_chunk,
                 "presses re-feeding the context with different chunk sizes (%lld and %lld) cannot share one pass",
                 static_cast<long long>(refeed.context_chunk), static_cast<long long>(o.refeed.context_chunk));
    refeed.context = true;
    refeed.context_chunk = o.refeed.context_chunk;
  }
  if (o.refeed.kvzip) {
    KVTRIM_CHECK(!refeed.kvzip || (refeed.kvzip_chunk == o.refeed.kvzip_chunk && refeed.kvzip_sinks == o.refeed.kvzip_sinks),
                 "kvzip presses with different chunk / sink settings (%lld / %d and %lld / %d) cannot share one pass",
                 static_cast<long long>(refeed.kvzip_chunk), refeed.kvzip_sinks,
                 static_cast<long long>(o.refeed.kvzip_chunk), o.refeed.kvzip_sinks);
    refeed.kvzip = true;
    refeed.kvzip_chunk = o.refeed.kvzip_chunk;
    refeed.kvzip_sinks = o.refeed.kvzip_sinks;
  }
}

// ---------------------------------------------------------------------------------------
// PressContext

PressContext::PressContext(const KvCache& cache, const HParams& hp, const Observations* obs, ThreadPool* pool)
    : cache_(&cache), hp_(&hp), obs_(obs), pool_(pool) {
  KVTRIM_CHECK(hp.n_layer == cache.config().n_layer && hp.n_head_kv == cache.config().n_head_kv,
               "press: the cache (%d layers, %d kv heads) does not match the model (%d layers, %d kv heads)",
               cache.config().n_layer, cache.config().n_head_kv, hp.n_layer, hp.n_head_kv);
}

int64_t PressContext::n_tokens(int il, int ih) const {
  const int64_t n = cache_->n_tokens(il, ih);
  if (!view()) return n;
  return plan_kept(view_.at(il, ih), n);
}

void PressContext::read_head(int il, int ih, HeadData* out, bool want_k, bool want_v) const {
  const int64_t n = cache_->n_tokens(il, ih);
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  cache_->read_head(il, ih, want_k ? &k : nullptr, want_v ? &v : nullptr, &pos);
  KVTRIM_ASSERT(static_cast<int64_t>(pos.size()) == n);
  const HeadPlan* sel = view() ? &view_.at(il, ih) : nullptr;
  if (!sel || sel->keep_all) {
    out->n = n;
    out->k = std::move(k);
    out->v = std::move(v);
    out->pos = std::move(pos);
    out->idx.resize(static_cast<size_t>(n));
    std::iota(out->idx.begin(), out->idx.end(), 0);
    return;
  }
  const size_t dk = static_cast<size_t>(head_dim_k()), dv = static_cast<size_t>(head_dim_v());
  const size_t m = sel->keep.size();
  out->n = static_cast<int64_t>(m);
  out->idx = sel->keep;
  out->pos.resize(m);
  out->k.resize(want_k ? m * dk : 0);
  out->v.resize(want_v ? m * dv : 0);
  for (size_t j = 0; j < m; ++j) {
    const size_t i = static_cast<size_t>(sel->keep[j]);
    out->pos[j] = pos[i];
    if (want_k) std::copy_n(k.data() + i * dk, dk, out->k.data() + j * dk);
    if (want_v) std::copy_n(v.data() + i * dv, dv, out->v.data() + j * dv);
  }
}

void PressContext::read_head_rows(int il, int ih, const std::vector<int32_t>& rows,
                                  std::vector<float>* k, std::vector<float>* v) const {
  const HeadPlan* sel = view() ? &view_.at(il, ih) : nullptr;
  if (!sel || sel->keep_all) {
    cache_->read_head_rows(il, ih, rows, k, v);
    return;
  }
  // The view's keep is increasing, so increasing rows map to increasing cache rows.
  std::vector<int32_t> cr(rows.size());
  for (size_t j = 0; j < rows.size(); ++j) {
    KVTRIM_CHECK(rows[j] >= 0 && static_cast<size_t>(rows[j]) < sel->keep.size(),
                 "read_head_rows: (layer %d, kv head %d) row %d out of the view's %zu tokens", il,
                 ih, rows[j], sel->keep.size());
    cr[j] = sel->keep[static_cast<size_t>(rows[j])];
  }
  cache_->read_head_rows(il, ih, cr, k, v);
}

const ObservedQueries& PressContext::queries(int il, bool query_aware, const char* who) const {
  KVTRIM_CHECK(obs_ != nullptr, "press '%s' needs observed queries, but none were captured (run it through a Session)", who);
  if (query_aware) {
    KVTRIM_CHECK(obs_->has_question() && il < static_cast<int>(obs_->question.size()),
                 "press '%s' is query-aware but no question queries were captured (give the question to the session)",
                 who);
    return obs_->question[static_cast<size_t>(il)];
  }
  KVTRIM_CHECK(obs_->has_window() && il < static_cast<int>(obs_->window.size()) &&
                   obs_->window[static_cast<size_t>(il)].n > 0,
               "press '%s' needs the last queries of each layer, but none were captured", who);
  return obs_->window[static_cast<size_t>(il)];
}

std::vector<float> PressContext::token_stat(TokenStat s, int il, int ih, const char* who) const {
  const TokenStatInfo& info = token_stat_info(s);
  KVTRIM_CHECK(has_token_stat(s), "press '%s' needs %s, but %s", who, info.needs, info.missing);
  const size_t width = token_stat_width(s, group());
  const auto& full = obs_->stat(s)[static_cast<size_t>(il * n_head_kv() + ih)];
  KVTRIM_CHECK(full.size() == static_cast<size_t>(cache_->n_tokens(il, ih)) * width,
               "press '%s': %s layer %d head %d covers %zu tokens, the cache holds %lld", who,
               info.covers, il, ih, full.size() / width,
               static_cast<long long>(cache_->n_tokens(il, ih)));
  return view() ? kept_rows(full, view_.at(il, ih), width) : full;
}

int64_t PressContext::task_count(int il) const {
  return has_task_attn() ? static_cast<int64_t>(obs_->task_pos[static_cast<size_t>(il)].size()) : 0;
}

int64_t PressContext::refeed_count(int il) const {
  return has_refeed() ? obs_->refeed_m[static_cast<size_t>(il)] : 0;
}

PressContext PressContext::with_view(const CompressionPlan& selection) const {
  PressContext c = *this;
  c.view_ = view() ? compose_plans(view_, selection) : selection;
  return c;
}

// ---------------------------------------------------------------------------------------
// Helpers

std::vector<int32_t> top_k_indices(const std::vector<float>& scores, int64_t k) {
  const int64_t n = static_cast<int64_t>(scores.size());
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  // NaN scores sort last.
  auto better = [&](int32_t a, int32_t b) {
    const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
    const bool na = std::isnan(sa), nb = std::isnan(sb);
    if (na != nb) return nb;
    if (!na && sa != sb) return sa > sb;
    return a < b;
  };
  if (k < n) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

ObservedQueries last_queries(const ObservedQueries& q, int64_t w) {
  if (w >= q.n) return q;
  ObservedQueries o;
  o.n = std::max<int64_t>(w, 0);
  const size_t per = q.n > 0 ? q.q.size() / static_cast<size_t>(q.n) : 0;
  const size_t first = static_cast<size_t>(q.n - o.n);
  o.q.assign(q.q.begin() + static_cast<std::ptrdiff_t>(first * per), q.q.end());
  o.pos.assign(q.pos.begin() + static_cast<std::ptrdiff_t>(first), q.pos.end());
  return o;
}

HeadPlan head_plan_from_scores(const std::vector<float>& scores, int64_t k) {
  HeadPlan h;
  if (k >= static_cast<int64_t>(scores.size())) return h;  // keep_all
  h.keep_all = false;
  h.keep = top_k_indices(scores, k);
  return h;
}

void protect_sinks_recent(std::vector<float>* scores, int64_t n_sinks, int64_t n_recent) {
  const int64_t n = static_cast<int64_t>(scores->size());
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < std::min(n_sinks, n); ++i) (*scores)[static_cast<size_t>(i)] = inf;
  for (int64_t i = std::max<int64_t>(0, n - n_recent); i < n; ++i) (*scores)[static_cast<size_t>(i)] = inf;
}

int64_t plan_kept(const HeadPlan& h, int64_t n_tok) {
  return h.keep_all ? n_tok : static_cast<int64_t>(h.keep.size());
}

bool plan_is_planned(const CompressionPlan& plan) {
  for (const auto& h : plan.heads)
    if (h.planned()) return true;
  return false;
}

void attention_probs(const PressContext& ctx, int il, int ih, const HeadData& head, const ObservedQueries& q,
                     std::vector<float>* probs) {
  const int g = ctx.group();
  const int n_head = ctx.n_head();
  const int d = ctx.head_dim_k();
  const int64_t n = head.n;
  const int window = il < static_cast<int>(ctx.hparams().sliding_window.size())
                         ? ctx.hparams().sliding_window[static_cast<size_t>(il)]
                         : 0;
  const float scale = ctx.hparams().attn_scale > 0 ? ctx.hparams().attn_scale : 1.f / std::sqrt(static_cast<float>(d));
  KVTRIM_ASSERT(static_cast<int64_t>(head.k.size()) == n * d);
  const size_t nq = static_cast<size_t>(q.n);
  probs->assign(static_cast<size_t>(g) * nq * static_cast<size_t>(n), 0.f);
  if (n == 0 || q.n == 0) return;
  // Logits of every (query head, query) row as one sgemm against the head's keys, written
  // straight into probs ([g, n_q] rows of n), then a masked softmax per row with the SIMD exp.
  const WeightView kw{GgmlType::F32, head.k.data(), n, d, static_cast<size_t>(d) * sizeof(float)};
  std::vector<float> qrows(static_cast<size_t>(g) * nq * static_cast<size_t>(d));
  for (int gi = 0; gi < g; ++gi) {
    for (size_t i = 0; i < nq; ++i) {
      const float* src = q.query(static_cast<int64_t>(i), ih * g + gi, n_head, d);
      std::copy(src, src + d, qrows.data() + (static_cast<size_t>(gi) * nq + i) * static_cast<size_t>(d));
    }
  }
  matmul(kw, qrows.data(), static_cast<int64_t>(g) * q.n, probs->data(), ctx.pool());
  const bool sorted = std::is_sorted(head.pos.begin(), head.pos.end());
  const int32_t* kpos = head.pos.data();
  for_range(ctx.pool(), static_cast<int64_t>(g) * q.n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t qp = q.pos[static_cast<size_t>(r) % nq];
      float* row = probs->data() + static_cast<size_t>(r) * static_cast<size_t>(n);
      auto visible = [&](int64_t t) { return kpos[t] <= qp && (window <= 0 || qp - kpos[t] < window); };
      if (sorted) {  // one visible run [lo, hi)
        const int64_t hi = std::upper_bound(kpos, kpos + n, qp) - kpos;
        const int64_t lo = window > 0 ? std::min(hi, static_cast<int64_t>(std::lower_bound(kpos, kpos + n, qp - window + 1) - kpos)) : 0;
        std::fill(row, row + lo, 0.f);
        std::fill(row + hi, row + n, 0.f);
        if (lo >= hi) continue;  // the query sees none of these tokens
        kvtrim::scale(row + lo, scale, hi - lo);  // (ops/nn.h; the local `scale` is the factor)
        softmax(row + lo, hi - lo);
        continue;
      }
      float mx = -INFINITY;
      for (int64_t t = 0; t < n; ++t) {
        row[t] *= scale;
        if (visible(t)) mx = std::max(mx, row[t]);
      }
      if (mx == -INFINITY) {
        std::fill(row, row + n, 0.f);
        continue;
      }
      float sum = 0.f;
      for (int64_t t = 0; t < n; ++t) {
        row[t] = visible(t) ? std::exp(row[t] - mx) : 0.f;
        sum += row[t];
      }
      const float inv = 1.f / sum;
      for (int64_t t = 0; t < n; ++t) row[t] *= inv;
    }
  });
}

// ---------------------------------------------------------------------------------------
// ScorerPress, ComposedPress

CompressionPlan ScorerPress::plan(const PressContext& ctx) const {
  CompressionPlan p(ctx.n_layer(), ctx.n_head_kv());
  std::vector<std::vector<float>> scores;
  for (int il = 0; il < ctx.n_layer(); ++il) {
    // Skip the scoring work for layers where every head keeps everything.
    bool any = false;
    for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
      const int64_t n = ctx.n_tokens(il, ih);
      if (keep_count(ctx, il, n) < n) any = true;
    }
    if (!any) continue;
    scores.assign(static_cast<size_t>(ctx.n_head_kv()), {});
    score_layer(ctx, il, &scores);
    for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
      const auto& sc = scores[static_cast<size_t>(ih)];
      const int64_t n = ctx.n_tokens(il, ih);
      KVTRIM_CHECK(static_cast<int64_t>(sc.size()) == n, "press '%s': %zu scores for %lld tokens (layer %d head %d)",
                   name().c_str(), sc.size(), static_cast<long long>(n), il, ih);
      p.at(il, ih) = head_plan_from_scores(sc, keep_count(ctx, il, n));
    }
  }
  return p;
}

ComposedPress::ComposedPress(std::vector<std::unique_ptr<Press>> presses) : presses_(std::move(presses)) {
  KVTRIM_CHECK(!presses_.empty(), "a composed press needs at least one press");
}

PressNeeds ComposedPress::needs() const {
  PressNeeds n;
  for (const auto& p : presses_) n.merge(p->needs());
  return n;
}

CompressionPlan ComposedPress::plan(const PressContext& ctx) const {
  CompressionPlan total = presses_[0]->plan(ctx);
  for (size_t i = 1; i < presses_.size(); ++i) {
    const PressContext view = ctx.with_view(total);
    total = compose_plans(total, presses_[i]->plan(view));
  }
  return total;
}

int ComposedPress::decode_interval() const {
  int g = 0;
  for (const auto& p : presses_) g = std::gcd(g, std::max(0, p->decode_interval()));
  return g;
}

CompressionPlan ComposedPress::plan_decode(const PressContext& ctx) const {
  CompressionPlan total(ctx.n_layer(), ctx.n_head_kv());
  for (const auto& p : presses_) {
    const int t = p->decode_interval();
    if (t <= 0 || (ctx.decode_step() > 0 && ctx.decode_step() % t != 0)) continue;
    total = compose_plans(total, p->plan_decode(ctx.with_view(total)));
  }
  return total;
}

bool ComposedPress::plans_after_append() const {
  for (const auto& p : presses_)
    if (p->plans_after_append()) return true;
  return false;
}

CompressionPlan ComposedPress::plan_after_append(const PressContext& ctx, int il) const {
  CompressionPlan total(ctx.n_layer(), ctx.n_head_kv());
  for (const auto& p : presses_) {
    if (!p->plans_after_append()) continue;
    total = compose_plans(total, p->plan_after_append(ctx.with_view(total), il));
  }
  return total;
}

std::string ComposedPress::calibration_id(const Model& model) const {
  std::string id;
  for (const auto& p : presses_) {
    const std::string part = p->calibration_id(model);
    if (part.empty()) continue;
    id += (id.empty() ? "" : "+") + part;
  }
  return id;
}

CompressionPlan Press::plan_decode(const PressContext& ctx) const { return CompressionPlan(ctx.n_layer(), ctx.n_head_kv()); }

CompressionPlan Press::plan_after_append(const PressContext& ctx, int il) const {
  (void)il;
  return CompressionPlan(ctx.n_layer(), ctx.n_head_kv());
}

}  // namespace kvtrim
