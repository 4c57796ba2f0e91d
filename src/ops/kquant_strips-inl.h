// Q4_K weights eight rows at a time, the rows as SIMD lanes: legacy_strips-inl.h's scheme (read
// it first) for the k-quant that Qwen2.5 and Gemma3's Q4_K_M files are mostly made of. Included
// by matmul_kernels.cpp inside its per-target namespace, after legacy_strips-inl.h (whose
// transpose_dwords, halves_to_ps, for_each_strip and strip_dispatch it uses); x86 only.
//
// A Q4_K super-block holds 256 columns in 8 sub-blocks of 32: x = d·sc_j·q − dmin·m_j with 4-bit
// q and 6-bit sc_j, m_j packed in 12 bytes. Per strip and super-block the 8 rows' header and
// nibbles are transposed in registers (u[8j + k], lane r = row r's columns 32j + 4k .. +3), the
// scales and mins unpacked lane-wise (the same word operations as scales_mins_k4); then per
// token each sub-block is 8 dpbusd (maddubs + madd without VNNI) times the broadcast activation
// dwords, multiplied by its scale lane-wise, and the min term is m_j times the activation's
// sub-block sum (two of Q8_K's bsums). The decoded super-block (2 KiB) is shared by up to
// kStripTokens tokens.
//
// Numerics: a row's result is a chain over its super-blocks of fma(float(Σ_j sc_j·isum_j),
// d·x.d, acc), then fma(−float(Σ_j m_j·bsum_j), dmin·x.d, acc), with exact integer sums; every
// lane runs the same operations whatever the other lanes and tokens, so a batched step equals
// the solo ones bit for bit and a row's result does not depend on its strip.
#if defined(KVTRIM_OPS_KQUANT_STRIPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVTRIM_OPS_KQUANT_STRIPS_INL_H_
#undef KVTRIM_OPS_KQUANT_STRIPS_INL_H_
#else
#define KVTRIM_OPS_KQUANT_STRIPS_INL_H_
#endif

#if KV_X86

// (-DKVTRIM_KQUANT_STRIPS=0 builds the row kernels only: the A/B.)
#ifndef KVTRIM_KQUANT_STRIPS
#define KVTRIM_KQUANT_STRIPS 1
#endif
template <GgmlType kT>
constexpr bool kKStripType = KVTRIM_KQUANT_STRIPS && kT == GgmlType::Q4_K;

// One Q4_K super-block of a strip, decoded.
struct K4StripBlock {
  __m256i u[64];         // u[8j + k] lane r: row r's nibbles of columns 32j + 4k .. 32j + 4k + 3
  __m256i sc[8];         // lane r: row r's 6-bit scale of sub-block j
  __m256i m2[4];         // lane r: row r's 6-bit mins of sub-blocks 2i (low i16) and 2i + 1 (high)
  __m256 d, dm;          // lane r: row r's d, dmin
};

// The super-block's header for 8 rows: its first 16 bytes (d, dmin, the 12 scale bytes) are one
// 8 x 4 dword transpose (no gathers); scales and mins unpacked lane-wise as scales_mins_k4 does.
KV_ATTR HWY_INLINE void k4_strip_header(const uint8_t* const* p, size_t off, K4StripBlock& s) {
  __m256i h[4];
  transpose_dwords(p, off, h);  // d | dmin << 16, scales 0..3, 4..7, 8..11
  s.d = halves_to_ps<0>(h[0]);
  s.dm = halves_to_ps<16>(h[0]);
  const __m256i u0 = h[1], u1 = h[2], u2 = h[3];
  const __m256i k1 = _mm256_set1_epi32(0x3f3f3f3f), k2 = _mm256_set1_epi32(0x0f0f0f0f),
                k3 = _mm256_set1_epi32(0x03030303), ff = _mm256_set1_epi32(0xff);
  const __m256i sc03 = _mm256_and_si256(u0, k1), m03 = _mm256_and_si256(u1, k1);
  const __m256i sc47 = _mm256_or_si256(_mm256_and_si256(u2, k2),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k3), 4));
  const __m256i m47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), k2),
                                      _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k3), 4));
  for (int b = 0; b < 4; ++b) {
    const __m128i cnt = _mm_cvtsi32_si128(8 * b);
    s.sc[b] = _mm256_and_si256(_mm256_srl_epi32(sc03, cnt), ff);
    s.sc[4 + b] = _mm256_and_si256(_mm256_srl_epi32(sc47, cnt), ff);
  }
  // the mins as i16 pairs: m2[i] lane r = m_2i | m_2i+1 << 16 (byte b of m03 is the min of
  // sub-block b, of m47 of sub-block 4 + b; 6 bits, so the masks cut nothing off)
  const __m256i w0 = _mm256_set1_epi32(0xff), w1 = _mm256_set1_epi32(0xff0000);
  for (int h = 0; h < 2; ++h) {
    const __m256i lo = h ? m47 : m03, hi = _mm256_srli_epi32(lo, 16);
    s.m2[2 * h] = _mm256_or_si256(_mm256_and_si256(lo, w0), _mm256_and_si256(_mm256_slli_epi32(lo, 8), w1));
    s.m2[2 * h + 1] = _mm256_or_si256(_mm256_and_si256(hi, w0), _mm256_and_si256(_mm256_slli_epi32(hi, 8), w1));
  }
}

