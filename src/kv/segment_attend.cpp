// Attention over one segment per encoding (segment_attend.h): the block loop with the online
// softmax, and which kernel scores / accumulates each stage's layout.
#include "kv/segment_attend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kv/attn_kernels.h"
#include "kv/kv_type.h"
#include "kv/quant_formats.h"
#include "kv/token_cache.h"

namespace kvtrim::kv {
namespace {

// Stored value width of a slot (without the fill sum).
int value_stored(const SideEncoding& v) { return v.per_token() ? v.width() : v.stored(); }

// s[g, t - b] (rows ld apart) = qs_g · k_t for rows [b, b + nb) of a dense key store.
void dense_scores(const SideStore& k, const float* qs, int G, int64_t b, int64_t nb, float* s,
                  int64_t ld) {
  kv_type(k.dtype()).ops.scores(qs, G, k.row_elems(), k.data(), k.row_scale(), k.block_scale(), b, nb, s, ld);
}

// s[g, t - b] = qs_g · R_pos[t] (D · c_t) for rows [b, b + nb) of a pre-RoPE key basis (rows ld
// apart; columns nb .. kBlock of s are overwritten with values nobody reads). A per-position
// rotation leaves no query projection that could see the stored coefficients, so the block's
// keys are reconstructed in f32, feature-major: kt [d, kBlock] = D · c_t is the score kernel
// itself with D's d rows as the "queries" over the stored coefficient tiles (any dtype, scales
// applied); RoPE rotates kt's row pairs with lanes over tokens; the group's scores are then one
// weighted sum of kt's rows per query head (s_g = Σ_i qs[g, i] kt[i, :]).
void rope_key_scores(const SideStore& k, const SideEncoding& e, const float* qs, int G,
                     const int32_t* pos, int64_t b, int64_t nb, float* s, int64_t ld) {
  KVTRIM_ASSERT(pos && !k.sparse() && e.basis && e.channels.all() && ld == kBlock);
  const int d = e.d;
  thread_local std::vector<float> kt;
  kt.resize(static_cast<size_t>(d) * kBlock);  // columns past nb: finite leftovers
  dense_scores(k, e.basis->decoder().data(), d, b, nb, kt.data(), kBlock);
  rope_cols(*e.rope, kt.data(), kBlock, nb, pos + b, /*inverse=*/false);
  std::fill(s, s + static_cast<int64_t>(G) * kBlock, 0.f);
  attn_accum_f32(qs, G, d, kt.data(), d, kBlock, s);
}

// The per-row scales a kernel view carries (q8 / fp8 rows), else nullptr.
const float* view_scales(const SideStore& st) {
  return kv_type(st.dtype()).scale == KvScale::kRow ? st.row_scale() : nullptr;
}

// The list kernels' view of per-token list rows; false for q4 rows and bitmask rows.
bool sparse_view(const SideStore& st, int w, SparseRows* r) {
  if (!kv_type(st.dtype()).sparse_kernels || st.bitmask()) return false;
  r->type = st.dtype();
  r->vals = st.data();
  r->idx = st.idx();
  r->idx_bytes = st.idx_bytes();
  r->off = st.offsets();
  r->T = st.topk();
  r->scale = view_scales(st);
  r->dim = w;
  return true;
}

// The masked kernels' view of bitmask rows: pruned coordinates as zero, value fill, or the
// degenerate key recovery ±fill · r_c (weight = the recovery scale r); false for q4 rows, list
// rows and sampled recoveries (drawn per coordinate: the generic path).
bool masked_view(const SideStore& st, const SideEncoding& e, int w, bool keys, MaskedRows* r) {
  if (!kv_type(st.dtype()).sparse_kernels || !st.bitmask()) return false;
  const bool rec = keys && e.recovers();
  if (keys && e.sampled_recovery()) return false;
  r->type = st.dtype();
  r->vals = st.data();
  r->mask = st.mask_row(0);
  r->off = st.offsets();
  r->T = st.topk();
  r->scale = view_scales(st);
  r->signs = rec ? st.sign_row(0) : nullptr;
  r->fill = st.fill_params() > 0 ? st.fills() : nullptr;
  r->fill_stride = st.fill_params();
  r->weight = rec ? e.recovery()->scale.data() : nullptr;
  r->dim = w;
  return true;
}

// Coordinate masks of rows up to kMaskWords · 64 wide (bit c of word c / 64).
constexpr int kMaskWords = 4;
using Mask = uint64_t[kMaskWords];

// Degenerate recovery (one fill per token) on long segments: the recovery term of a token is
// fill · Σ_{c pruned} ±qr_g[c] = fill · (Σ_{pruned} qr_g − 2 Σ_{pruned, negative} qr_g), two
// masked sums. Byte tables make each one nbytes lookups: for a chunk of kLanes query heads,
// byte b of a mask and its value v, tab[((chunk · nbytes + b) · 256 + v) · kLanes + l] = Σ over
// the set bits i of v of qr_{chunk·kLanes + l}[8b + i], so one lookup serves kLanes heads (one
// SIMD add). Per token: 2 · nbytes lookups per chunk of 4 heads, whatever the pruned count.
struct RecoveryTables {
  static constexpr int kLanes = 4;
  int nbytes = 0, chunks = 0;
  std::vector<float> tab;
  bool on() const { return nbytes > 0; }
  void build(const float* qr, int G, int w) {
    nbytes = (w + 7) / 8;
    chunks = (G + kLanes - 1) / kLanes;
    tab.assign(static_cast<size_t>(chunks) * static_cast<size_t>(nbytes) * 256 * kLanes, 0.f);
    for (int ch = 0; ch < chunks; ++ch)
      for (int b = 0; b < nbytes; ++b) {
        float* t = table(ch, b);
        for (int v = 1; v < 256; ++v) {
          const int c = 8 * b + __builtin_ctz(static_cast<unsigned>(v));
          const float* prev = t + (v & (v - 1)) * kLanes;
          for (int l = 0; l < kLanes; ++l) {
            const int g = ch * kLanes + l;
            t[v * kLanes + l] = prev[l] + (g < G && c < w ? qr[static_cast<int64_t>(g) * w + c] : 0.f);
          }
        }
      }
  }
  size_t offset(int ch, int b) const {
    return (static_cast<size_t>(ch) * static_cast<size_t>(nbytes) + static_cast<size_t>(b)) * 256 * kLanes;
  }
  float* table(int ch, int b) { return tab.data() + offset(ch, b); }
  // out[l] = Σ_pruned qr − 2 Σ_neg qr for the heads of chunk ch: one 4-lane add per lookup (a
  // GCC / Clang vector type, so the lanes stay in one register on any target).
  void sum(int ch, const Mask& pruned, const Mask& neg, float* out) const {
    typedef float V4 __attribute__((vector_size(16)));
    static_assert(kLanes == 4);
    V4 a = {0, 0, 0, 0}, n = a, x;
    const float* t = tab.data() + offset(ch, 0);
    for (int b = 0; b < nbytes; ++b, t += 256 * kLanes) {
      const int sh = 8 * (b & 7);
      std::memcpy(&x, t + ((pruned[b >> 3] >> sh) & 255) * kLanes, sizeof x);
      a += x;
      std::memcpy(&x, t + ((neg[b >> 3] >> sh) & 255) * kLanes, sizeof x);
      n += x;
    }
    const V4 r = a - 2.f * n;
    std::memcpy(out, &r, sizeof r);
  }
};

// The row's kept coordinates ix [cnt] (increasing, < w <= 256: uint8) as a mask, accumulated in a
// register per word (a loop of |= into memory would chain store-to-load forwarding); pruned = the
// others below w; neg = the pruned ones whose stored sign bit (sign_row, ceil(w / 8) bytes) is set.
void row_masks(const uint8_t* ix, int cnt, int w, const uint8_t* sign_row, int sign_bytes, Mask& pruned,
               Mask& neg) {
  Mask sg = {};
  std::memcpy(sg, sign_row, static_cast<size_t>(sign_bytes));
  int j = 0;
  for (int i = 0; i < kMaskWords; ++i) {
    const int lo = 64 * i;
    uint64_t kept = 0;
    for (; j < cnt && ix[j] < lo + 64; ++j) kept |= uint64_t{1} << (ix[j] - lo);
    const uint64_t valid = w >= lo + 64 ? ~uint64_t{0} : w <= lo ? 0 : (uint64_t{1} << (w - lo)) - 1;
    pruned[i] = ~kept & valid;
    neg[i] = pruned[i] & sg[i];
  }
}

// Per-token key rows: s[g, t - b] = Σ_kept qs_g[c] k_tc + Σ_pruned ±m_tc qr_g[c] (qr = qs ∘ r,
// only with recovery; m_tc = the token's fill, or its draw for a sampled recovery). qs, qr: [G, w].
void sparse_scores(const SideStore& k, const SideEncoding& e, int w, const float* qs, const float* qr,
                   const RecoveryTables& rt, int G, int64_t b, int64_t nb, float* s, int64_t ld) {
  thread_local std::vector<float> val, pv;
  thread_local std::vector<int> ch, pc;
  thread_local std::vector<char> kept;
  const bool rec = qr != nullptr;
  MaskedRows mview;
  if (masked_view(k, e, w, /*keys=*/true, &mview)) {  // kept entries and recovery in one pass
    masked_scores(mview, qs, G, w, b, nb, s, ld);
    return;
  }
  SparseRows view;
  const bool kern = sparse_view(k, w, &view);
  if (kern) {
    kvtrim::kv::sparse_scores(view, qs, G, w, b, nb, s, ld);
    if (!rec) return;
  }
  const int nf = k.fill_params();
  if (kern && rt.on()) {  // the kernel scored the kept entries; the recovery term from the tables
    float out[RecoveryTables::kLanes];
    for (int64_t t = b; t < b + nb; ++t) {
      const int cnt = k.row_count(t);
      if (cnt == w) continue;
      Mask pruned, neg;
      row_masks(k.idx() + k.row_begin(t), cnt, w, k.sign_row(t), k.sign_bytes(), pruned, neg);
      const float fill = k.fills()[t * nf];
      for (int c4 = 0; c4 < rt.chunks; ++c4) {
        rt.sum(c4, pruned, neg, out);
        const int g0 = c4 * RecoveryTables::kLanes, gn = std::min(G - g0, RecoveryTables::kLanes);
        for (int l = 0; l < gn; ++l) s[(g0 + l) * ld + (t - b)] += fill * out[l];
      }
    }
    return;
  }
  for (int64_t t = b; t < b + nb; ++t) {
    const int64_t e0 = k.row_begin(t);
    const int cnt = k.row_count(t);
    val.resize(static_cast<size_t>(cnt));
    ch.resize(static_cast<size_t>(cnt));
    k.row_channels(t, ch.data());
    for (int j = 0; j < cnt; ++j)
      if (!kern) val[static_cast<size_t>(j)] = k.entry_at(t, e0 + j);  // (the kernel scored them)
    for (int g = 0; g < G && !kern; ++g) {
      const float* q = qs + static_cast<int64_t>(g) * w;
      float dot = 0;
      for (int j = 0; j < cnt; ++j) dot += q[ch[static_cast<size_t>(j)]] * val[static_cast<size_t>(j)];
      s[g * ld + (t - b)] = dot;
    }
    if (!rec || cnt == w) continue;
    const uint8_t* sg = k.sign_row(t);
    // The pruned coordinates with their signed magnitude.
    kept.assign(static_cast<size_t>(w), 0);
    for (int j = 0; j < cnt; ++j) kept[static_cast<size_t>(ch[static_cast<size_t>(j)])] = 1;
    const float* fp = k.fills() + t * nf;
    pc.clear();
    pv.clear();
    for (int c = 0; c < w; ++c) {
      if (kept[static_cast<size_t>(c)]) continue;
      const float mag = e.pruned_magnitude(fp, c);
      pc.push_back(c);
      pv.push_back(((sg[c >> 3] >> (c & 7)) & 1) ? -mag : mag);
    }
    const size_t np = pc.size();
    for (int g = 0; g < G; ++g) {
      const float* r = qr + static_cast<int64_t>(g) * w;
      float acc = 0;
      for (size_t j = 0; j < np; ++j) acc += pv[j] * r[pc[j]];
      s[g * ld + (t - b)] += acc;
    }
  }
}

// acc[g, :] (rows aw apart) += Σ_t p[g, t - b] v_t over rows [b, b + nb) of a dense value store.
void dense_accum(const SideStore& v, const float* p, int G, int64_t ldp, int64_t b, int64_t nb,
                 float* acc) {
  const KvTypeInfo& tt = kv_type(v.dtype());
  const int64_t dv = v.row_elems();
  if (tt.scale == KvScale::kRow) {
    // v_t = v_scale[t] · code_t: fold the scale into the weights, p'[g, t] = p[g, t] · v_scale[t]
    thread_local std::vector<float> pv;
    pv.resize(static_cast<size_t>(G) * static_cast<size_t>(nb));
    const float* vsc = v.row_scale() + b;
    for (int g = 0; g < G; ++g)
      for (int64_t t = 0; t < nb; ++t) pv[static_cast<size_t>(g * nb + t)] = p[g * ldp + t] * vsc[t];
    p = pv.data();
    ldp = nb;
  }
  const uint16_t* bs = tt.scale == KvScale::kBlock ? v.block_scale() + b * ((dv + kKvBlock - 1) / kKvBlock) : nullptr;
  tt.ops.accum(p, G, ldp, v.data() + b * static_cast<int64_t>(tt.code_bytes(dv)), bs, nb, dv, acc);
}

// Per-token value rows. Bitmask rows: acc[g, c] += p·ṽ_tc for every c (pruned: the fill or 0), the
// fill sum acc[g, w] untouched. List rows: acc[g, c] += p·v_tc for kept c; with fill, acc[g, w]
// (the fill sum) += p·fill_t and acc[g, c] -= p·fill_t for kept c (so that adding the fill sum to
// every coordinate at the lift gives fill_t on the pruned ones).
void sparse_accum(const SideStore& v, const SideEncoding& e, const float* p, int G, int64_t ldp, int64_t b,
                  int64_t nb, float* acc, int aw) {
  const int w = e.width();
  const bool fill = e.fill();
  MaskedRows mview;
  if (masked_view(v, e, w, /*keys=*/false, &mview)) {  // every coordinate (pruned: the fill)
    masked_accum(mview, p, G, ldp, b, nb, acc, aw);
    return;
  }
  SparseRows view;
  if (!fill && sparse_view(v, w, &view)) {
    kvtrim::kv::sparse_accum(view, p, G, ldp, b, nb, acc, aw);
    return;
  }
  thread_local std::vector<int32_t> ch;
  for (int64_t t = b; t < b + nb; ++t) {
    const int64_t e0 = v.row_begin(t);
    const int cnt = v.row_count(t);
    const float f = fill ? v.fills()[t] : 0.f;
    ch.resize(static_cast<size_t>(cnt));
    v.row_channels(t, ch.data());
    for (int g = 0; g < G; ++g) {
      const float pt = p[g * ldp + (t - b)];
      float* a = acc + static_cast<int64_t>(g) * aw;
      for (int j = 0; j < cnt; ++j) a[ch[static_cast<size_t>(j)]] += pt * (v.entry_at(t, e0 + j) - f);
      if (fill) a[w] += pt * f;
    }
  }
}

// One online-softmax step of one row over its scores sv[0..w) (softcap applied first): the
// accumulator acc [aw] and l are rescaled when the running max m grows, then sv[t] = e^{s_t - m}
// and l += Σ sv.
void softmax_step(float* sv, int64_t w, float softcap, float* acc, int aw, float* m, float* l) {
  if (softcap > 0) {
    for (int64_t t = 0; t < w; ++t) sv[t] = softcap * std::tanh(sv[t] / softcap);
  }
  const float mb = max_of(sv, w);
  if (mb > *m) {
    const float f = std::isinf(*m) ? 0.f : std::exp(*m - mb);
    *l *= f;
    for (int i = 0; i < aw; ++i) acc[i] *= f;
    *m = mb;
  }
  *l += exp_sub_sum(sv, w, *m);
}

}  // namespace

int key_query_width(const SideEncoding& k) {
  if (k.rope) return k.d;
  return k.per_token() ? k.width() : k.stored();
}

void key_query(const SideEncoding& k, const float* q, int G, float* qk) {
  if (k.rope) {  // the reconstructed keys meet the query itself
    std::copy(q, q + static_cast<int64_t>(G) * k.d, qk);
    return;
  }
  const ChannelSubset* sub = k.channels.subset();
  if (!sub) {
    k.query_coords(q, G, qk);
    return;
  }
  thread_local std::vector<float> full;
  full.resize(static_cast<size_t>(G) * static_cast<size_t>(k.width()));
  k.query_coords(q, G, full.data());
  const int s = k.stored(), w = k.width();
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < s; ++j)
      qk[g * s + j] = full[static_cast<size_t>(g * w + sub->channels[static_cast<size_t>(j)])];
}

