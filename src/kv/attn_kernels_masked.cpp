// SIMD kernels over masked rows (MaskedRows in attn_kernels.h: per-token channel subsets whose
// kept coordinates are a bitmask, pruned coordinates read 0, a fill, or SPARK's signed recovery):
//   scores:  s[g][t] = Σ_c q[g][c] · row_t[c]
//   accum:   acc[g][c] += Σ_t p[g][t] · row_t[c]
//   decode:  the rows as dense f32
// One Highway translation unit compiled for every x86 target and dispatched at run time.
//
// Why this shape: the list kernels (attn_kernels_sparse.cpp) spend one q load per kept entry at a
// data-dependent channel plus, for SPARK, a second pass over the pruned channels' signs; at the
// head sizes of our models (d = 64 .. 256, T = d/5 .. d/2 kept) that costs more time than the
// bytes it saves. A bitmask row instead expands to dense lanes: for each group of N = 8
// coordinates (4 on 128-bit targets), the group's mask bits pick a permutation from a 256-entry
// table that moves the next popcount(bits) packed values to their lanes (one unaligned load,
// one conversion, one vpermps), the kept-lane mask (a second table) merges them with the pruned
// lanes' value (zero, or ±fill · w_c: one multiply and one sign XOR), and every query head of
// the group meets the 8 coordinates with one FMA, as the dense kernels do. Per token and group
// that is ~8 operations plus one FMA per head, independent of how many coordinates are kept, and
// no scattered loads: the work a dense row costs plus a fixed expansion, for the bytes of the
// packed row. Scores end with one horizontal sum per (token, head).
// Values take the same expansion into an f32 scratch block, summed by attn_accum_f32.
// On AVX-512 (AVX3_DL) attn_kernels_masked_zmm-inl.h replaces all of this: 16-channel groups whose
// mask bits are a k-register, one vexpandps per group, value rows summed in registers.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/fp16.h"
#include "kv/attn_kernels.h"
#include "kv/attn_kernels_masked_tables.h"

// AVX3_DL is opt-in in Highway 1.0.3 (as in ops/matmul_kernels.cpp): it runs the zmm kernels of
// attn_kernels_masked_zmm-inl.h, 16 channels per group.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif

// foreach_target.h must come first: it re-includes this file once per target.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/attn_kernels_masked.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kv/sparse_values-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace kvtrim::kv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using sv::Bf16;
using sv::kValMul;
using sv::Raw;
using sv::scalar;

#undef KVTRIM_MASKED_X86  // this file is compiled once per target
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define KVTRIM_MASKED_X86 1  // x86 with 256-bit vectors: AVX2 intrinsics on CappedTag<float, 8>
#endif

constexpr int64_t kMaxDim = 512;  // largest dim on the SIMD path (staged q: 8 · 2 KiB)
constexpr int kMaxG = 8;          // query heads per pass
[[maybe_unused]] constexpr int64_t kPrefetchBytes = 512;  // how far ahead of a row its values are prefetched (x86)

HWY_INLINE int64_t row_begin(const MaskedRows& r, int64_t t) {
  return r.off ? static_cast<int64_t>(r.off[t]) : t * r.T;
}
HWY_INLINE int64_t mask_bytes(const MaskedRows& r) {
  return (r.dim + 7) / 8;
}
HWY_INLINE float row_scale(const MaskedRows& r, int64_t t) {
  return r.scale ? r.scale[t] : 1.f;
}

