// The token cache: the one KV cache implementation for the token and precision axes
// (DESIGN.md §3), used both uncompressed (make_dense_cache) and after token eviction
// (apply). Storage is per (layer, kv head), each head with its own token count:
//  - K [n_tok, head_dim_k] in transposed tiles of kKeyTile tokens (attn_kernels.h),
//  - V [n_tok, head_dim_v] row-major,
// both in cfg.dtype: f32, f16, bf16 or q8 (int8 codes with one f32 scale per stored
// (token, kv head) vector: k_scale / v_scale, symmetric, scale = max|x| / 127, codes
// round-to-nearest-even and clamped to [-127, 127]).
// Original positions (increasing) are stored once per layer while the layer's heads hold
// the same tokens (always true until a plan keeps different tokens in different heads), then
// once per head. Capacity grows geometrically (at least kGrowTokens at a time, never past
// n_ctx) in uninitialised buffers (untouched slack costs no resident memory); bytes()
// counts only the stored tokens. apply() reallocates every planned head to exactly its kept
// tokens (rounded up to a whole key tile), frees the old buffers and, after a large apply,
// returns the freed heap pages to the OS (malloc_trim), so the process's RSS shrinks.
//
// Attention (flash-decoding style): the keys a query sees form one contiguous run of each
// head's sorted positions (causal + sliding window), found by binary search per (query,
// kv head). Work items are (query token, kv head, split of the run); an item serves all
// n_head / n_head_kv query heads of its group so each K/V row is read once per group, walks
// its run in blocks of kBlock tokens with an online softmax (running max m, sum l,
// unnormalised accumulator), and the splits of a run are merged at the end:
// out = Σ_s e^{m_s-M} acc_s / Σ_s e^{m_s-M} l_s. Splitting the run keeps every thread busy
// during decode (n_q = 1, few kv heads). A compressed head is read in place: fewer stored
// tokens is fewer bytes read, with no dense rebuild.
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kv/attn_kernels.h"
#include "kv/kv_cache.h"

namespace kvtrim {
namespace {

constexpr int64_t kGrowTokens = 256;            // minimum capacity step (tokens)
constexpr int64_t kBlock = 256;                 // tokens per score block inside a work item
constexpr int64_t kMinSplit = 512;              // a decode split covers at least this many tokens
constexpr size_t kTrimBytes = size_t{8} << 20;  // malloc_trim after an apply frees this much

// An uninitialised byte buffer: pages are touched (made resident) only when written.
struct Buf {
  std::unique_ptr<uint8_t[]> p;
  size_t n = 0;
  void alloc(size_t bytes) {
    p = bytes ? std::make_unique_for_overwrite<uint8_t[]>(bytes) : nullptr;
    n = bytes;
  }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(p.get());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(p.get());
  }
};

size_t dtype_size(KvDtype t) {
  switch (t) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kF16:
    case KvDtype::kBF16:
      return 2;
    case KvDtype::kQ8:
      return 1;
  }
  return 0;
}

// q8 encoding of one vector x[d]: scale = max|x| / 127, code = clamp(rne(x / scale)).
float q8_encode(const float* x, int64_t d, int8_t* codes, int64_t stride) {
  float amax = 0;
  for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / 127.f;
  const float inv = scale > 0 ? 1.f / scale : 0.f;
  for (int64_t i = 0; i < d; ++i) {
    const float c = std::nearbyint(x[i] * inv);
    codes[i * stride] = static_cast<int8_t>(std::clamp(c, -127.f, 127.f));
  }
  return scale;
}

// x[i] (f32) -> element i of a row with the given stride, in dtype t (not q8).
void encode(KvDtype t, const float* x, int64_t d, uint8_t* dst, int64_t stride) {
  switch (t) {
    case KvDtype::kF32:
      for (int64_t i = 0; i < d; ++i) reinterpret_cast<float*>(dst)[i * stride] = x[i];
      break;
    case KvDtype::kF16:
      if (stride == 1) {
        kv::f32_to_f16_row(x, reinterpret_cast<uint16_t*>(dst), d);
      } else {
        for (int64_t i = 0; i < d; ++i)
          reinterpret_cast<uint16_t*>(dst)[i * stride] = fp32_to_fp16(x[i]);
      }
      break;
    case KvDtype::kBF16:
      for (int64_t i = 0; i < d; ++i)
        reinterpret_cast<uint16_t*>(dst)[i * stride] = fp32_to_bf16(x[i]);
      break;
    case KvDtype::kQ8:
      KVTRIM_ASSERT(false);
  }
}

