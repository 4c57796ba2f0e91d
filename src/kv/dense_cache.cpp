// The uncompressed KV cache: per (layer, kv head) contiguous K [n_tok, head_dim_k] (stored
// in transposed tiles of kKeyTile tokens, see attn_kernels.h) and V [n_tok, head_dim_v]
// (row-major) arrays in f16 or f32, with the layer's original positions
// (increasing; shared by its kv heads, so stored once per layer). Capacity grows
// geometrically (at least kGrowTokens at a time, never past n_ctx); bytes() counts only the
// stored tokens.
//
// Attention (flash-decoding style): the keys a query sees form one contiguous run of the
// sorted positions (causal + sliding window), found by binary search. Work items are
// (query token, kv head, split of the run); an item serves all n_head / n_head_kv query
// heads of its group so each K/V row is read once per group, walks its run in blocks of
// kBlock tokens with an online softmax (running max m, sum l, unnormalised accumulator),
// and the splits of a run are merged at the end: out = Σ_s e^{m_s-M} acc_s / Σ_s e^{m_s-M} l_s.
// Splitting the run keeps every thread busy during decode (n_q = 1, few kv heads).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kv/attn_kernels.h"
#include "kv/kv_cache.h"

namespace kvtrim {
namespace {

constexpr int64_t kGrowTokens = 256;  // minimum capacity step (tokens)
constexpr int64_t kBlock = 256;       // tokens per score block inside a work item
constexpr int64_t kMinSplit = 512;    // a decode split covers at least this many tokens

class DenseCache final : public KvCache {
 public:
  explicit DenseCache(KvCacheConfig cfg);

  void append(int il, int64_t n, const float* k, const float* v, const int32_t* pos) override;
  void attend(int il, int64_t n_q, const float* q, const int32_t* q_pos, const AttnParams& p,
              float* out, ThreadPool* pool) const override;
  int64_t n_tokens(int il, int ih) const override;
  // The dense cache keeps every token: it has no compressed layout to apply a plan to.
  void apply(const CompressionPlan&) override {
    fail("the dense KV cache cannot apply a compression plan (use a compressed cache)");
  }
  void read_head(int il, int ih, std::vector<float>* k, std::vector<float>* v,
                 std::vector<int32_t>* pos) const override;
  KvBytes bytes() const override;
  void truncate(int32_t pos) override;
  std::string describe() const override;

 private:
  struct Layer {
    int64_t n_tok = 0;         // tokens stored
    int64_t cap = 0;           // tokens allocated per head
    std::vector<int32_t> pos;  // [n_tok] original positions, strictly increasing
    std::vector<std::vector<uint8_t>>
        k;  // per kv head: [cap / kKeyTile, head_dim_k, kKeyTile] in dtype
    std::vector<std::vector<uint8_t>> v;  // per kv head: [cap, head_dim_v] in dtype
  };

  // One work item: query iq against tokens [t0, t1) of kv head ihk for the group's n_group
  // query heads. acc: [n_group, head_dim_v] unnormalised, m / l: [n_group] running max / sum.
  template <typename T>
  void attend_range(const Layer& L, int ihk, int n_group, const float* q_group, float scale,
                    float softcap, int64_t t0, int64_t t1, float* acc, float* m, float* l) const;
  void grow(Layer& L, int64_t need);