// Row t as dense f32 coordinates out [dim] (plain loops: the scalar target and dim > kMaxDim).
template <typename V>
void decode_row_scalar(const MaskedRows& r, int64_t t, float* out) {
  const V* v = static_cast<const V*>(r.vals) + row_begin(r, t);
  const int64_t mb = mask_bytes(r);
  const uint8_t* m = r.mask + t * mb;
  const uint8_t* sg = r.signs ? r.signs + t * mb : nullptr;
  const float sc = row_scale(r, t) * kValMul<V>;
  const float f = r.fill ? r.fill[t * r.fill_stride] : 0.f;
  for (int64_t c = 0; c < r.dim; ++c) {
    if ((m[c >> 3] >> (c & 7)) & 1) {
      out[c] = sc * scalar(*v++);
    } else {
      const float x = r.fill ? f * (r.weight ? r.weight[c] : 1.f) : 0.f;
      out[c] = sg && ((sg[c >> 3] >> (c & 7)) & 1) ? -x : x;
    }
  }
}

// The mask bits of lane group j (N lanes per group, N = 8 or 4).
template <int64_t N>
HWY_INLINE unsigned group_bits(const uint8_t* m, int64_t j) {
  if constexpr (N == 8) {
    return m[j];
  } else {
    static_assert(N == 4);
    return (m[j >> 1] >> ((j & 1) * 4)) & 15u;
  }
}

// Expands row groups: holds one row's cursor (next packed value) and the per-row constants, and
// yields the N coordinates of group j as f32 (kept: scale · value; pruned: 0 or ±fill · w).
template <class DF, typename V, bool kAlt>
struct RowExpander {
  using R = typename Raw<V>::T;
  using VecF = hn::Vec<DF>;
  static constexpr int64_t N = hn::MaxLanes(DF());
  static constexpr bool kMul = sv::kScaled<V>;  // kept values need the row scale per group

  const R* v;
  const uint8_t* m;
  const uint8_t* sg;
  const float* w;  // staged weights [dimP] (kAlt)
  VecF scv, fv;

  HWY_INLINE void start(const MaskedRows& r, int64_t t, const float* wst, bool scale_kept) {
    const DF df;
    const int64_t mb = mask_bytes(r);
    v = static_cast<const R*>(r.vals) + row_begin(r, t);
    m = r.mask + t * mb;
    sg = r.signs ? r.signs + t * mb : masked::kZeroSigns;
    w = wst;
    scv = hn::Set(df, scale_kept ? row_scale(r, t) * kValMul<V> : 1.f);
    fv = hn::Set(df, kAlt ? r.fill[t * r.fill_stride] : 0.f);
  }

  // scale_kept: the kept values come out multiplied by the row scale (needed when they meet
  // pruned values in real units; else the caller applies it once per row).
  template <bool kScaleKept>
  HWY_INLINE VecF group(int64_t j) {
    const DF df;
    const hn::RebindToSigned<DF> di;
    const masked::Tables& tb = masked::kTables;
    const unsigned bits = group_bits<N>(m, j);
    const int32_t* perm = N == 8 ? tb.perm8[bits] : tb.perm4[bits];
    const int32_t* lanes = N == 8 ? tb.lanes8[bits] : tb.lanes4[bits];
    VecF e = hn::TableLookupLanes(sv::decode(df, reinterpret_cast<const V*>(v)), hn::SetTableIndices(df, perm));
    v += tb.cnt[bits];
    if constexpr (kScaleKept && (kMul || kValMul<V> != 1.f)) e = hn::Mul(e, scv);
    const auto keep = hn::MaskFromVec(hn::BitCast(df, hn::LoadU(di, lanes)));
    if constexpr (kAlt) {
      const unsigned sb = group_bits<N>(sg, j);
      const int32_t* sl = N == 8 ? tb.lanes8[sb] : tb.lanes4[sb];
      const auto neg = hn::And(hn::LoadU(di, sl), hn::Set(di, static_cast<int32_t>(0x80000000u)));
      const VecF alt = hn::Xor(hn::Mul(fv, hn::LoadU(df, w + j * N)), hn::BitCast(df, neg));
      return hn::IfThenElse(keep, e, alt);
    } else {
      return hn::IfThenElseZero(keep, e);
    }
  }
};

