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

namespace {

// What every attention statistic of layer il needs: the layer's sliding window (0 = none) and
// the attention scale.
int layer_window(const HParams& hp, int il) {
  return il < static_cast<int>(hp.sliding_window.size()) ? hp.sliding_window[static_cast<size_t>(il)] : 0;
}
float attention_scale(const HParams& hp) {
  return hp.attn_scale > 0 ? hp.attn_scale : 1.f / std::sqrt(static_cast<float>(hp.head_dim_k));
}
}  // namespace

PressObserver::PressObserver(const Model& model, const KvCache& cache, PressNeeds needs)
    : model_(model), cache_(cache), needs_(needs) {
  reset();
}

void PressObserver::reset() {
  const int nl = model_.hparams().n_layer, nkv = model_.hparams().n_head_kv;
  obs_ = Observations{};
  if (needs_.window > 0) obs_.window.assign(static_cast<size_t>(nl), {});
  if (needs_.question) obs_.question.assign(static_cast<size_t>(nl), {});
  if (needs_.cum_attn) {
    obs_.cum_attn.assign(static_cast<size_t>(nl * nkv), {});
    obs_.cum_count.assign(static_cast<size_t>(nl * nkv), {});
    // Tokens already in the cache (none on a fresh session) start at zero.
    for (int il = 0; il < nl; ++il)
      for (int ih = 0; ih < nkv; ++ih) {
        obs_.cum_attn[static_cast<size_t>(il * nkv + ih)].assign(static_cast<size_t>(cache_.n_tokens(il, ih)), 0.f);
        obs_.cum_count[static_cast<size_t>(il * nkv + ih)].assign(static_cast<size_t>(cache_.n_tokens(il, ih)), 0.f);
      }
  }
  if (needs_.task_attn) {
    const size_t g = static_cast<size_t>(model_.hparams().n_head / nkv);
    obs_.task_max.assign(static_cast<size_t>(nl * nkv), {});
    obs_.task_sum.assign(static_cast<size_t>(nl * nkv), {});
    obs_.task_pos.assign(static_cast<size_t>(nl), {});
    for (int il = 0; il < nl; ++il)
      for (int ih = 0; ih < nkv; ++ih) {
        const size_t n = static_cast<size_t>(cache_.n_tokens(il, ih)) * g;
        obs_.task_max[static_cast<size_t>(il * nkv + ih)].assign(n, 0.f);
        obs_.task_sum[static_cast<size_t>(il * nkv + ih)].assign(n, 0.f);
      }
  }
  question_mode_ = false;
  reset_refeed();
}

void PressObserver::reset_refeed() {
  obs_.refeed_max.clear();
  obs_.refeed_sum.clear();
  obs_.refeed_m.clear();
  obs_.kvzip.clear();
  obs_.refeed_current = false;
}

void PressObserver::start_refeed(bool context, bool kvzip, int kvzip_sinks) {
  reset_refeed();
  const int nl = model_.hparams().n_layer, nkv = model_.hparams().n_head_kv;
  const size_t g = static_cast<size_t>(model_.hparams().n_head / nkv);
  if (context) {
    obs_.refeed_max.assign(static_cast<size_t>(nl * nkv), {});
    obs_.refeed_sum.assign(static_cast<size_t>(nl * nkv), {});
    obs_.refeed_m.assign(static_cast<size_t>(nl), 0);
  }
  if (kvzip) obs_.kvzip.assign(static_cast<size_t>(nl * nkv), {});
  std::vector<float> kk;
  std::vector<int32_t> kp;
  for (int il = 0; il < nl; ++il)
    for (int ih = 0; ih < nkv; ++ih) {
      const size_t at = static_cast<size_t>(il * nkv + ih), n = static_cast<size_t>(cache_.n_tokens(il, ih));
      if (context) {
        obs_.refeed_max[at].assign(n * g, 0.f);
        obs_.refeed_sum[at].assign(n * g, 0.f);
      }
      if (kvzip) {
        cache_.read_head(il, ih, nullptr, nullptr, &kp);
        auto& z = obs_.kvzip[at];
        z.assign(n, 0.f);
        for (size_t t = 0; t < n; ++t)
          if (kp[t] < kvzip_sinks) z[t] = 1.f;
      }
    }
  refeed_sinks_ = kvzip_sinks;
  refeed_n_past_ = cache_.n_past();
}

void PressObserver::finish_refeed() { obs_.refeed_current = true; }

