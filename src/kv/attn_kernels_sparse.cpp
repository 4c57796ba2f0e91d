// SIMD kernels over sparse rows (per-token channel subsets, SparseRows in attn_kernels.h):
//   scores:  s[g][t] = scale_t · Σ_j q[g][idx_tj] · val_tj
//   accum:   acc[g][idx_tj] += p[g][t] · scale_t · val_tj
// One Highway translation unit compiled for every x86 target and dispatched at run time.
//
// Why this shape: every kept entry needs q (or acc) at a data-dependent channel, and hardware
// gathers are slow on the AMD CPUs this runs on (Zen 2 vgatherdps ymm: about 1 element per
// cycle, no better than scalar loads, and one gather per query head). Lanes over tokens (as
// the dense kernels do) would need such a gather per (entry, head); decoding a block of rows
// into a dense zeroed tile and running the dense kernel costs the dense FMAs plus d stores per
// token. So the group's query heads are the SIMD lanes: q is staged transposed once per call,
// qT [dim][L], and an entry is one load of qT[idx] (all heads at once), a broadcast of the
// value from a register (4 values decoded per conversion, Broadcast<k> within each 128-bit
// block) and one FMA, into 8 independent accumulators (FMA latency). Channel indices come 8
// at a time from one 64-bit load. With n_g <= 4 and 256-bit vectors two tokens share a vector
// (lanes 0..3 and 4..7): one FMA serves both and a q row pair is a 128-bit load plus a
// 128-bit insert from memory (scores_pairs; measured 1.5x the 4-lane loop on Zen 2).
// The accumulate kernel is the transpose: acc staged as accT [dim][L], an entry is load / FMA
// / store of accT[idx] with the token's weights p[:, t] · scale_t as the lanes; consecutive
// tokens alternate between two copies of accT, so a channel kept by every token (the usual
// case for outlier channels) does not chain each token's store-to-load forwarding into the
// next. Measured on Zen 2 at ~2.7 GHz, cache resident: scores ~0.35 ns per entry + ~5 ns per
// token (pairs; 0.75 ns per entry with 8 lanes), accum ~0.6-0.8 ns per entry (one store
// each, the bound), whatever the value type. Dense f16 costs n_g/16 FMA cycles per (token,
// channel), so at d/4 entries the sparse kernels only win on bytes read, and only from d = 256
// or n_g >= 6 on compute (bench/kv_kernels_bench.cpp).
// The staged q / acc live in per-thread aligned scratch sized to the row width, so wide rows
// (Lexico's dictionaries of 1024+ atoms) take the same kernels. No kernel reads past a row's last
// entry.
// The cache stores per-token rows as a kept-coordinate bitmask wherever that is smaller than the
// list (T > dim / 8 with uint8 indices, dim / 16 with uint16), and those take the masked kernels (attn_kernels_masked.cpp: no per-entry
// loads at scattered channels); these list kernels serve rows with few kept entries.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/fp16.h"
#include "hwy/aligned_allocator.h"
#include "kv/attn_kernels.h"

// foreach_target.h must come first: it re-includes this file once per target.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/attn_kernels_sparse.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kv/sparse_values-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace kvtrim::kv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kChunk = 64;    // tokens whose weights are staged at once (accum)

using sv::Bf16;
using sv::convert;
using sv::decode;
using sv::kValMul;
using sv::Raw;
using sv::scalar;

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

// Channel indices ix[0 .. 8) into out (one or two 64-bit loads instead of eight).
HWY_INLINE void load_idx8(const uint8_t* ix, uint32_t* out) {
  uint64_t w;
  std::memcpy(&w, ix, 8);
  for (int k = 0; k < 8; ++k) out[k] = static_cast<uint32_t>((w >> (8 * k)) & 0xffu);
}
HWY_INLINE void load_idx8(const uint16_t* ix, uint32_t* out) {
  uint64_t w[2];
  std::memcpy(w, ix, 16);
  for (int k = 0; k < 8; ++k)
    out[k] = static_cast<uint32_t>((w[k / 4] >> (16 * (k % 4))) & 0xffffu);
}