// s[g · ld_s] = Σ lanes of acc[g] for g < ng (kG accumulators of one token).
template <int kG, class DF>
HWY_INLINE void store_sums(DF df, const hn::Vec<DF>* acc, int ng, float sc, float* s, int64_t ld_s) {
#ifdef KVTRIM_MASKED_X86
  if constexpr (hn::MaxLanes(df) == 8) {  // horizontal adds: 4 heads' sums in 3 hadds + 1 add
    HWY_ALIGN float out[8];
    for (int g0 = 0; g0 < kG; g0 += 4) {
      const __m256 z = _mm256_setzero_ps();
      const __m256 a0 = acc[g0].raw, a1 = g0 + 1 < kG ? acc[g0 + 1].raw : z;
      const __m256 a2 = g0 + 2 < kG ? acc[g0 + 2].raw : z, a3 = g0 + 3 < kG ? acc[g0 + 3].raw : z;
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
      const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      _mm_store_ps(out + g0, _mm_mul_ps(r, _mm_set1_ps(sc)));
    }
    for (int g = 0; g < ng && g < kG; ++g) s[g * ld_s] = out[g];
    return;
  }
#endif
  for (int g = 0; g < ng; ++g) s[g * ld_s] = hn::GetLane(hn::SumOfLanes(df, acc[g])) * sc;
}

// Scores for ng <= kG query heads: qT [kG][dimP] staged (zero-padded), w [dimP] (kAlt); the
// portable version (128-bit and emulated targets; x86 with AVX2 takes scores_x86). With few heads
// each head keeps two accumulators (even / odd lane groups): two independent FMA chains per row.
template <int kG, bool kAlt, typename V>
HWY_NOINLINE void scores_g(const MaskedRows& r, const float* HWY_RESTRICT qT, const float* w, int64_t dimP,
                           int ng, int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  const hn::CappedTag<float, 8> df;
  using VecF = hn::Vec<decltype(df)>;
  constexpr int64_t N = hn::MaxLanes(df);
  constexpr int kSplit = kG <= 4 ? 2 : 1;
  RowExpander<decltype(df), V, kAlt> ex;
  const int64_t groups = dimP / N;
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    ex.start(r, t, w, kAlt);
    VecF acc[kSplit][kG];
    for (int h = 0; h < kSplit; ++h)
      for (int g = 0; g < kG; ++g) acc[h][g] = hn::Zero(df);
    int64_t j = 0;
    for (; j + kSplit <= groups; j += kSplit) {
      for (int h = 0; h < kSplit; ++h) {
        const VecF k = ex.template group<kAlt>(j + h);
        for (int g = 0; g < kG; ++g)
          acc[h][g] = hn::MulAdd(hn::Load(df, qT + g * dimP + (j + h) * N), k, acc[h][g]);
      }
    }
    for (; j < groups; ++j) {
      const VecF k = ex.template group<kAlt>(j);
      for (int g = 0; g < kG; ++g) acc[0][g] = hn::MulAdd(hn::Load(df, qT + g * dimP + j * N), k, acc[0][g]);
    }
    if constexpr (kSplit == 2)
      for (int g = 0; g < kG; ++g) acc[0][g] = hn::Add(acc[0][g], acc[1][g]);
    const float sc = kAlt ? 1.f : row_scale(r, t) * kValMul<V>;
    store_sums<kG>(df, acc[0], ng, sc, s + (t - t0), ld_s);
  }
}

#ifdef KVTRIM_MASKED_X86
// scores_g with AVX2 intrinsics (8 lanes). A row is bound by loads (L1 ports), not by its bytes, so
// the kernel counts them: the permutation table's kept lanes carry bit 31 (vpermps reads the low 3
// bits, vblendvps the top one), so one table line is both the permutation and the lane mask; with
// up to 4 query heads two rows go through each group together and share the group's q and w loads
// (a q load feeds two FMAs). Per group and row: the mask byte, its permutation and count, the
// packed values, and (recovery) the sign byte and its flip line, plus half of the shared loads.
template <typename V, bool kAlt>
struct X86Row {
  using R = typename Raw<V>::T;
  static constexpr bool kMul = sv::kScaled<V> || kValMul<V> != 1.f;
  const R* v;
  const uint8_t* m;
  const uint8_t* sg;
  __m256 fv, scv;