void PressObserver::begin_refeed(RefeedMode mode, int32_t lo, int32_t hi) {
  KVTRIM_CHECK(!obs_.refeed_max.empty() || !obs_.kvzip.empty(), "observer: begin_refeed before start_refeed");
  KVTRIM_CHECK(mode != RefeedMode::kContext || !obs_.refeed_max.empty(), "observer: no context re-feed results");
  KVTRIM_CHECK(mode != RefeedMode::kKvzip || !obs_.kvzip.empty(), "observer: no reconstruction results");
  refeed_mode_ = mode;
  refeed_lo_ = lo;
  refeed_hi_ = hi;
}

void PressObserver::begin_question() {
  question_mode_ = true;
  question_started_.assign(static_cast<size_t>(model_.hparams().n_layer), 0);
  question_k_.assign(static_cast<size_t>(model_.hparams().n_layer), {});
  question_kpos_.assign(static_cast<size_t>(model_.hparams().n_layer), {});
  if (obs_.question.empty()) obs_.question.assign(static_cast<size_t>(model_.hparams().n_layer), {});
}
void PressObserver::end_question() {
  question_mode_ = false;
  question_k_.clear();
  question_kpos_.clear();
}
void PressObserver::clear_question() {
  for (auto& q : obs_.question) q = ObservedQueries{};
}

void PressObserver::on_qkv(int il, int64_t n, const float* q, const float* k, const float* v, const int32_t* pos) {
  const HParams& hp = model_.hparams();
  const size_t row = static_cast<size_t>(hp.n_head) * static_cast<size_t>(hp.head_dim_k);
  if (refeed_mode_ != RefeedMode::kOff) {
    refeed_scores(il, n, q, k, pos);
    return;
  }
  if (question_mode_) {
    ObservedQueries& oq = obs_.question[static_cast<size_t>(il)];
    if (!question_started_[static_cast<size_t>(il)]) {
      oq = ObservedQueries{};
      question_started_[static_cast<size_t>(il)] = 1;
    }
    oq.q.insert(oq.q.end(), q, q + static_cast<size_t>(n) * row);
    oq.pos.insert(oq.pos.end(), pos, pos + n);
    oq.n += n;
    // the new queries see the question's keys so far, their own chunk's included
    auto& qk = question_k_[static_cast<size_t>(il)];
    auto& qp = question_kpos_[static_cast<size_t>(il)];
    qk.insert(qk.end(), k, k + static_cast<size_t>(n) * static_cast<size_t>(hp.n_head_kv) * static_cast<size_t>(hp.head_dim_k));
    qp.insert(qp.end(), pos, pos + n);
    const size_t at = oq.self_lse.size();
    oq.self_lse.resize(at + static_cast<size_t>(n) * static_cast<size_t>(hp.n_head));
    self_logsumexp(q, pos, n, hp.n_head, hp.n_head_kv, hp.head_dim_k, qk.data(), qp.data(),
                   static_cast<int64_t>(qp.size()), attention_scale(hp), layer_window(hp, il), oq.self_lse.data() + at);
    return;
  }
  if (il == 0 && obs_.refeed_current) reset_refeed();  // the context grows: the re-feed is stale
  if (needs_.window > 0) {
    ObservedQueries& w = obs_.window[static_cast<size_t>(il)];
    const int64_t keep_new = std::min<int64_t>(n, needs_.window);
    const int64_t skip = n - keep_new;
    w.q.insert(w.q.end(), q + static_cast<size_t>(skip) * row, q + static_cast<size_t>(n) * row);
    w.pos.insert(w.pos.end(), pos + skip, pos + n);
    w.n += keep_new;
    if (w.n > needs_.window) {
      const int64_t drop = w.n - needs_.window;
      w.q.erase(w.q.begin(), w.q.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(drop) * row));
      w.pos.erase(w.pos.begin(), w.pos.begin() + static_cast<std::ptrdiff_t>(drop));
      w.n = needs_.window;
    }
  }
  if (!accumulate_) {  // keep the per-token rows aligned with the cache, add no attention
    const int nkv = hp.n_head_kv;
    const size_t g = static_cast<size_t>(hp.n_head / hp.n_head_kv), nu = static_cast<size_t>(n);
    for (int ih = 0; ih < nkv; ++ih) {
      const size_t at = static_cast<size_t>(il * nkv + ih);
      if (needs_.cum_attn) {
        obs_.cum_attn[at].resize(obs_.cum_attn[at].size() + nu, 0.f);
        obs_.cum_count[at].resize(obs_.cum_count[at].size() + nu, 0.f);
      }
      if (needs_.task_attn) {
        obs_.task_max[at].resize(obs_.task_max[at].size() + nu * g, 0.f);
        obs_.task_sum[at].resize(obs_.task_sum[at].size() + nu * g, 0.f);
      }
    }
    return;
  }
  if (needs_.cum_attn) accumulate_attention(il, n, q, k, pos);
  if (needs_.task_attn) accumulate_task_attention(il, n, q, k, pos);
  (void)v;
}