  size_t esize_;  // bytes per stored element
  std::vector<Layer> layers_;
};

DenseCache::DenseCache(KvCacheConfig cfg) : KvCache(std::move(cfg)) {
  KVTRIM_CHECK(cfg_.n_layer > 0 && cfg_.n_head_kv > 0 && cfg_.head_dim_k > 0 && cfg_.head_dim_v > 0,
               "invalid KV cache config: n_layer %d, n_head_kv %d, head_dim_k %d, head_dim_v %d",
               cfg_.n_layer, cfg_.n_head_kv, cfg_.head_dim_k, cfg_.head_dim_v);
  KVTRIM_CHECK(cfg_.n_ctx > 0, "invalid KV cache config: n_ctx %lld",
               static_cast<long long>(cfg_.n_ctx));
  KVTRIM_CHECK(
      cfg_.sliding_window.empty() || static_cast<int>(cfg_.sliding_window.size()) == cfg_.n_layer,
      "invalid KV cache config: %zu sliding windows for %d layers", cfg_.sliding_window.size(),
      cfg_.n_layer);
  KVTRIM_CHECK(cfg_.dtype == KvDtype::kF16 || cfg_.dtype == KvDtype::kF32,
               "the dense KV cache stores f16 or f32, not %s", kv_dtype_name(cfg_.dtype));
  esize_ = cfg_.dtype == KvDtype::kF16 ? sizeof(uint16_t) : sizeof(float);
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (Layer& L : layers_) {
    L.k.resize(static_cast<size_t>(cfg_.n_head_kv));
    L.v.resize(static_cast<size_t>(cfg_.n_head_kv));
  }
}

void DenseCache::grow(Layer& L, int64_t need) {
  if (need <= L.cap) return;
  int64_t cap = std::max({need, 2 * L.cap, kGrowTokens});
  cap = std::min(cap, std::max(need, cfg_.n_ctx));
  cap = (cap + kv::kKeyTile - 1) / kv::kKeyTile * kv::kKeyTile;  // whole key tiles
  for (int ih = 0; ih < cfg_.n_head_kv; ++ih) {
    L.k[ih].resize(static_cast<size_t>(cap * cfg_.head_dim_k) * esize_);
    L.v[ih].resize(static_cast<size_t>(cap * cfg_.head_dim_v) * esize_);
  }
  L.pos.reserve(static_cast<size_t>(cap));
  L.cap = cap;
}

void DenseCache::append(int il, int64_t n, const float* k, const float* v, const int32_t* pos) {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer, "KV cache: layer %d out of range [0, %d)", il,
               cfg_.n_layer);
  if (n <= 0) return;
  Layer& L = layers_[il];
  int32_t last = L.n_tok > 0 ? L.pos[L.n_tok - 1] : -1;
  for (int64_t j = 0; j < n; ++j) {
    KVTRIM_CHECK(
        pos[j] > last,
        "KV cache layer %d: position %d appended after position %d (positions must increase)", il,
        pos[j], last);
    last = pos[j];
  }
  KVTRIM_CHECK(last < cfg_.n_ctx,
               "KV cache: position %d is beyond the context limit of %lld tokens", last,
               static_cast<long long>(cfg_.n_ctx));
  grow(L, L.n_tok + n);
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v, nkv = cfg_.n_head_kv;
  for (int ih = 0; ih < nkv; ++ih) {
    for (int64_t j = 0; j < n; ++j) {
      const float* ks = k + (j * nkv + ih) * dk;  // k: [n, n_head_kv, head_dim_k]
      const float* vs = v + (j * nkv + ih) * dv;  // v: [n, n_head_kv, head_dim_v]
      const int64_t row = L.n_tok + j;
      if (cfg_.dtype == KvDtype::kF16) {
        uint16_t* kd = reinterpret_cast<uint16_t*>(L.k[ih].data());
        for (int i = 0; i < dk; ++i) kd[kv::key_tile_index(row, i, dk)] = fp32_to_fp16(ks[i]);
        kv::f32_to_f16_row(vs, reinterpret_cast<uint16_t*>(L.v[ih].data()) + row * dv, dv);
      } else {
        float* kd = reinterpret_cast<float*>(L.k[ih].data());
        for (int i = 0; i < dk; ++i) kd[kv::key_tile_index(row, i, dk)] = ks[i];
        std::copy(vs, vs + dv, reinterpret_cast<float*>(L.v[ih].data()) + row * dv);
      }
    }
  }
  L.pos.insert(L.pos.end(), pos, pos + n);
  L.n_tok += n;
}

template <typename T>
void DenseCache::attend_range(const Layer& L, int ihk, int n_group, const float* q_group,
                              float scale, float softcap, int64_t t0, int64_t t1, float* acc,
                              float* m, float* l) const {
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  thread_local std::vector<float> qs, s;  // scaled queries [n_group, dk]; scores [n_group, kBlock]
  qs.resize(static_cast<size_t>(n_group) * dk);
  s.resize(static_cast<size_t>(n_group) * kBlock);
  for (int64_t i = 0; i < static_cast<int64_t>(n_group) * dk; ++i) qs[i] = q_group[i] * scale;
  std::fill(acc, acc + static_cast<int64_t>(n_group) * dv, 0.f);
  for (int g = 0; g < n_group; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0;
  }
  const T* K = reinterpret_cast<const T*>(L.k[ihk].data());
  const T* V = reinterpret_cast<const T*>(L.v[ihk].data());
  for (int64_t b = t0; b < t1; b += kBlock) {
    const int64_t nb = std::min(kBlock, t1 - b);
    // s[g, t] = scale · q_g · k_t
    if constexpr (sizeof(T) == 2) {
      kv::attn_scores_f16(qs.data(), n_group, dk, K, b, nb, s.data(), kBlock);
    } else {
      kv::attn_scores_f32(qs.data(), n_group, dk, K, b, nb, s.data(), kBlock);
    }
    for (int g = 0; g < n_group; ++g) {
      float* sg = s.data() + static_cast<int64_t>(g) * kBlock;
      if (softcap > 0) {
        for (int64_t t = 0; t < nb; ++t) sg[t] = softcap * std::tanh(sg[t] / softcap);
      }
      // online softmax: rescale what was accumulated when the running max grows
      const float mb = *std::max_element(sg, sg + nb);
      if (mb > m[g]) {
        const float f = std::isinf(m[g]) ? 0.f : std::exp(m[g] - mb);
        l[g] *= f;
        float* ag = acc + static_cast<int64_t>(g) * dv;
        for (int i = 0; i < dv; ++i) ag[i] *= f;
        m[g] = mb;
      }
      l[g] += kv::exp_sub_sum(sg, nb, m[g]);  // sg[t] = e^{s_t - m}
    }
    // acc_g += Σ_t p[g, t] v_t
    if constexpr (sizeof(T) == 2) {
      kv::attn_accum_f16(s.data(), n_group, kBlock, V + b * dv, nb, dv, acc);
    } else {
      kv::attn_accum_f32(s.data(), n_group, kBlock, V + b * dv, nb, dv, acc);
    }
  }
}

void DenseCache::attend(int il, int64_t n_q, const float* q, const int32_t* q_pos,
                        const AttnParams& p, float* out, ThreadPool* pool) const {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer, "KV cache: layer %d out of range [0, %d)", il,
               cfg_.n_layer);
  KVTRIM_CHECK(p.n_head > 0 && p.n_head % cfg_.n_head_kv == 0,
               "attention: n_head %d is not a positive multiple of n_head_kv %d", p.n_head,
               cfg_.n_head_kv);
  if (n_q <= 0) return;
  const Layer& L = layers_[il];
  const int nkv = cfg_.n_head_kv, dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  const int n_group = p.n_head / nkv;