  HWY_INLINE HWY_ATTR void start(const MaskedRows& r, int64_t t, int64_t mb) {
    v = static_cast<const R*>(r.vals) + row_begin(r, t);
    m = r.mask + t * mb;
    sg = kAlt && r.signs ? r.signs + t * mb : masked::kZeroSigns;
    // the rows stream, a few rows ahead: a row is ~100 instructions at d = 64, too many for the
    // out-of-order window to reach the next rows' loads by itself
    // (addresses as integers: they may lie past the arrays, which a prefetch may touch freely)
    const auto ahead = [](const void* p, int64_t by) {
      return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(by));
    };
    __builtin_prefetch(ahead(v, kPrefetchBytes));
    __builtin_prefetch(ahead(m, 4 * mb));
    if constexpr (kAlt) __builtin_prefetch(ahead(sg, 4 * mb));
    fv = _mm256_set1_ps(kAlt ? r.fill[t * r.fill_stride] : 0.f);
    scv = _mm256_set1_ps(row_scale(r, t) * kValMul<V>);
  }
  // Group j's 8 coordinates (kept: the values, times the row scale when kScale; pruned: 0 or
  // ±fill · w); fw = the group's staged weights.
  template <bool kScale>
  HWY_INLINE HWY_ATTR __m256 group(int64_t j, __m256 fw) {
    const hn::CappedTag<float, 8> df;
    const masked::Tables& tb = masked::kTables;
    const unsigned bits = m[j];
    const __m256i pm = _mm256_load_si256(reinterpret_cast<const __m256i*>(tb.permk8[bits]));
    __m256 e = _mm256_permutevar8x32_ps(sv::decode(df, reinterpret_cast<const V*>(v)).raw, pm);
    v += tb.cnt[bits];
    if constexpr (kScale && kMul) e = _mm256_mul_ps(e, scv);
    if constexpr (kAlt) {
      const __m256 flip = _mm256_load_ps(reinterpret_cast<const float*>(tb.sign8[sg[j]]));
      return _mm256_blendv_ps(_mm256_xor_ps(_mm256_mul_ps(fv, fw), flip), e, _mm256_castsi256_ps(pm));
    } else {
      return _mm256_blendv_ps(_mm256_setzero_ps(), e, _mm256_castsi256_ps(pm));
    }
  }
};

