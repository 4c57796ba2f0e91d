// KVCompose, the pure maths: see kvcompose_core.h (equation numbers refer to
// papers/kvcompose.txt).
#include "press/token/kvcompose_core.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "press/attention_stats.h"
#include "core/ggml_type.h"
#include "core/thread_pool.h"

namespace kvtrim::kvcompose {

const char* agg_name(Agg a) { return a == Agg::kMax ? "max" : "mean"; }

void accumulate_task_attention(const float* q, const int32_t* q_pos, int64_t n_q, int n_head,
                               int ih, int group, int head_dim, const float* k,
                               const int32_t* k_pos, int64_t n_k, float scale, int window,
                               Agg agg_task, float* acc, ThreadPool* pool, const float* extra_lse) {
  attention_max_sum(q, q_pos, n_q, n_head, ih, group, head_dim, k, k_pos, n_k, scale, window,
                    agg_task == Agg::kMax ? acc : nullptr, agg_task == Agg::kMean ? acc : nullptr, pool, extra_lse);
}

void group_scores(const float* acc, int64_t n_tok, int group, int64_t n_task, Agg agg_task,
                  Agg agg_group, const float* w, float* out) {
  const double task_div = agg_task == Agg::kMean && n_task > 0 ? static_cast<double>(n_task) : 1.0;
  for (int64_t c = 0; c < n_tok; ++c) {
    double r = agg_group == Agg::kMax ? -INFINITY : 0.0;
    for (int g = 0; g < group; ++g) {
      const size_t j = static_cast<size_t>(c) * static_cast<size_t>(group) + static_cast<size_t>(g);
      double v = static_cast<double>(acc[j]) / task_div;  // eq. 14 (mean: / M)
      if (w) v *= static_cast<double>(w[j]);             // appendix A.1.3 weight
      r = agg_group == Agg::kMax ? std::max(r, v) : r + v;
    }
    if (agg_group == Agg::kMean) r /= group;  // eq. 15
    out[c] = static_cast<float>(r);
  }
}

void add_head_mean(std::vector<std::vector<float>>* s, const std::vector<std::vector<int32_t>>& pos) {
  const size_t n_head_kv = s->size();
  KVTRIM_ASSERT(pos.size() == n_head_kv);
  if (n_head_kv == 0) return;
  bool aligned = true;
  for (size_t ih = 0; ih < n_head_kv; ++ih) {
    KVTRIM_ASSERT((*s)[ih].size() == pos[ih].size());
    if (pos[ih] != pos[0]) aligned = false;
  }
  const double inv = 1.0 / static_cast<double>(n_head_kv);
  std::vector<std::vector<double>> mean(n_head_kv);
  for (size_t ih = 0; ih < n_head_kv; ++ih) {
    const size_t n = pos[ih].size();
    mean[ih].assign(n, 0.0);
    if (aligned && ih > 0) continue;  // every head shares head 0's means
    for (size_t i = 0; i < n_head_kv; ++i) {
      for (size_t c = 0; c < n; ++c) {
        size_t j = c;
        if (!aligned) {
          auto it = std::lower_bound(pos[i].begin(), pos[i].end(), pos[ih][c]);
          if (it == pos[i].end() || *it != pos[ih][c]) continue;  // head i does not hold it
          j = static_cast<size_t>(it - pos[i].begin());
        }
        const float v = (*s)[i][j];
        if (std::isfinite(v)) mean[ih][c] += static_cast<double>(v) * inv;
      }
    }
  }
  for (size_t ih = 0; ih < n_head_kv; ++ih) {
    const std::vector<double>& m = aligned ? mean[0] : mean[ih];
    for (size_t c = 0; c < (*s)[ih].size(); ++c) {
      float& v = (*s)[ih][c];
      if (std::isfinite(v)) v = static_cast<float>(static_cast<double>(v) + m[c]);  // eq. 16
    }
  }
}

namespace {

// Candidates of one head sorted by score descending, ties: lower index first (eq. 17).
std::vector<int32_t> argsort_desc(const std::vector<float>& s) {
  std::vector<int32_t> idx;
  idx.reserve(s.size());
  for (size_t c = 0; c < s.size(); ++c) {
    if (s[c] != -INFINITY) idx.push_back(static_cast<int32_t>(c));
  }
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)];
  });
  return idx;
}