// One row's score for ng <= L query heads: Σ_j qT[idx_j] · vf[j] over the lanes, 8 chains.
template <class D, typename I>
HWY_INLINE hn::Vec<D> row_dot(D d, const float* HWY_RESTRICT qT, const I* ix, const float* vf,
                              int64_t cnt) {
  constexpr int64_t L = hn::MaxLanes(d);
  using VecF = hn::Vec<D>;
  VecF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  int64_t j = 0;
  uint32_t ii[8];
  for (; j + 8 <= cnt; j += 8) {
    load_idx8(ix + j, ii);
    const VecF v0 = hn::LoadDup128(d, vf + j), v1 = hn::LoadDup128(d, vf + j + 4);
    a0 = hn::MulAdd(hn::Load(d, qT + ii[0] * L), hn::Broadcast<0>(v0), a0);
    a1 = hn::MulAdd(hn::Load(d, qT + ii[1] * L), hn::Broadcast<1>(v0), a1);
    a2 = hn::MulAdd(hn::Load(d, qT + ii[2] * L), hn::Broadcast<2>(v0), a2);
    a3 = hn::MulAdd(hn::Load(d, qT + ii[3] * L), hn::Broadcast<3>(v0), a3);
    a4 = hn::MulAdd(hn::Load(d, qT + ii[4] * L), hn::Broadcast<0>(v1), a4);
    a5 = hn::MulAdd(hn::Load(d, qT + ii[5] * L), hn::Broadcast<1>(v1), a5);
    a6 = hn::MulAdd(hn::Load(d, qT + ii[6] * L), hn::Broadcast<2>(v1), a6);
    a7 = hn::MulAdd(hn::Load(d, qT + ii[7] * L), hn::Broadcast<3>(v1), a7);
  }
  for (; j < cnt; ++j) a0 = hn::MulAdd(hn::Load(d, qT + ix[j] * L), hn::Set(d, vf[j]), a0);
  return hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                 hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
}

// Per-thread aligned scratch: slot k holds at least n floats (grows, never shrinks). Slots: 0 the
// staged q or the even tokens' acc, 1 and 2 decoded values, 3 the odd tokens' acc.
HWY_INLINE float* scratch(int slot, int64_t n) {
  thread_local hwy::AlignedFreeUniquePtr<float[]> buf[4];
  thread_local int64_t cap[4] = {0, 0, 0, 0};
  if (cap[slot] < n) {
    buf[slot] = hwy::AllocateAligned<float>(static_cast<size_t>(n));
    cap[slot] = n;
  }
  return buf[slot].get();
}

// qT [dim, L] = q [ng, ldq] transposed, zero in lanes >= ng.
template <int64_t L>
HWY_INLINE void stage_q(const float* q, int ng, int64_t ldq, int64_t dim, float* HWY_RESTRICT qT) {
  for (int64_t i = 0; i < dim; ++i) {
    for (int64_t g = 0; g < L; ++g) qT[i * L + g] = g < ng ? q[g * ldq + i] : 0.f;
  }
}

// Scores for ng <= L query heads (L = lanes of d), one token at a time.
template <class D, typename V, typename I>
HWY_NOINLINE void scores_lanes(D d, const SparseRows& r, const float* q, int ng, int64_t ldq,
                               int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  constexpr int64_t L = hn::MaxLanes(d);
  const V* vals = static_cast<const V*>(r.vals);
  const I* idx = static_cast<const I*>(r.idx);
  float* HWY_RESTRICT qT = scratch(0, r.dim * L);
  float* HWY_RESTRICT vf = scratch(1, r.dim + 8);
  HWY_ALIGN float out[L];
  stage_q<L>(q, ng, ldq, r.dim, qT);
  for (int64_t t = t0; t < t0 + n_t; ++t) {
    int64_t beg, cnt;
    row_range(r, t, beg, cnt);
    decode_row(vals + beg, cnt, vf);
    const float sc = (r.scale ? r.scale[t] : 1.f) * kValMul<V>;
    hn::Store(hn::Mul(row_dot(d, qT, idx + beg, vf, cnt), hn::Set(d, sc)), d, out);
    for (int g = 0; g < ng; ++g) s[g * ld_s + t - t0] = out[g];
  }
}