  // Visible run [lo, hi) of each query: k_pos <= q_pos and q_pos - k_pos < window.
  // (thread_local scratch is only touched through plain pointers inside the pool's lambda:
  // a thread_local named there would be the worker's own instance.)
  thread_local std::vector<int64_t> lo_buf, hi_buf;
  lo_buf.resize(static_cast<size_t>(n_q));
  hi_buf.resize(static_cast<size_t>(n_q));
  int64_t* lo = lo_buf.data();
  int64_t* hi = hi_buf.data();
  int64_t max_len = 0;
  const int32_t* pb = L.pos.data();
  const int32_t* pe = pb + L.n_tok;
  for (int64_t iq = 0; iq < n_q; ++iq) {
    hi[iq] = std::upper_bound(pb, pe, q_pos[iq]) - pb;
    lo[iq] =
        p.sliding_window > 0 ? std::lower_bound(pb, pe, q_pos[iq] - p.sliding_window + 1) - pb : 0;
    lo[iq] = std::min(lo[iq], hi[iq]);
    max_len = std::max(max_len, hi[iq] - lo[iq]);
  }

  // Split long runs when there are fewer (query, kv head) pairs than threads.
  const int nth = pool ? pool->n_threads() : 1;
  const int64_t n_base = n_q * nkv;
  int64_t n_split = 1;
  if (n_base < 2 * nth) {
    n_split = std::min((2 * nth + n_base - 1) / n_base, std::max<int64_t>(1, max_len / kMinSplit));
  }
  const int64_t part_stride =
      static_cast<int64_t>(n_group) * (dv + 2);  // acc [G, dv], m [G], l [G]
  thread_local std::vector<float> parts;
  parts.resize(static_cast<size_t>(n_base * n_split * part_stride));
  float* parts_data = parts.data();

  auto run_items = [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      const int64_t s = item % n_split;
      const int64_t iq = item / n_split / nkv;
      const int ihk = static_cast<int>(item / n_split % nkv);
      const int64_t len = hi[iq] - lo[iq];
      const int64_t t0 = lo[iq] + len * s / n_split, t1 = lo[iq] + len * (s + 1) / n_split;
      float* part = parts_data + item * part_stride;
      float* acc = part;
      float* m = part + static_cast<int64_t>(n_group) * dv;
      float* l = m + n_group;
      const float* q_group = q + (iq * p.n_head + static_cast<int64_t>(ihk) * n_group) * dk;
      if (cfg_.dtype == KvDtype::kF16) {
        attend_range<uint16_t>(L, ihk, n_group, q_group, p.scale, p.softcap, t0, t1, acc, m, l);
      } else {
        attend_range<float>(L, ihk, n_group, q_group, p.scale, p.softcap, t0, t1, acc, m, l);
      }
    }
  };
  const int64_t n_items = n_base * n_split;
  if (pool && n_items > 1) {
    pool->parallel_for(n_items, run_items);
  } else {
    run_items(0, n_items);
  }

  // Merge the splits of each (query, head): out = Σ_s e^{m_s-M} acc_s / Σ_s e^{m_s-M} l_s.
  for (int64_t iq = 0; iq < n_q; ++iq) {
    for (int ihk = 0; ihk < nkv; ++ihk) {
      for (int g = 0; g < n_group; ++g) {
        float* o = out + (iq * p.n_head + static_cast<int64_t>(ihk) * n_group + g) * dv;
        const int64_t item0 = (iq * nkv + ihk) * n_split;
        float M = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < n_split; ++s) {
          M = std::max(
              M, parts_data[(item0 + s) * part_stride + static_cast<int64_t>(n_group) * dv + g]);
        }
        std::fill(o, o + dv, 0.f);
        if (std::isinf(M)) continue;  // no visible key
        float denom = 0;
        for (int64_t s = 0; s < n_split; ++s) {
          const float* part = parts_data + (item0 + s) * part_stride;
          const float ms = part[static_cast<int64_t>(n_group) * dv + g];
          if (std::isinf(ms)) continue;
          const float f = std::exp(ms - M);
          denom += f * part[static_cast<int64_t>(n_group) * dv + n_group + g];
          const float* a = part + static_cast<int64_t>(g) * dv;
          for (int i = 0; i < dv; ++i) o[i] += f * a[i];
        }
        const float inv = 1.f / denom;
        for (int i = 0; i < dv; ++i) o[i] *= inv;
      }
    }
  }
}