bool same_key_query(const SideEncoding& a, const SideEncoding& b) {
  if (a.rope || b.rope) return a.rope.has_value() && b.rope.has_value() && a.d == b.d;
  const ChannelSubset *sa = a.channels.subset(), *sb = b.channels.subset();
  return a.basis == b.basis && a.d == b.d && (sa == nullptr) == (sb == nullptr) &&
         (!sa || sa->channels == sb->channels);
}

int slot_width(const SegmentEncoding& e) { return value_stored(e.v) + (e.v.fill() ? 1 : 0); }

void attend_rows(const SideStore& k, const SideStore& v, const SegmentEncoding& e, const float* qk,
                 int G, float scale, float softcap, int64_t t0, int64_t t1, float* acc, float* m,
                 float* l, const int32_t* pos) {
  const int kw = key_query_width(e.k), aw = slot_width(e);
  // scaled queries [G, kw]; recovery weights qr = qs ∘ r [G, kw]; scores [G, kBlock]
  thread_local std::vector<float> qs, qr, s;
  qs.resize(static_cast<size_t>(G) * kw);
  s.resize(static_cast<size_t>(G) * kBlock);
  for (int64_t i = 0; i < static_cast<int64_t>(G) * kw; ++i) qs[static_cast<size_t>(i)] = qk[i] * scale;
  const bool rec = e.k.per_token() && e.k.recovers();
  if (rec) {
    qr.resize(qs.size());
    const std::vector<float>& r = e.k.recovery()->scale;  // [kw]
    for (int64_t i = 0; i < static_cast<int64_t>(G) * kw; ++i)
      qr[static_cast<size_t>(i)] = qs[static_cast<size_t>(i)] * r[static_cast<size_t>(i % kw)];
  }
  // byte tables for the degenerate recovery when they pay off (long enough segments)
  thread_local RecoveryTables rt;
  rt.nbytes = 0;
  // (list rows only: bitmask rows score their recovery inside masked_scores)
  if (rec && !e.k.sampled_recovery() && !k.bitmask() && kw <= 64 * kMaskWords && t1 - t0 >= 96)
    rt.build(qr.data(), G, kw);
  std::fill(acc, acc + static_cast<int64_t>(G) * aw, 0.f);
  for (int g = 0; g < G; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0;
  }
  for (int64_t b = t0; b < t1; b += kBlock) {
    const int64_t nb = std::min(kBlock, t1 - b);
    // s[g, t] = scale · q_g · k_t
    if (e.k.rope) {
      rope_key_scores(k, e.k, qs.data(), G, pos, b, nb, s.data(), kBlock);
    } else if (k.sparse()) {
      sparse_scores(k, e.k, kw, qs.data(), rec ? qr.data() : nullptr, rt, G, b, nb, s.data(), kBlock);
    } else {
      dense_scores(k, qs.data(), G, b, nb, s.data(), kBlock);
    }
    for (int g = 0; g < G; ++g) {
      float* sg = s.data() + static_cast<int64_t>(g) * kBlock;
      softmax_step(sg, nb, softcap, acc + static_cast<int64_t>(g) * aw, aw, &m[g], &l[g]);
    }
    // acc_g += Σ_t p[g, t] v_t
    if (v.sparse()) {
      sparse_accum(v, e.v, s.data(), G, kBlock, b, nb, acc, aw);
    } else {
      dense_accum(v, s.data(), G, kBlock, b, nb, acc);
    }
  }
}