namespace {

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

}  // namespace

// Task-causal KVCompose (eq. 14 online): the chunk's queries attend over the stored tokens
// plus the chunk's own keys (appended to the cache only after this call; used as forward
// computed them, f32, exactly as accumulate_attention does), softmax over each query's visible
// tokens, folded into the running max and sum of each (token, query head). Per kv head, the
// attention runs through attention_max_sum (sgemm logits, rows and columns on the pool); memory
// O(group · n · (n_stored + n)) for one head at a time, nothing kept but the accumulators.
void PressObserver::accumulate_task_attention(int il, int64_t n, const float* q, const float* k, const int32_t* pos) {
  const HParams& hp = model_.hparams();
  const int nkv = hp.n_head_kv, g = hp.n_head / hp.n_head_kv, d = hp.head_dim_k;
  const size_t gu = static_cast<size_t>(g);
  const int window = layer_window(hp, il);
  const float scale = attention_scale(hp);
  std::vector<float> kk;
  std::vector<int32_t> kp;
  for (int ih = 0; ih < nkv; ++ih) {
    auto& amax = obs_.task_max[static_cast<size_t>(il * nkv + ih)];
    auto& asum = obs_.task_sum[static_cast<size_t>(il * nkv + ih)];
    cache_.read_head(il, ih, &kk, nullptr, &kp);
    const int64_t n_old = static_cast<int64_t>(kp.size());
    KVTRIM_CHECK(amax.size() == static_cast<size_t>(n_old) * gu,
                 "observer: task attention of layer %d head %d covers %zu tokens, the cache holds %lld", il, ih,
                 amax.size() / gu, static_cast<long long>(n_old));
    append_chunk_keys(k, pos, n, nkv, ih, d, &kk, &kp);
    const int64_t m = n_old + n;
    amax.resize(static_cast<size_t>(m) * gu, 0.f);
    asum.resize(static_cast<size_t>(m) * gu, 0.f);
    attention_max_sum(q, pos, n, hp.n_head, ih, g, d, kk.data(), kp.data(), m, scale, window, amax.data(),
                      asum.data(), pool_);
  }
  auto& tp = obs_.task_pos[static_cast<size_t>(il)];
  tp.insert(tp.end(), pos, pos + n);
}

// A re-feed chunk (start_refeed, begin_refeed): per kv head, the stored keys the mode lets the
// chunk see plus the chunk's own, through the same pooled sgemm + softmax as the task
// attention; only the stored context's rows (positions < n_context) are kept.
void PressObserver::refeed_scores(int il, int64_t n, const float* q, const float* k, const int32_t* pos) {
  const HParams& hp = model_.hparams();
  const int nkv = hp.n_head_kv, g = hp.n_head / hp.n_head_kv, d = hp.head_dim_k;
  const size_t gu = static_cast<size_t>(g);
  const int window = layer_window(hp, il);
  const float scale = attention_scale(hp);
  const bool kvzip = refeed_mode_ == RefeedMode::kKvzip;
  std::vector<float> kk, sk, amax, asum;
  std::vector<int32_t> kp, sp, src;  // src: the stored row of each selected key (-1: not context)
  for (int ih = 0; ih < nkv; ++ih) {
    const size_t at = static_cast<size_t>(il * nkv + ih);
    cache_.read_head(il, ih, &kk, nullptr, &kp);
    const size_t n_old = kp.size();
    const size_t n_rows = kvzip ? obs_.kvzip[at].size() : obs_.refeed_max[at].size() / gu;
    // the context's rows are the stored tokens before the re-feed's own (positions < n_context)
    size_t n_ctx_rows = 0;
    while (n_ctx_rows < n_old && kp[n_ctx_rows] < refeed_n_past_) ++n_ctx_rows;
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
        const bool context = p < refeed_n_past_;
        if (context && !(p < std::min(refeed_sinks_, refeed_lo_) || (p >= refeed_lo_ && p < refeed_hi_))) continue;
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
    attention_max_sum(q, pos, n, hp.n_head, ih, g, d, keys.data(), kpos.data(), m, scale, window, amax.data(),
                      kvzip ? nullptr : asum.data(), pool_);
    for (size_t j = 0; j < static_cast<size_t>(m); ++j) {
      const int32_t t = src[j];
      if (t < 0) continue;
      const size_t r = static_cast<size_t>(t);
      if (kvzip) {
        // KVzip: the max over the group too; the chunk's span only (the sinks are scored 1)
        if (kpos[j] < refeed_lo_ || kpos[j] >= refeed_hi_) continue;
        float best = 0.f;
        for (size_t gi = 0; gi < gu; ++gi) best = std::max(best, amax[j * gu + gi]);
        obs_.kvzip[at][r] = std::max(obs_.kvzip[at][r], best);
      } else {
        for (size_t gi = 0; gi < gu; ++gi) {
          float& mx = obs_.refeed_max[at][r * gu + gi];
          mx = std::max(mx, amax[j * gu + gi]);
          obs_.refeed_sum[at][r * gu + gi] += asum[j * gu + gi];
        }
      }
    }
  }
  if (!kvzip) obs_.refeed_m[static_cast<size_t>(il)] += n;
}