template <int kG, bool kAlt, typename V>
HWY_NOINLINE void scores_x86(const MaskedRows& r, const float* HWY_RESTRICT qT, const float* w, int64_t dimP,
                             int ng, int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  const hn::CappedTag<float, 8> df;
  constexpr bool kPairs = kG <= 4;  // two rows' accumulators fit the 16 registers
  const int64_t groups = dimP / 8, mb = mask_bytes(r);
  auto finish = [&](const __m256* acc, const X86Row<V, kAlt>& row, int64_t t) HWY_ATTR {
    hn::Vec<decltype(df)> out[kG];
    for (int g = 0; g < kG; ++g) out[g].raw = acc[g];
    const float sc = kAlt ? 1.f : row_scale(r, t) * kValMul<V>;
    store_sums<kG>(df, out, ng, sc, s + (t - t0), ld_s);
  };
  X86Row<V, kAlt> a, b;
  int64_t t = t0;
  if constexpr (kPairs) {
    for (; t + 2 <= t0 + n_t; t += 2) {
      a.start(r, t, mb);
      b.start(r, t + 1, mb);
      __m256 acc_a[kG], acc_b[kG];
      for (int g = 0; g < kG; ++g) acc_a[g] = acc_b[g] = _mm256_setzero_ps();
#pragma GCC unroll 4
      for (int64_t j = 0; j < groups; ++j) {
        const __m256 fw = kAlt ? _mm256_load_ps(w + j * 8) : _mm256_setzero_ps();
        const __m256 ka = a.template group<kAlt>(j, fw), kb = b.template group<kAlt>(j, fw);
        for (int g = 0; g < kG; ++g) {
          const __m256 q = _mm256_load_ps(qT + g * dimP + j * 8);
          acc_a[g] = _mm256_fmadd_ps(q, ka, acc_a[g]);
          acc_b[g] = _mm256_fmadd_ps(q, kb, acc_b[g]);
        }
      }
      finish(acc_a, a, t);
      finish(acc_b, b, t + 1);
    }
  }
  for (; t < t0 + n_t; ++t) {  // single rows (many heads: their FMAs already share each expansion)
    a.start(r, t, mb);
    __m256 acc[kG];
    for (int g = 0; g < kG; ++g) acc[g] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int64_t j = 0; j < groups; ++j) {
      const __m256 k = a.template group<kAlt>(j, kAlt ? _mm256_load_ps(w + j * 8) : _mm256_setzero_ps());
      for (int g = 0; g < kG; ++g) acc[g] = _mm256_fmadd_ps(_mm256_load_ps(qT + g * dimP + j * 8), k, acc[g]);
    }
    finish(acc, a, t);
  }
}
#endif

#ifdef KVTRIM_MASKED_X86
template <bool kAlt, typename V>
HWY_NOINLINE void decode_x86(const MaskedRows& r, const float* w, int64_t dimP, int64_t t0, int64_t n_t,
                             float* out, int64_t ld_out) {
  const int64_t groups = dimP / 8, mb = mask_bytes(r);
  X86Row<V, kAlt> row;
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    row.start(r, t, mb);
    float* o = out + (t - t0) * ld_out;
#pragma GCC unroll 4
    for (int64_t j = 0; j < groups; ++j)
      _mm256_storeu_ps(o + j * 8, row.template group<true>(j, kAlt ? _mm256_load_ps(w + j * 8) : _mm256_setzero_ps()));
  }
}
#endif

template <bool kAlt, typename V>
HWY_NOINLINE void decode_g(const MaskedRows& r, const float* w, int64_t dimP, int64_t t0, int64_t n_t,
                           float* out, int64_t ld_out) {
  const hn::CappedTag<float, 8> df;
  constexpr int64_t N = hn::MaxLanes(df);
  RowExpander<decltype(df), V, kAlt> ex;
  const int64_t groups = dimP / N;
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    ex.start(r, t, w, true);
    float* o = out + (t - t0) * ld_out;
    for (int64_t j = 0; j < groups; ++j) hn::StoreU(ex.template group<true>(j), df, o + j * N);
  }
}

#include "kv/attn_kernels_masked_zmm-inl.h"

// Staged weights w [dimP]: weight (or 1) below dim, 0 above (so pruned padding lanes read 0).
HWY_INLINE void stage_weight(const MaskedRows& r, int64_t dimP, float* w) {
  for (int64_t c = 0; c < dimP; ++c) w[c] = c < r.dim ? (r.weight ? r.weight[c] : 1.f) : 0.f;
}

template <typename V>
void scores_scalar(const MaskedRows& r, const float* q, int n_g, int64_t ldq, int64_t t0, int64_t n_t,
                   float* s, int64_t ld_s) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(r.dim));
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    decode_row_scalar<V>(r, t, row.data());
    for (int g = 0; g < n_g; ++g) {
      float sum = 0;
      for (int64_t c = 0; c < r.dim; ++c) sum += q[g * ldq + c] * row[static_cast<size_t>(c)];
      s[g * ld_s + (t - t0)] = sum;
    }
  }
}

