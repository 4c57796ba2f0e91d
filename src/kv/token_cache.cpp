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
//
// Basis axis (HeadPlan::basis_k / basis_v / anchors): a head given a basis switches to basis
// mode: its dense rows keep only the full-rank anchors, and each basis epoch's tokens live in
// a segment {basis, coefficient rows [n, r_k] / [n, r_v] in the same tiled / row-major dtype
// layout, positions}. Appends go to the current basis's segment. A work item over such a head
// walks every segment's visible run (split s of n_split of each), scoring the queries projected
// per epoch (q·U_k) and accumulating in coefficient space (Σ a ṽ), with the dense kernels at
// d = r. Unsplit, the item lifts each segment's accumulator ((Σ a ṽ)·U_vᵀ) and merges them by
// the online softmax; split (decode), attend() projects the queries once per (query, segment)
// before the items and, after merging each segment's splits in coefficient space, lifts once
// per (query, segment), so the basis matrices are read once per query, not once per split.
// Heads without a basis take the original path unchanged.
// Oblique epochs (HeadPlan::decoder_k / decoder_v, KQ-SVD) store the same coefficients
// (encoded with the basis, Eᵀx) and only swap the matrix used on the way out: the queries are
// projected with D_k and the coefficient-space accumulator lifted with D_v (Basis::dec_k /
// dec_v). An epoch with appends_dense (OjaKV's decode buffer) sends later appends to the head's
// dense rows, as channel epochs do, until the next plan with a basis re-encodes them. A basis
// plan on a head with no tokens only sets its current basis (and unshares the layer), so every
// later append is encoded at once.
//
// Channel axis, keys (HeadPlan::key_channels, ThinK): an epoch like a basis epoch whose
// "basis" is the channel subset S (Basis::kch, |S| = rk): its segment's key rows hold only
// the |S| kept channels (k̃ = k[S], in the same tiled dtype layout, q8 scale over k[S]), the
// values stay full. A work item gathers the queries' channels once per epoch (q[S]) and scores
// q[S]·k̃; dropped channels contribute zero; read_head scatters k̃ back with zeros elsewhere.
// Tokens appended after a channel plan go to the head's dense rows (all channels) until the
// next plan with key_channels re-encodes them into a new epoch.
// Per-token channels (HeadPlan::key_topk, SPARK / SWAN): an epoch (Basis::topk, rk = T) whose
// segment stores per row the T kept key values (tiled, dtype), their channel indices (kidx,
// uint8 / uint16), and with recovery one f32 fill and the sign bits of the pruned channels.
// attend_range scores it with sparse_scores (full scaled queries: sparse dot over the row's
// indices + fill · Σ ± q_c r[c] over the pruned channels) instead of the tiled kernels.
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
  Buf() = default;
  Buf(const Buf& o) { *this = o; }  // deep copy (KvCache::clone)
  Buf& operator=(const Buf& o) {
    if (this != &o) {
      alloc(o.n);
      if (o.n) std::memcpy(p.get(), o.p.get(), o.n);
    }
    return *this;
  }
  Buf(Buf&&) noexcept = default;
  Buf& operator=(Buf&&) noexcept = default;
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

// One basis epoch of a head: encoders U_k [dk, rk] and U_v [dv, rv], row-major f32 (orthonormal
// columns unless the side has a decoder); an empty matrix is the identity (that side stays
// full-rank, rk = dk / rv = dv). Oblique sides (KQ-SVD) add a decoder D [d, r]: tokens are still
// encoded c = Uᵀx, but queries are projected with it (q·D_k), value outputs lifted with it
// ((Σ a ṽ)·D_vᵀ) and read_head reconstructs D·c. Without a decoder D = U.
struct Basis {
  int32_t id = 0;  // epoch id (unique in the cache)
  int rk = 0, rv = 0;
  std::vector<float> uk, uv;
  std::vector<float> dk, dv;  // decoders (empty: the encoder itself)
  std::vector<uint16_t> kch;  // channel epoch: the kept key channels (rk of them); uk empty
  bool topk = false;          // per-token channel epoch: rk = T channels per token (own lists)
  std::vector<float> rec;     // per-token recovery scale r [dk] (empty: zero-fill)
  bool dense = false;         // HeadPlan::appends_dense given with the basis
  bool appends_dense() const { return !kch.empty() || topk || dense; }
  const std::vector<float>& dec_k() const { return dk.empty() ? uk : dk; }
  const std::vector<float>& dec_v() const { return dv.empty() ? uv : dv; }
};

// c[g, j] = Σ_i x[g, i] U[i, j]: n vectors x [n, d] -> coefficients c [n, r] (U empty: c = x).
// The SIMD weighted-sum kernel with U's rows as the "values".
void project(const std::vector<float>& U, int d, int r, const float* x, float* c, int n = 1) {
  if (U.empty()) {
    std::copy(x, x + static_cast<int64_t>(n) * d, c);
    return;
  }
  std::fill(c, c + static_cast<int64_t>(n) * r, 0.f);
  kv::attn_accum_f32(x, n, d, U.data(), d, r, c);
}

// x[g, i] = Σ_j U[i, j] c[g, j]: coefficients c [n, r] -> x [n, d] (U empty: x = c).
void lift(const std::vector<float>& U, int d, int r, const float* c, float* x, int n = 1) {
  if (U.empty()) {
    std::copy(c, c + static_cast<int64_t>(n) * d, x);
    return;
  }
  kv::rows_dot_f32(U.data(), d, r, c, n, r, x, d);
}

// Key coefficients of x [d] in epoch b: the kept channels (channel epoch) or x·U_k.
void project_key(const Basis& b, int d, const float* x, float* c) {
  if (!b.kch.empty()) {
    for (size_t j = 0; j < b.kch.size(); ++j) c[j] = x[b.kch[j]];
    return;
  }
  project(b.uk, d, b.rk, x, c);
}

// Query of epoch b in coefficient space: the kept channels (channel epoch) or q·D_k (D_k = U_k
// without a decoder), so that the score is q̃·k̃.
void project_query(const Basis& b, int d, const float* q, float* c) {
  if (!b.kch.empty()) {
    project_key(b, d, q, c);
    return;
  }
  project(b.dec_k(), d, b.rk, q, c);
}

// Key of epoch b from its coefficients c: scattered with zeros (channel epoch) or D_k·c.
void lift_key(const Basis& b, int d, const float* c, float* x) {
  if (!b.kch.empty()) {
    std::fill(x, x + d, 0.f);
    for (size_t j = 0; j < b.kch.size(); ++j) x[b.kch[j]] = c[j];
    return;
  }
  lift(b.dec_k(), d, b.rk, c, x);
}