void DenseCache::read_head(int il, int ih, std::vector<float>* k, std::vector<float>* v,
                           std::vector<int32_t>* pos) const {
  const int64_t n = n_tokens(il, ih);  // range-checks (il, ih)
  const Layer& L = layers_[il];
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  const bool f16 = cfg_.dtype == KvDtype::kF16;
  if (k) {
    k->resize(static_cast<size_t>(n * dk));
    for (int64_t t = 0; t < n; ++t)
      for (int i = 0; i < dk; ++i) {
        const int64_t at = kv::key_tile_index(t, i, dk);
        (*k)[static_cast<size_t>(t * dk + i)] =
            f16 ? fp16_to_fp32(reinterpret_cast<const uint16_t*>(L.k[ih].data())[at])
                : reinterpret_cast<const float*>(L.k[ih].data())[at];
      }
  }
  if (v) {
    v->resize(static_cast<size_t>(n * dv));
    for (int64_t j = 0; j < n * dv; ++j)
      (*v)[static_cast<size_t>(j)] = f16 ? fp16_to_fp32(reinterpret_cast<const uint16_t*>(L.v[ih].data())[j])
                                         : reinterpret_cast<const float*>(L.v[ih].data())[j];
  }
  if (pos) pos->assign(L.pos.begin(), L.pos.begin() + n);
}

int64_t DenseCache::n_tokens(int il, int ih) const {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer && ih >= 0 && ih < cfg_.n_head_kv,
               "KV cache: (layer %d, kv head %d) out of range (%d layers, %d kv heads)", il, ih,
               cfg_.n_layer, cfg_.n_head_kv);
  return layers_[il].n_tok;
}

KvBytes DenseCache::bytes() const {
  KvBytes b;
  b.per_layer.resize(layers_.size());
  for (size_t il = 0; il < layers_.size(); ++il) {
    const size_t n = static_cast<size_t>(layers_[il].n_tok);
    const size_t keys = n * static_cast<size_t>(cfg_.n_head_kv * cfg_.head_dim_k) * esize_;
    const size_t values = n * static_cast<size_t>(cfg_.n_head_kv * cfg_.head_dim_v) * esize_;
    const size_t positions = n * sizeof(int32_t);
    b.keys += keys;
    b.values += values;
    b.positions += positions;
    b.per_layer[il] = keys + values + positions;
  }
  return b;
}

void DenseCache::truncate(int32_t pos) {
  KVTRIM_CHECK(pos >= 0, "KV cache: cannot truncate to negative position %d", pos);
  for (Layer& L : layers_) {
    const int64_t keep = std::lower_bound(L.pos.begin(), L.pos.end(), pos) - L.pos.begin();
    L.pos.resize(static_cast<size_t>(keep));
    L.n_tok = keep;
  }
  n_past_ = std::min(n_past_, pos);
}

std::string DenseCache::describe() const {
  const KvBytes b = bytes();
  return strprintf(
      "dense %s cache: %d layers x %d kv heads, head dims %d/%d, n_ctx %lld, n_past %d, %.2f MiB",
      kv_dtype_name(cfg_.dtype), cfg_.n_layer, cfg_.n_head_kv, cfg_.head_dim_k, cfg_.head_dim_v,
      static_cast<long long>(cfg_.n_ctx), n_past_, static_cast<double>(b.total()) / (1 << 20));
}

}  // namespace

std::unique_ptr<KvCache> make_dense_cache(const KvCacheConfig& cfg) {
  return std::make_unique<DenseCache>(cfg);
}

}  // namespace kvtrim