// scores_x86 where it is compiled, else scores_g; alt: pruned coordinates read a fill.
template <int kG, typename V>
HWY_INLINE void scores_simd(bool alt, const MaskedRows& r, const float* qT, const float* w, int64_t dimP, int ng,
                            int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
#if HWY_TARGET == HWY_AVX3_DL
  alt ? zmm::scores<kG, true, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s)
      : zmm::scores<kG, false, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s);
#elif defined(KVTRIM_MASKED_X86)
  alt ? scores_x86<kG, true, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s)
      : scores_x86<kG, false, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s);
#else
  alt ? scores_g<kG, true, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s)
      : scores_g<kG, false, V>(r, qT, w, dimP, ng, t0, n_t, s, ld_s);
#endif
}

template <typename V>
void scores_typed(const MaskedRows& r, const float* q, int n_g, int64_t ldq, int64_t t0, int64_t n_t,
                  float* s, int64_t ld_s) {
  if constexpr (HWY_TARGET == HWY_SCALAR) {
    return scores_scalar<V>(r, q, n_g, ldq, t0, n_t, s, ld_s);
  } else {
    if (r.dim > kMaxDim) return scores_scalar<V>(r, q, n_g, ldq, t0, n_t, s, ld_s);
#if HWY_TARGET == HWY_AVX3_DL
    constexpr int64_t N = 16;  // zmm::scores: 16-channel groups
#else
    const hn::CappedTag<float, 8> df;
    constexpr int64_t N = hn::MaxLanes(df);
#endif
    const int64_t dimP = (r.dim + N - 1) / N * N;
    HWY_ALIGN float qT[kMaxG * kMaxDim];
    HWY_ALIGN float w[kMaxDim];
    const bool alt = r.fill != nullptr;
    if (alt) stage_weight(r, dimP, w);
    for (int g0 = 0; g0 < n_g; g0 += kMaxG) {
      const int ng = std::min(kMaxG, n_g - g0);
      // head buckets: the pass's accumulators live in registers
      const int kg = ng <= 4 ? ng : ng <= 6 ? 6 : 8;
      for (int g = 0; g < kg; ++g)
        for (int64_t c = 0; c < dimP; ++c) qT[g * dimP + c] = g < ng && c < r.dim ? q[(g0 + g) * ldq + c] : 0.f;
      float* sg = s + g0 * ld_s;
      switch (kg) {
        case 1:
          scores_simd<1, V>(alt, r, qT, w, dimP, ng, t0, n_t, sg, ld_s);
          break;
        case 2:
          scores_simd<2, V>(alt, r, qT, w, dimP, ng, t0, n_t, sg, ld_s);
          break;
        case 3:
          scores_simd<3, V>(alt, r, qT, w, dimP, ng, t0, n_t, sg, ld_s);
          break;
        case 4:
          scores_simd<4, V>(alt, r, qT, w, dimP, ng, t0, n_t, sg, ld_s);
          break;
        case 6:
          scores_simd<6, V>(alt, r, qT, w, dimP, ng, t0, n_t, sg, ld_s);
          break;
        default:
          scores_simd<8, V>(alt, r, qT, w, dimP, ng, t0, n_t, sg, ld_s);
          break;
      }
    }
  }
}

template <typename V>
void decode_scalar(const MaskedRows& r, int64_t t0, int64_t n_t, float* out, int64_t ld_out) {
  for (int64_t t = t0; t < t0 + n_t; ++t) decode_row_scalar<V>(r, t, out + (t - t0) * ld_out);
}

// decode_x86 where it is compiled, else decode_g.
template <bool kAlt, typename V>
HWY_INLINE void decode_simd(const MaskedRows& r, const float* w, int64_t dimP, int64_t t0, int64_t n_t,
                            float* out, int64_t ld_out) {
#if HWY_TARGET == HWY_AVX3_DL
  zmm::decode<kAlt, V>(r, w, dimP, t0, n_t, out, ld_out);
#elif defined(KVTRIM_MASKED_X86)
  decode_x86<kAlt, V>(r, w, dimP, t0, n_t, out, ld_out);
#else
  decode_g<kAlt, V>(r, w, dimP, t0, n_t, out, ld_out);
#endif
}

