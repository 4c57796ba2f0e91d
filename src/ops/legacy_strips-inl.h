// Legacy-type weights eight rows at a time ("strips"), the rows as SIMD lanes. Included by
// matmul_kernels.cpp inside its per-target namespace, after its x86 helpers (half,
// KV_ATTR, KV_VNNI); x86 targets only.
//
// Why: the row-at-a-time kernels (dot_legacy / dot_legacy_n) reduce each row's block products
// across lanes and pay per block and token a scalar scale product, a broadcast, a conversion
// and an FMA for one row: ~7 operations per 32 multiply-adds of one token, and a horizontal sum
// per row and token. A batched decode step (several streams, one weight pass) is bound by that
// work, not by the weight bytes. Here the lanes are 8 rows: each i32 lane accumulates 4 weight
// bytes of its row times 4 activation bytes broadcast to every lane (one dpbusd; maddubs + madd
// without VNNI), so a block of 32 columns is 8 such products per token for all 8 rows at once,
// and the scale, the min / offset and the final store are one vector operation each for the 8
// rows. The weights are read in place (no repacked copy, no extra memory): each block's 8 row
// slices are loaded and transposed in registers once per strip and block, and shared by every
// token of the step (up to kStripTokens at once).
//
// Numerics: a row's result is a chain over its blocks of fma(float(isum_b), d_b·x_b.d, acc)
// (then, for Q4_1, fma(m_b, x_b.s, acc): the block's min term); isum_b is the exact integer
// dot product (Q4_0 and Q8_0 subtract their offset, 8 and 128, times the activation block's
// integer sum Σq before the conversion). Every lane is computed by the same operations whatever
// the other lanes and tokens are, so a row's result does not depend on the strip it falls in,
// the thread split, or how many tokens share the step: a batched step equals the solo ones bit
// for bit.
//
// Q8_0 needs VNNI (u8 x s8 dot products of full-range bytes: its weights are used as w + 128,
// which overflows maddubs' i16 pairs); without it Q8_0 keeps the row kernels. Q5_0 / Q5_1 get
// their fifth bits from one gather of the 8 rows' qh words per block, spread to bytes by
// shuffles and a bit test.
#if defined(KVTRIM_OPS_LEGACY_STRIPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVTRIM_OPS_LEGACY_STRIPS_INL_H_
#undef KVTRIM_OPS_LEGACY_STRIPS_INL_H_
#else
#define KVTRIM_OPS_LEGACY_STRIPS_INL_H_
#endif

#if KV_X86

constexpr int kStripRows = 8;
// Tokens sharing one decoded strip: one accumulator each, next to the 8 weight vectors and 2
// scale vectors (AVX2 has 16 registers, AVX-512 32).
constexpr int kStripTokens = KV_AVX512 ? 8 : 4;

// (-DKVTRIM_LEGACY_STRIPS=0 builds the row kernels only: the A/B of docs/results/perf.)
#ifndef KVTRIM_LEGACY_STRIPS
#define KVTRIM_LEGACY_STRIPS 1
#endif
template <GgmlType kT>
constexpr bool kStripType =
    KVTRIM_LEGACY_STRIPS &&
    (kT == GgmlType::Q4_0 || kT == GgmlType::Q4_1 || kT == GgmlType::Q5_0 || kT == GgmlType::Q5_1 ||
     (KV_VNNI && kT == GgmlType::Q8_0));

template <GgmlType kT>
using StripBlock = std::conditional_t<
    kT == GgmlType::Q4_0, BlockQ4_0,
    std::conditional_t<kT == GgmlType::Q4_1, BlockQ4_1,
                       std::conditional_t<kT == GgmlType::Q5_0, BlockQ5_0,
                                          std::conditional_t<kT == GgmlType::Q5_1, BlockQ5_1, BlockQ8_0>>>>;
template <GgmlType kT>
constexpr bool kHasMin = kT == GgmlType::Q4_1 || kT == GgmlType::Q5_1;
template <GgmlType kT>
constexpr bool kFiveBit = kT == GgmlType::Q5_0 || kT == GgmlType::Q5_1;
// The unsigned weight's offset (x = (u - offset) · d), applied through the activation's Σq.
template <GgmlType kT>
constexpr int32_t kStripOffset = kT == GgmlType::Q4_0 ? 8 : kT == GgmlType::Q5_0 ? 16 : kT == GgmlType::Q8_0 ? 128 : 0;