// Element at index `at` of a dtype array, as f32 (q8: code · scale).
float decode(KvDtype t, const uint8_t* src, int64_t at, float scale) {
  switch (t) {
    case KvDtype::kF32:
      return reinterpret_cast<const float*>(src)[at];
    case KvDtype::kF16:
      return fp16_to_fp32(reinterpret_cast<const uint16_t*>(src)[at]);
    case KvDtype::kBF16:
      return bf16_to_fp32(reinterpret_cast<const uint16_t*>(src)[at]);
    case KvDtype::kQ8:
      return static_cast<float>(reinterpret_cast<const int8_t*>(src)[at]) * scale;
  }
  return 0;
}

// dst key row r <- src key row j, for tiled keys of head size d with elements of type E.
template <typename E>
void gather_keys(const uint8_t* src, uint8_t* dst, int64_t d, const int32_t* keep, int64_t n) {
  const E* s = reinterpret_cast<const E*>(src);
  E* o = reinterpret_cast<E*>(dst);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t j = keep[r];
    const E* sj = s + (j / kv::kKeyTile) * d * kv::kKeyTile + j % kv::kKeyTile;
    E* orow = o + (r / kv::kKeyTile) * d * kv::kKeyTile + r % kv::kKeyTile;
    for (int64_t i = 0; i < d; ++i) orow[i * kv::kKeyTile] = sj[i * kv::kKeyTile];
  }
}

class TokenCache final : public KvCache {
 public:
  explicit TokenCache(KvCacheConfig cfg);

  void append(int il, int64_t n, const float* k, const float* v, const int32_t* pos) override;
  void attend(int il, int64_t n_q, const float* q, const int32_t* q_pos, const AttnParams& p,
              float* out, ThreadPool* pool) const override;
  int64_t n_tokens(int il, int ih) const override;
  void apply(const CompressionPlan& plan) override;
  void read_head(int il, int ih, std::vector<float>* k, std::vector<float>* v,
                 std::vector<int32_t>* pos) const override;
  KvBytes bytes() const override;
  void truncate(int32_t pos) override;
  std::string describe() const override;

 private:
  struct Head {
    int64_t n_tok = 0;         // tokens stored
    int64_t cap = 0;           // tokens allocated (a multiple of kKeyTile)
    Buf k;                     // [cap / kKeyTile, head_dim_k, kKeyTile] in dtype (q8: int8 codes)
    Buf v;                     // [cap, head_dim_v] in dtype (q8: int8 codes)
    Buf k_scale, v_scale;      // q8 only: [cap] f32, key_t = k_scale[t] · code_t (same for v)
    std::vector<int32_t> pos;  // [n_tok] original positions, increasing (unshared layers only)
  };
  struct Layer {
    bool shared = true;        // all heads hold the same tokens: positions stored once, here
    std::vector<int32_t> pos;  // [n_tok] shared positions, increasing (shared layers only)
    std::vector<Head> heads;   // [n_head_kv]
  };

  const std::vector<int32_t>& head_pos(const Layer& L, int ih) const {
    return L.shared ? L.pos : L.heads[static_cast<size_t>(ih)].pos;
  }
  // One work item: query against tokens [t0, t1) of head H for the group's n_group query
  // heads. acc: [n_group, head_dim_v] unnormalised, m / l: [n_group] running max / sum.
  template <KvDtype D>
  void attend_range(const Head& H, int n_group, const float* q_group, float scale, float softcap,
                    int64_t t0, int64_t t1, float* acc, float* m, float* l) const;
  void reserve(Head& H, int64_t need) const;  // capacity >= need tokens
  void realloc_head(Head& H, int64_t cap, bool grow, const int32_t* keep, int64_t n_keep) const;

  size_t esize_;  // bytes per stored element
  std::vector<Layer> layers_;
};