template <typename V>
void decode_typed(const MaskedRows& r, int64_t t0, int64_t n_t, float* out, int64_t ld_out) {
  if constexpr (HWY_TARGET == HWY_SCALAR) {
    return decode_scalar<V>(r, t0, n_t, out, ld_out);
  } else {
    if (r.dim > kMaxDim) return decode_scalar<V>(r, t0, n_t, out, ld_out);
#if HWY_TARGET == HWY_AVX3_DL
    constexpr int64_t N = 16;
#else
    const hn::CappedTag<float, 8> df;
    constexpr int64_t N = hn::MaxLanes(df);
#endif
    const int64_t dimP = (r.dim + N - 1) / N * N;
    HWY_ALIGN float w[kMaxDim];
    if (r.fill) {
      stage_weight(r, dimP, w);
      decode_simd<true, V>(r, w, dimP, t0, n_t, out, ld_out);
    } else {
      decode_simd<false, V>(r, w, dimP, t0, n_t, out, ld_out);
    }
  }
}

// Calls f.template operator()<V>() for the rows' value type.
template <class F>
HWY_INLINE void with_type(const MaskedRows& r, F&& f) {
  switch (r.type) {
    case KvDtype::kF32:
      return f.template operator()<float>();
    case KvDtype::kF16:
      return f.template operator()<uint16_t>();
    case KvDtype::kBF16:
      return f.template operator()<Bf16>();
    case KvDtype::kQ8:
      return f.template operator()<int8_t>();
    case KvDtype::kFP8:
      return f.template operator()<uint8_t>();
    default:  // a type without these kernels (kv_type(t).sparse_kernels): callers take the
      break;  // generic path
  }
}

// The accumulation in registers where this target has it (AVX3_DL, dim <= kMaxDim); false: the
// caller expands the rows and sums them with attn_accum_f32.
bool MaskedAccumDirect(const MaskedRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0, int64_t n_t,
                       float* acc, int64_t ld_acc) {
#if HWY_TARGET == HWY_AVX3_DL
  if (r.dim > kMaxDim) return false;
  const int64_t groups = (r.dim + 15) / 16;
  HWY_ALIGN float w[kMaxDim];
  const bool alt = r.fill != nullptr;
  if (alt) stage_weight(r, groups * 16, w);
  const int head_passes = (n_g + zmm::kAccHeads - 1) / zmm::kAccHeads;
  const int64_t ch_passes = (groups + zmm::kMaxCB - 1) / zmm::kMaxCB;
  // several passes: a block of rows at a time, so that every pass after the first reads it from L1
  const int64_t block = head_passes * ch_passes > 1 ? zmm::kBlock : std::max<int64_t>(n_t, 1);
  with_type(r, [&]<typename V>() {
    for (int64_t tb = t0; tb < t0 + n_t; tb += block) {
      const int64_t nb = std::min(block, t0 + n_t - tb);
      for (int g0 = 0; g0 < n_g; g0 += zmm::kAccHeads) {
        const int ng = std::min(zmm::kAccHeads, n_g - g0);
        const float* pg = p + g0 * ld_p + (tb - t0);
        float* ag = acc + g0 * ld_acc;
        for (int64_t j0 = 0; j0 < groups; j0 += zmm::kMaxCB) {
          const int ncb = static_cast<int>(std::min<int64_t>(zmm::kMaxCB, groups - j0));
          auto pass = [&]<int kG>() {
            if (ncb == zmm::kMaxCB) {
              alt ? zmm::accum_pass<kG, zmm::kMaxCB, true, V>(r, pg, ld_p, w, j0, ncb, tb, nb, ag, ld_acc)
                  : zmm::accum_pass<kG, zmm::kMaxCB, false, V>(r, pg, ld_p, w, j0, ncb, tb, nb, ag, ld_acc);
            } else {
              alt ? zmm::accum_pass<kG, 0, true, V>(r, pg, ld_p, w, j0, ncb, tb, nb, ag, ld_acc)
                  : zmm::accum_pass<kG, 0, false, V>(r, pg, ld_p, w, j0, ncb, tb, nb, ag, ld_acc);
            }
          };
          switch (ng) {
            case 1: pass.template operator()<1>(); break;
            case 2: pass.template operator()<2>(); break;
            case 3: pass.template operator()<3>(); break;
            case 4: pass.template operator()<4>(); break;
            case 5: pass.template operator()<5>(); break;
            default: pass.template operator()<6>(); break;
          }
        }
      }
    }
  });
  return true;
#else
  (void)r, (void)p, (void)n_g, (void)ld_p, (void)t0, (void)n_t, (void)acc, (void)ld_acc;
  return false;
#endif
}