// One block of a strip, decoded: u[k] lane r = row r's 4 weight bytes for columns 4k..4k+3,
// unsigned (Q4: the nibble, Q5: nibble | fifth bit << 4, Q8_0: w + 128); d, m lane r = row r's
// scale and min (Q4_1, Q5_1).
struct StripBlockVecs {
  __m256i u[8];
  __m256 d, m;
};

// w[j] lane r = dword j of the 16 bytes at p[r] + off (an 8 x 4 dword transpose).
KV_ATTR HWY_INLINE void transpose_dwords(const uint8_t* const* p, size_t off, __m256i* w) {
  auto pair = [&](int r) {
    return _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[r] + off))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[r + 4] + off)), 1);
  };
  const __m256i r0 = pair(0), r1 = pair(1), r2 = pair(2), r3 = pair(3);
  const __m256i t0 = _mm256_unpacklo_epi32(r0, r1), t1 = _mm256_unpackhi_epi32(r0, r1);
  const __m256i t2 = _mm256_unpacklo_epi32(r2, r3), t3 = _mm256_unpackhi_epi32(r2, r3);
  w[0] = _mm256_unpacklo_epi64(t0, t2);
  w[1] = _mm256_unpackhi_epi64(t0, t2);
  w[2] = _mm256_unpacklo_epi64(t1, t3);
  w[3] = _mm256_unpackhi_epi64(t1, t3);
}

// The f16 in the low (shift 0) or high (shift 16) half of each dword, as f32.
template <int kShift>
KV_ATTR inline __m256 halves_to_ps(__m256i g) {
  const __m256i h = kShift ? _mm256_srli_epi32(g, 16) : _mm256_and_si256(g, _mm256_set1_epi32(0xffff));
  return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

// Block i of the strip whose rows start at p[0..8) (lane r's byte offset from p[0] in gidx).
template <GgmlType kT>
KV_ATTR inline void strip_block(const uint8_t* const* p, __m256i gidx, int64_t i, StripBlockVecs& s) {
  using B = StripBlock<kT>;
  const size_t off = static_cast<size_t>(i) * sizeof(B);
  const __m256i g = _mm256_i32gather_epi32(reinterpret_cast<const int*>(p[0] + off), gidx, 1);
  s.d = halves_to_ps<0>(g);
  if constexpr (kHasMin<kT>) s.m = halves_to_ps<16>(g);
  if constexpr (kT == GgmlType::Q8_0) {
    transpose_dwords(p, off + offsetof(B, qs), s.u);
    transpose_dwords(p, off + offsetof(B, qs) + 16, s.u + 4);
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int k = 0; k < 8; ++k) s.u[k] = _mm256_xor_si256(s.u[k], bias);
  } else {
    // low nibbles: columns 0..15 (dword j: 4j..4j+3), high nibbles: columns 16..31
    __m256i q[4];
    transpose_dwords(p, off + offsetof(B, qs), q);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      s.u[j] = _mm256_and_si256(q[j], m4);
      s.u[4 + j] = _mm256_and_si256(_mm256_srli_epi16(q[j], 4), m4);
    }
    if constexpr (kFiveBit<kT>) {
      // u[k] byte b of lane r needs bit 4k + b of row r's qh: byte k / 2 of qh copied to the 4
      // bytes of the lane, tested against bits (k odd: 4..7, even: 0..3) b.
      const __m256i h = _mm256_i32gather_epi32(reinterpret_cast<const int*>(p[0] + off + offsetof(B, qh)), gidx, 1);
      const __m256i lo_bits = _mm256_set1_epi32(0x08040201), hi_bits = _mm256_set1_epi32(static_cast<int>(0x80402010u));
      const __m256i five = _mm256_set1_epi8(0x10);
      for (int byte = 0; byte < 4; ++byte) {
        const int c = byte * 0x01010101;  // dword j of each half <- byte 4j + `byte`, 4 times
        const __m256i sp = _mm256_shuffle_epi8(
            h, _mm256_setr_epi32(c, c + 0x04040404, c + 0x08080808, c + 0x0c0c0c0c, c, c + 0x04040404,
                                 c + 0x08080808, c + 0x0c0c0c0c));
        const __m256i b_lo = _mm256_cmpeq_epi8(_mm256_and_si256(sp, lo_bits), lo_bits);
        const __m256i b_hi = _mm256_cmpeq_epi8(_mm256_and_si256(sp, hi_bits), hi_bits);
        s.u[2 * byte] = _mm256_or_si256(s.u[2 * byte], _mm256_and_si256(b_lo, five));
        s.u[2 * byte + 1] = _mm256_or_si256(s.u[2 * byte + 1], _mm256_and_si256(b_hi, five));
      }
    }
  }
}