// Checks one side of a plan's basis: none (rank 0, empty, no decoder), or U [d, r] with
// 1 <= r <= d and orthonormal columns (|UᵀU - I| <= 1e-4 elementwise); with a decoder D (an
// oblique side) U need not be orthonormal, and both U and D [d, r] must be finite.
void check_basis(const std::vector<float>& U, const std::vector<float>& D, int r, int d,
                 const char* side, int il, int ih) {
  KVTRIM_CHECK(D.empty() || !U.empty(),
               "compression plan (layer %d, kv head %d): %s decoder given without a %s basis "
               "(the encoder)",
               il, ih, side, side);
  if (r == 0 && U.empty()) return;
  KVTRIM_CHECK(r >= 1 && r <= d,
               "compression plan (layer %d, kv head %d): %s basis rank %d is out of range [1, %d]",
               il, ih, side, r, d);
  KVTRIM_CHECK(U.size() == static_cast<size_t>(d) * static_cast<size_t>(r),
               "compression plan (layer %d, kv head %d): %s basis holds %zu floats, expected "
               "head_dim %d x rank %d = %d",
               il, ih, side, U.size(), d, r, d * r);
  if (!D.empty()) {
    KVTRIM_CHECK(D.size() == U.size(),
                 "compression plan (layer %d, kv head %d): %s decoder holds %zu floats, expected "
                 "head_dim %d x rank %d = %d (the basis's shape)",
                 il, ih, side, D.size(), d, r, d * r);
    for (const std::vector<float>* m : {&U, &D}) {
      for (size_t i = 0; i < m->size(); ++i)
        KVTRIM_CHECK(std::isfinite((*m)[i]),
                     "compression plan (layer %d, kv head %d): %s %s element %zu is not finite",
                     il, ih, side, m == &U ? "basis" : "decoder", i);
    }
    return;  // oblique: no orthonormality required
  }
  double worst = 0;
  for (int a = 0; a < r; ++a) {
    for (int b = a; b < r; ++b) {
      double dot = 0;
      for (int i = 0; i < d; ++i)
        dot += static_cast<double>(U[static_cast<size_t>(i) * r + a]) *
               U[static_cast<size_t>(i) * r + b];
      const double dev = std::fabs(dot - (a == b ? 1.0 : 0.0));
      if (!(dev <= worst)) worst = std::isnan(dev) ? std::numeric_limits<double>::infinity() : dev;
    }
  }
  KVTRIM_CHECK(worst <= 1e-4,
               "compression plan (layer %d, kv head %d): %s basis columns are not orthonormal "
               "(max |UᵀU - I| = %g, tolerance 1e-4)",
               il, ih, side, worst);
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
  void read_head_rows(int il, int ih, const std::vector<int32_t>& rows, std::vector<float>* k,
                      std::vector<float>* v) const override;
  KvBytes bytes() const override;
  void truncate(int32_t pos) override;
  std::string describe() const override;
  std::unique_ptr<KvCache> clone() const override { return std::make_unique<TokenCache>(*this); }
  HeadLayout head_layout(int il, int ih) const override;
  void reset() override;

 private:
  // Rows of one segment of a head: dk / dv elements a key / value row (the head dims for the
  // dense rows, the ranks for a basis epoch's coefficients).
  struct Store {
    int dk = 0, dv = 0;
    int64_t n_tok = 0;         // tokens stored
    int64_t cap = 0;           // tokens allocated (a multiple of kKeyTile)
    Buf k;                     // [cap / kKeyTile, dk, kKeyTile] in dtype (q8: int8 codes)
    Buf v;                     // [cap, dv] in dtype (q8: int8 codes)
    Buf k_scale, v_scale;      // q8 only: [cap] f32, key_t = k_scale[t] · code_t (same for v)
    std::vector<int32_t> pos;  // [n_tok] original positions, increasing (unshared layers only)
    // per-token channel epoch (sp_isz > 0): key row t holds the values of channels kidx[t]
    int sp_isz = 0;  // bytes per channel index (1: uint8, 2: uint16); 0 = not per-token
    int sp_sb = 0;   // sign bytes per token (recovery only; 0 = zero-fill)
    Buf kidx;        // [cap, dk] channel indices of each row's kept values
    Buf kfill;       // recovery: [cap] f32 sqrt(μ_t)
    Buf ksign;       // recovery: [cap, sp_sb] bit j (LSB first) = 1 if the j-th pruned channel < 0
  };
  // Tokens encoded in one basis epoch: coefficients [n_tok, rk] / [n_tok, rv].
  struct Seg {
    std::shared_ptr<const Basis> b;
    Store s;
  };
  // A head: its dense rows (all tokens while it has no basis; its full-rank anchors once it
  // has one) plus, in basis mode (cur set), one segment per epoch still referenced.
  struct Head : Store {
    std::shared_ptr<const Basis> cur;  // basis new tokens are encoded with (null: none)
    std::vector<Seg> segs;
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
  // Sp: a per-token channel segment (sp = its epoch), scored by sparse_scores; a compile-time
  // switch so the ordinary path has no added branch.
  template <KvDtype D, bool Sp = false>
  void attend_range(const Store& H, int n_group, const float* q_group, float scale,
                    float softcap, int64_t t0, int64_t t1, float* acc, float* m, float* l,
                    const Basis* sp = nullptr) const;
  // Scores of rows [b, b + nb) of a per-token channel segment: s[g, t] = Σ_{c kept} qs_gc k_tc
  // + fill_t Σ_{c pruned} sign_tc qr_gc (qs: scaled queries [n_group, head_dim_k], qr = qs·r).
  void sparse_scores(const Store& S, const Basis& b, int n_group, const float* qs,
                     const float* qr, int64_t b0, int64_t nb, float* s, int64_t ld) const;
  void put_sparse_row(Store& S, int64_t row, const Basis& b, const float* k, const float* v,
                      const int32_t* ch, float fill) const;
  // A work item over a basis-mode head: split s of n_split of every segment's visible run,
  // each left in its slot, in the segment's own coefficient space (slots_floats floats: the
  // dense rows, then each segment: acc [n_group, d_slot], m [n_group], l [n_group]; d_slot the
  // slot's stored value width). qproj: the group's queries already projected for each segment
  // with an encoder ([n_group, r_k] after another, qproj_floats), or nullptr to project here.
  template <KvDtype D>
  void attend_basis(const Head& H, int n_group, const float* q_group, const float* qproj,
                    const AttnParams& p, int32_t q_pos, int64_t s, int64_t n_split,
                    float* slots) const;
  // Lifts each slot's accumulator to the output space (·D_vᵀ, once per slot) and merges the
  // slots by the online softmax into acc [n_group, head_dim_v], m, l.
  void merge_slots(const Head& H, int n_group, const float* slots, float* acc, float* m,
                   float* l) const;
  static int64_t slots_floats(const Head& H, int n_group, int dv) {
    int64_t n = static_cast<int64_t>(n_group) * (dv + 2);
    for (const Seg& g : H.segs) n += static_cast<int64_t>(n_group) * (g.s.dv + 2);
    return n;
  }
  static int64_t qproj_floats(const Head& H, int n_group) {
    int64_t n = 0;
    for (const Seg& g : H.segs)
      if (!g.b->uk.empty()) n += static_cast<int64_t>(n_group) * g.b->rk;
    return n;
  }
  void reserve(Store& H, int64_t need) const;  // capacity >= need tokens
  void realloc_head(Store& H, int64_t cap, bool grow, const int32_t* keep, int64_t n_keep) const;
  void put_row(Store& S, int64_t row, const float* k, const float* v) const;
  void get_row(const Store& S, int64_t t, float* k, float* v) const;  // k / v may be null
  // Basis mode: token (sg, j) of order(H) reconstructed into kt [head_dim_k] / vt [head_dim_v]
  // (either may be null); ck / cv: scratch [head_dim_k] / [head_dim_v]. Returns its position.
  int32_t read_row(const Head& H, int sg, int64_t j, float* kt, float* vt, float* ck,
                   float* cv) const;
  void select(Store& S, const std::vector<int32_t>& keep) const;      // keep rows, exact size
  void apply_basis_head(Head& H, const HeadPlan& hp);
  static int64_t head_tokens(const Head& H) {
    int64_t n = H.n_tok;
    for (const Seg& g : H.segs) n += g.s.n_tok;
    return n;
  }
  // The head's tokens in position order: (segment, row), segment -1 = the dense rows.
  static std::vector<std::pair<int, int64_t>> order(const Head& H);
  int32_t last_pos(const Layer& L, int ih) const;

  int32_t next_epoch_ = 0;

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
  for (Layer& L : layers_) {
    L.heads.resize(static_cast<size_t>(cfg_.n_head_kv));
    for (Head& H : L.heads) {
      H.dk = cfg_.head_dim_k;
      H.dv = cfg_.head_dim_v;
    }
  }
}

// Moves head H into fresh buffers of `cap` tokens holding its rows keep[0..n_keep), or all of
// its rows in order when grow is true (keep unused); the old buffers are freed.
void TokenCache::realloc_head(Store& H, int64_t cap, bool grow, const int32_t* keep,
                              int64_t n_keep) const {
  const int64_t dk = H.dk, dv = H.dv;
  const bool q8 = cfg_.dtype == KvDtype::kQ8;
  Store N;
  N.dk = H.dk;
  N.dv = H.dv;
  N.sp_isz = H.sp_isz;
  N.sp_sb = H.sp_sb;
  N.cap = cap;
  if (H.sp_isz) {  // per-token channel arrays: [cap, row bytes], copied / gathered by rows
    auto side = [&](Buf& dst, const Buf& src, size_t rb) {
      if (rb == 0) return;
      dst.alloc(static_cast<size_t>(cap) * rb);
      if (grow) {
        if (H.n_tok > 0) std::memcpy(dst.p.get(), src.p.get(), static_cast<size_t>(H.n_tok) * rb);
      } else {
        for (int64_t r = 0; r < n_keep; ++r)
          std::memcpy(dst.p.get() + static_cast<size_t>(r) * rb,
                      src.p.get() + static_cast<size_t>(keep[r]) * rb, rb);
      }
    };
    side(N.kidx, H.kidx, static_cast<size_t>(H.dk) * static_cast<size_t>(H.sp_isz));
    side(N.kfill, H.kfill, H.sp_sb ? sizeof(float) : 0);
    side(N.ksign, H.ksign, static_cast<size_t>(H.sp_sb));
  }
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

void TokenCache::reserve(Store& H, int64_t need) const {
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
  for (int ih = 0; ih < nkv; ++ih) last = std::max(last, last_pos(L, ih));
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
    if (H.cur && !H.cur->appends_dense()) {  // basis mode: encode with the current basis
      const Basis& B = *H.cur;
      Store* S = nullptr;
      for (Seg& g : H.segs)
        if (g.b == H.cur) S = &g.s;
      if (!S) {
        H.segs.emplace_back();
        H.segs.back().b = H.cur;
        S = &H.segs.back().s;
        S->dk = B.rk;
        S->dv = B.rv;
      }
      reserve(*S, S->n_tok + n);
      // coefficients of all n tokens at once: c [n, r] = x [n, d] (rows nkv·d apart) · U
      std::vector<float> ck(static_cast<size_t>(n * B.rk)), cv(static_cast<size_t>(n * B.rv));
      auto encode_all = [n, nkv, ih](const std::vector<float>& U, int64_t d, int r,
                                     const float* x, float* c) {
        if (U.empty()) {
          for (int64_t j = 0; j < n; ++j)
            std::copy(x + (j * nkv + ih) * d, x + (j * nkv + ih + 1) * d, c + j * d);
          return;
        }
        std::fill(c, c + n * r, 0.f);
        kv::attn_accum_f32(x + ih * d, static_cast<int>(n), nkv * d, U.data(), d, r, c);
      };
      encode_all(B.uk, dk, B.rk, k, ck.data());
      encode_all(B.uv, dv, B.rv, v, cv.data());
      for (int64_t j = 0; j < n; ++j)
        put_row(*S, S->n_tok + j, ck.data() + j * B.rk, cv.data() + j * B.rv);
      S->n_tok += n;
      S->pos.insert(S->pos.end(), pos, pos + n);  // basis-mode layers are never shared
      continue;
    }
    reserve(H, H.n_tok + n);
    for (int64_t j = 0; j < n; ++j) {
      const float* ks = k + (j * nkv + ih) * dk;  // k: [n, n_head_kv, head_dim_k]
      const float* vs = v + (j * nkv + ih) * dv;  // v: [n, n_head_kv, head_dim_v]
      put_row(H, H.n_tok + j, ks, vs);
    }
    H.n_tok += n;  // (a channel-epoch head appends here: dense until its next channel plan)
    if (!L.shared) H.pos.insert(H.pos.end(), pos, pos + n);
  }
  if (L.shared) L.pos.insert(L.pos.end(), pos, pos + n);
}

void TokenCache::put_row(Store& S, int64_t row, const float* ks, const float* vs) const {
  const int64_t dk = S.dk, dv = S.dv;
  const int64_t k_at = kv::key_tile_index(row, 0, dk);  // element (row, 0) of the tiles
  if (cfg_.dtype == KvDtype::kQ8) {
    S.k_scale.as<float>()[row] = q8_encode(ks, dk, S.k.as<int8_t>() + k_at, kv::kKeyTile);
    S.v_scale.as<float>()[row] = q8_encode(vs, dv, S.v.as<int8_t>() + row * dv, 1);
  } else {
    encode(cfg_.dtype, ks, dk, S.k.p.get() + static_cast<size_t>(k_at) * esize_, kv::kKeyTile);
    encode(cfg_.dtype, vs, dv, S.v.p.get() + static_cast<size_t>(row * dv) * esize_, 1);
  }
}

void TokenCache::get_row(const Store& S, int64_t t, float* k, float* v) const {
  const bool q8 = cfg_.dtype == KvDtype::kQ8;
  if (k) {
    const float sc = q8 ? S.k_scale.as<float>()[t] : 1.f;
    for (int i = 0; i < S.dk; ++i)
      k[i] = decode(cfg_.dtype, S.k.p.get(), kv::key_tile_index(t, i, S.dk), sc);
  }
  if (v) {
    const float sc = q8 ? S.v_scale.as<float>()[t] : 1.f;
    for (int i = 0; i < S.dv; ++i) v[i] = decode(cfg_.dtype, S.v.p.get(), t * S.dv + i, sc);
  }
}

void TokenCache::select(Store& S, const std::vector<int32_t>& keep) const {
  // keep is increasing and in range (validated plans): as many rows as stored = all of them.
  // Storage already at its exact size would be copied unchanged (every plan_decode of OjaKV
  // keeps every old segment whole).
  const int64_t n_keep = static_cast<int64_t>(keep.size());
  const int64_t cap = (n_keep + kv::kKeyTile - 1) / kv::kKeyTile * kv::kKeyTile;
  if (n_keep == S.n_tok && cap == S.cap && S.pos.capacity() == S.pos.size()) return;
  std::vector<int32_t> np(keep.size());  // exact size: the old capacity is released
  for (size_t j = 0; j < np.size(); ++j) np[j] = S.pos[static_cast<size_t>(keep[j])];
  realloc_head(S, cap, /*grow=*/false, keep.data(), n_keep);
  S.pos = std::move(np);
}

std::vector<std::pair<int, int64_t>> TokenCache::order(const Head& H) {
  std::vector<std::pair<int32_t, std::pair<int, int64_t>>> t;
  t.reserve(static_cast<size_t>(head_tokens(H)));
  for (int64_t j = 0; j < H.n_tok; ++j) t.push_back({H.pos[static_cast<size_t>(j)], {-1, j}});
  for (size_t s = 0; s < H.segs.size(); ++s) {
    const Store& S = H.segs[s].s;
    for (int64_t j = 0; j < S.n_tok; ++j)
      t.push_back({S.pos[static_cast<size_t>(j)], {static_cast<int>(s), j}});
  }
  std::sort(t.begin(), t.end());
  std::vector<std::pair<int, int64_t>> r(t.size());
  for (size_t i = 0; i < t.size(); ++i) r[i] = t[i].second;
  return r;
}

int32_t TokenCache::last_pos(const Layer& L, int ih) const {
  const std::vector<int32_t>& hp = head_pos(L, ih);
  int32_t last = hp.empty() ? -1 : hp.back();
  for (const Seg& g : L.heads[static_cast<size_t>(ih)].segs)
    if (!g.s.pos.empty()) last = std::max(last, g.s.pos.back());
  return last;
}

void TokenCache::sparse_scores(const Store& S, const Basis& b, int n_group, const float* qs,
                               const float* qr, int64_t b0, int64_t nb, float* s,
                               int64_t ld) const {
  const int T = S.dk, d = cfg_.head_dim_k;
  const bool q8 = cfg_.dtype == KvDtype::kQ8;
  const bool rec = S.sp_sb > 0;
  thread_local std::vector<float> kv_;
  thread_local std::vector<int> ch;
  kv_.resize(static_cast<size_t>(T));
  ch.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < nb; ++t) {
    const int64_t row = b0 + t;
    const float sc = q8 ? S.k_scale.as<float>()[row] : 1.f;
    const uint8_t* ix = S.kidx.p.get() + static_cast<size_t>(row * T) * static_cast<size_t>(S.sp_isz);
    for (int j = 0; j < T; ++j) {
      kv_[static_cast<size_t>(j)] = decode(cfg_.dtype, S.k.p.get(), kv::key_tile_index(row, j, T), sc);
      ch[static_cast<size_t>(j)] =
          S.sp_isz == 1 ? ix[j] : reinterpret_cast<const uint16_t*>(ix)[j];
    }
    const uint8_t* sg = rec ? S.ksign.p.get() + static_cast<size_t>(row) * S.sp_sb : nullptr;
    const float fill = rec ? S.kfill.as<float>()[row] : 0.f;
    for (int g = 0; g < n_group; ++g) {
      const float* q = qs + static_cast<int64_t>(g) * d;
      float dot = 0;
      for (int j = 0; j < T; ++j) dot += q[ch[static_cast<size_t>(j)]] * kv_[static_cast<size_t>(j)];
      if (rec) {  // Σ over pruned channels (in channel order) of ±q_c r_c, times fill_t
        const float* r = qr + static_cast<int64_t>(g) * d;
        float acc = 0;
        int jj = 0, ord = 0;
        for (int c = 0; c < d; ++c) {
          if (jj < T && ch[static_cast<size_t>(jj)] == c) {
            ++jj;
            continue;
          }
          acc += ((sg[ord >> 3] >> (ord & 7)) & 1) ? -r[c] : r[c];
          ++ord;
        }
        dot += fill * acc;
      }
      s[static_cast<int64_t>(g) * ld + t] = dot;
    }
  }
  (void)b;
}

