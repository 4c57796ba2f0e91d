// Scores over q8 keys with the query in 8 bits too (attn_scores_q8q, see attn_kernels.h: meant
// for the decode and prefill attention of a q8 key cache, not wired in yet). One Highway
// translation unit compiled for every x86 target and dispatched at run time; every target
// computes the same integers and the same float operations in the same order, so the scores are
// equal bit for bit on every CPU. Reference (the loops of tests/kv/attn_kernels_test.cpp,
// q8_query_scores_match_reference):
//   q~[g][i] = clamp(rint(q[g][i] / dq[g][b]), ±127), dq[g][b] = max_{i in b} |q[g][i]| / 127
//   isum[g][t][b] = Σ_{i in block b} q~[g][i] · code(t, i)                       (exact, int32)
//   s[g][t] = k_scale[t] · (((0 + isum_0·dq_0) + isum_1·dq_1) + ...)   each step one f32 fma
// Blocks are 32 channels (the last one may be shorter). Why: with f32 queries every key element
// costs one 16-lane FMA per query head after its conversion, so a q8 cache took 0.68–0.75 of
// f16's time for 0.53 of its bytes (docs/results/perf §7); with VNNI one vpdpbusd multiplies 4
// channels of 16 tokens for a query head. llama.cpp scores its q8_0 keys the same way (the query
// quantized to q8_0 blocks of 32).
//   AVX3_DL and better (VNNI + VBMI): 4 channels × 16 tokens of a key tile (64 bytes) reordered
//     to token-major by one vpermb, biased to unsigned (code + 128, the bias removed with
//     128 · Σ q~ per block), one vpdpbusd per query head.
//   AVX2 / AVX3: the same 64 bytes reordered by byte / word unpacks, |code| times the query's
//     bytes with the code's sign (maddubs: pairs ≤ 2 · 127 · 127 < 2^15, exact), madd to int32.
//   other targets: plain loops.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kv/attn_kernels.h"
#include "kv/attn_batches.h"

// AVX3_DL (VNNI, VBMI) is opt-in in Highway 1.0.3, as in ops/matmul_kernels.cpp.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif

