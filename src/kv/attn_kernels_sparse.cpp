// SIMD kernels over sparse rows (per-token channel subsets, SparseRows in attn_kernels.h):
//   scores:  s[g][t] = scale_t · Σ_j q[g][idx_tj] · val_tj
//   accum:   acc[g][idx_tj] += p[g][t] · scale_t · val_tj
// One Highway translation unit compiled for every x86 target and dispatched at run time.
//
// Why this shape: every kept entry needs q (or acc) at a data-dependent channel, and
// hardware gathers are slow on the AMD CPUs this runs on (vgatherdps ymm: ~1 element per
// cycle, no better than scalar loads). So the group's queries are the SIMD lanes: q is staged
// transposed once per call, qT [dim][L] with L = 4 lanes for n_g <= 4 and 8 otherwise, and an
// entry is one aligned load of qT[idx] (all queries at once), one in-register broadcast of the
// value (LoadDup128 + Broadcast<k>, no extra load) and one FMA, into 8 independent
// accumulators per token (the FMA latency would otherwise bound a 16-entry row). The
// accumulate kernel is the transpose: acc staged as accT [dim][L], an entry is load / FMA /
// store of accT[idx] with the token's weights p[:, t]·scale_t as the lanes; consecutive tokens
// alternate between two copies of accT, so a channel kept by every token (the usual case for
// outlier channels) does not chain each token's store-to-load forwarding into the next.
// Entries cost about one load-port cycle (scores) or one store (accum) each, whatever their
// type: the values of a row are first decoded to f32 in a small buffer (f16 / bf16 / int8 /
// fp8 widened as in attn_kernels.cpp, fp8 via its f16 bit identity with 2^8 in the scale).
// Rows with dim > kMaxDim take a scalar loop. No kernel reads past a row's last entry.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/fp16.h"
#include "kv/attn_kernels.h"

// foreach_target.h must come first: it re-includes this file once per target.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/attn_kernels_sparse.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace kvtrim::kv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kMaxDim = 512;  // largest dim with staged q / acc (16 KiB per copy at L = 8)
constexpr int64_t kChunk = 64;    // tokens whose weights are staged at once (accum)

struct Bf16 {  // tag: bf16 bits
  uint16_t b;
};

HWY_INLINE float scalar(float x) {
  return x;
}
HWY_INLINE float scalar(uint16_t h) {
  return fp16_to_fp32(h);
}
HWY_INLINE float scalar(Bf16 b) {
  return bf16_to_fp32(b.b);
}
HWY_INLINE float scalar(int8_t c) {
  return static_cast<float>(c);
}
HWY_INLINE float scalar(uint8_t b) {  // fp8 E4M3 · 2^-8
  return fp16_to_fp32(static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7)));
}
// 2^8 for fp8 (undoing scalar / decode's 2^-8), else 1.
template <typename V>
constexpr float kValMul = std::is_same_v<V, uint8_t> ? 256.f : 1.f;

template <class DF>
HWY_INLINE hn::Vec<DF> decode(DF df, const float* p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> decode(DF df, const uint16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}
template <class DF>
HWY_INLINE hn::Vec<DF> decode(DF df, const Bf16* p) {
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<uint32_t, DF> du32;
  const auto w = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
  return hn::BitCast(df, hn::ShiftLeft<16>(w));
}
template <class DF>
HWY_INLINE hn::Vec<DF> decode(DF df, const int8_t* p) {
  const hn::Rebind<int8_t, DF> di8;
  const hn::Rebind<int32_t, DF> di32;
  return hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, p)));
}
template <class DF>
HWY_INLINE hn::Vec<DF> decode(DF df, const uint8_t* p) {
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto w = hn::ShiftLeft<7>(hn::PromoteTo(du16, hn::LoadU(du8, p)));
  return hn::PromoteTo(df, hn::BitCast(dh, hn::Add(w, hn::And(w, hn::Set(du16, 0x4000)))));
}

// vf [cnt] = the row's values as f32 (fp8: · 2^-8); reads exactly cnt values.
template <typename V>
HWY_INLINE void decode_row(const V* v, int64_t cnt, float* HWY_RESTRICT vf) {
  const hn::CappedTag<float, 8> df;
  constexpr int64_t N = hn::MaxLanes(df);
  int64_t j = 0;
  for (; j + N <= cnt; j += N) hn::Store(decode(df, v + j), df, vf + j);
  for (; j < cnt; ++j) vf[j] = scalar(v[j]);
}