// Σ_k u[k] · (activation bytes 4k..4k+3 broadcast): lane r = row r's exact block dot product.
template <GgmlType kT>
KV_ATTR inline __m256i strip_isum(const StripBlockVecs& s, const int8_t* xq) {
  auto bc = [xq](int k) {
    int32_t v;
    std::memcpy(&v, xq + 4 * k, 4);
    return _mm256_set1_epi32(v);
  };
#if KV_VNNI
  __m256i a0 = dpbusd256(_mm256_setzero_si256(), s.u[0], bc(0));
  __m256i a1 = dpbusd256(_mm256_setzero_si256(), s.u[1], bc(1));
  for (int k = 2; k < 8; k += 2) {
    a0 = dpbusd256(a0, s.u[k], bc(k));
    a1 = dpbusd256(a1, s.u[k + 1], bc(k + 1));
  }
  return _mm256_add_epi32(a0, a1);
#else
  static_assert(kT != GgmlType::Q8_0, "Q8_0 strips need VNNI");
  // A maddubs pair is at most 2 · 15 · 127 = 3810 (Q4) or 2 · 31 · 127 = 7874 (Q5): eight (Q4)
  // or four (Q5) of them summed in i16 stay below 2^15.
  constexpr int kRun = kFiveBit<kT> ? 4 : 8;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
  for (int k0 = 0; k0 < 8; k0 += kRun) {
    __m256i p = _mm256_maddubs_epi16(s.u[k0], bc(k0));
    for (int k = k0 + 1; k < k0 + kRun; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(s.u[k], bc(k)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
  }
  return acc;
#endif
}

// out[t] lane r = row p[r] · token t's activation (NT tokens, blocks x[t][0..nb)); qsum[t][i]
// = kStripOffset times Σq of x[t][i] (types without a min).
template <GgmlType kT, int NT>
KV_ATTR void dot_strip(const uint8_t* const* p, __m256i gidx, const BlockQ8A* const* x,
                       const int32_t* const* qsum, int64_t nb, __m256* out) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  StripBlockVecs s;
  for (int64_t i = 0; i < nb; ++i) {
    strip_block<kT>(p, gidx, i, s);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8A& xb = x[t][i];
      __m256i isum = strip_isum<kT>(s, xb.qs);
      if constexpr (kStripOffset<kT> != 0) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(qsum[t][i]));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(s.d, _mm256_set1_ps(xb.d)), acc[t]);
      if constexpr (kHasMin<kT>) acc[t] = _mm256_fmadd_ps(s.m, _mm256_set1_ps(xb.s), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = acc[t];
}

// Rows [r0, r1) of w in strips of 8 (the last one padded by repeating its last row; the padding
// lanes are not stored) times n_tok tokens in groups of up to kStripTokens: kernel(p, gidx, t0,
// nt, out) fills out[0..nt) (lane r = row p[r] · token t0 + t), stored into y. The strip two
// ahead is prefetched while this one is computed (decode streams W from DRAM; the hardware
// prefetcher stops at page boundaries). Measured on SmolLM2's Q8_0 output matrix (49152 x 576,
// 1 thread, medians of 10): one strip ahead 917-937 us, two 876-878 us, three 1017+ us; the row
// kernels 976-1057 us.
template <class Kernel>
KV_ATTR void for_each_strip(const WeightView& w, int64_t r0, int64_t r1, int64_t n_tok, float* y, int64_t ldy,
                            Kernel&& kernel) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  constexpr int kAhead = 2;
  const size_t strip_bytes = kStripRows * w.row_bytes;
  const size_t pf_bytes = std::min<size_t>(strip_bytes, 16384);
  __m256 out[kStripTokens];
  for (int64_t r = r0; r < r1; r += kStripRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kStripRows, r1 - r));
    const uint8_t* p[kStripRows];
    alignas(32) int32_t off[kStripRows];
    for (int k = 0; k < kStripRows; ++k) {
      p[k] = base + static_cast<size_t>(r + std::min(k, nr - 1)) * w.row_bytes;
      off[k] = static_cast<int32_t>(p[k] - p[0]);
    }
    const __m256i gidx = _mm256_load_si256(reinterpret_cast<const __m256i*>(off));
    if (r + kAhead * kStripRows < r1) {
      const uint8_t* next = p[0] + kAhead * strip_bytes;
      for (size_t o = 0; o < pf_bytes; o += 64) __builtin_prefetch(next + o);
    }
    for (int64_t t0 = 0; t0 < n_tok; t0 += kStripTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(kStripTokens, n_tok - t0));
      kernel(p, gidx, t0, nt, out);
      for (int t = 0; t < nt; ++t) {
        float* yt = y + (t0 + t) * ldy + r;
        if (nr == kStripRows) {
          _mm256_storeu_ps(yt, out[t]);
        } else {
          alignas(32) float tmp[kStripRows];
          _mm256_store_ps(tmp, out[t]);
          std::memcpy(yt, tmp, static_cast<size_t>(nr) * sizeof(float));
        }
      }
    }
  }
}