void TokenCache::put_sparse_row(Store& S, int64_t row, const Basis& b, const float* k,
                                const float* v, const int32_t* ch, float fill) const {
  const int T = S.dk, d = cfg_.head_dim_k;
  std::vector<float> vals(static_cast<size_t>(T));
  for (int j = 0; j < T; ++j) vals[static_cast<size_t>(j)] = k[ch[j]];
  put_row(S, row, vals.data(), v);
  uint8_t* ix = S.kidx.p.get() + static_cast<size_t>(row * T) * static_cast<size_t>(S.sp_isz);
  for (int j = 0; j < T; ++j) {
    if (S.sp_isz == 1) {
      ix[j] = static_cast<uint8_t>(ch[j]);
    } else {
      reinterpret_cast<uint16_t*>(ix)[j] = static_cast<uint16_t>(ch[j]);
    }
  }
  if (S.sp_sb == 0) return;
  S.kfill.as<float>()[row] = fill;
  uint8_t* sg = S.ksign.p.get() + static_cast<size_t>(row) * S.sp_sb;
  std::fill(sg, sg + S.sp_sb, uint8_t{0});
  int jj = 0, ord = 0;
  for (int c = 0; c < d; ++c) {
    if (jj < T && ch[jj] == c) {
      ++jj;
      continue;
    }
    if (k[c] < 0) sg[ord >> 3] = static_cast<uint8_t>(sg[ord >> 3] | (1u << (ord & 7)));
    ++ord;
  }
  (void)b;
}