// Row t's first entry and count.
HWY_INLINE void row_range(const SparseRows& r, int64_t t, int64_t& beg, int64_t& cnt) {
  if (r.off) {
    beg = r.off[t];
    cnt = static_cast<int64_t>(r.off[t + 1]) - beg;
  } else {
    beg = t * r.T;
    cnt = r.T;
  }
}

// Scores for ng <= L query heads (L = lanes of d).
template <class D, typename V, typename I>
HWY_NOINLINE void scores_lanes(D d, const SparseRows& r, const float* q, int ng, int64_t ldq,
                               int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  constexpr int64_t L = hn::MaxLanes(d);
  using VecF = hn::Vec<D>;
  const V* vals = static_cast<const V*>(r.vals);
  const I* idx = static_cast<const I*>(r.idx);
  HWY_ALIGN float qT[kMaxDim * L];
  HWY_ALIGN float vf[kMaxDim + 8];
  HWY_ALIGN float out[L];
  for (int64_t i = 0; i < r.dim; ++i) {
    for (int64_t g = 0; g < L; ++g) qT[i * L + g] = g < ng ? q[g * ldq + i] : 0.f;
  }
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    int64_t beg, cnt;
    row_range(r, t, beg, cnt);
    decode_row(vals + beg, cnt, vf);
    const I* ix = idx + beg;
    VecF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    int64_t j = 0;
    for (; j + 8 <= cnt; j += 8) {
      const VecF v0 = hn::LoadDup128(d, vf + j), v1 = hn::LoadDup128(d, vf + j + 4);
      a0 = hn::MulAdd(hn::Load(d, qT + ix[j + 0] * L), hn::Broadcast<0>(v0), a0);
      a1 = hn::MulAdd(hn::Load(d, qT + ix[j + 1] * L), hn::Broadcast<1>(v0), a1);
      a2 = hn::MulAdd(hn::Load(d, qT + ix[j + 2] * L), hn::Broadcast<2>(v0), a2);
      a3 = hn::MulAdd(hn::Load(d, qT + ix[j + 3] * L), hn::Broadcast<3>(v0), a3);
      a4 = hn::MulAdd(hn::Load(d, qT + ix[j + 4] * L), hn::Broadcast<0>(v1), a4);
      a5 = hn::MulAdd(hn::Load(d, qT + ix[j + 5] * L), hn::Broadcast<1>(v1), a5);
      a6 = hn::MulAdd(hn::Load(d, qT + ix[j + 6] * L), hn::Broadcast<2>(v1), a6);
      a7 = hn::MulAdd(hn::Load(d, qT + ix[j + 7] * L), hn::Broadcast<3>(v1), a7);
    }
    for (; j < cnt; ++j) a0 = hn::MulAdd(hn::Load(d, qT + ix[j] * L), hn::Set(d, vf[j]), a0);
    const VecF sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                             hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
    const float sc = (r.scale ? r.scale[t] : 1.f) * kValMul<V>;
    hn::Store(hn::Mul(sum, hn::Set(d, sc)), d, out);
    for (int g = 0; g < ng; ++g) s[g * ld_s + t - t0] = out[g];
  }
}

