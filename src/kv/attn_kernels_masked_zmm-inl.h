// The masked-row kernels on AVX-512 (Highway's AVX3_DL target): included by
// attn_kernels_masked.cpp inside its per-target namespace, compiled in the AVX3_DL pass only.
//
// Why a kernel of its own: on 512-bit vectors a row group is 16 channels and its 16 mask bits are
// an AVX-512 mask register as they are stored, so the expansion needs no table at all: the next 16
// packed values are converted to f32 as a dense row's are, and one vexpandps puts the first
// popcount(bits) of them into their lanes and zeroes the others; the pruned lanes' fill (SPARK:
// ±fill · w_c) is merged under the same mask, its signs flipped under the sign bits. Per row
// group: one 16-bit mask load, one value load and conversion, the expansion and a popcount, then
// one FMA per query head: the dense kernel's work plus ~4 instructions, where the 8-lane table
// path of attn_kernels_masked.cpp spends ~14 per 8 channels (counted from the code).
//   scores: 16 rows' per-head accumulators are reduced together (a transpose-and-add tree, 3
//           instructions per row and head instead of a horizontal sum's 8);
//   accum:  the output rows stay in registers across the tokens (up to 6 heads × 4 groups per
//           pass; wider heads take several passes over a block of rows, which is then in L1);
//   decode: rows as dense f32.
// Every kernel computes each coordinate as the portable path does (kept: value · row scale;
// pruned: ±fill · w), so decode is bit-identical and scores / accum differ only in the order of
// their float additions.
#if HWY_TARGET == HWY_AVX3_DL

#include <immintrin.h>

// Highway 1.0's AVX3_DL target string, plus popcnt (for the per-group count).
#define KV_MZ_ATTR __attribute__((target(HWY_TARGET_STR ",popcnt")))
#define KV_MZ_INLINE inline __attribute__((always_inline)) KV_MZ_ATTR

namespace zmm {

constexpr int kRows = 16;      // scores: rows reduced together
constexpr int kMaxCB = 4;      // accum: 16-channel groups per pass
constexpr int kAccHeads = 6;   // accum: query heads per pass (6 × 4 accumulators + 4 groups)
constexpr int64_t kBlock = 32; // accum: rows per block (every pass of a block reads it from L1)

// The 16 mask bits of group j (2 bytes; the last group of an odd byte count has only one).
KV_MZ_INLINE __mmask16 group_mask(const uint8_t* m, int64_t j, int64_t mb) {
  if (2 * j + 1 < mb) {
    uint16_t b;
    std::memcpy(&b, m + 2 * j, 2);
    return static_cast<__mmask16>(b);
  }
  return static_cast<__mmask16>(m[2 * j]);
}

// Set bits of the row's mask in its first `groups` groups (the packed entries before group j0).
KV_MZ_INLINE int64_t bits_before(const uint8_t* m, int64_t groups, int64_t mb) {
  int64_t n = 0;
  const int64_t bytes = std::min<int64_t>(2 * groups, mb);
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, m + i, 8);
    n += __builtin_popcountll(w);
  }
  for (; i < bytes; ++i) n += __builtin_popcount(m[i]);
  return n;
}

// The packed values at v spread over the lanes set in k, as f32 (times scv where kScaleIt), the
// other lanes 0 or, kMerge, src's (the pruned coordinates' fill: vexpandps merges it in the same
// instruction), and v moved past them. The narrower types convert one whole vector of raw elements
// (at most 32 bytes, inside the store's slack) and expand the f32 lanes: on Zen 4 vpexpandw /
// vpexpandb take ~3.5× the time of vexpandps (measured: 2.9 vs 0.8 ns per 16-channel group and
// three FMAs), in either form. f32 expands from memory (no read past the row; never scaled).
template <typename V, bool kScaleIt, bool kMerge>
KV_MZ_INLINE __m512 expand(const typename sv::Raw<V>::T*& v, __mmask16 k, __m512 scv, __m512 src) {
  __m512 r;
  if constexpr (std::is_same_v<V, float>) {
    static_assert(!kScaleIt);
    r = kMerge ? _mm512_mask_expandloadu_ps(src, k, v) : _mm512_maskz_expandloadu_ps(k, v);
  } else {
    if constexpr (std::is_same_v<V, uint16_t>) {
      r = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)));
    } else if constexpr (std::is_same_v<V, sv::Bf16>) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
      r = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
    } else if constexpr (std::is_same_v<V, int8_t>) {
      r = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v))));
    } else {  // fp8 E4M3 via f16 bits, as sv::convert
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
      const __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(x), 7);
      r = _mm512_cvtph_ps(_mm256_add_epi16(w, _mm256_and_si256(w, _mm256_set1_epi16(0x4000))));
    }
    if constexpr (kScaleIt) r = _mm512_mul_ps(r, scv);
    r = kMerge ? _mm512_mask_expand_ps(src, k, r) : _mm512_maskz_expand_ps(k, r);
  }
  v += __builtin_popcount(static_cast<unsigned>(k));
  return r;
}