// H2O: attention of the chunk's queries over the stored tokens plus the chunk's own keys
// (masked causally and by the sliding window), summed over the GQA group into each token's
// cumulative attention; cum_count counts the queries that could see the token. One kv head
// at a time through attention_max_sum's pooled sgemm + softmax (the same code as the task
// attention above): memory O(group · n · (n_stored + n)), never n² for every layer.
void PressObserver::accumulate_attention(int il, int64_t n, const float* q, const float* k, const int32_t* pos) {
  const HParams& hp = model_.hparams();
  const int nkv = hp.n_head_kv, g = hp.n_head / hp.n_head_kv, d = hp.head_dim_k;
  const size_t gu = static_cast<size_t>(g);
  const int window = layer_window(hp, il);
  const float scale = attention_scale(hp);
  std::vector<float> kk, tsum;
  std::vector<int32_t> kp;
  for (int ih = 0; ih < nkv; ++ih) {
    auto& acc = obs_.cum_attn[static_cast<size_t>(il * nkv + ih)];
    auto& cnt = obs_.cum_count[static_cast<size_t>(il * nkv + ih)];
    cache_.read_head(il, ih, &kk, nullptr, &kp);
    const int64_t n_old = static_cast<int64_t>(kp.size());
    KVTRIM_CHECK(static_cast<int64_t>(acc.size()) == n_old,
                 "observer: cumulative attention of layer %d head %d covers %zu tokens, the cache holds %lld", il, ih,
                 acc.size(), static_cast<long long>(n_old));
    append_chunk_keys(k, pos, n, nkv, ih, d, &kk, &kp);
    const int64_t m = n_old + n;
    acc.resize(static_cast<size_t>(m), 0.f);
    cnt.resize(static_cast<size_t>(m), 0.f);
    tsum.assign(static_cast<size_t>(m) * gu, 0.f);
    attention_max_sum(q, pos, n, hp.n_head, ih, g, d, kk.data(), kp.data(), m, scale, window, nullptr,
                      tsum.data(), pool_);
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

void PressObserver::after_append(int il, KvCache& cache) {
  if (!hook_press_ || !hooks_ || question_mode_ || refeed_mode_ != RefeedMode::kOff) return;
  PressContext ctx(cache, model_.hparams(), &obs_, pool_);
  ctx.set_model(&model_);
  ctx.set_new_from(cache.n_past());  // the engine advances n_past only after the whole forward call
  const CompressionPlan plan = hook_press_->plan_after_append(ctx, il);
  if (!plan_is_planned(plan)) return;
  cache.apply(plan);
  on_apply(plan);
}

void PressObserver::on_apply(const CompressionPlan& plan) {
  // Rows of `width` floats per stored token: keep the rows of the kept tokens.
  auto keep_rows = [](std::vector<float>* vec, const HeadPlan& h, size_t width) {
    std::vector<float> out(h.keep.size() * width);
    for (size_t j = 0; j < h.keep.size(); ++j) {
      const size_t src = static_cast<size_t>(h.keep[j]) * width;
      std::copy(vec->begin() + static_cast<std::ptrdiff_t>(src), vec->begin() + static_cast<std::ptrdiff_t>(src + width),
                out.begin() + static_cast<std::ptrdiff_t>(j * width));
    }
    *vec = std::move(out);
  };
  const size_t g = static_cast<size_t>(model_.hparams().n_head / model_.hparams().n_head_kv);
  for (size_t i = 0; i < plan.heads.size(); ++i) {
    const HeadPlan& h = plan.heads[i];
    if (h.keep_all) continue;
    if (!obs_.cum_attn.empty()) {
      keep_rows(&obs_.cum_attn[i], h, 1);
      keep_rows(&obs_.cum_count[i], h, 1);
    }
    if (!obs_.task_max.empty()) {
      keep_rows(&obs_.task_max[i], h, g);
      keep_rows(&obs_.task_sum[i], h, g);
    }
    if (!obs_.refeed_max.empty()) {
      keep_rows(&obs_.refeed_max[i], h, g);
      keep_rows(&obs_.refeed_sum[i], h, g);
    }
    if (!obs_.kvzip.empty()) keep_rows(&obs_.kvzip[i], h, 1);
  }
}

void PressObserver::on_truncate(int32_t pos) {
  for (auto& w : obs_.window) {
    const size_t row = w.n > 0 ? w.q.size() / static_cast<size_t>(w.n) : 0;
    int64_t keep = 0;
    while (keep < w.n && w.pos[static_cast<size_t>(keep)] < pos) ++keep;
    w.n = keep;
    w.pos.resize(static_cast<size_t>(keep));
    w.q.resize(static_cast<size_t>(keep) * row);
  }
  if (!obs_.cum_attn.empty()) {
    const int nkv = model_.hparams().n_head_kv;
    for (size_t i = 0; i < obs_.cum_attn.size(); ++i) {
      const int il = static_cast<int>(i) / nkv, ih = static_cast<int>(i) % nkv;
      const size_t n = static_cast<size_t>(cache_.n_tokens(il, ih));
      obs_.cum_attn[i].resize(n);
      obs_.cum_count[i].resize(n);
    }
  }
  if (!obs_.task_max.empty()) {
    // The truncated tokens' rows go; the queries at positions >= pos no longer count in M
    // (what they added to the max / sum of earlier tokens cannot be taken back, as for H2O).
    const int nkv = model_.hparams().n_head_kv;
    const size_t g = static_cast<size_t>(model_.hparams().n_head / nkv);
    for (size_t i = 0; i < obs_.task_max.size(); ++i) {
      const int il = static_cast<int>(i) / nkv, ih = static_cast<int>(i) % nkv;
      const size_t n = static_cast<size_t>(cache_.n_tokens(il, ih)) * g;
      obs_.task_max[i].resize(n);
      obs_.task_sum[i].resize(n);
    }
    for (auto& tp : obs_.task_pos) tp.erase(std::remove_if(tp.begin(), tp.end(), [pos](int32_t p) { return p >= pos; }), tp.end());
  }
  // The re-feed's chunks are truncated away after each one (their tokens never had rows); a
  // truncation into the context itself makes the re-feed stale.
  if (obs_.refeed_current && refeed_mode_ == RefeedMode::kOff && pos < refeed_n_past_) {
    reset_refeed();  // the re-fed context was longer than what is left
  } else if (obs_.refeed_current && refeed_mode_ == RefeedMode::kOff) {
    const int nkv = model_.hparams().n_head_kv;
    const size_t g = static_cast<size_t>(model_.hparams().n_head / nkv);
    for (int il = 0; il < model_.hparams().n_layer && obs_.refeed_current; ++il)
      for (int ih = 0; ih < nkv; ++ih) {
        const size_t at = static_cast<size_t>(il * nkv + ih), n = static_cast<size_t>(cache_.n_tokens(il, ih));
        if ((!obs_.refeed_max.empty() && obs_.refeed_max[at].size() != n * g) ||
            (!obs_.kvzip.empty() && obs_.kvzip[at].size() != n)) {
          reset_refeed();
          break;
        }
      }
  }
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
  const CompressionPlan plan = press.plan(ctx);
  if (plan_is_planned(plan)) {  // token selections, and basis / channel plans that keep every token
    cache.apply(plan);
    if (obs) obs->on_apply(plan);
  }
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