#undef KVTRIM_SPARSE_PAIRS                  // this file is compiled once per target
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2  // 256-bit vectors
#define KVTRIM_SPARSE_PAIRS 1
// Scores for ng <= 4 query heads with 8-lane vectors: two tokens per vector (lanes 0..3 token
// A, 4..7 token B), so each FMA does twice the useful work of a 4-lane one. Per entry pair:
// a q row pair is one 128-bit load plus one 128-bit insert from memory; values are decoded
// straight from the rows, 4 of A and 4 of B per conversion, and broadcast within each half.
template <typename V, typename I>
HWY_NOINLINE void scores_pairs(const SparseRows& r, const float* q, int ng, int64_t ldq, int64_t t0,
                               int64_t n_t, float* s, int64_t ld_s) {
  const hn::CappedTag<float, 4> d4;
  const hn::CappedTag<float, 8> d8;
  const hn::Rebind<typename Raw<V>::T, decltype(d8)> dr8;
  const hn::Half<decltype(dr8)> dr4;
  using V8 = hn::Vec<decltype(d8)>;
  using R = typename Raw<V>::T;
  const R* vals = static_cast<const R*>(r.vals);
  const I* idx = static_cast<const I*>(r.idx);
  constexpr int64_t kOut = 64;  // token pairs whose scores are staged before the transpose
  float* HWY_RESTRICT qT = scratch(0, r.dim * 4);
  float* HWY_RESTRICT vfa = scratch(1, r.dim + 8);
  float* HWY_RESTRICT vfb = scratch(2, r.dim + 8);
  HWY_ALIGN float out[kOut][8];
  stage_q<4>(q, ng, ldq, r.dim, qT);
  const int64_t n_pair = n_t / 2;
  for (int64_t p0 = 0; p0 < n_pair; p0 += kOut) {
    const int64_t np = std::min(kOut, n_pair - p0);
    for (int64_t u = 0; u < np; ++u) {
      const int64_t t = t0 + 2 * (p0 + u);
      int64_t ba, ca, bb, cb;
      row_range(r, t, ba, ca);
      row_range(r, t + 1, bb, cb);
      const I* ixa = idx + ba;
      const I* ixb = idx + bb;
      const R* va = vals + ba;
      const R* vb = vals + bb;
      V8 a0 = hn::Zero(d8), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
      const int64_t common = std::min(ca, cb) / 8 * 8;
      uint32_t ia[8], ib[8];
      for (int64_t j = 0; j < common; j += 8) {
        load_idx8(ixa + j, ia);
        load_idx8(ixb + j, ib);
        const V8 v0 =
            convert<V>(d8, hn::Combine(dr8, hn::LoadU(dr4, vb + j), hn::LoadU(dr4, va + j)));
        const V8 v1 = convert<V>(
            d8, hn::Combine(dr8, hn::LoadU(dr4, vb + j + 4), hn::LoadU(dr4, va + j + 4)));
#define KVTRIM_QROW(k) hn::Combine(d8, hn::Load(d4, qT + ib[k] * 4), hn::Load(d4, qT + ia[k] * 4))
        a0 = hn::MulAdd(KVTRIM_QROW(0), hn::Broadcast<0>(v0), a0);
        a1 = hn::MulAdd(KVTRIM_QROW(1), hn::Broadcast<1>(v0), a1);
        a2 = hn::MulAdd(KVTRIM_QROW(2), hn::Broadcast<2>(v0), a2);
        a3 = hn::MulAdd(KVTRIM_QROW(3), hn::Broadcast<3>(v0), a3);
        a4 = hn::MulAdd(KVTRIM_QROW(4), hn::Broadcast<0>(v1), a4);
        a5 = hn::MulAdd(KVTRIM_QROW(5), hn::Broadcast<1>(v1), a5);
        a6 = hn::MulAdd(KVTRIM_QROW(6), hn::Broadcast<2>(v1), a6);
        a7 = hn::MulAdd(KVTRIM_QROW(7), hn::Broadcast<3>(v1), a7);
#undef KVTRIM_QROW
      }
      V8 sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                       hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
      if (ca > common || cb > common) {  // the rest of each row (variable counts, T % 8)
        decode_row(reinterpret_cast<const V*>(va + common), ca - common, vfa);
        decode_row(reinterpret_cast<const V*>(vb + common), cb - common, vfb);
        const auto ra = row_dot(d4, qT, ixa + common, vfa, ca - common);
        const auto rb = row_dot(d4, qT, ixb + common, vfb, cb - common);
        sum = hn::Add(sum, hn::Combine(d8, rb, ra));
      }
      const float sa = (r.scale ? r.scale[t] : 1.f) * kValMul<V>;
      const float sb = (r.scale ? r.scale[t + 1] : 1.f) * kValMul<V>;
      hn::Store(hn::Mul(sum, hn::Combine(d8, hn::Set(d4, sb), hn::Set(d4, sa))), d8, out[u]);
    }
    for (int g = 0; g < ng; ++g) {
      float* sg = s + g * ld_s + 2 * p0;
      for (int64_t u = 0; u < np; ++u) {
        sg[2 * u] = out[u][g];
        sg[2 * u + 1] = out[u][4 + g];
      }
    }
  }
  if (n_t % 2) {
    const int64_t t = t0 + n_t - 1;
    scores_lanes<decltype(d4), V, I>(d4, r, q, ng, ldq, t, 1, s + t - t0, ld_s);
  }
}
#endif

// Raw elements p[0 .. 4) in each 128-bit block of a vector of Lanes(dr) raw elements (4 or 8),
// for Broadcast<k> after conversion.
template <class DR>
HWY_INLINE hn::Vec<DR> dup4(DR dr, const hn::TFromD<DR>* p) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(dr) == 8) {
    const hn::Half<DR> dh;
    const auto x = hn::LoadU(dh, p);
    return hn::Combine(dr, x, x);
  }