TokenCache::TokenCache(KvCacheConfig cfg) : KvCache(std::move(cfg)) {
  KVTRIM_CHECK(cfg_.n_layer > 0 && cfg_.n_head_kv > 0 && cfg_.head_dim_k > 0 && cfg_.head_dim_v > 0,
               "invalid KV cache config: n_layer %d, n_head_kv %d, head_dim_k %d, head_dim_v %d",
               cfg_.n_layer, cfg_.n_head_kv, cfg_.head_dim_k, cfg_.head_dim_v);
  KVTRIM_CHECK(cfg_.n_ctx > 0, "invalid KV cache config: n_ctx %lld",
               static_cast<long long>(cfg_.n_ctx));
  KVTRIM_CHECK(
      cfg_.sliding_window.empty() || static_cast<int>(cfg_.sliding_window.size()) == cfg_.n_layer,
      "invalid KV cache config: %zu sliding windows for %d layers", cfg_.sliding_window.size(),
      cfg_.n_layer);
  esize_ = dtype_size(cfg_.dtype);
  KVTRIM_CHECK(esize_ > 0, "invalid KV cache config: unknown dtype %d",
               static_cast<int>(cfg_.dtype));
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (Layer& L : layers_) L.heads.resize(static_cast<size_t>(cfg_.n_head_kv));
}

// Moves head H into fresh buffers of `cap` tokens holding its rows keep[0..n_keep), or all of
// its rows in order when grow is true (keep unused); the old buffers are freed.
void TokenCache::realloc_head(Head& H, int64_t cap, bool grow, const int32_t* keep,
                              int64_t n_keep) const {
  const int64_t dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  const bool q8 = cfg_.dtype == KvDtype::kQ8;
  Head N;
  N.cap = cap;
  N.n_tok = n_keep;
  N.k.alloc(static_cast<size_t>(cap * dk) * esize_);
  N.v.alloc(static_cast<size_t>(cap * dv) * esize_);
  if (q8) {
    N.k_scale.alloc(static_cast<size_t>(cap) * sizeof(float));
    N.v_scale.alloc(static_cast<size_t>(cap) * sizeof(float));
  }
  if (grow) {  // growth: the stored prefix (whole key tiles) is copied as is
    const int64_t tiles = (H.n_tok + kv::kKeyTile - 1) / kv::kKeyTile;
    if (H.n_tok > 0) {
      std::memcpy(N.k.p.get(), H.k.p.get(),
                  static_cast<size_t>(tiles * kv::kKeyTile * dk) * esize_);
      std::memcpy(N.v.p.get(), H.v.p.get(), static_cast<size_t>(H.n_tok * dv) * esize_);
      if (q8) {
        std::memcpy(N.k_scale.p.get(), H.k_scale.p.get(),
                    static_cast<size_t>(H.n_tok) * sizeof(float));
        std::memcpy(N.v_scale.p.get(), H.v_scale.p.get(),
                    static_cast<size_t>(H.n_tok) * sizeof(float));
      }
    }
  } else if (n_keep > 0) {
    switch (esize_) {
      case 1:
        gather_keys<uint8_t>(H.k.p.get(), N.k.p.get(), dk, keep, n_keep);
        break;
      case 2:
        gather_keys<uint16_t>(H.k.p.get(), N.k.p.get(), dk, keep, n_keep);
        break;
      default:
        gather_keys<uint32_t>(H.k.p.get(), N.k.p.get(), dk, keep, n_keep);
        break;
    }
    const size_t vrow = static_cast<size_t>(dv) * esize_;
    for (int64_t r = 0; r < n_keep; ++r) {
      std::memcpy(N.v.p.get() + static_cast<size_t>(r) * vrow,
                  H.v.p.get() + static_cast<size_t>(keep[r]) * vrow, vrow);
      if (q8) {
        N.k_scale.as<float>()[r] = H.k_scale.as<float>()[keep[r]];
        N.v_scale.as<float>()[r] = H.v_scale.as<float>()[keep[r]];
      }
    }
  }
  N.pos = std::move(H.pos);
  H = std::move(N);  // frees the old buffers
}

void TokenCache::reserve(Head& H, int64_t need) const {
  if (need <= H.cap) return;
  int64_t cap = std::max({need, 2 * H.cap, kGrowTokens});
  cap = std::min(cap, std::max(need, cfg_.n_ctx));
  cap = (cap + kv::kKeyTile - 1) / kv::kKeyTile * kv::kKeyTile;  // whole key tiles
  realloc_head(H, cap, /*grow=*/true, nullptr, H.n_tok);
}