// One pool entry: a score and a key that orders ties (lower key first).
struct Entry {
  float v;
  uint32_t a;  // layer (structured) / layer * n_head_kv + head (unstructured)
  int32_t b;   // rank k (structured) / token index (unstructured)
};
bool entry_before(const Entry& x, const Entry& y) {
  if (x.v != y.v) return x.v > y.v;
  if (x.a != y.a) return x.a < y.a;
  return x.b < y.b;
}

// Keeps the first k entries of `pool` in entry_before order (partially reordered in place).
void top_entries(std::vector<Entry>* pool, int64_t k) {
  k = std::clamp<int64_t>(k, 0, static_cast<int64_t>(pool->size()));
  std::nth_element(pool->begin(), pool->begin() + k, pool->end(), entry_before);
  pool->resize(static_cast<size_t>(k));
}

}  // namespace

Selection select_structured(const std::vector<std::vector<std::vector<float>>>& s, Agg agg_head,
                            int64_t b_total, const StructuredOptions& opt) {
  const size_t n_layer = s.size();
  const size_t n_head_kv = n_layer ? s[0].size() : 0;
  Selection out;
  out.keep.resize(n_layer * n_head_kv);
  out.n_keep_layer.assign(n_layer, 0);
  std::vector<std::vector<std::vector<int32_t>>> idx(n_layer);
  std::vector<std::vector<double>> comp(n_layer);  // I[il, k]
  for (size_t il = 0; il < n_layer; ++il) {
    KVTRIM_ASSERT(s[il].size() == n_head_kv);
    size_t max_rank = 0;
    for (size_t ih = 0; ih < n_head_kv; ++ih) {
      idx[il].push_back(argsort_desc(s[il][ih]));  // eq. 17
      max_rank = std::max(max_rank, idx[il][ih].size());
    }
    for (size_t k = 0; k < max_rank; ++k) {
      // eqs. 18-19: I[il, k] = Agg_head of each head's k-th best score
      double r = agg_head == Agg::kMax ? -INFINITY : 0.0;
      int n = 0;
      for (size_t ih = 0; ih < n_head_kv; ++ih) {
        if (k >= idx[il][ih].size()) continue;
        const double v = s[il][ih][static_cast<size_t>(idx[il][ih][k])];
        r = agg_head == Agg::kMax ? std::max(r, v) : r + v;
        ++n;
      }
      if (agg_head == Agg::kMean) r /= n;
      comp[il].push_back(r);
    }
  }
  // The reference implementation's layer-0 boost: layer 0's k-th composite score becomes the
  // largest k-th composite score of any layer, so layer 0 keeps at least as many as any layer.
  if (opt.layer0_max && n_layer > 0)
    for (size_t k = 0; k < comp[0].size(); ++k)
      for (size_t il = 1; il < n_layer; ++il)
        if (k < comp[il].size()) comp[0][k] = std::max(comp[0][k], comp[il][k]);
  std::vector<Entry> pool;
  int64_t n_forced = 0;
  const size_t forced_ranks = static_cast<size_t>(std::max<int64_t>(1, opt.keep_min));
  for (size_t il = 0; il < n_layer; ++il) {
    for (size_t k = 0; k < comp[il].size(); ++k) {
      if (k < forced_ranks) {  // a head never goes empty; keep_min: the reference's lower bound
        ++out.n_keep_layer[il];
        ++n_forced;
      } else {
        pool.push_back({static_cast<float>(comp[il][k]), static_cast<uint32_t>(il), static_cast<int32_t>(k)});  // eq. 20
      }
    }
  }
  top_entries(&pool, b_total - n_forced);  // eq. 22
  for (const Entry& e : pool) ++out.n_keep_layer[e.a];
  for (size_t il = 0; il < n_layer; ++il) {
    for (size_t ih = 0; ih < n_head_kv; ++ih) {  // eqs. 23-24
      const std::vector<int32_t>& order = idx[il][ih];
      const size_t n = std::min(order.size(), static_cast<size_t>(out.n_keep_layer[il]));
      std::vector<int32_t>& keep = out.keep[il * n_head_kv + ih];
      keep.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
      std::sort(keep.begin(), keep.end());
    }
  }
  return out;
}