// One row's cursor and constants.
template <typename V, bool kAlt>
struct Row {
  using R = typename sv::Raw<V>::T;
  static constexpr bool kMul = sv::kScaled<V> || sv::kValMul<V> != 1.f;
  const R* v;
  const uint8_t* m;
  const uint8_t* sg;
  int64_t mb;
  __m512 scv, fv;

  KV_MZ_INLINE void start(const MaskedRows& r, int64_t t, int64_t mb_) {
    mb = mb_;
    v = static_cast<const R*>(r.vals) + row_begin(r, t);
    m = r.mask + t * mb;
    sg = kAlt && r.signs ? r.signs + t * mb : masked::kZeroSigns;
    scv = _mm512_set1_ps(row_scale(r, t) * sv::kValMul<V>);
    fv = _mm512_set1_ps(kAlt ? r.fill[t * r.fill_stride] : 0.f);
  }
  // Group j's 16 coordinates (kept: the values, times the row scale when kScale; pruned: 0, or
  // ±fill · w with w = the group's staged weights).
  template <bool kScale>
  KV_MZ_INLINE __m512 group(int64_t j, const float* w) {
    const __mmask16 k = group_mask(m, j, mb);
    if constexpr (kAlt) {
      const __m512 alt = _mm512_mul_ps(fv, _mm512_load_ps(w + j * 16));
      const __m512 flipped = _mm512_mask_xor_ps(alt, group_mask(sg, j, mb), alt, _mm512_set1_ps(-0.f));
      return expand<V, kScale && kMul, true>(v, k, scv, flipped);
    } else {
      return expand<V, kScale && kMul, false>(v, k, scv, _mm512_setzero_ps());
    }
  }
};

// out lane i = the sum of v[i]'s lanes, i < 16 (a transpose-and-add tree).
KV_MZ_INLINE __m512 sum16(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {  // 256-bit halves: quarters 0-1 of a[i] from v[2i], 2-3 from v[2i+1]
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 4; ++i) {  // quarter k of b[i]: 4 partial sums of row 4i + k
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int i = 0; i < 2; ++i) {  // quarter k of c[i]: rows 8i + k (lanes 0-1), 8i + 4 + k (2-3)
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // lane 4k + i: row 4i + k
  const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(idx, d);
}

// Rows i0 .. i0 + kR - 1 of the block starting at tb (kR = 1 or 2: two rows share each q load and
// give the FMAs two independent chains): part[g][i] = the per-lane products summed over the groups.
// kGroups: the group count where it is a compile-time constant (dims 64 / 128 / 256), else 0.
template <int kG, int kR, int kGroups, bool kAlt, typename V>
KV_MZ_INLINE void score_rows(const MaskedRows& r, const float* HWY_RESTRICT qT, const float* w, int64_t dimP,
                             int64_t mb, int64_t tb, int i0, __m512 (*part)[kRows]) {
  const int64_t groups = kGroups ? kGroups : dimP / 16;
  Row<V, kAlt> row[kR];
  __m512 acc[kR][kG];
  for (int x = 0; x < kR; ++x) {
    row[x].start(r, tb + i0 + x, mb);
    for (int g = 0; g < kG; ++g) acc[x][g] = _mm512_setzero_ps();
  }
#pragma GCC unroll 16
  for (int64_t j = 0; j < groups; ++j) {
    __m512 k[kR];
    for (int x = 0; x < kR; ++x) k[x] = row[x].template group<kAlt>(j, w);
    for (int g = 0; g < kG; ++g) {
      const __m512 q = _mm512_load_ps(qT + g * dimP + j * 16);
      for (int x = 0; x < kR; ++x) acc[x][g] = _mm512_fmadd_ps(q, k[x], acc[x][g]);
    }
  }
  for (int x = 0; x < kR; ++x)
    for (int g = 0; g < kG; ++g) part[g][i0 + x] = acc[x][g];
}

// Scores for ng <= kG query heads: qT [kG][dimP] staged (zero-padded, dimP a multiple of 16),
// w [dimP] staged weights (kAlt).
template <int kG, int kGroups, bool kAlt, typename V>
KV_MZ_ATTR HWY_NOINLINE void scores_n(const MaskedRows& r, const float* HWY_RESTRICT qT, const float* w,
                                      int64_t dimP, int ng, int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  static_assert(kG <= 8, "two rows' 2 · kG accumulators, their groups and q fit 32 zmm registers");
  const int64_t mb = mask_bytes(r);
  alignas(64) __m512 part[kG][kRows];
  for (int64_t tb = t0; tb < t0 + n_t; tb += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, t0 + n_t - tb));
    int i = 0;
    for (; i + 2 <= nr; i += 2) score_rows<kG, 2, kGroups, kAlt, V>(r, qT, w, dimP, mb, tb, i, part);
    for (; i < nr; ++i) score_rows<kG, 1, kGroups, kAlt, V>(r, qT, w, dimP, mb, tb, i, part);
    for (int g = 0; g < kG; ++g)
      for (int x = nr; x < kRows; ++x) part[g][x] = _mm512_setzero_ps();
    // the row scale once per row where the kept values were not scaled (no pruned fill)
    const __mmask16 out = static_cast<__mmask16>((1u << nr) - 1);
    __m512 sc = _mm512_set1_ps(kAlt ? 1.f : sv::kValMul<V>);
    if (!kAlt && r.scale) sc = _mm512_mul_ps(sc, _mm512_maskz_loadu_ps(out, r.scale + tb));
    for (int g = 0; g < ng && g < kG; ++g)
      _mm512_mask_storeu_ps(s + g * ld_s + (tb - t0), out, _mm512_mul_ps(sum16(part[g]), sc));
  }
}