// The 32 qs bytes of sub-blocks 2·j2 (low nibbles) and 2·j2 + 1 (high) for 8 rows: q[k] lane r =
// row r's bytes 4k .. 4k + 3.
KV_ATTR HWY_INLINE void k4_strip_qs(const uint8_t* const* p, size_t off, int j2, __m256i* q) {
  transpose_dwords(p, off + offsetof(BlockQ4_K, qs) + 32 * static_cast<size_t>(j2), q);
  transpose_dwords(p, off + offsetof(BlockQ4_K, qs) + 32 * static_cast<size_t>(j2) + 16, q + 4);
}

// Σ_k u[k] · (activation bytes 4k..4k+3 broadcast), k < 8: lane r = row r's exact sub-block dot.
KV_ATTR HWY_INLINE __m256i k4_isum(const __m256i* u, const int8_t* xq) {
  auto bc = [xq](int k) {
    int32_t v;
    std::memcpy(&v, xq + 4 * k, 4);
    return _mm256_set1_epi32(v);
  };
#if KV_VNNI
  __m256i a0 = dpbusd256(_mm256_setzero_si256(), u[0], bc(0));
  __m256i a1 = dpbusd256(_mm256_setzero_si256(), u[1], bc(1));
  for (int k = 2; k < 8; k += 2) {
    a0 = dpbusd256(a0, u[k], bc(k));
    a1 = dpbusd256(a1, u[k + 1], bc(k + 1));
  }
  return _mm256_add_epi32(a0, a1);
#else
  // a maddubs pair is at most 2 · 15 · 127 = 3810: eight of them summed in i16 stay below 2^15
  __m256i p = _mm256_maddubs_epi16(u[0], bc(0));
  for (int k = 1; k < 8; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[k], bc(k)));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

// The activation's 8 sub-block sums (pairs of its 16 bsums; |sum| <= 32 · 127, an i16) as dwords
// (sum 2i | sum 2i+1 << 16): Σ_j m_j · sum_j is then 4 madd with the mins' i16 pairs (m2).
KV_ATTR HWY_INLINE __m128i k4_bsum_pairs(const BlockQ8_K& xb) {
  const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
  return _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
}

// Token t's super-block total: acc ← fma(float(Σ_j sc_j·isum_j), d·x.d, acc), then the min term.
KV_ATTR HWY_INLINE __m256 k4_finish(const K4StripBlock& s, const BlockQ8_K& xb, __m256i sumi, __m256 acc) {
  const __m128i pairs = k4_bsum_pairs(xb);
  __m256i summ = _mm256_madd_epi16(s.m2[0], _mm256_broadcastd_epi32(pairs));
  summ = _mm256_add_epi32(summ, _mm256_madd_epi16(s.m2[1], _mm256_broadcastd_epi32(_mm_shuffle_epi32(pairs, 1))));
  summ = _mm256_add_epi32(summ, _mm256_madd_epi16(s.m2[2], _mm256_broadcastd_epi32(_mm_shuffle_epi32(pairs, 2))));
  summ = _mm256_add_epi32(summ, _mm256_madd_epi16(s.m2[3], _mm256_broadcastd_epi32(_mm_shuffle_epi32(pairs, 3))));
  const __m256 xd = _mm256_set1_ps(xb.d);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(s.d, xd), acc);
  return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(s.dm, xd), acc);
}