void attend_rows_multi(const SideStore& k, const SideStore& v, const SegmentEncoding& e, const float* qk,
                       int R, float scale, float softcap, const int64_t* lo, const int64_t* hi, float* acc,
                       float* m, float* l, const int32_t* pos) {
  KVTRIM_ASSERT(!k.sparse() && !v.sparse());
  const int kw = key_query_width(e.k), aw = slot_width(e);
  KVTRIM_ASSERT(aw == v.row_elems());
  thread_local std::vector<float> qs, s;
  qs.resize(static_cast<size_t>(R) * kw);
  s.resize(static_cast<size_t>(R) * kBlock);
  for (int64_t i = 0; i < static_cast<int64_t>(R) * kw; ++i) qs[static_cast<size_t>(i)] = qk[i] * scale;
  std::fill(acc, acc + static_cast<int64_t>(R) * aw, 0.f);
  int64_t t0 = std::numeric_limits<int64_t>::max(), t1 = 0;
  for (int r = 0; r < R; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0;
    if (lo[r] < hi[r]) {
      t0 = std::min(t0, lo[r]);
      t1 = std::max(t1, hi[r]);
    }
  }
  for (int64_t b = t0; b < t1; b += kBlock) {
    const int64_t nb = std::min(kBlock, t1 - b);
    // s[r, t] = scale · q_r · k_t for every row, then each row's softmax step over its part
    if (e.k.rope) {
      rope_key_scores(k, e.k, qs.data(), R, pos, b, nb, s.data(), kBlock);
    } else {
      dense_scores(k, qs.data(), R, b, nb, s.data(), kBlock);
    }
    bool any = false;
    for (int r = 0; r < R; ++r) {
      float* sr = s.data() + static_cast<int64_t>(r) * kBlock;
      const int64_t a = std::clamp<int64_t>(lo[r] - b, 0, nb), z = std::clamp<int64_t>(hi[r] - b, 0, nb);
      if (a >= z) {  // nothing visible here: zero weights
        std::fill(sr, sr + nb, 0.f);
        continue;
      }
      any = true;
      std::fill(sr, sr + a, 0.f);
      std::fill(sr + z, sr + nb, 0.f);
      float* sv = sr + a;
      const int64_t w = z - a;
      softmax_step(sv, w, softcap, acc + static_cast<int64_t>(r) * aw, aw, &m[r], &l[r]);
    }
    if (any) dense_accum(v, s.data(), R, kBlock, b, nb, acc);
  }
}

