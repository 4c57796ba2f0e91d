// The observer's statistics (see the header).
#include "engine/observation_stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "press/attention_stats.h"

namespace kvtrim {

int layer_window(const HParams& hp, int il) {
  return il < static_cast<int>(hp.sliding_window.size()) ? hp.sliding_window[static_cast<size_t>(il)] : 0;
}

float attention_scale(const HParams& hp) {
  return hp.attn_scale > 0 ? hp.attn_scale : 1.f / std::sqrt(static_cast<float>(hp.head_dim_k));
}

namespace {

size_t group_of(const HParams& hp) { return static_cast<size_t>(hp.n_head / hp.n_head_kv); }

// Appends kv head ih's keys of a forward chunk (k [n, n_kv, d], as forward computed them) and
// their positions to a head's stored keys and positions.
void append_chunk_keys(const float* k, const int32_t* pos, int64_t n, int n_kv, int ih, int d, std::vector<float>* kk,
                       std::vector<int32_t>* kp) {
  const size_t du = static_cast<size_t>(d);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = k + (static_cast<size_t>(i) * static_cast<size_t>(n_kv) + static_cast<size_t>(ih)) * du;
    kk->insert(kk->end(), row, row + du);
    kp->push_back(pos[i]);
  }
}

// Each TokenStat's rows: [n_layer * n_head_kv], each token_stat_width floats per stored token.

size_t width_of(const StatContext& c, TokenStat s) {
  return token_stat_width(s, c.hp().n_head / c.hp().n_head_kv);
}

// The rows of statistic s for (layer, kv head) il * n_head_kv + ih.
std::vector<float>& head_rows(StatContext& c, TokenStat s, int il, int ih) {
  return c.obs.stat(s)[static_cast<size_t>(il * c.hp().n_head_kv + ih)];
}

// Keep the rows of the plan's kept tokens in every (layer, kv head) of statistic s.
void keep_rows(StatContext& c, TokenStat s, const CompressionPlan& plan) {
  auto& rows = c.obs.stat(s);
  const size_t width = width_of(c, s);
  for (size_t i = 0; i < plan.heads.size(); ++i)
    if (!plan.heads[i].keep_all) rows[i] = kept_rows(rows[i], plan.heads[i], width);
}

// Statistic s sized for the cache (zeros).
void size_rows(StatContext& c, TokenStat s) {
  const int nl = c.hp().n_layer, nkv = c.hp().n_head_kv;
  const size_t width = width_of(c, s);
  c.obs.stat(s).assign(static_cast<size_t>(nl * nkv), {});
  for (int il = 0; il < nl; ++il)
    for (int ih = 0; ih < nkv; ++ih)
      head_rows(c, s, il, ih).assign(static_cast<size_t>(c.cache.n_tokens(il, ih)) * width, 0.f);
}

// Cut each (layer, kv head)'s rows of statistic s to the tokens the cache still holds.
void truncate_rows(StatContext& c, TokenStat s) {
  auto& rows = c.obs.stat(s);
  const int nkv = c.hp().n_head_kv;
  const size_t width = width_of(c, s);
  for (size_t i = 0; i < rows.size(); ++i)
    rows[i].resize(static_cast<size_t>(
                       c.cache.n_tokens(static_cast<int>(i) / nkv, static_cast<int>(i) % nkv)) *
                   width);
}

// Zero rows of statistic s for a chunk of n tokens in every kv head of layer il.
void grow_rows(StatContext& c, TokenStat s, int il, int64_t n) {
  const size_t width = width_of(c, s);
  for (int ih = 0; ih < c.hp().n_head_kv; ++ih) {
    auto& r = head_rows(c, s, il, ih);
    r.resize(r.size() + static_cast<size_t>(n) * width, 0.f);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// RecentQueries

void RecentQueries::reset(StatContext& c) { c.obs.window.assign(static_cast<size_t>(c.hp().n_layer), {}); }

void RecentQueries::on_context(StatContext& c, int il, int64_t n, const float* q, const float*, const int32_t* pos,
                               bool) {
  const size_t row = static_cast<size_t>(c.hp().n_head) * static_cast<size_t>(c.hp().head_dim_k);
  ObservedQueries& w = c.obs.window[static_cast<size_t>(il)];
  const int64_t keep_new = std::min<int64_t>(n, window_);
  const int64_t skip = n - keep_new;
  w.q.insert(w.q.end(), q + static_cast<size_t>(skip) * row, q + static_cast<size_t>(n) * row);
  w.pos.insert(w.pos.end(), pos + skip, pos + n);
  w.n += keep_new;
  if (w.n > window_) {
    const int64_t drop = w.n - window_;
    w.q.erase(w.q.begin(), w.q.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(drop) * row));
    w.pos.erase(w.pos.begin(), w.pos.begin() + static_cast<std::ptrdiff_t>(drop));
    w.n = window_;
  }
}

void RecentQueries::on_truncate(StatContext& c, int32_t pos) {
  for (auto& w : c.obs.window) {
    const size_t row = w.n > 0 ? w.q.size() / static_cast<size_t>(w.n) : 0;
    int64_t keep = 0;
    while (keep < w.n && w.pos[static_cast<size_t>(keep)] < pos) ++keep;
    w.n = keep;
    w.pos.resize(static_cast<size_t>(keep));
    w.q.resize(static_cast<size_t>(keep) * row);
  }
}

// ---------------------------------------------------------------------------------------
// CumulativeAttention

void CumulativeAttention::reset(StatContext& c) {
  // tokens already in the cache (none on a fresh session) start at zero
  size_rows(c, TokenStat::kCumAttn);
  size_rows(c, TokenStat::kCumCount);
}

// One kv head at a time through attention_max_sum's pooled sgemm + softmax: memory
// O(group · n · (n_stored + n)), never n² for every layer.
void CumulativeAttention::on_context(StatContext& c, int il, int64_t n, const float* q, const float* k,
                                     const int32_t* pos, bool accumulate) {
  if (!accumulate) {
    grow_rows(c, TokenStat::kCumAttn, il, n);
    grow_rows(c, TokenStat::kCumCount, il, n);
    return;
  }
  const HParams& hp = c.hp();
  const int nkv = hp.n_head_kv, g = hp.n_head / hp.n_head_kv, d = hp.head_dim_k;
  const size_t gu = static_cast<size_t>(g);
  const int window = layer_window(hp, il);
  std::vector<float> kk, tsum;
  std::vector<int32_t> kp;
  for (int ih = 0; ih < nkv; ++ih) {
    auto& acc = head_rows(c, TokenStat::kCumAttn, il, ih);
    auto& cnt = head_rows(c, TokenStat::kCumCount, il, ih);
    c.cache.read_head(il, ih, &kk, nullptr, &kp);
    const int64_t n_old = static_cast<int64_t>(kp.size());
    KVTRIM_CHECK(static_cast<int64_t>(acc.size()) == n_old,
                 "observer: cumulative attention of layer %d head %d covers %zu tokens, the cache holds %lld", il, ih,
                 acc.size(), static_cast<long long>(n_old));
    append_chunk_keys(k, pos, n, nkv, ih, d, &kk, &kp);
    const int64_t m = n_old + n;
    acc.resize(static_cast<size_t>(m), 0.f);
    cnt.resize(static_cast<size_t>(m), 0.f);
    tsum.assign(static_cast<size_t>(m) * gu, 0.f);
    attention_max_sum(q, pos, n, hp.n_head, ih, g, d, kk.data(), kp.data(), m, attention_scale(hp), window, nullptr,
                      tsum.data(), c.pool);
    for (int64_t t = 0; t < m; ++t) {
      float a = 0.f;
      for (size_t gi = 0; gi < gu; ++gi) a += tsum[static_cast<size_t>(t) * gu + gi];
      acc[static_cast<size_t>(t)] += a;
      // queries of the chunk that can see token t: p <= pos[i] (and pos[i] - p < window);
      // the chunk's positions increase, so both bounds are binary searches
      const int32_t p = kp[static_cast<size_t>(t)];
      const int32_t* lo = std::lower_bound(pos, pos + n, p);
      const int32_t* hi = window > 0 ? std::lower_bound(pos, pos + n, p + window) : pos + n;
      cnt[static_cast<size_t>(t)] += static_cast<float>(std::max<std::ptrdiff_t>(0, hi - lo));
    }
  }
}

void CumulativeAttention::on_apply(StatContext& c, const CompressionPlan& plan) {
  if (!c.obs.has(TokenStat::kCumAttn)) return;  // observations restored without them
  keep_rows(c, TokenStat::kCumAttn, plan);
  keep_rows(c, TokenStat::kCumCount, plan);
}

void CumulativeAttention::on_truncate(StatContext& c, int32_t) {
  truncate_rows(c, TokenStat::kCumAttn);
  truncate_rows(c, TokenStat::kCumCount);
}

// ---------------------------------------------------------------------------------------
// TaskAttention

void TaskAttention::reset(StatContext& c) {
  size_rows(c, TokenStat::kTaskMax);
  size_rows(c, TokenStat::kTaskSum);
  c.obs.task_pos.assign(static_cast<size_t>(c.hp().n_layer), {});
}

// The chunk's keys are used as forward computed them (f32), appended after the stored ones;
// per kv head through attention_max_sum (sgemm logits, rows and columns on the pool): memory
// O(group · n · (n_stored + n)) for one head at a time, nothing kept but the accumulators.
void TaskAttention::on_context(StatContext& c, int il, int64_t n, const float* q, const float* k, const int32_t* pos,
                               bool accumulate) {
  const HParams& hp = c.hp();
  const size_t gu = group_of(hp);
  if (!accumulate) {
    grow_rows(c, TokenStat::kTaskMax, il, n);
    grow_rows(c, TokenStat::kTaskSum, il, n);
    return;
  }
  const int nkv = hp.n_head_kv, g = hp.n_head / hp.n_head_kv, d = hp.head_dim_k;
  const int window = layer_window(hp, il);
  std::vector<float> kk;
  std::vector<int32_t> kp;
  for (int ih = 0; ih < nkv; ++ih) {
    auto& amax = head_rows(c, TokenStat::kTaskMax, il, ih);
    auto& asum = head_rows(c, TokenStat::kTaskSum, il, ih);
    c.cache.read_head(il, ih, &kk, nullptr, &kp);
    const int64_t n_old = static_cast<int64_t>(kp.size());
    KVTRIM_CHECK(amax.size() == static_cast<size_t>(n_old) * gu,
                 "observer: task attention of layer %d head %d covers %zu tokens, the cache holds %lld", il, ih,
                 amax.size() / gu, static_cast<long long>(n_old));
    append_chunk_keys(k, pos, n, nkv, ih, d, &kk, &kp);
    const int64_t m = n_old + n;
    amax.resize(static_cast<size_t>(m) * gu, 0.f);
    asum.resize(static_cast<size_t>(m) * gu, 0.f);
    attention_max_sum(q, pos, n, hp.n_head, ih, g, d, kk.data(), kp.data(), m, attention_scale(hp), window,
                      amax.data(), asum.data(), c.pool);
  }
  auto& tp = c.obs.task_pos[static_cast<size_t>(il)];
  tp.insert(tp.end(), pos, pos + n);
}

void TaskAttention::on_apply(StatContext& c, const CompressionPlan& plan) {
  if (!c.obs.has(TokenStat::kTaskMax)) return;  // observations restored without them
  keep_rows(c, TokenStat::kTaskMax, plan);
  keep_rows(c, TokenStat::kTaskSum, plan);
}

// The truncated tokens' rows go; the queries at positions >= pos no longer count in M (what
// they added to the max / sum of earlier tokens cannot be taken back, as for H2O).
void TaskAttention::on_truncate(StatContext& c, int32_t pos) {
  truncate_rows(c, TokenStat::kTaskMax);
  truncate_rows(c, TokenStat::kTaskSum);
  for (auto& tp : c.obs.task_pos)
    tp.erase(std::remove_if(tp.begin(), tp.end(), [pos](int32_t p) { return p >= pos; }), tp.end());
}

// ---------------------------------------------------------------------------------------
// QuestionQueries

void QuestionQueries::begin(StatContext& c) {
  const size_t nl = static_cast<size_t>(c.hp().n_layer);
  started_.assign(nl, 0);
  k_.assign(nl, {});
  kpos_.assign(nl, {});
  if (c.obs.question.empty()) c.obs.question.assign(nl, {});
}

void QuestionQueries::end() {
  k_.clear();
  kpos_.clear();
}

void QuestionQueries::clear(StatContext& c) {
  for (auto& q : c.obs.question) q = ObservedQueries{};
}

void QuestionQueries::on_chunk(StatContext& c, int il, int64_t n, const float* q, const float* k, const int32_t* pos) {
  const HParams& hp = c.hp();
  const size_t row = static_cast<size_t>(hp.n_head) * static_cast<size_t>(hp.head_dim_k);
  const size_t l = static_cast<size_t>(il);
  ObservedQueries& oq = c.obs.question[l];
  if (!started_[l]) {
    oq = ObservedQueries{};
    started_[l] = 1;
  }
  oq.q.insert(oq.q.end(), q, q + static_cast<size_t>(n) * row);
  oq.pos.insert(oq.pos.end(), pos, pos + n);
  oq.n += n;
  // the new queries see the question's keys so far, their own chunk's included
  k_[l].insert(k_[l].end(), k, k + static_cast<size_t>(n) * static_cast<size_t>(hp.n_head_kv) * static_cast<size_t>(hp.head_dim_k));
  kpos_[l].insert(kpos_[l].end(), pos, pos + n);
  const size_t at = oq.self_lse.size();
  oq.self_lse.resize(at + static_cast<size_t>(n) * static_cast<size_t>(hp.n_head));
  self_logsumexp(q, pos, n, hp.n_head, hp.n_head_kv, hp.head_dim_k, k_[l].data(), kpos_[l].data(),
                 static_cast<int64_t>(kpos_[l].size()), attention_scale(hp), layer_window(hp, il),
                 oq.self_lse.data() + at);
}

// ---------------------------------------------------------------------------------------
// RefeedScores

void RefeedScores::clear(StatContext& c) {
  for (TokenStat s : {TokenStat::kRefeedMax, TokenStat::kRefeedSum, TokenStat::kKvzip})
    c.obs.stat(s).clear();
  c.obs.refeed_m.clear();
  c.obs.refeed_current = false;
}

void RefeedScores::start(StatContext& c, bool context, bool kvzip, int kvzip_sinks) {
  clear(c);
  const int nl = c.hp().n_layer, nkv = c.hp().n_head_kv;
  if (context) {
    size_rows(c, TokenStat::kRefeedMax);
    size_rows(c, TokenStat::kRefeedSum);
    c.obs.refeed_m.assign(static_cast<size_t>(nl), 0);
  }
  if (kvzip) {
    size_rows(c, TokenStat::kKvzip);
    std::vector<int32_t> kp;
    for (int il = 0; il < nl; ++il)
      for (int ih = 0; ih < nkv; ++ih) {
        c.cache.read_head(il, ih, nullptr, nullptr, &kp);
        auto& z = head_rows(c, TokenStat::kKvzip, il, ih);
        for (size_t t = 0; t < z.size(); ++t)
          if (kp[t] < kvzip_sinks) z[t] = 1.f;
      }
  }
  sinks_ = kvzip_sinks;
  n_past_ = c.cache.n_past();
}

void RefeedScores::begin(StatContext& c, Mode mode, int32_t lo, int32_t hi) {
  KVTRIM_CHECK(c.obs.has_refeed() || c.obs.has_kvzip(),
               "observer: begin_refeed before start_refeed");
  KVTRIM_CHECK(mode != Mode::kContext || c.obs.has_refeed(),
               "observer: no context re-feed results");
  KVTRIM_CHECK(mode != Mode::kKvzip || c.obs.has_kvzip(), "observer: no reconstruction results");
  mode_ = mode;
  lo_ = lo;
  hi_ = hi;
}

void RefeedScores::on_context(StatContext& c, int il) const {
  if (il == 0 && c.obs.refeed_current) clear(c);  // the context grows: the re-feed is stale
}

// Per kv head, the stored keys the mode lets the chunk see plus the chunk's own, through the
// same pooled sgemm + softmax as the task attention; only the stored context's rows
// (positions < n_context) are kept.
void RefeedScores::on_chunk(StatContext& c, int il, int64_t n, const float* q, const float* k, const int32_t* pos) {
  const HParams& hp = c.hp();
  const int nkv = hp.n_head_kv, g = hp.n_head / hp.n_head_kv, d = hp.head_dim_k;
  const size_t gu = static_cast<size_t>(g);
  const int window = layer_window(hp, il);
  const bool kvzip = mode_ == Mode::kKvzip;
  auto& zip = c.obs.stat(TokenStat::kKvzip);
  auto& rmax = c.obs.stat(TokenStat::kRefeedMax);
  auto& rsum = c.obs.stat(TokenStat::kRefeedSum);
  std::vector<float> kk, sk, amax, asum;
  std::vector<int32_t> kp, sp, src;  // src: the stored row of each selected key (-1: not context)
  for (int ih = 0; ih < nkv; ++ih) {
    const size_t at = static_cast<size_t>(il * nkv + ih);
    c.cache.read_head(il, ih, &kk, nullptr, &kp);
    const size_t n_old = kp.size();
    const size_t n_rows = kvzip ? zip[at].size() : rmax[at].size() / gu;
    // the context's rows are the stored tokens before the re-feed's own (positions < n_context)
    size_t n_ctx_rows = 0;
    while (n_ctx_rows < n_old && kp[n_ctx_rows] < n_past_) ++n_ctx_rows;
    KVTRIM_CHECK(n_ctx_rows == n_rows, "observer: the re-feed of layer %d head %d covers %zu tokens, the cache holds %zu",
                 il, ih, n_rows, n_ctx_rows);
    // The keys the chunk's queries see: every stored key (context mode: the context and the
    // chunk's earlier sub-chunks, kk as read) or KVzip's subset (the sinks, the chunk's span of
    // the context, the re-feed's earlier sub-chunks); then the chunk's own. src: the context row
    // of each key (-1: a re-feed token).
    src.clear();
    if (kvzip) {
      sk.clear();
      sp.clear();
      const size_t du = static_cast<size_t>(d);
      for (size_t t = 0; t < n_old; ++t) {
        const int32_t p = kp[t];
        const bool context = p < n_past_;
        if (context && !(p < std::min(sinks_, lo_) || (p >= lo_ && p < hi_))) continue;
        sk.insert(sk.end(), kk.begin() + static_cast<std::ptrdiff_t>(t * du),
                  kk.begin() + static_cast<std::ptrdiff_t>((t + 1) * du));
        sp.push_back(p);
        src.push_back(context ? static_cast<int32_t>(t) : -1);
      }
    } else {
      for (size_t t = 0; t < n_old; ++t) src.push_back(t < n_ctx_rows ? static_cast<int32_t>(t) : -1);
    }
    std::vector<float>& keys = kvzip ? sk : kk;
    std::vector<int32_t>& kpos = kvzip ? sp : kp;
    append_chunk_keys(k, pos, n, nkv, ih, d, &keys, &kpos);
    src.resize(kpos.size(), -1);
    const int64_t m = static_cast<int64_t>(kpos.size());
    amax.assign(static_cast<size_t>(m) * gu, 0.f);
    if (!kvzip) asum.assign(static_cast<size_t>(m) * gu, 0.f);
    attention_max_sum(q, pos, n, hp.n_head, ih, g, d, keys.data(), kpos.data(), m, attention_scale(hp), window,
                      amax.data(), kvzip ? nullptr : asum.data(), c.pool);
    for (size_t j = 0; j < static_cast<size_t>(m); ++j) {
      const int32_t t = src[j];
      if (t < 0) continue;
      const size_t r = static_cast<size_t>(t);
      if (kvzip) {
        // KVzip: the max over the group too; the chunk's span only (the sinks are scored 1)
        if (kpos[j] < lo_ || kpos[j] >= hi_) continue;
        float best = 0.f;
        for (size_t gi = 0; gi < gu; ++gi) best = std::max(best, amax[j * gu + gi]);
        zip[at][r] = std::max(zip[at][r], best);
      } else {
        for (size_t gi = 0; gi < gu; ++gi) {
          float& mx = rmax[at][r * gu + gi];
          mx = std::max(mx, amax[j * gu + gi]);
          rsum[at][r * gu + gi] += asum[j * gu + gi];
        }
      }
    }
  }
  if (!kvzip) c.obs.refeed_m[static_cast<size_t>(il)] += n;
}

void RefeedScores::on_apply(StatContext& c, const CompressionPlan& plan) const {
  for (TokenStat s : {TokenStat::kRefeedMax, TokenStat::kRefeedSum, TokenStat::kKvzip})
    if (c.obs.has(s)) keep_rows(c, s, plan);
}

// The re-feed's own chunks are truncated away after each one (their tokens never had rows); a
// truncation into the context itself makes the results stale.
void RefeedScores::on_truncate(StatContext& c, int32_t pos) const {
  if (!c.obs.refeed_current || mode_ != Mode::kOff) return;
  if (pos < n_past_) {
    clear(c);  // the re-fed context was longer than what is left
    return;
  }
  for (int il = 0; il < c.hp().n_layer; ++il)
    for (int ih = 0; ih < c.hp().n_head_kv; ++ih) {
      const size_t n = static_cast<size_t>(c.cache.n_tokens(il, ih));
      for (TokenStat s : {TokenStat::kRefeedMax, TokenStat::kKvzip})
        if (c.obs.has(s) && head_rows(c, s, il, ih).size() != n * width_of(c, s)) {
          clear(c);
          return;
        }
    }
}

}  // namespace kvtrim