template <KvDtype D>
void TokenCache::attend_basis(const Head& H, int n_group, const float* q_group,
                              const float* qproj, const AttnParams& p, int32_t q_pos, int64_t s,
                              int64_t n_split, float* slots) const {
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  thread_local std::vector<float> qb;
  float* sl = slots;
  const float* qp = qproj;
  auto part = [&](const Store& S, const Basis* b, int dslot) {
    float* acc = sl;
    float* m = sl + static_cast<int64_t>(n_group) * dslot;
    float* l = m + n_group;
    sl = l + n_group;
    const float* qpre = nullptr;  // this segment's projected queries, when given
    if (qp && b && !b->uk.empty()) {
      qpre = qp;
      qp += static_cast<int64_t>(n_group) * b->rk;
    }
    std::fill(acc, acc + static_cast<int64_t>(n_group) * dslot, 0.f);
    for (int g = 0; g < n_group; ++g) {
      m[g] = -std::numeric_limits<float>::infinity();
      l[g] = 0;
    }
    if (S.n_tok == 0) return;
    // the visible run of this segment (its own sorted positions), and this item's split of it
    const int32_t* pb = S.pos.data();
    const int32_t* pe = pb + S.n_tok;
    const int64_t hi = std::upper_bound(pb, pe, q_pos) - pb;
    int64_t lo =
        p.sliding_window > 0 ? std::lower_bound(pb, pe, q_pos - p.sliding_window + 1) - pb : 0;
    lo = std::min(lo, hi);
    const int64_t len = hi - lo;
    const int64_t t0 = lo + len * s / n_split, t1 = lo + len * (s + 1) / n_split;
    if (t0 >= t1) return;
    const float* qq = q_group;  // scores in the epoch's coordinates: (q·D_k)·k̃
    if (qpre) {
      qq = qpre;
    } else if (b && (!b->uk.empty() || !b->kch.empty())) {  // q·D_k, or q[S] in a channel epoch
      qb.resize(static_cast<size_t>(n_group) * static_cast<size_t>(b->rk));
      if (b->kch.empty()) {  // the whole group at once (one SIMD pass over D_k)
        project(b->dec_k(), dk, b->rk, q_group, qb.data(), n_group);
      } else {
        for (int g = 0; g < n_group; ++g)
          project_query(*b, dk, q_group + static_cast<int64_t>(g) * dk,
                        qb.data() + static_cast<int64_t>(g) * b->rk);
      }
      qq = qb.data();
    }
    if (b && b->topk) {
      attend_range<D, true>(S, n_group, qq, p.scale, p.softcap, t0, t1, acc, m, l, b);
    } else {
      attend_range<D>(S, n_group, qq, p.scale, p.softcap, t0, t1, acc, m, l);
    }
  };
  part(H, nullptr, dv);  // dense rows (anchors, buffered appends)
  for (const Seg& g : H.segs) part(g.s, g.b.get(), g.s.dv);
}

void TokenCache::merge_slots(const Head& H, int n_group, const float* slots, float* acc,
                             float* m, float* l) const {
  const int dv = cfg_.head_dim_v;
  thread_local std::vector<float> w;
  w.resize(static_cast<size_t>(n_group) * static_cast<size_t>(dv));
  std::fill(acc, acc + static_cast<int64_t>(n_group) * dv, 0.f);
  for (int g = 0; g < n_group; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0;
  }
  const float* sl = slots;
  auto one = [&](const Basis* b, int dslot) {
    const float* as = sl;
    const float* ms = sl + static_cast<int64_t>(n_group) * dslot;
    const float* ls = ms + n_group;
    sl = ls + n_group;
    bool any = false;
    for (int g = 0; g < n_group; ++g) any = any || !std::isinf(ms[g]);
    if (!any) return;
    const float* lifted = as;  // [n_group, dv]
    if (b && !b->uv.empty()) {  // (Σ_t a_t ṽ_t)·D_vᵀ (D_v = U_v without a decoder), all g
      lift(b->dec_v(), dv, b->rv, as, w.data(), n_group);
      lifted = w.data();
    }
    for (int g = 0; g < n_group; ++g) {
      if (std::isinf(ms[g])) continue;
      const float M = std::max(m[g], ms[g]);
      const float fa = std::isinf(m[g]) ? 0.f : std::exp(m[g] - M), fs = std::exp(ms[g] - M);
      const float* ag_s = lifted + static_cast<int64_t>(g) * dv;
      float* ag = acc + static_cast<int64_t>(g) * dv;
      for (int i = 0; i < dv; ++i) ag[i] = ag[i] * fa + ag_s[i] * fs;
      l[g] = l[g] * fa + ls[g] * fs;
      m[g] = M;
    }
  };
  one(nullptr, dv);
  for (const Seg& g : H.segs) one(g.b.get(), g.s.dv);
}