#endif
  return hn::LoadU(dr, p);
}

// Accumulation for ng <= L query heads.
template <class D, typename V, typename I>
HWY_NOINLINE void accum_lanes(D d, const SparseRows& r, const float* p, int ng, int64_t ld_p,
                              int64_t t0, int64_t n_t, float* acc, int64_t ld_acc) {
  constexpr int64_t L = hn::MaxLanes(d);
  using VecF = hn::Vec<D>;
  using R = typename Raw<V>::T;
  const hn::Rebind<R, D> dr;
  const R* vals = static_cast<const R*>(r.vals);
  const I* idx = static_cast<const I*>(r.idx);
  float* aT[2] = {scratch(0, r.dim * L), scratch(3, r.dim * L)};  // two copies: even and odd tokens
  float* HWY_RESTRICT vf = scratch(1, r.dim + 8);
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
      const I* ix = idx + beg;
      const R* vr = vals + beg;
      float* a = aT[u & 1];
      const VecF pv = hn::Load(d, pw + u * L);
      int64_t j = 0;
      uint32_t ii[8];
      for (; j + 8 <= cnt; j += 8) {  // 8 entries: indices from one load, values decoded 4 at once
        load_idx8(ix + j, ii);
        const VecF v0 = convert<V>(d, dup4(dr, vr + j)), v1 = convert<V>(d, dup4(dr, vr + j + 4));
#define KVTRIM_UPD(k, v, lane) \
  hn::Store(hn::MulAdd(hn::Broadcast<lane>(v), pv, hn::Load(d, a + ii[k] * L)), d, a + ii[k] * L)
        KVTRIM_UPD(0, v0, 0);
        KVTRIM_UPD(1, v0, 1);
        KVTRIM_UPD(2, v0, 2);
        KVTRIM_UPD(3, v0, 3);
        KVTRIM_UPD(4, v1, 0);
        KVTRIM_UPD(5, v1, 1);
        KVTRIM_UPD(6, v1, 2);
        KVTRIM_UPD(7, v1, 3);
#undef KVTRIM_UPD
      }
      if (j < cnt) {
        decode_row(reinterpret_cast<const V*>(vr + j), cnt - j, vf);
        for (int64_t k = 0; j + k < cnt; ++k) {
          float* rk = a + ix[j + k] * L;
          hn::Store(hn::MulAdd(hn::Set(d, vf[k]), pv, hn::Load(d, rk)), d, rk);
        }
      }
    }
  }
  for (int64_t i = 0; i < r.dim; ++i) {
    for (int g = 0; g < ng; ++g) acc[g * ld_acc + i] = aT[0][i * L + g] + aT[1][i * L + g];
  }
}

// Plain loops (the scalar target).
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
#ifdef KVTRIM_SPARSE_PAIRS
      scores_pairs<V, I>(r, q + g0 * ldq, ng, ldq, t0, n_t, s + g0 * ld_s, ld_s);
      continue;
#endif
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
    scores_simd<V, I>(r, q, n_g, ldq, t0, n_t, s, ld_s);
  }
}

template <typename V, typename I>
void accum_typed(const SparseRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0,
                 int64_t n_t, float* acc, int64_t ld_acc) {
  if constexpr (HWY_TARGET == HWY_SCALAR) {
    return accum_scalar<V, I>(r, p, n_g, ld_p, t0, n_t, acc, ld_acc);
  } else {
    accum_simd<V, I>(r, p, n_g, ld_p, t0, n_t, acc, ld_acc);
  }
}

// Calls f.template operator()<V, I>() for the rows' value and index types.
template <class F>
HWY_INLINE void with_types(const SparseRows& r, F&& f) {
  const bool i8 = r.idx_bytes == 1;
  switch (r.type) {
    case KvDtype::kF32:
      return i8 ? f.template operator()<float, uint8_t>()
                : f.template operator()<float, uint16_t>();
    case KvDtype::kF16:
      return i8 ? f.template operator()<uint16_t, uint8_t>()
                : f.template operator()<uint16_t, uint16_t>();
    case KvDtype::kBF16:
      return i8 ? f.template operator()<Bf16, uint8_t>() : f.template operator()<Bf16, uint16_t>();
    case KvDtype::kQ8:
      return i8 ? f.template operator()<int8_t, uint8_t>()
                : f.template operator()<int8_t, uint16_t>();
    case KvDtype::kFP8:
      return i8 ? f.template operator()<uint8_t, uint8_t>()
                : f.template operator()<uint8_t, uint16_t>();
    default:  // a type without these kernels (kv_type(t).sparse_kernels): callers take the
      break;  // generic path
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