void MaskedScores(const MaskedRows& r, const float* q, int n_g, int64_t ldq, int64_t t0, int64_t n_t, float* s,
                  int64_t ld_s) {
  with_type(r, [&]<typename V>() { scores_typed<V>(r, q, n_g, ldq, t0, n_t, s, ld_s); });
}
void MaskedDecode(const MaskedRows& r, int64_t t0, int64_t n_t, float* out, int64_t ld_out) {
  with_type(r, [&]<typename V>() { decode_typed<V>(r, t0, n_t, out, ld_out); });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim::kv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvtrim::kv {

HWY_EXPORT(MaskedScores);
HWY_EXPORT(MaskedDecode);
HWY_EXPORT(MaskedAccumDirect);

void masked_scores(const MaskedRows& r, const float* q, int n_g, int64_t ldq, int64_t t0, int64_t n_t, float* s,
                   int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(MaskedScores)(r, q, n_g, ldq, t0, n_t, s, ld_s);
}
void masked_decode(const MaskedRows& r, int64_t t0, int64_t n_t, float* out, int64_t ld_out) {
  HWY_DYNAMIC_DISPATCH(MaskedDecode)(r, t0, n_t, out, ld_out);
}

void masked_accum(const MaskedRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0, int64_t n_t, float* acc,
                  int64_t ld_acc) {
  if (HWY_DYNAMIC_DISPATCH(MaskedAccumDirect)(r, p, n_g, ld_p, t0, n_t, acc, ld_acc)) return;
  const int64_t dim = r.dim;
  thread_local std::vector<float> rows, a;
  rows.resize(static_cast<size_t>(masked::kChunkRows * dim + 8));
  // attn_accum_f32 sums into a contiguous [n_g, dim]; a strided acc goes through a copy
  const bool strided = ld_acc != dim;
  float* ac = acc;
  if (strided) {
    a.resize(static_cast<size_t>(n_g) * static_cast<size_t>(dim));
    for (int g = 0; g < n_g; ++g) std::copy(acc + g * ld_acc, acc + g * ld_acc + dim, a.data() + g * dim);
    ac = a.data();
  }
  for (int64_t c0 = 0; c0 < n_t; c0 += masked::kChunkRows) {
    const int64_t nc = std::min(masked::kChunkRows, n_t - c0);
    masked_decode(r, t0 + c0, nc, rows.data(), dim);
    attn_accum_f32(p + c0, n_g, ld_p, rows.data(), nc, dim, ac);
  }
  if (strided) {
    for (int g = 0; g < n_g; ++g) std::copy(a.data() + g * dim, a.data() + (g + 1) * dim, acc + g * ld_acc);
  }
}

}  // namespace kvtrim::kv
#endif  // HWY_ONCE