void TokenCache::append(int il, int64_t n, const float* k, const float* v, const int32_t* pos) {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer, "KV cache: layer %d out of range [0, %d)", il,
               cfg_.n_layer);
  if (n <= 0) return;
  Layer& L = layers_[il];
  const int nkv = cfg_.n_head_kv;
  // positions must increase past every stored position of every head
  int32_t last = -1;
  for (int ih = 0; ih < nkv; ++ih) {
    const std::vector<int32_t>& hp = head_pos(L, ih);
    if (!hp.empty()) last = std::max(last, hp.back());
  }
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
  const int64_t dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  for (int ih = 0; ih < nkv; ++ih) {
    Head& H = L.heads[static_cast<size_t>(ih)];
    reserve(H, H.n_tok + n);
    for (int64_t j = 0; j < n; ++j) {
      const float* ks = k + (j * nkv + ih) * dk;  // k: [n, n_head_kv, head_dim_k]
      const float* vs = v + (j * nkv + ih) * dv;  // v: [n, n_head_kv, head_dim_v]
      const int64_t row = H.n_tok + j;
      const int64_t k_at = kv::key_tile_index(row, 0, dk);  // element (row, 0) of the tiles
      if (cfg_.dtype == KvDtype::kQ8) {
        H.k_scale.as<float>()[row] = q8_encode(ks, dk, H.k.as<int8_t>() + k_at, kv::kKeyTile);
        H.v_scale.as<float>()[row] = q8_encode(vs, dv, H.v.as<int8_t>() + row * dv, 1);
      } else {
        encode(cfg_.dtype, ks, dk, H.k.p.get() + static_cast<size_t>(k_at) * esize_, kv::kKeyTile);
        encode(cfg_.dtype, vs, dv, H.v.p.get() + static_cast<size_t>(row * dv) * esize_, 1);
      }
    }
    H.n_tok += n;
    if (!L.shared) H.pos.insert(H.pos.end(), pos, pos + n);
  }
  if (L.shared) L.pos.insert(L.pos.end(), pos, pos + n);
}