// foreach_target.h must come first: it re-includes this file once per target.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/attn_kernels_q8q.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kvtrim::kv {
namespace HWY_NAMESPACE {

// (Highway 1.0.3's AVX3_DL target attribute leaves out VNNI and VBMI, which its runtime check
// requires: the kernel names them itself, as matmul_kernels.cpp's KV_ATTR does.)
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
#define KV_Q8Q_PATH 2
#define KV_Q8Q_ATTR __attribute__((target("avx512vnni,avx512vbmi")))
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define KV_Q8Q_PATH 1
#define KV_Q8Q_ATTR
#else
#define KV_Q8Q_PATH 0
#define KV_Q8Q_ATTR
#endif

// Tile tk's scores s[g][t] for t in [lo, hi) (absolute tokens) from acc lane t − tile start.
// (Not always_inline: clang compiles q8q_batch's VNNI path with KV_Q8Q_ATTR's target, which
// replaces Highway's, and refuses to force-inline a function of another target into it.)
inline void store_tile(const float* acc, int G, int64_t tile, int64_t lo, int64_t hi, float* s,
                       int64_t ld_s, int64_t t0) {
  for (int g = 0; g < G; ++g)
    for (int64_t t = lo; t < hi; ++t) s[g * ld_s + t - t0] = acc[g * kKeyTile + t - tile * kKeyTile];
}

#if KV_Q8Q_PATH == 2
// One group of 4 channels (ch .. ch + 3) of a tile for G query heads: is[g] += its 4 × 16
// products (biased codes, see the top).
template <int G>
KV_Q8Q_ATTR HWY_INLINE void q8q_group(const int8_t* kt, int64_t ch, int64_t d, __m512i perm, __m512i bias,
                                      const int8_t* qi, int64_t dp, __m512i* is) {
  const __m512i raw = ch + 4 <= d ? _mm512_loadu_si512(kt + ch * kKeyTile)
                                  : _mm512_maskz_loadu_epi8((~0ULL) >> (64 - (d - ch) * kKeyTile),
                                                            kt + ch * kKeyTile);
  // (the maskz forms: GCC 12 warns about the plain ones' undefined pass-through operand)
  const __m512i u = _mm512_xor_si512(_mm512_maskz_permutexvar_epi8(~0ULL, perm, raw), bias);
  for (int g = 0; g < G; ++g) {
    int32_t w;
    std::memcpy(&w, qi + g * dp + ch, 4);
    is[g] = _mm512_dpbusd_epi32(is[g], u, _mm512_set1_epi32(w));
  }
}
#endif

// qi [G][dp] (zero past d), dq / qsum [G][nblk]; tokens [t0, t0 + n_t).
template <int G>
KV_Q8Q_ATTR HWY_NOINLINE void q8q_batch(const int8_t* qi, int64_t dp, const float* dq, const int32_t* qsum,
                            int64_t nblk, int64_t d, const int8_t* k, const float* k_scale,
                            int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  const int64_t t_end = t0 + n_t;
  alignas(64) float out[G * kKeyTile];
#if KV_Q8Q_PATH != 0
  const int64_t n4 = (d + 3) / 4;  // groups of 4 channels
#endif
#if KV_Q8Q_PATH == 2
  // output byte 4t + c = input byte 16c + t: 4 channels of a token side by side
  alignas(64) static const uint8_t kPerm[64] = {
      0, 16, 32, 48, 1, 17, 33, 49, 2,  18, 34, 50, 3,  19, 35, 51, 4,  20, 36, 52, 5,  21,
      37, 53, 6, 22, 38, 54, 7, 23, 39, 55, 8, 24, 40, 56, 9,  25, 41, 57, 10, 26, 42, 58, 11, 27,
      43, 59, 12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};
  const __m512i perm = _mm512_load_si512(kPerm);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
#elif KV_Q8Q_PATH == 1
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  for (int64_t tile = t0 / kKeyTile; tile * kKeyTile < t_end; ++tile) {
    const int8_t* kt = k + tile * d * kKeyTile;
#if KV_Q8Q_PATH == 2
    // two sums per head (even / odd channel groups), so that enough vpdpbusd chains are in flight
    // with few query heads (latency ~5 cycles, one per cycle)
    __m512 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; ++b) {
      __m512i is0[G], is1[G];
      for (int g = 0; g < G; ++g) is0[g] = is1[g] = _mm512_setzero_si512();
      const int64_t c_end = std::min<int64_t>(8 * b + 8, n4);
      int64_t c = 8 * b;
      for (; c + 2 <= c_end; c += 2) {
        q8q_group<G>(kt, 4 * c, d, perm, bias, qi, dp, is0);
        q8q_group<G>(kt, 4 * c + 4, d, perm, bias, qi, dp, is1);
      }
      if (c < c_end) q8q_group<G>(kt, 4 * c, d, perm, bias, qi, dp, is0);
      for (int g = 0; g < G; ++g) {
        const __m512i sum = _mm512_add_epi32(is0[g], is1[g]);
        const __m512i exact = _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * qsum[g * nblk + b]));
        acc[g] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, exact), _mm512_set1_ps(dq[g * nblk + b]), acc[g]);
      }
    }
    const __m512 sc = _mm512_loadu_ps(k_scale + tile * kKeyTile);
    if (tile * kKeyTile >= t0 && (tile + 1) * kKeyTile <= t_end) {  // whole tile in range
      for (int g = 0; g < G; ++g) _mm512_storeu_ps(s + g * ld_s + tile * kKeyTile - t0, _mm512_mul_ps(acc[g], sc));
      continue;
    }
    for (int g = 0; g < G; ++g) _mm512_store_ps(out + g * kKeyTile, _mm512_mul_ps(acc[g], sc));
#elif KV_Q8Q_PATH == 1
    for (int h = 0; h < 2; ++h) {  // tokens 8h .. 8h + 7 of the tile
      __m256 acc[G];
      for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
      for (int64_t b = 0; b < nblk; ++b) {
        __m256i is[G];
        for (int g = 0; g < G; ++g) is[g] = _mm256_setzero_si256();
        const int64_t c_end = std::min<int64_t>(8 * b + 8, n4);
        for (int64_t c = 8 * b; c < c_end; ++c) {
          const int64_t ch = 4 * c;
          __m128i r[4];
          for (int j = 0; j < 4; ++j)
            r[j] = ch + j < d ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(kt + (ch + j) * kKeyTile))
                              : _mm_setzero_si128();
          const __m128i a = h ? _mm_unpackhi_epi8(r[0], r[1]) : _mm_unpacklo_epi8(r[0], r[1]);
          const __m128i bb = h ? _mm_unpackhi_epi8(r[2], r[3]) : _mm_unpacklo_epi8(r[2], r[3]);
          const __m256i v = _mm256_set_m128i(_mm_unpackhi_epi16(a, bb), _mm_unpacklo_epi16(a, bb));
          const __m256i av = _mm256_abs_epi8(v);
          for (int g = 0; g < G; ++g) {
            int32_t w;
            std::memcpy(&w, qi + g * dp + ch, 4);
            const __m256i p = _mm256_maddubs_epi16(av, _mm256_sign_epi8(_mm256_set1_epi32(w), v));
            is[g] = _mm256_add_epi32(is[g], _mm256_madd_epi16(p, ones));
          }
        }
        for (int g = 0; g < G; ++g)
          acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[g]), _mm256_set1_ps(dq[g * nblk + b]), acc[g]);
      }
      const __m256 sc = _mm256_loadu_ps(k_scale + tile * kKeyTile + 8 * h);
      for (int g = 0; g < G; ++g) _mm256_store_ps(out + g * kKeyTile + 8 * h, _mm256_mul_ps(acc[g], sc));
    }