// Accumulation for ng <= L query heads.
template <class D, typename V, typename I>
HWY_NOINLINE void accum_lanes(D d, const SparseRows& r, const float* p, int ng, int64_t ld_p,
                              int64_t t0, int64_t n_t, float* acc, int64_t ld_acc) {
  constexpr int64_t L = hn::MaxLanes(d);
  using VecF = hn::Vec<D>;
  const V* vals = static_cast<const V*>(r.vals);
  const I* idx = static_cast<const I*>(r.idx);
  HWY_ALIGN float aT[2][kMaxDim * L];  // two copies: even and odd tokens
  HWY_ALIGN float vf[kMaxDim + 8];
  HWY_ALIGN float pw[kChunk * L];  // [token of the chunk][lane]: p · scale_t · kValMul
  for (int64_t i = 0; i < r.dim; ++i) {
    for (int64_t g = 0; g < L; ++g) {
      aT[0][i * L + g] = g < ng ? acc[g * ld_acc + i] : 0.f;
      aT[1][i * L + g] = 0.f;
    }
  }
  for (int64_t c0 = 0; c0 < n_t; c0 += kChunk) {
    const int64_t nc = std::min(kChunk, n_t - c0);
    for (int64_t u = 0; u < nc; ++u) {
      const int64_t t = t0 + c0 + u;
      const float sc = (r.scale ? r.scale[t] : 1.f) * kValMul<V>;
      for (int64_t g = 0; g < L; ++g) pw[u * L + g] = g < ng ? p[g * ld_p + c0 + u] * sc : 0.f;
    }
    for (int64_t u = 0; u < nc; ++u) {
      const int64_t t = t0 + c0 + u;
      int64_t beg, cnt;
      row_range(r, t, beg, cnt);
      decode_row(vals + beg, cnt, vf);
      const I* ix = idx + beg;
      float* a = aT[u & 1];
      const VecF pv = hn::Load(d, pw + u * L);
      int64_t j = 0;
      for (; j + 4 <= cnt; j += 4) {
        const VecF v = hn::LoadDup128(d, vf + j);
        float* r0 = a + ix[j] * L;
        float* r1 = a + ix[j + 1] * L;
        float* r2 = a + ix[j + 2] * L;
        float* r3 = a + ix[j + 3] * L;
        hn::Store(hn::MulAdd(hn::Broadcast<0>(v), pv, hn::Load(d, r0)), d, r0);
        hn::Store(hn::MulAdd(hn::Broadcast<1>(v), pv, hn::Load(d, r1)), d, r1);
        hn::Store(hn::MulAdd(hn::Broadcast<2>(v), pv, hn::Load(d, r2)), d, r2);
        hn::Store(hn::MulAdd(hn::Broadcast<3>(v), pv, hn::Load(d, r3)), d, r3);
      }
      for (; j < cnt; ++j) {
        float* rj = a + ix[j] * L;
        hn::Store(hn::MulAdd(hn::Set(d, vf[j]), pv, hn::Load(d, rj)), d, rj);
      }
    }
  }
  for (int64_t i = 0; i < r.dim; ++i) {
    for (int g = 0; g < ng; ++g) acc[g * ld_acc + i] = aT[0][i * L + g] + aT[1][i * L + g];
  }
}

// Plain loops for dim > kMaxDim.
template <typename V, typename I>
void scores_scalar(const SparseRows& r, const float* q, int n_g, int64_t ldq, int64_t t0,
                   int64_t n_t, float* s, int64_t ld_s) {
  const V* vals = static_cast<const V*>(r.vals);
  const I* idx = static_cast<const I*>(r.idx);
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    int64_t beg, cnt;
    row_range(r, t, beg, cnt);
    const float sc = (r.scale ? r.scale[t] : 1.f) * kValMul<V>;
    for (int g = 0; g < n_g; ++g) {
      float sum = 0;
      for (int64_t j = beg; j < beg + cnt; ++j) sum += q[g * ldq + idx[j]] * scalar(vals[j]);
      s[g * ld_s + t - t0] = sum * sc;
    }
  }
}
template <typename V, typename I>
void accum_scalar(const SparseRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0,
                  int64_t n_t, float* acc, int64_t ld_acc) {
  const V* vals = static_cast<const V*>(r.vals);
  const I* idx = static_cast<const I*>(r.idx);
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    int64_t beg, cnt;
    row_range(r, t, beg, cnt);
    const float sc = (r.scale ? r.scale[t] : 1.f) * kValMul<V>;
    for (int g = 0; g < n_g; ++g) {
      const float w = p[g * ld_p + t - t0] * sc;
      for (int64_t j = beg; j < beg + cnt; ++j) acc[g * ld_acc + idx[j]] += w * scalar(vals[j]);
    }
  }
}

template <typename V, typename I>
void scores_simd(const SparseRows& r, const float* q, int n_g, int64_t ldq, int64_t t0, int64_t n_t,
                 float* s, int64_t ld_s) {
  const hn::CappedTag<float, 4> d4;
  const hn::CappedTag<float, 8> d8;
  for (int g0 = 0; g0 < n_g; g0 += static_cast<int>(hn::MaxLanes(d8))) {
    const int ng = std::min(static_cast<int>(hn::MaxLanes(d8)), n_g - g0);
    if (ng <= static_cast<int>(hn::MaxLanes(d4))) {
      scores_lanes<decltype(d4), V, I>(d4, r, q + g0 * ldq, ng, ldq, t0, n_t, s + g0 * ld_s, ld_s);
    } else {
      scores_lanes<decltype(d8), V, I>(d8, r, q + g0 * ldq, ng, ldq, t0, n_t, s + g0 * ld_s, ld_s);
    }
  }
}