// f(std::integral_constant<int, NT>) for the token count nt of a group (a compile-time NT for the
// kernels' accumulators; up to kStripTokens). No target attribute: it runs inside the strip
// walker's lambdas, which clang compiles without KV_ATTR's features (and it uses no intrinsics).
template <class F>
HWY_INLINE void strip_dispatch(int nt, F&& f) {
  switch (nt) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
#if KV_AVX512
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
#endif
    default: break;
  }
}

// kStripOffset<kT> times Σq of every activation block (n_tok BlockQ8A rows of nb blocks,
// act_stride bytes apart), once per call: element t · nb + i (token-major) or i · n_tok + t
// (block-major) of a per-thread buffer, valid until the next call; nullptr for the types without
// an offset.
template <GgmlType kT>
inline const int32_t* offset_qsums(const uint8_t* a, size_t act_stride, int64_t n_tok, int64_t nb, bool block_major) {
  if constexpr (kStripOffset<kT> == 0) {
    return nullptr;
  } else {
    thread_local std::vector<int32_t> buf;
    buf.resize(static_cast<size_t>(n_tok * nb));
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* xb = reinterpret_cast<const BlockQ8A*>(a + static_cast<size_t>(t) * act_stride);
      for (int64_t i = 0; i < nb; ++i) {
        int32_t s = 0;
        for (int j = 0; j < kQK; ++j) s += xb[i].qs[j];
        buf[static_cast<size_t>(block_major ? i * n_tok + t : t * nb + i)] = kStripOffset<kT> * s;
      }
    }
    return buf.data();
  }
}

// Rows [r0, r1) of a legacy-type w times n_tok activations (BlockQ8A rows act_stride apart).
template <GgmlType kT>
KV_ATTR void strip_rows_loop(const WeightView& w, int64_t r0, int64_t r1, const void* act, size_t act_stride,
                             int64_t n_tok, float* y, int64_t ldy, int64_t nb) {
  const auto* a = static_cast<const uint8_t*>(act);
  constexpr int32_t kOffset = kStripOffset<kT>;
  const int32_t* qsums = offset_qsums<kT>(a, act_stride, n_tok, nb, /*block_major=*/false);
  for_each_strip(w, r0, r1, n_tok, y, ldy, [&](const uint8_t* const* p, __m256i gidx, int64_t t0, int nt, __m256* out) {
    const BlockQ8A* x[kStripTokens];
    const int32_t* qs[kStripTokens] = {};
    for (int t = 0; t < nt; ++t) {
      x[t] = reinterpret_cast<const BlockQ8A*>(a + static_cast<size_t>(t0 + t) * act_stride);
      if constexpr (kOffset != 0) qs[t] = qsums + (t0 + t) * nb;
    }
    strip_dispatch(nt, [&](auto n) { dot_strip<kT, decltype(n)::value>(p, gidx, x, qs, nb, out); });
  });
}

#endif  // KV_X86
#endif  // KVTRIM_OPS_LEGACY_STRIPS_INL_H_