#else
    (void)qsum;
    for (int g = 0; g < G; ++g) {
      for (int64_t j = 0; j < kKeyTile; ++j) {
        float acc = 0.f;
        for (int64_t b = 0; b < nblk; ++b) {
          int32_t is = 0;
          for (int64_t i = 32 * b; i < std::min<int64_t>(32 * b + 32, d); ++i)
            is += static_cast<int32_t>(qi[g * dp + i]) * kt[i * kKeyTile + j];
          acc = std::fma(static_cast<float>(is), dq[g * nblk + b], acc);
        }
        out[g * kKeyTile + j] = acc * k_scale[tile * kKeyTile + j];
      }
    }
#endif
    store_tile(out, G, tile, std::max(t0, tile * kKeyTile), std::min(t_end, (tile + 1) * kKeyTile), s,
               ld_s, t0);
  }
}

void ScoresQ8Q(const int8_t* qi, int64_t dp, const float* dq, const int32_t* qsum, int64_t nblk,
               int n_g, int64_t d, const int8_t* k, const float* k_scale, int64_t t0, int64_t n_t,
               float* s, int64_t ld_s) {
  for_batches(n_g, [&](int g0, int ng) {
    with_batch(ng, [&](auto G) {
      q8q_batch<decltype(G)::value>(qi + g0 * dp, dp, dq + g0 * nblk, qsum + g0 * nblk, nblk, d, k,
                                    k_scale, t0, n_t, s + g0 * ld_s, ld_s);
    });
  });
}
#undef KV_Q8Q_PATH
#undef KV_Q8Q_ATTR

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim::kv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvtrim::kv {

HWY_EXPORT(ScoresQ8Q);

void QueryQ8::set(const float* q, int n_g_, int64_t d_) {
  n_g = n_g_;
  d = d_;
  const int64_t nblk = this->nblk(), dp = this->dp();
  qi.assign(static_cast<size_t>(n_g * dp), int8_t{0});
  dq.resize(static_cast<size_t>(n_g * nblk));
  qsum.resize(dq.size());
  for (int g = 0; g < n_g; ++g) {
    const float* x = q + g * d;
    int8_t* y = qi.data() + g * dp;
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t i0 = 32 * b, i1 = std::min(d, i0 + 32);
      float amax = 0.f;
      for (int64_t i = i0; i < i1; ++i) amax = std::max(amax, std::fabs(x[i]));
      // a NaN / inf query (a damaged model) must not reach the integer conversion: zeros
      const float scale = std::isfinite(amax) ? amax / 127.f : 0.f;
      const float inv = scale > 0.f ? 127.f / amax : 0.f;
      int32_t sum = 0;
      for (int64_t i = i0; i < i1; ++i) {
        const float r = std::rint(x[i] * inv);  // (rint: inlined; the same as nearbyint here)
        const int32_t c = r == r ? static_cast<int32_t>(std::clamp(r, -127.f, 127.f)) : 0;
        y[i] = static_cast<int8_t>(c);
        sum += c;
      }
      dq[static_cast<size_t>(g * nblk + b)] = scale;
      qsum[static_cast<size_t>(g * nblk + b)] = sum;
    }
  }
}

void attn_scores_q8q(const QueryQ8& q, const int8_t* k, const float* k_scale, int64_t t0, int64_t n_t,
                     float* s, int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(ScoresQ8Q)(q.qi.data(), q.dp(), q.dq.data(), q.qsum.data(), q.nblk(), q.n_g, q.d, k,
                                  k_scale, t0, n_t, s, ld_s);
}

}  // namespace kvtrim::kv
#endif  // HWY_ONCE