void lift_slot(const SegmentEncoding& e, const float* acc, int G, float* out) {
  const SideEncoding& v = e.v;
  const int aw = slot_width(e), w = v.width();
  if (v.identity() && !v.fill()) {  // already in the output space
    std::copy(acc, acc + static_cast<int64_t>(G) * aw, out);
    return;
  }
  thread_local std::vector<float> c;
  c.assign(static_cast<size_t>(G) * static_cast<size_t>(w), 0.f);
  for (int g = 0; g < G; ++g) {
    const float* a = acc + static_cast<int64_t>(g) * aw;
    float* cg = c.data() + static_cast<int64_t>(g) * w;
    if (const ChannelSubset* sub = v.channels.subset()) {
      for (size_t j = 0; j < sub->channels.size(); ++j) cg[sub->channels[j]] = a[j];
    } else {
      const float f = v.fill() ? a[w] : 0.f;
      for (int i = 0; i < w; ++i) cg[i] = a[i] + f;
    }
  }
  v.from_coords(c.data(), G, out, v.d);
}

void merge_softmax(int n, const float* const* accs, const float* ms, const float* ls,
                   int64_t width, float* acc, float* m, float* l) {
  float M = -std::numeric_limits<float>::infinity();
  for (int s = 0; s < n; ++s) M = std::max(M, ms[s]);
  std::fill(acc, acc + width, 0.f);
  *m = M;
  *l = 0;
  if (std::isinf(M)) return;  // no visible key
  for (int s = 0; s < n; ++s) {
    if (std::isinf(ms[s])) continue;
    const float f = std::exp(ms[s] - M);
    *l += f * ls[s];
    const float* a = accs[s];
    for (int64_t i = 0; i < width; ++i) acc[i] += f * a[i];
  }
}

}  // namespace kvtrim::kv