Selection select_unstructured(const std::vector<std::vector<std::vector<float>>>& s,
                              int64_t b_entries) {
  const size_t n_layer = s.size();
  const size_t n_head_kv = n_layer ? s[0].size() : 0;
  Selection out;
  out.keep.resize(n_layer * n_head_kv);
  out.n_keep_layer.assign(n_layer, 0);
  std::vector<Entry> pool;
  int64_t n_forced = 0;
  for (size_t il = 0; il < n_layer; ++il) {
    KVTRIM_ASSERT(s[il].size() == n_head_kv);
    for (size_t ih = 0; ih < n_head_kv; ++ih) {
      const std::vector<float>& sh = s[il][ih];
      const uint32_t a = static_cast<uint32_t>(il * n_head_kv + ih);
      int32_t best = -1;
      for (size_t c = 0; c < sh.size(); ++c) {
        if (sh[c] == -INFINITY) continue;
        if (best < 0 || sh[c] > sh[static_cast<size_t>(best)]) best = static_cast<int32_t>(c);
      }
      if (best < 0) continue;
      out.keep[a].push_back(best);  // a head never goes empty
      ++n_forced;
      for (size_t c = 0; c < sh.size(); ++c) {
        if (sh[c] == -INFINITY || static_cast<int32_t>(c) == best) continue;
        pool.push_back({sh[c], a, static_cast<int32_t>(c)});
      }
    }
  }
  top_entries(&pool, b_entries - n_forced);
  for (const Entry& e : pool) out.keep[e.a].push_back(e.b);
  for (size_t il = 0; il < n_layer; ++il) {
    int64_t tot = 0;
    for (size_t ih = 0; ih < n_head_kv; ++ih) {
      std::vector<int32_t>& keep = out.keep[il * n_head_kv + ih];
      std::sort(keep.begin(), keep.end());
      tot += static_cast<int64_t>(keep.size());
    }
    out.n_keep_layer[il] = n_head_kv ? tot / static_cast<int64_t>(n_head_kv) : 0;
  }
  return out;
}

int64_t budget_from_ratio(double ratio, int64_t n) {
  return static_cast<int64_t>(static_cast<double>(n) * (1.0 - ratio));
}

std::vector<double> vo_gram(const WeightView& wo, int n_head, int head_dim_v) {
  const size_t dv = static_cast<size_t>(head_dim_v);
  KVTRIM_CHECK(wo.data != nullptr && wo.n_cols == static_cast<int64_t>(n_head) * head_dim_v,
               "kvcompose vo-norm: W_O has %lld columns, expected n_head * head_dim_v = %d",
               static_cast<long long>(wo.n_cols), n_head * head_dim_v);
  std::vector<double> gram(static_cast<size_t>(n_head) * dv * dv, 0.0);
  std::vector<float> row(static_cast<size_t>(wo.n_cols));
  for (int64_t r = 0; r < wo.n_rows; ++r) {
    get_row(wo, r, row.data());
    for (size_t h = 0; h < static_cast<size_t>(n_head); ++h) {
      const float* x = row.data() + h * dv;
      double* g = gram.data() + h * dv * dv;
      for (size_t a = 0; a < dv; ++a) {
        const double xa = x[a];
        double* ga = g + a * dv;
        for (size_t b = 0; b < dv; ++b) ga[b] += xa * static_cast<double>(x[b]);
      }
    }
  }
  return gram;
}

float vo_norm(const double* gram, const float* v, int head_dim_v) {
  const size_t dv = static_cast<size_t>(head_dim_v);
  double q = 0;
  for (size_t a = 0; a < dv; ++a) {
    double t = 0;
    for (size_t b = 0; b < dv; ++b) t += gram[a * dv + b] * static_cast<double>(v[b]);
    q += static_cast<double>(v[a]) * t;
  }
  return static_cast<float>(std::sqrt(std::max(q, 0.0)));
}

float v_norm(const float* v, int head_dim_v) {
  double q = 0;
  for (int i = 0; i < head_dim_v; ++i) q += static_cast<double>(v[i]) * v[i];
  return static_cast<float>(std::sqrt(q));
}

}  // namespace kvtrim::kvcompose