template <KvDtype D>
void TokenCache::attend_range(const Head& H, int n_group, const float* q_group, float scale,
                              float softcap, int64_t t0, int64_t t1, float* acc, float* m,
                              float* l) const {
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  // scaled queries [n_group, dk]; scores [n_group, kBlock]; q8: scores · v_scale [n_group, kBlock]
  thread_local std::vector<float> qs, s, sv;
  qs.resize(static_cast<size_t>(n_group) * dk);
  s.resize(static_cast<size_t>(n_group) * kBlock);
  if constexpr (D == KvDtype::kQ8) sv.resize(static_cast<size_t>(n_group) * kBlock);
  for (int64_t i = 0; i < static_cast<int64_t>(n_group) * dk; ++i) qs[i] = q_group[i] * scale;
  std::fill(acc, acc + static_cast<int64_t>(n_group) * dv, 0.f);
  for (int g = 0; g < n_group; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0;
  }
  for (int64_t b = t0; b < t1; b += kBlock) {
    const int64_t nb = std::min(kBlock, t1 - b);
    // s[g, t] = scale · q_g · k_t
    if constexpr (D == KvDtype::kF32) {
      kv::attn_scores_f32(qs.data(), n_group, dk, H.k.as<float>(), b, nb, s.data(), kBlock);
    } else if constexpr (D == KvDtype::kF16) {
      kv::attn_scores_f16(qs.data(), n_group, dk, H.k.as<uint16_t>(), b, nb, s.data(), kBlock);
    } else if constexpr (D == KvDtype::kBF16) {
      kv::attn_scores_bf16(qs.data(), n_group, dk, H.k.as<uint16_t>(), b, nb, s.data(), kBlock);
    } else {
      kv::attn_scores_q8(qs.data(), n_group, dk, H.k.as<int8_t>(), H.k_scale.as<float>(), b, nb,
                         s.data(), kBlock);
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
    if constexpr (D == KvDtype::kF32) {
      kv::attn_accum_f32(s.data(), n_group, kBlock, H.v.as<float>() + b * dv, nb, dv, acc);
    } else if constexpr (D == KvDtype::kF16) {
      kv::attn_accum_f16(s.data(), n_group, kBlock, H.v.as<uint16_t>() + b * dv, nb, dv, acc);
    } else if constexpr (D == KvDtype::kBF16) {
      kv::attn_accum_bf16(s.data(), n_group, kBlock, H.v.as<uint16_t>() + b * dv, nb, dv, acc);
    } else {
      // v_t = v_scale[t] · code_t: fold the scale into the weights, p'[g, t] = p[g, t] · v_scale[t]
      const float* vsc = H.v_scale.as<float>() + b;
      for (int g = 0; g < n_group; ++g) {
        const float* sg = s.data() + static_cast<int64_t>(g) * kBlock;
        float* pg = sv.data() + static_cast<int64_t>(g) * kBlock;
        for (int64_t t = 0; t < nb; ++t) pg[t] = sg[t] * vsc[t];
      }
      kv::attn_accum_q8(sv.data(), n_group, kBlock, H.v.as<int8_t>() + b * dv, nb, dv, acc);
    }
  }
}

void TokenCache::attend(int il, int64_t n_q, const float* q, const int32_t* q_pos,
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

  // Visible run [lo, hi) of each (query, kv head): k_pos <= q_pos and q_pos - k_pos < window.
  // lo, hi: [n_q, n_head_kv]. (thread_local scratch is only touched through plain pointers
  // inside the pool's lambda: a thread_local named there would be the worker's own instance.)
  thread_local std::vector<int64_t> lo_buf, hi_buf;
  lo_buf.resize(static_cast<size_t>(n_q * nkv));
  hi_buf.resize(static_cast<size_t>(n_q * nkv));
  int64_t* lo = lo_buf.data();
  int64_t* hi = hi_buf.data();
  int64_t max_len = 0;
  for (int ihk = 0; ihk < nkv; ++ihk) {
    if (L.shared && ihk > 0) {  // same positions as head 0
      for (int64_t iq = 0; iq < n_q; ++iq) {
        lo[iq * nkv + ihk] = lo[iq * nkv];
        hi[iq * nkv + ihk] = hi[iq * nkv];
      }
      continue;
    }
    const std::vector<int32_t>& hp = head_pos(L, ihk);
    const int32_t* pb = hp.data();
    const int32_t* pe = pb + hp.size();
    for (int64_t iq = 0; iq < n_q; ++iq) {
      int64_t& h = hi[iq * nkv + ihk];
      int64_t& o = lo[iq * nkv + ihk];
      h = std::upper_bound(pb, pe, q_pos[iq]) - pb;
      o = p.sliding_window > 0 ? std::lower_bound(pb, pe, q_pos[iq] - p.sliding_window + 1) - pb
                               : 0;
      o = std::min(o, h);
      max_len = std::max(max_len, h - o);
    }
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
      const int64_t r0 = lo[iq * nkv + ihk], len = hi[iq * nkv + ihk] - r0;
      const int64_t t0 = r0 + len * s / n_split, t1 = r0 + len * (s + 1) / n_split;
      float* part = parts_data + item * part_stride;
      float* acc = part;
      float* m = part + static_cast<int64_t>(n_group) * dv;
      float* l = m + n_group;
      const float* q_group = q + (iq * p.n_head + static_cast<int64_t>(ihk) * n_group) * dk;
      const Head& H = L.heads[static_cast<size_t>(ihk)];
      switch (cfg_.dtype) {
        case KvDtype::kF32:
          attend_range<KvDtype::kF32>(H, n_group, q_group, p.scale, p.softcap, t0, t1, acc, m, l);
          break;
        case KvDtype::kF16:
          attend_range<KvDtype::kF16>(H, n_group, q_group, p.scale, p.softcap, t0, t1, acc, m, l);
          break;
        case KvDtype::kBF16:
          attend_range<KvDtype::kBF16>(H, n_group, q_group, p.scale, p.softcap, t0, t1, acc, m, l);
          break;
        case KvDtype::kQ8:
          attend_range<KvDtype::kQ8>(H, n_group, q_group, p.scale, p.softcap, t0, t1, acc, m, l);
          break;
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

void TokenCache::apply(const CompressionPlan& plan) {
  const int nl = cfg_.n_layer, nkv = cfg_.n_head_kv;
  KVTRIM_CHECK(plan.n_layer == nl && plan.n_head_kv == nkv,
               "compression plan is for %d layers x %d kv heads, but the KV cache has %d x %d",
               plan.n_layer, plan.n_head_kv, nl, nkv);
  KVTRIM_CHECK(plan.heads.size() == static_cast<size_t>(nl) * static_cast<size_t>(nkv),
               "compression plan holds %zu head plans, expected %d layers x %d kv heads = %d",
               plan.heads.size(), nl, nkv, nl * nkv);
  // Validate everything before touching storage: a rejected plan leaves the cache as it was.
  for (int il = 0; il < nl; ++il) {
    for (int ih = 0; ih < nkv; ++ih) {
      const HeadPlan& hp = plan.at(il, ih);
      if (hp.keep_all) continue;
      const int64_t n = layers_[il].heads[static_cast<size_t>(ih)].n_tok;
      for (size_t j = 0; j < hp.keep.size(); ++j) {
        KVTRIM_CHECK(hp.keep[j] >= 0 && hp.keep[j] < n,
                     "compression plan (layer %d, kv head %d): keep[%zu] = %d is out of range "
                     "[0, %lld) (the head's stored tokens)",
                     il, ih, j, hp.keep[j], static_cast<long long>(n));
        KVTRIM_CHECK(j == 0 || hp.keep[j] > hp.keep[j - 1],
                     "compression plan (layer %d, kv head %d): keep[%zu] = %d after %d (indices "
                     "must be strictly increasing)",
                     il, ih, j, hp.keep[j], hp.keep[j - 1]);
      }
    }
  }
  const size_t before = bytes().total();
  for (int il = 0; il < nl; ++il) {
    Layer& L = layers_[il];
    const HeadPlan& h0 = plan.at(il, 0);
    bool any = false, same = true;  // any head planned; all heads planned alike
    for (int ih = 0; ih < nkv; ++ih) {
      const HeadPlan& hp = plan.at(il, ih);
      any = any || !hp.keep_all;
      same = same && hp.keep_all == h0.keep_all && (hp.keep_all || hp.keep == h0.keep);
    }
    if (!any) continue;
    if (L.shared && !same) {  // heads diverge: each keeps its own positions from now on
      for (Head& H : L.heads) H.pos = L.pos;
      std::vector<int32_t>().swap(L.pos);
      L.shared = false;
    }
    for (int ih = 0; ih < nkv; ++ih) {
      const HeadPlan& hp = plan.at(il, ih);
      if (hp.keep_all) continue;
      Head& H = L.heads[static_cast<size_t>(ih)];
      const int64_t n_keep = static_cast<int64_t>(hp.keep.size());
      if (!L.shared) {
        std::vector<int32_t> np(hp.keep.size());  // exact size: the old capacity is released
        for (size_t j = 0; j < np.size(); ++j) np[j] = H.pos[static_cast<size_t>(hp.keep[j])];
        H.pos = std::move(np);
      }
      const int64_t cap = (n_keep + kv::kKeyTile - 1) / kv::kKeyTile * kv::kKeyTile;
      realloc_head(H, cap, /*grow=*/false, hp.keep.data(), n_keep);
    }
    if (L.shared) {
      std::vector<int32_t> np(h0.keep.size());
      for (size_t j = 0; j < np.size(); ++j) np[j] = L.pos[static_cast<size_t>(h0.keep[j])];
      L.pos = std::move(np);
    }
  }
  const size_t after = bytes().total();
  // Large frees from the heap (buffers that grew by steps) only leave the process when the
  // allocator gives the pages back.
  if (before > after && before - after >= kTrimBytes) malloc_trim(0);
}

void TokenCache::read_head(int il, int ih, std::vector<float>* k, std::vector<float>* v,
                           std::vector<int32_t>* pos) const {
  const int64_t n = n_tokens(il, ih);  // range-checks (il, ih)
  const Layer& L = layers_[il];
  const Head& H = L.heads[static_cast<size_t>(ih)];
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  const bool q8 = cfg_.dtype == KvDtype::kQ8;
  if (k) {
    k->resize(static_cast<size_t>(n * dk));
    for (int64_t t = 0; t < n; ++t) {
      const float sc = q8 ? H.k_scale.as<float>()[t] : 1.f;
      for (int i = 0; i < dk; ++i)
        (*k)[static_cast<size_t>(t * dk + i)] =
            decode(cfg_.dtype, H.k.p.get(), kv::key_tile_index(t, i, dk), sc);
    }
  }
  if (v) {
    v->resize(static_cast<size_t>(n * dv));
    for (int64_t t = 0; t < n; ++t) {
      const float sc = q8 ? H.v_scale.as<float>()[t] : 1.f;
      for (int i = 0; i < dv; ++i)
        (*v)[static_cast<size_t>(t * dv + i)] = decode(cfg_.dtype, H.v.p.get(), t * dv + i, sc);
    }
  }
  if (pos) {
    const std::vector<int32_t>& hp = head_pos(L, ih);
    pos->assign(hp.begin(), hp.begin() + n);
  }
}

int64_t TokenCache::n_tokens(int il, int ih) const {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer && ih >= 0 && ih < cfg_.n_head_kv,
               "KV cache: (layer %d, kv head %d) out of range (%d layers, %d kv heads)", il, ih,
               cfg_.n_layer, cfg_.n_head_kv);
  return layers_[il].heads[static_cast<size_t>(ih)].n_tok;
}

KvBytes TokenCache::bytes() const {
  KvBytes b;
  b.per_layer.resize(layers_.size());
  const size_t es = esize_;
  for (size_t il = 0; il < layers_.size(); ++il) {
    const Layer& L = layers_[il];
    size_t keys = 0, values = 0, positions = 0, scales = 0;
    if (L.shared) positions = L.pos.size() * sizeof(int32_t);
    for (const Head& H : L.heads) {
      const size_t n = static_cast<size_t>(H.n_tok);
      keys += n * static_cast<size_t>(cfg_.head_dim_k) * es;
      values += n * static_cast<size_t>(cfg_.head_dim_v) * es;
      if (!L.shared) positions += n * sizeof(int32_t);
      if (cfg_.dtype == KvDtype::kQ8) scales += 2 * n * sizeof(float);  // one key + one value scale
    }
    b.keys += keys;
    b.values += values;
    b.positions += positions;
    b.scales += scales;
    b.per_layer[il] = keys + values + positions + scales;
  }
  return b;
}

void TokenCache::truncate(int32_t pos) {
  KVTRIM_CHECK(pos >= 0, "KV cache: cannot truncate to negative position %d", pos);
  for (Layer& L : layers_) {
    if (L.shared) {
      const int64_t keep = std::lower_bound(L.pos.begin(), L.pos.end(), pos) - L.pos.begin();
      L.pos.resize(static_cast<size_t>(keep));
      for (Head& H : L.heads) H.n_tok = keep;
    } else {
      for (Head& H : L.heads) {
        const int64_t keep = std::lower_bound(H.pos.begin(), H.pos.end(), pos) - H.pos.begin();
        H.pos.resize(static_cast<size_t>(keep));
        H.n_tok = keep;
      }
    }
  }
  n_past_ = std::min(n_past_, pos);
}

std::string TokenCache::describe() const {
  const KvBytes b = bytes();
  int64_t stored = 0;
  for (const Layer& L : layers_)
    for (const Head& H : L.heads) stored += H.n_tok;
  return strprintf(
      "token %s cache: %d layers x %d kv heads, head dims %d/%d, n_ctx %lld, n_past %d, "
      "%lld (layer, head) tokens stored, %.2f MiB",
      kv_dtype_name(cfg_.dtype), cfg_.n_layer, cfg_.n_head_kv, cfg_.head_dim_k, cfg_.head_dim_v,
      static_cast<long long>(cfg_.n_ctx), n_past_, static_cast<long long>(stored),
      static_cast<double>(b.total()) / (1 << 20));
}

}  // namespace

std::unique_ptr<KvCache> make_kv_cache(const KvCacheConfig& cfg) {
  return std::make_unique<TokenCache>(cfg);
}

std::unique_ptr<KvCache> make_dense_cache(const KvCacheConfig& cfg) {
  return make_kv_cache(cfg);
}

}  // namespace kvtrim