template <KvDtype D, bool Sp>
void TokenCache::attend_range(const Store& H, int n_group, const float* q_group, float scale,
                              float softcap, int64_t t0, int64_t t1, float* acc, float* m,
                              float* l, const Basis* sp) const {
  const int dk = Sp ? cfg_.head_dim_k : H.dk, dv = H.dv;  // per-token channels: full queries
  // scaled queries [n_group, dk]; scores [n_group, kBlock]; q8: scores · v_scale [n_group, kBlock]
  thread_local std::vector<float> qs, s, sv;
  qs.resize(static_cast<size_t>(n_group) * dk);
  s.resize(static_cast<size_t>(n_group) * kBlock);
  if constexpr (D == KvDtype::kQ8) sv.resize(static_cast<size_t>(n_group) * kBlock);
  for (int64_t i = 0; i < static_cast<int64_t>(n_group) * dk; ++i) qs[i] = q_group[i] * scale;
  thread_local std::vector<float> qr;
  if constexpr (Sp) {
    if (!sp->rec.empty()) {
      qr.resize(static_cast<size_t>(n_group) * dk);
      for (int64_t i = 0; i < static_cast<int64_t>(n_group) * dk; ++i)
        qr[i] = qs[i] * sp->rec[i % dk];
    }
  }
  std::fill(acc, acc + static_cast<int64_t>(n_group) * dv, 0.f);
  for (int g = 0; g < n_group; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0;
  }
  for (int64_t b = t0; b < t1; b += kBlock) {
    const int64_t nb = std::min(kBlock, t1 - b);
    // s[g, t] = scale · q_g · k_t
    if constexpr (Sp) {
      sparse_scores(H, *sp, n_group, qs.data(), qr.data(), b, nb, s.data(), kBlock);
    } else if constexpr (D == KvDtype::kF32) {
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
    const Head& Hk = L.heads[static_cast<size_t>(ihk)];
    if (Hk.cur) {  // basis mode: each segment finds its own run inside the work item
      for (int64_t iq = 0; iq < n_q; ++iq) lo[iq * nkv + ihk] = hi[iq * nkv + ihk] = 0;
      max_len = std::max(max_len, head_tokens(Hk));
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
  int64_t part_stride =
      static_cast<int64_t>(n_group) * (dv + 2);  // acc [G, dv], m [G], l [G]
  // Basis-mode heads split across items keep each segment's partial result in coefficient
  // space (slots, lifted once per query after the splits are merged) and get their queries
  // projected once per (query, segment) here rather than once per split.
  thread_local std::vector<float> qproj_buf;
  thread_local std::vector<int64_t> qproj_off;
  const float* qproj_data = nullptr;
  const int64_t* qproj_at = nullptr;
  if (n_split > 1) {
    int64_t nq_f = 0;
    qproj_off.assign(static_cast<size_t>(n_base), -1);
    for (int ihk = 0; ihk < nkv; ++ihk) {
      const Head& H = L.heads[static_cast<size_t>(ihk)];
      if (!H.cur) continue;
      part_stride = std::max(part_stride, slots_floats(H, n_group, dv));
      for (int64_t iq = 0; iq < n_q; ++iq) {
        qproj_off[static_cast<size_t>(iq * nkv + ihk)] = nq_f;
        nq_f += qproj_floats(H, n_group);
      }
    }
    qproj_buf.resize(static_cast<size_t>(nq_f));
    for (int64_t iq = 0; iq < n_q; ++iq) {
      for (int ihk = 0; ihk < nkv; ++ihk) {
        const Head& H = L.heads[static_cast<size_t>(ihk)];
        if (!H.cur) continue;
        float* dst = qproj_buf.data() + qproj_off[static_cast<size_t>(iq * nkv + ihk)];
        const float* q_group = q + (iq * p.n_head + static_cast<int64_t>(ihk) * n_group) * dk;
        for (const Seg& g : H.segs) {
          if (g.b->uk.empty()) continue;
          project(g.b->dec_k(), dk, g.b->rk, q_group, dst, n_group);
          dst += static_cast<int64_t>(n_group) * g.b->rk;
        }
      }
    }
    qproj_data = qproj_buf.data();
    qproj_at = qproj_off.data();
  }
  thread_local std::vector<float> parts;
  parts.resize(static_cast<size_t>(n_base * n_split * part_stride));
  float* parts_data = parts.data();

  auto run_items = [&](int64_t b, int64_t e) {
    std::vector<float> scratch;  // basis-mode slots of an unsplit item (this thread's)
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
      if (H.cur) {
        // one split: the item lifts and merges its slots itself (in parallel); several: the
        // slots stay in the part and are merged across splits below, then lifted once
        const float* qp = qproj_at ? qproj_data + qproj_at[iq * nkv + ihk] : nullptr;
        float* slots = part;
        if (n_split == 1) {
          scratch.resize(static_cast<size_t>(slots_floats(H, n_group, dv)));
          slots = scratch.data();
        }
        switch (cfg_.dtype) {
          case KvDtype::kF32:
            attend_basis<KvDtype::kF32>(H, n_group, q_group, qp, p, q_pos[iq], s, n_split, slots);
            break;
          case KvDtype::kF16:
            attend_basis<KvDtype::kF16>(H, n_group, q_group, qp, p, q_pos[iq], s, n_split, slots);
            break;
          case KvDtype::kBF16:
            attend_basis<KvDtype::kBF16>(H, n_group, q_group, qp, p, q_pos[iq], s, n_split,
                                         slots);
            break;
          case KvDtype::kQ8:
            attend_basis<KvDtype::kQ8>(H, n_group, q_group, qp, p, q_pos[iq], s, n_split, slots);
            break;
        }
        if (n_split == 1) merge_slots(H, n_group, slots, acc, m, l);
        continue;
      }
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
  thread_local std::vector<float> bslots, bout;
  for (int64_t iq = 0; iq < n_q; ++iq) {
    for (int ihk = 0; ihk < nkv; ++ihk) {
      const Head& Hb = L.heads[static_cast<size_t>(ihk)];
      if (n_split > 1 && Hb.cur) {  // basis mode: merge each slot's splits, lift, merge slots
        const int64_t item0 = (iq * nkv + ihk) * n_split;
        bslots.resize(static_cast<size_t>(slots_floats(Hb, n_group, dv)));
        int64_t off = 0;  // the slot's offset in a part and in bslots
        auto merge_slot = [&](int dslot) {
          const int64_t a_n = static_cast<int64_t>(n_group) * dslot;
          float* acc = bslots.data() + off;
          float* m = acc + a_n;
          float* l = m + n_group;
          for (int g = 0; g < n_group; ++g) {
            float M = -std::numeric_limits<float>::infinity();
            for (int64_t s = 0; s < n_split; ++s)
              M = std::max(M, parts_data[(item0 + s) * part_stride + off + a_n + g]);
            float* ag = acc + static_cast<int64_t>(g) * dslot;
            std::fill(ag, ag + dslot, 0.f);
            m[g] = M;
            l[g] = 0;
            if (std::isinf(M)) continue;
            for (int64_t s = 0; s < n_split; ++s) {
              const float* part = parts_data + (item0 + s) * part_stride + off;
              const float ms = part[a_n + g];
              if (std::isinf(ms)) continue;
              const float f = std::exp(ms - M);
              l[g] += f * part[a_n + n_group + g];
              const float* a = part + static_cast<int64_t>(g) * dslot;
              for (int i = 0; i < dslot; ++i) ag[i] += f * a[i];
            }
          }
          off += a_n + 2 * n_group;
        };
        merge_slot(dv);
        for (const Seg& sg : Hb.segs) merge_slot(sg.s.dv);
        bout.resize(static_cast<size_t>(n_group) * (dv + 2));
        float* acc = bout.data();
        float* m = acc + static_cast<int64_t>(n_group) * dv;
        float* l = m + n_group;
        merge_slots(Hb, n_group, bslots.data(), acc, m, l);
        for (int g = 0; g < n_group; ++g) {
          float* o = out + (iq * p.n_head + static_cast<int64_t>(ihk) * n_group + g) * dv;
          if (std::isinf(m[g])) {  // no visible key
            std::fill(o, o + dv, 0.f);
            continue;
          }
          const float inv = 1.f / l[g];
          for (int i = 0; i < dv; ++i) o[i] = acc[static_cast<int64_t>(g) * dv + i] * inv;
        }
        continue;
      }
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
      const Head& H = layers_[il].heads[static_cast<size_t>(ih)];
      const int64_t n = head_tokens(H);
      check_basis(hp.basis_k, hp.decoder_k, hp.rank_k, cfg_.head_dim_k, "key", il, ih);
      check_basis(hp.basis_v, hp.decoder_v, hp.rank_v, cfg_.head_dim_v, "value", il, ih);
      KVTRIM_CHECK(!hp.appends_dense || hp.has_basis() || hp.has_channels(),
                   "compression plan (layer %d, kv head %d): appends_dense is given without a "
                   "basis (it says how tokens appended after the plan's basis are stored)",
                   il, ih);
      if (hp.has_channels()) {
        KVTRIM_CHECK(hp.key_channels.empty() || (hp.key_topk == 0 && hp.key_token_channels.empty() &&
                                                 hp.key_recovery_scale.empty() &&
                                                 hp.key_token_fill.empty()),
                     "compression plan (layer %d, kv head %d): key_channels (per head) and "
                     "key_topk (per token) cannot be combined",
                     il, ih);
        KVTRIM_CHECK(!hp.has_basis(),
                     "compression plan (layer %d, kv head %d): key_channels cannot be combined "
                     "with a basis (channels are in the head's own coordinates)",
                     il, ih);
        const size_t nc = hp.key_channels.size();
        KVTRIM_CHECK(nc <= static_cast<size_t>(cfg_.head_dim_k),
                     "compression plan (layer %d, kv head %d): %zu key channels for head_dim_k %d",
                     il, ih, nc, cfg_.head_dim_k);
        for (size_t j = 0; j < nc; ++j) {
          const int32_t c = hp.key_channels[j];
          KVTRIM_CHECK(c >= 0 && c < cfg_.head_dim_k,
                       "compression plan (layer %d, kv head %d): key_channels[%zu] = %d is out of "
                       "range [0, %d) (head_dim_k)",
                       il, ih, j, c, cfg_.head_dim_k);
          KVTRIM_CHECK(j == 0 || c > hp.key_channels[j - 1],
                       "compression plan (layer %d, kv head %d): key_channels[%zu] = %d after %d "
                       "(channels must be strictly increasing)",
                       il, ih, j, c, hp.key_channels[j - 1]);
        }
        if (hp.key_channels.empty()) {  // per-token channels
          const int T = hp.key_topk, d = cfg_.head_dim_k;
          KVTRIM_CHECK(T >= 1 && T <= d,
                       "compression plan (layer %d, kv head %d): key_topk %d is out of range "
                       "[1, %d] (head_dim_k)",
                       il, ih, T, d);
          const size_t rows = hp.keep_all ? static_cast<size_t>(n) : hp.keep.size();
          KVTRIM_CHECK(hp.key_token_channels.size() == rows * static_cast<size_t>(T),
                       "compression plan (layer %d, kv head %d): key_token_channels holds %zu "
                       "indices, expected %zu kept tokens x key_topk %d",
                       il, ih, hp.key_token_channels.size(), rows, T);
          for (size_t r = 0; r < rows; ++r) {
            const int32_t* row = hp.key_token_channels.data() + r * static_cast<size_t>(T);
            for (int j = 0; j < T; ++j) {
              KVTRIM_CHECK(row[j] >= 0 && row[j] < d && (j == 0 || row[j] > row[j - 1]),
                           "compression plan (layer %d, kv head %d): key_token_channels row %zu "
                           "entry %d = %d is out of range [0, %d) or not strictly increasing",
                           il, ih, r, j, row[j], d);
            }
          }
          KVTRIM_CHECK(hp.key_recovery_scale.empty() == hp.key_token_fill.empty(),
                       "compression plan (layer %d, kv head %d): key_recovery_scale and "
                       "key_token_fill are given together or not at all",
                       il, ih);
          if (!hp.key_recovery_scale.empty()) {
            KVTRIM_CHECK(hp.key_recovery_scale.size() == static_cast<size_t>(d) &&
                             hp.key_token_fill.size() == rows,
                         "compression plan (layer %d, kv head %d): key_recovery_scale holds %zu "
                         "floats (expected head_dim_k %d), key_token_fill %zu (expected %zu)",
                         il, ih, hp.key_recovery_scale.size(), d, hp.key_token_fill.size(), rows);
            for (float x : hp.key_recovery_scale)
              KVTRIM_CHECK(std::isfinite(x),
                           "compression plan (layer %d, kv head %d): key_recovery_scale is not "
                           "finite",
                           il, ih);
            for (float x : hp.key_token_fill)
              KVTRIM_CHECK(std::isfinite(x),
                           "compression plan (layer %d, kv head %d): key_token_fill is not finite",
                           il, ih);
          }
        }
      }
      if (!hp.anchors.empty()) {
        KVTRIM_CHECK(hp.has_basis() || hp.has_channels(),
                     "compression plan (layer %d, kv head %d): anchors are given without a basis "
                     "or key channels (anchors are the tokens a basis leaves dense)",
                     il, ih);
        const std::vector<std::pair<int, int64_t>> ord =
            H.cur ? order(H) : std::vector<std::pair<int, int64_t>>();
        for (size_t j = 0; j < hp.anchors.size(); ++j) {
          const int32_t a = hp.anchors[j];
          KVTRIM_CHECK(a >= 0 && a < n,
                       "compression plan (layer %d, kv head %d): anchors[%zu] = %d is out of range "
                       "[0, %lld) (the head's stored tokens)",
                       il, ih, j, a, static_cast<long long>(n));
          KVTRIM_CHECK(j == 0 || a > hp.anchors[j - 1],
                       "compression plan (layer %d, kv head %d): anchors[%zu] = %d after %d "
                       "(indices must be strictly increasing)",
                       il, ih, j, a, hp.anchors[j - 1]);
          KVTRIM_CHECK(hp.keep_all || std::binary_search(hp.keep.begin(), hp.keep.end(), a),
                       "compression plan (layer %d, kv head %d): anchors[%zu] = %d is not kept",
                       il, ih, j, a);
          KVTRIM_CHECK(ord.empty() || ord[static_cast<size_t>(a)].first < 0,
                       "compression plan (layer %d, kv head %d): anchors[%zu] = %d is already "
                       "stored in a basis (its full-rank vector is gone)",
                       il, ih, j, a);
        }
      }
      if (hp.keep_all) continue;
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
      any = any || hp.planned();
      same = same && !hp.has_basis() && !hp.has_channels() && hp.keep_all == h0.keep_all &&
             (hp.keep_all || hp.keep == h0.keep);
    }
    if (!any) continue;
    if (L.shared && !same) {  // heads diverge: each keeps its own positions from now on
      for (Head& H : L.heads) H.pos = L.pos;
      std::vector<int32_t>().swap(L.pos);
      L.shared = false;
    }
    for (int ih = 0; ih < nkv; ++ih) {
      const HeadPlan& hp = plan.at(il, ih);
      Head& H = L.heads[static_cast<size_t>(ih)];
      if (H.cur || hp.has_basis() || hp.has_channels()) {  // the layer is unshared here
        if (hp.planned()) apply_basis_head(H, hp);
        continue;
      }
      if (hp.keep_all) continue;
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

// A head with a basis (or getting one): token selection across its segments, then, with a new
// basis, re-encoding of its kept full-rank non-anchor tokens into a new epoch's segment.
void TokenCache::apply_basis_head(Head& H, const HeadPlan& hp) {
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  std::shared_ptr<const Basis> nb;
  if (hp.has_basis()) {
    auto b = std::make_shared<Basis>();
    b->id = next_epoch_++;
    b->rk = hp.basis_k.empty() ? dk : hp.rank_k;
    b->rv = hp.basis_v.empty() ? dv : hp.rank_v;
    b->uk = hp.basis_k;
    b->uv = hp.basis_v;
    b->dk = hp.decoder_k;
    b->dv = hp.decoder_v;
    b->dense = hp.appends_dense;
    nb = std::move(b);
  } else if (!hp.key_channels.empty()) {
    auto b = std::make_shared<Basis>();
    b->id = next_epoch_++;
    b->rk = static_cast<int>(hp.key_channels.size());
    b->rv = dv;
    b->kch.assign(hp.key_channels.begin(), hp.key_channels.end());
    nb = std::move(b);
  } else if (hp.has_channels()) {  // per-token channels
    auto b = std::make_shared<Basis>();
    b->id = next_epoch_++;
    b->rk = hp.key_topk;
    b->rv = dv;
    b->topk = true;
    b->rec = hp.key_recovery_scale;
    nb = std::move(b);
  }
  const std::vector<std::pair<int, int64_t>> ord = order(H);
  std::vector<int32_t> keep_dense, reenc, reenc_row;  // reenc_row: the plan row of each
  std::vector<std::vector<int32_t>> keep_seg(H.segs.size());
  size_t ia = 0;
  int32_t prow = 0;  // plan row of the token being taken (keep order)
  auto take = [&](int64_t g) {
    const bool anchor = ia < hp.anchors.size() && hp.anchors[ia] == g;
    if (anchor) ++ia;
    const auto [sg, j] = ord[static_cast<size_t>(g)];
    if (sg >= 0) {
      keep_seg[static_cast<size_t>(sg)].push_back(static_cast<int32_t>(j));
    } else if (!nb || anchor) {
      keep_dense.push_back(static_cast<int32_t>(j));
    } else {
      reenc.push_back(static_cast<int32_t>(j));
      reenc_row.push_back(prow);
    }
    ++prow;
  };
  if (hp.keep_all) {
    for (int64_t g = 0; g < static_cast<int64_t>(ord.size()); ++g) take(g);
  } else {
    for (int32_t g : hp.keep) take(g);
  }
  Seg ns;  // the new epoch's segment (re-encoded from the full-rank rows still stored)
  if (nb && !reenc.empty()) {
    ns.b = nb;
    ns.s.dk = nb->rk;
    ns.s.dv = nb->rv;
    if (nb->topk) {
      ns.s.sp_isz = dk <= 256 ? 1 : 2;
      ns.s.sp_sb = nb->rec.empty() ? 0 : (dk - nb->rk + 7) / 8;
    }
    const int64_t n = static_cast<int64_t>(reenc.size());
    realloc_head(ns.s, (n + kv::kKeyTile - 1) / kv::kKeyTile * kv::kKeyTile, /*grow=*/true,
                 nullptr, 0);
    std::vector<float> kf(static_cast<size_t>(dk)), vf(static_cast<size_t>(dv)),
        ck(static_cast<size_t>(nb->rk)), cv(static_cast<size_t>(nb->rv));
    ns.s.pos.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      get_row(H, reenc[static_cast<size_t>(r)], kf.data(), vf.data());
      if (nb->topk) {
        const size_t pr = static_cast<size_t>(reenc_row[static_cast<size_t>(r)]);
        put_sparse_row(ns.s, r, *nb, kf.data(), vf.data(),
                       hp.key_token_channels.data() + pr * static_cast<size_t>(nb->rk),
                       nb->rec.empty() ? 0.f : hp.key_token_fill[pr]);
        ns.s.pos[static_cast<size_t>(r)] = H.pos[static_cast<size_t>(reenc[static_cast<size_t>(r)])];
        continue;
      }
      project_key(*nb, dk, kf.data(), ck.data());
      project(nb->uv, dv, nb->rv, vf.data(), cv.data());
      put_row(ns.s, r, ck.data(), cv.data());
      ns.s.pos[static_cast<size_t>(r)] = H.pos[static_cast<size_t>(reenc[static_cast<size_t>(r)])];
    }
    ns.s.n_tok = n;
  }
  select(H, keep_dense);
  for (size_t sg = 0; sg < H.segs.size(); ++sg) select(H.segs[sg].s, keep_seg[sg]);
  // a basis no token uses any more is freed with its last segment (unless it is current)
  std::erase_if(H.segs, [](const Seg& g) { return g.s.n_tok == 0; });
  if (ns.s.n_tok > 0) H.segs.push_back(std::move(ns));
  if (nb) H.cur = std::move(nb);
}

KvCache::HeadLayout TokenCache::head_layout(int il, int ih) const {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer && ih >= 0 && ih < cfg_.n_head_kv,
               "head_layout: (layer %d, kv head %d) out of range", il, ih);
  const Head& H = layers_[static_cast<size_t>(il)].heads[static_cast<size_t>(ih)];
  HeadLayout out;
  if (!H.cur) {  // no basis / channel epoch: every token dense
    out.epoch.assign(static_cast<size_t>(H.n_tok), -1);
    return out;
  }
  for (const auto& [seg, row] : order(H))
    out.epoch.push_back(seg < 0 ? -1 : H.segs[static_cast<size_t>(seg)].b->id);
  const Basis& b = *H.cur;
  out.current_epoch = b.id;
  out.appends_dense = b.appends_dense();
  if (!b.uk.empty()) {
    out.rank_k = b.rk;
    out.basis_k = b.uk;
    out.decoder_k = b.dk;
  }
  if (!b.uv.empty()) {
    out.rank_v = b.rv;
    out.basis_v = b.uv;
    out.decoder_v = b.dv;
  }
  return out;
}

int32_t TokenCache::read_row(const Head& H, int sg, int64_t j, float* kt, float* vt, float* ck,
                             float* cv) const {
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  if (sg < 0) {
    get_row(H, j, kt, vt);
    return H.pos[static_cast<size_t>(j)];
  }
  const Seg& G = H.segs[static_cast<size_t>(sg)];
  get_row(G.s, j, kt ? ck : nullptr, vt ? cv : nullptr);
  if (kt && G.b->topk) {  // kept values; pruned: ±fill·r[c] with recovery, else 0
    const Store& S = G.s;
    const int T = S.dk;
    const uint8_t* ix = S.kidx.p.get() + static_cast<size_t>(j * T) * static_cast<size_t>(S.sp_isz);
    const uint8_t* sb = S.sp_sb ? S.ksign.p.get() + static_cast<size_t>(j) * S.sp_sb : nullptr;
    int jj = 0, ord = 0;
    for (int c = 0; c < dk; ++c) {
      const int cj = jj < T ? (S.sp_isz == 1 ? ix[jj] : reinterpret_cast<const uint16_t*>(ix)[jj]) : -1;
      if (cj == c) {
        kt[c] = ck[static_cast<size_t>(jj++)];
      } else if (sb) {
        const float f = S.kfill.as<float>()[j] * G.b->rec[static_cast<size_t>(c)];
        kt[c] = ((sb[ord >> 3] >> (ord & 7)) & 1) ? -f : f;
        ++ord;
      } else {
        kt[c] = 0.f;
      }
    }
  } else if (kt) {
    lift_key(*G.b, dk, ck, kt);
  }
  if (vt) lift(G.b->dec_v(), dv, G.b->rv, cv, vt);
  return G.s.pos[static_cast<size_t>(j)];
}

void TokenCache::read_head(int il, int ih, std::vector<float>* k, std::vector<float>* v,
                           std::vector<int32_t>* pos) const {
  const int64_t n = n_tokens(il, ih);  // range-checks (il, ih)
  const Layer& L = layers_[il];
  const Head& H = L.heads[static_cast<size_t>(ih)];
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  if (H.cur) {  // basis mode: every token reconstructed with the basis of its own epoch
    const std::vector<std::pair<int, int64_t>> ord = order(H);
    if (k) k->resize(static_cast<size_t>(n * dk));
    if (v) v->resize(static_cast<size_t>(n * dv));
    if (pos) pos->resize(static_cast<size_t>(n));
    std::vector<float> ck(static_cast<size_t>(dk)), cv(static_cast<size_t>(dv));
    for (int64_t t = 0; t < n; ++t) {
      const auto [sg, j] = ord[static_cast<size_t>(t)];
      const int32_t p = read_row(H, sg, j, k ? k->data() + t * dk : nullptr,
                                 v ? v->data() + t * dv : nullptr, ck.data(), cv.data());
      if (pos) (*pos)[static_cast<size_t>(t)] = p;
    }
    return;
  }
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

void TokenCache::read_head_rows(int il, int ih, const std::vector<int32_t>& rows,
                                std::vector<float>* k, std::vector<float>* v) const {
  const int64_t n = n_tokens(il, ih);  // range-checks (il, ih)
  for (size_t r = 0; r < rows.size(); ++r)
    KVTRIM_CHECK(rows[r] >= 0 && rows[r] < n && (r == 0 || rows[r] > rows[r - 1]),
                 "read_head_rows: (layer %d, kv head %d) row %zu is %d: rows must be increasing "
                 "and in [0, %lld)",
                 il, ih, r, rows[r], static_cast<long long>(n));
  const Head& H = layers_[static_cast<size_t>(il)].heads[static_cast<size_t>(ih)];
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  const int64_t m = static_cast<int64_t>(rows.size());
  if (k) k->resize(static_cast<size_t>(m * dk));
  if (v) v->resize(static_cast<size_t>(m * dv));
  // Without a basis every token is a dense row, in position order.
  const std::vector<std::pair<int, int64_t>> ord =
      H.cur ? order(H) : std::vector<std::pair<int, int64_t>>();
  std::vector<float> ck(static_cast<size_t>(dk)), cv(static_cast<size_t>(dv));
  for (int64_t r = 0; r < m; ++r) {
    const int64_t t = rows[static_cast<size_t>(r)];
    float* kt = k ? k->data() + r * dk : nullptr;
    float* vt = v ? v->data() + r * dv : nullptr;
    if (H.cur) {
      const auto [sg, j] = ord[static_cast<size_t>(t)];
      read_row(H, sg, j, kt, vt, ck.data(), cv.data());
    } else {
      get_row(H, t, kt, vt);
    }
  }
}

int64_t TokenCache::n_tokens(int il, int ih) const {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer && ih >= 0 && ih < cfg_.n_head_kv,
               "KV cache: (layer %d, kv head %d) out of range (%d layers, %d kv heads)", il, ih,
               cfg_.n_layer, cfg_.n_head_kv);
  return head_tokens(layers_[il].heads[static_cast<size_t>(ih)]);
}

KvBytes TokenCache::bytes() const {
  KvBytes b;
  b.per_layer.resize(layers_.size());
  const size_t es = esize_;
  for (size_t il = 0; il < layers_.size(); ++il) {
    const Layer& L = layers_[il];
    size_t keys = 0, values = 0, positions = 0, scales = 0, bases = 0, indices = 0, bitmasks = 0,
           other = 0;
    if (L.shared) positions = L.pos.size() * sizeof(int32_t);
    auto add = [&](const Store& S) {
      const size_t n = static_cast<size_t>(S.n_tok);
      keys += n * static_cast<size_t>(S.dk) * es;
      values += n * static_cast<size_t>(S.dv) * es;
      if (!L.shared) positions += n * sizeof(int32_t);
      if (cfg_.dtype == KvDtype::kQ8) scales += 2 * n * sizeof(float);  // one key + one value scale
      if (S.sp_isz) {  // per-token channels: indices, sign bits and fills
        indices += n * static_cast<size_t>(S.dk) * static_cast<size_t>(S.sp_isz);
        bitmasks += n * static_cast<size_t>(S.sp_sb);
        if (S.sp_sb) scales += n * sizeof(float);
      }
    };
    for (const Head& H : L.heads) {
      add(H);
      if (!H.cur) continue;
      std::vector<const Basis*> held{H.cur.get()};  // each basis the head holds, once
      for (const Seg& g : H.segs) {
        add(g.s);
        other += sizeof(int32_t);  // the segment's epoch id
        held.push_back(g.b.get());
      }
      std::sort(held.begin(), held.end());
      held.erase(std::unique(held.begin(), held.end()), held.end());
      for (const Basis* B : held) {
        bases += (B->uk.size() + B->uv.size() + B->dk.size() + B->dv.size()) * sizeof(float);
        indices += B->kch.size() * sizeof(uint16_t);
        scales += B->rec.size() * sizeof(float);
      }
    }
    b.keys += keys;
    b.values += values;
    b.positions += positions;
    b.scales += scales;
    b.bases += bases;
    b.indices += indices;
    b.bitmasks += bitmasks;
    b.other += other;
    b.per_layer[il] = keys + values + positions + scales + bases + indices + bitmasks + other;
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
      auto cut = [pos](Store& S) {
        const int64_t keep = std::lower_bound(S.pos.begin(), S.pos.end(), pos) - S.pos.begin();
        S.pos.resize(static_cast<size_t>(keep));
        S.n_tok = keep;
      };
      for (Head& H : L.heads) {
        cut(H);
        for (Seg& g : H.segs) cut(g.s);
        std::erase_if(H.segs, [](const Seg& g) { return g.s.n_tok == 0; });
      }
      // An emptied layer whose heads hold no basis shares positions again, so a new context
      // after clear() is stored (and counted) like the first one: 4 bytes per position, not
      // per (position, head).
      const bool empty = std::all_of(L.heads.begin(), L.heads.end(), [](const Head& H) {
        return H.n_tok == 0 && H.segs.empty() && !H.cur;
      });
      if (empty) {
        L.shared = true;
        L.pos.clear();
        for (Head& H : L.heads) std::vector<int32_t>().swap(H.pos);
      }
    }
  }
  n_past_ = std::min(n_past_, pos);
}

void TokenCache::reset() {
  truncate(0);
  for (Layer& L : layers_) {
    bool had_basis = false;
    for (Head& H : L.heads) {
      had_basis = had_basis || H.cur != nullptr;
      H.cur.reset();
      H.segs.clear();
    }
    if (had_basis) {  // emptied and basis-free: positions are shared again (as in truncate)
      L.shared = true;
      L.pos.clear();
      for (Head& H : L.heads) std::vector<int32_t>().swap(H.pos);
    }
  }
}

std::string TokenCache::describe() const {
  const KvBytes b = bytes();
  int64_t stored = 0;
  for (const Layer& L : layers_)
    for (const Head& H : L.heads) stored += head_tokens(H);
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