template <typename V, typename I>
void accum_simd(const SparseRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0, int64_t n_t,
                float* acc, int64_t ld_acc) {
  const hn::CappedTag<float, 4> d4;
  const hn::CappedTag<float, 8> d8;
  for (int g0 = 0; g0 < n_g; g0 += static_cast<int>(hn::MaxLanes(d8))) {
    const int ng = std::min(static_cast<int>(hn::MaxLanes(d8)), n_g - g0);
    float* ag = acc + g0 * ld_acc;
    if (ng <= static_cast<int>(hn::MaxLanes(d4))) {
      accum_lanes<decltype(d4), V, I>(d4, r, p + g0 * ld_p, ng, ld_p, t0, n_t, ag, ld_acc);
    } else {
      accum_lanes<decltype(d8), V, I>(d8, r, p + g0 * ld_p, ng, ld_p, t0, n_t, ag, ld_acc);
    }
  }
}

template <typename V, typename I>
void scores_typed(const SparseRows& r, const float* q, int n_g, int64_t ldq, int64_t t0,
                  int64_t n_t, float* s, int64_t ld_s) {
  if constexpr (HWY_TARGET == HWY_SCALAR) {
    return scores_scalar<V, I>(r, q, n_g, ldq, t0, n_t, s, ld_s);
  } else {
    if (r.dim > kMaxDim) return scores_scalar<V, I>(r, q, n_g, ldq, t0, n_t, s, ld_s);
    scores_simd<V, I>(r, q, n_g, ldq, t0, n_t, s, ld_s);
  }
}

template <typename V, typename I>
void accum_typed(const SparseRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0,
                 int64_t n_t, float* acc, int64_t ld_acc) {
  if constexpr (HWY_TARGET == HWY_SCALAR) {
    return accum_scalar<V, I>(r, p, n_g, ld_p, t0, n_t, acc, ld_acc);
  } else {
    if (r.dim > kMaxDim) return accum_scalar<V, I>(r, p, n_g, ld_p, t0, n_t, acc, ld_acc);
    accum_simd<V, I>(r, p, n_g, ld_p, t0, n_t, acc, ld_acc);
  }
}

// Calls f.template operator()<V, I>() for the rows' value and index types.
template <class F>
HWY_INLINE void with_types(const SparseRows& r, F&& f) {
  const bool i8 = r.idx_bytes == 1;
  switch (r.type) {
    case SparseType::kF32:
      return i8 ? f.template operator()<float, uint8_t>()
                : f.template operator()<float, uint16_t>();
    case SparseType::kF16:
      return i8 ? f.template operator()<uint16_t, uint8_t>()
                : f.template operator()<uint16_t, uint16_t>();
    case SparseType::kBF16:
      return i8 ? f.template operator()<Bf16, uint8_t>() : f.template operator()<Bf16, uint16_t>();
    case SparseType::kQ8:
      return i8 ? f.template operator()<int8_t, uint8_t>()
                : f.template operator()<int8_t, uint16_t>();
    case SparseType::kFP8:
      return i8 ? f.template operator()<uint8_t, uint8_t>()
                : f.template operator()<uint8_t, uint16_t>();
  }
}

void SparseScores(const SparseRows& r, const float* q, int n_g, int64_t ldq, int64_t t0,
                  int64_t n_t, float* s, int64_t ld_s) {
  with_types(
      r, [&]<typename V, typename I>() { scores_typed<V, I>(r, q, n_g, ldq, t0, n_t, s, ld_s); });
}
void SparseAccum(const SparseRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0,
                 int64_t n_t, float* acc, int64_t ld_acc) {
  with_types(r, [&]<typename V, typename I>() {
    accum_typed<V, I>(r, p, n_g, ld_p, t0, n_t, acc, ld_acc);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim::kv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvtrim::kv {

HWY_EXPORT(SparseScores);
HWY_EXPORT(SparseAccum);

void sparse_scores(const SparseRows& r, const float* q, int n_g, int64_t ldq, int64_t t0,
                   int64_t n_t, float* s, int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(SparseScores)(r, q, n_g, ldq, t0, n_t, s, ld_s);
}
void sparse_accum(const SparseRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0,
                  int64_t n_t, float* acc, int64_t ld_acc) {
  HWY_DYNAMIC_DISPATCH(SparseAccum)(r, p, n_g, ld_p, t0, n_t, acc, ld_acc);
}

}  // namespace kvtrim::kv
#endif  // HWY_ONCE