// Super-blocks each row of a strip prefetches ahead (perf §6: 4 / 8 / 16 / 32 measured).
constexpr int kK4Ahead = 32;

// out[t] lane r = row p[r] · token t's activation (NT tokens, super-blocks x[t][0..nbk)). One
// token: each pair of sub-blocks is computed straight from its transposed bytes; several: the
// super-block's nibbles are decoded once into s.u and read by every token. Both add the same
// integers in the same order (sub-blocks 0..7), so their results are equal bit for bit.
template <int NT>
KV_ATTR void dot_strip_k4(const uint8_t* const* p, const BlockQ8_K* const* x, int64_t nbk, __m256* out) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  K4StripBlock s;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nbk; ++i) {
    const size_t off = static_cast<size_t>(i) * sizeof(BlockQ4_K);
    // each row's super-block kK4Ahead ahead (past a row's end: the next row's start, read soon
    // anyway): 8 interleaved streams from DRAM, which the hardware prefetcher alone does not
    // keep ahead of
    for (int r = 0; r < kStripRows; ++r) {
      const uint8_t* a = p[r] + off + kK4Ahead * sizeof(BlockQ4_K);
      __builtin_prefetch(a);
      __builtin_prefetch(a + 64);
      __builtin_prefetch(a + 128);
    }
    k4_strip_header(p, off, s);
    if constexpr (NT == 1) {
      const BlockQ8_K& xb = x[0][i];
      __m256i sumi = _mm256_setzero_si256();
      for (int j2 = 0; j2 < 4; ++j2) {
        __m256i q[8], u[8];
        k4_strip_qs(p, off, j2, q);
        for (int k = 0; k < 8; ++k) u[k] = _mm256_and_si256(q[k], m4);
        sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(k4_isum(u, xb.qs + 64 * j2), s.sc[2 * j2]));
        for (int k = 0; k < 8; ++k) u[k] = _mm256_and_si256(_mm256_srli_epi16(q[k], 4), m4);
        sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(k4_isum(u, xb.qs + 64 * j2 + 32), s.sc[2 * j2 + 1]));
      }
      acc[0] = k4_finish(s, xb, sumi, acc[0]);
    } else {
      for (int j2 = 0; j2 < 4; ++j2) {
        __m256i q[8];
        k4_strip_qs(p, off, j2, q);
        for (int k = 0; k < 8; ++k) {
          s.u[16 * j2 + k] = _mm256_and_si256(q[k], m4);
          s.u[16 * j2 + 8 + k] = _mm256_and_si256(_mm256_srli_epi16(q[k], 4), m4);
        }
      }
      for (int t = 0; t < NT; ++t) {
        const BlockQ8_K& xb = x[t][i];
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j)
          sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(k4_isum(s.u + 8 * j, xb.qs + 32 * j), s.sc[j]));
        acc[t] = k4_finish(s, xb, sumi, acc[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = acc[t];
}

// Rows [r0, r1) of a Q4_K w times n_tok activations (BlockQ8_K rows act_stride apart).
KV_ATTR inline void k4_strip_rows_loop(const WeightView& w, int64_t r0, int64_t r1, const void* act,
                                       size_t act_stride, int64_t n_tok, float* y, int64_t ldy, int64_t nbk) {
  const auto* a = static_cast<const uint8_t*>(act);
  for_each_strip(w, r0, r1, n_tok, y, ldy, [&](const uint8_t* const* p, __m256i, int64_t t0, int nt, __m256* out) {
    const BlockQ8_K* x[kStripTokens];
    for (int t = 0; t < nt; ++t) x[t] = reinterpret_cast<const BlockQ8_K*>(a + static_cast<size_t>(t0 + t) * act_stride);
    strip_dispatch(nt, [&](auto n) { dot_strip_k4<decltype(n)::value>(p, x, nbk, out); });
  });
}

#endif  // KV_X86
#endif  // KVTRIM_OPS_KQUANT_STRIPS_INL_H_