template <int kG, bool kAlt, typename V>
HWY_INLINE void scores(const MaskedRows& r, const float* HWY_RESTRICT qT, const float* w, int64_t dimP, int ng,
                       int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  switch (dimP) {
    case 64:
      return scores_n<kG, 4, kAlt, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s);
    case 128:
      return scores_n<kG, 8, kAlt, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s);
    case 256:
      return scores_n<kG, 16, kAlt, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s);
    default:
      return scores_n<kG, 0, kAlt, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s);
  }
}

// acc[g][c] += Σ_t p[g][t] · row_t[c] for g < kG, c in groups [j0, j0 + ncb) (ncb <= kMaxCB; kCB:
// ncb where it is kMaxCB, else 0 and ncb at run time), rows [t0, t0 + n_t); acc rows ld_acc
// apart, dim columns (the last group masked).
template <int kG, int kCB, bool kAlt, typename V>
KV_MZ_ATTR HWY_NOINLINE void accum_pass(const MaskedRows& r, const float* p, int64_t ld_p, const float* w,
                                        int64_t j0, int ncb_rt, int64_t t0, int64_t n_t, float* acc,
                                        int64_t ld_acc) {
  const int ncb = kCB ? kCB : ncb_rt;
  const int64_t mb = mask_bytes(r), dim = r.dim;
  __mmask16 cols[kMaxCB];
  for (int jj = 0; jj < kMaxCB; ++jj) {
    const int64_t c0 = (j0 + jj) * 16, live = jj < ncb ? std::clamp<int64_t>(dim - c0, 0, 16) : 0;
    cols[jj] = static_cast<__mmask16>((1u << live) - 1);
  }
  __m512 a[kG][kMaxCB];
  for (int g = 0; g < kG; ++g)
    for (int jj = 0; jj < kMaxCB; ++jj) a[g][jj] = _mm512_maskz_loadu_ps(cols[jj], acc + g * ld_acc + (j0 + jj) * 16);
  Row<V, kAlt> row;
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    row.start(r, t, mb);
    if (j0 > 0) row.v += bits_before(row.m, j0, mb);
    __m512 e[kMaxCB];
    for (int jj = 0; jj < kMaxCB; ++jj)
      e[jj] = kCB || jj < ncb ? row.template group<true>(j0 + jj, w) : _mm512_setzero_ps();
    for (int g = 0; g < kG; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g * ld_p + (t - t0)]);
      for (int jj = 0; jj < kMaxCB; ++jj) a[g][jj] = _mm512_fmadd_ps(pg, e[jj], a[g][jj]);
    }
  }
  for (int g = 0; g < kG; ++g)
    for (int jj = 0; jj < ncb; ++jj) _mm512_mask_storeu_ps(acc + g * ld_acc + (j0 + jj) * 16, cols[jj], a[g][jj]);
}

template <bool kAlt, typename V>
KV_MZ_ATTR HWY_NOINLINE void decode(const MaskedRows& r, const float* w, int64_t dimP, int64_t t0, int64_t n_t,
                                    float* out, int64_t ld_out) {
  const int64_t groups = dimP / 16, mb = mask_bytes(r), dim = r.dim;
  const __mmask16 tail = static_cast<__mmask16>((1u << (dim - (groups - 1) * 16)) - 1);
  Row<V, kAlt> row;
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    row.start(r, t, mb);
    float* o = out + (t - t0) * ld_out;
    for (int64_t j = 0; j < groups; ++j)
      _mm512_mask_storeu_ps(o + j * 16, j + 1 < groups ? static_cast<__mmask16>(0xFFFF) : tail,
                            row.template group<true>(j, w));
  }
}

}  // namespace zmm

#endif  // HWY_TARGET == HWY_AVX3_DL
