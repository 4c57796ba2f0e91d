// Row-at-a-time integer dot products of Q2_K, Q3_K and IQ4_XS weight rows with a BlockQ8_K
// activation (IQ4_NL, a 32-element type, runs the legacy types' kernels with BlockQ8A, see
// row_kernels-inl.h). Included by matmul_kernels.cpp inside its per-target namespace, after
// row_kernels-inl.h (whose helpers it uses): x86 intrinsics (256-bit; VNNI on AVX3_DL) and the
// portable scalar code of the other targets, which computes the same integer sums.
//
// Per 256-element super-block the whole integer dot is exact in i32 and meets the f32 scales once:
//   Q2_K:   d·x.d · Σ_g sc_g Σ_{e∈g} q_e x_e  −  dmin·x.d · Σ_g m_g bsum_g    (q in 0..3)
//   Q3_K:   d·x.d · (Σ_g sc_g Σ_{e∈g} (q_e + 4) x_e − 4 Σ_g sc_g bsum_g)     (q in −4..3, sc signed)
//   IQ4_XS: d·x.d · Σ_s ls_s Σ_{e∈s} v_e x_e                                 (v the IQ4 level)
// g: the 16 sub-blocks of 16 (scale by sub-block, bsum the activation's 16-sums); s: the 8 of 32.
// Unsigned x signed byte products (maddubs / vpdpbusd) keep q + 4 (Q3_K) and |v| (IQ4, with the
// activation's sign flipped where v < 0): the pairs stay within i16 (7·127·2, 127·127·2).
#if defined(KVTRIM_OPS_LOWBIT_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVTRIM_OPS_LOWBIT_KERNELS_INL_H_
#undef KVTRIM_OPS_LOWBIT_KERNELS_INL_H_
#else
#define KVTRIM_OPS_LOWBIT_KERNELS_INL_H_
#endif

#if KV_X86

// The 16 signed scales (sc - 32) of a Q3_K super-block as bytes (q3k_scale per field, moved into
// place with word operations).
inline __m128i q3k_scales16(const uint8_t* q) {
  uint32_t a[3];
  std::memcpy(a, q, 12);
  constexpr uint32_t k4 = 0x0f0f0f0f, k2 = 0x03030303;
  const uint32_t s0 = (a[0] & k4) | ((a[2] & k2) << 4);                  // sub-blocks 0..3
  const uint32_t s1 = (a[1] & k4) | (((a[2] >> 2) & k2) << 4);           // 4..7
  const uint32_t s2 = ((a[0] >> 4) & k4) | (((a[2] >> 4) & k2) << 4);    // 8..11
  const uint32_t s3 = ((a[1] >> 4) & k4) | (((a[2] >> 6) & k2) << 4);    // 12..15
  return _mm_sub_epi8(_mm_set_epi32(static_cast<int>(s3), static_cast<int>(s2), static_cast<int>(s1),
                                    static_cast<int>(s0)),
                      _mm_set1_epi8(32));
}

// Σ_g sc_g Σ q_e x_e over one super-block of 2-bit fields (Q2_K's q, Q3_K's low bits): qs[64], the
// 16 sub-block scales as i16 (scales16, signed), and for Q3_K the third bits in hmask (added as 4).
template <bool kHighBit>
KV_ATTR inline __m256i k_2bit_sums(const uint8_t* qs, const uint8_t* hmask, __m256i scales16, const int8_t* xq) {
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  [[maybe_unused]] __m256i hm;
  if constexpr (kHighBit) hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hmask));
  __m256i sumi = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * h));
    // i16 scales of sub-blocks 8h .. 8h + 7 in both 128-bit halves
    const __m256i sc = h ? _mm256_permute2x128_si256(scales16, scales16, 0x11)
                         : _mm256_permute2x128_si256(scales16, scales16, 0x00);
    for (int j = 0; j < 4; ++j) {
      __m256i u = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
      if constexpr (kHighBit) {
        const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + j)), one);
        u = _mm256_or_si256(u, _mm256_slli_epi16(hb, 2));
      }
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 128 * h + 32 * j));
      // elements 128h + 32j + 0..15 are sub-block 8h + 2j, 16..31 sub-block 8h + 2j + 1
      sumi = mul_add_us8_scaled(sumi, u, xv, _mm256_shuffle_epi8(sc, bcast16(2 * j, 2 * j + 1)));
    }
  }
  return sumi;
}

KV_ATTR inline float dot_q2k(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  const auto* w = reinterpret_cast<const BlockQ2_K*>(wrow);
  const __m128i m4 = _mm_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ2_K& b = w[i];
    const BlockQ8_K& xb = x[i];
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sm, m4));
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
    const __m256i mins = _mm256_madd_epi16(m16, bs);  // Σ_g m_g bsum_g, in 8 parts
    acc_min = _mm256_fmadd_ps(_mm256_set1_ps(half(b.dmin) * xb.d), _mm256_cvtepi32_ps(mins), acc_min);
    const __m256i sumi = k_2bit_sums<false>(b.qs, nullptr, sc16, xb.qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(b.d) * xb.d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_ps(acc) - hsum_ps(acc_min);
}

KV_ATTR inline float dot_q3k(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  const auto* w = reinterpret_cast<const BlockQ3_K*>(wrow);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ3_K& b = w[i];
    const BlockQ8_K& xb = x[i];
    const __m256i sc16 = _mm256_cvtepi8_epi16(q3k_scales16(b.scales));
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
    const __m256i off = _mm256_madd_epi16(sc16, bs);  // Σ_g sc_g bsum_g, in 8 parts
    const __m256i sumi = _mm256_sub_epi32(k_2bit_sums<true>(b.qs, b.hmask, sc16, xb.qs), _mm256_slli_epi32(off, 2));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(b.d) * xb.d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_ps(acc);
}

// Two sub-blocks (64 elements) per 32-byte load of nibbles: bytes 0..15 are the first sub-block
// (low nibbles its elements 0..15, high nibbles 16..31), bytes 16..31 the second; the levels are
// looked up in place and the 128-bit halves regrouped per sub-block.
KV_ATTR inline float dot_iq4xs(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  const auto* w = reinterpret_cast<const BlockIQ4_XS*>(wrow);
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const BlockIQ4_XS& b = w[i];
    const BlockQ8_K& xb = x[i];
    int16_t ls[8];
    for (int s = 0; s < 8; ++s) ls[s] = static_cast<int16_t>(iq4xs_scale(s, b));
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ls)));
    __m256i sumi = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * p));
      const __m256i vlo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
      const __m256i vhi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
      const __m256i v0 = _mm256_permute2x128_si256(vlo, vhi, 0x20);  // sub-block 2p, elements 0..31
      const __m256i v1 = _mm256_permute2x128_si256(vlo, vhi, 0x31);  // sub-block 2p + 1
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 64 * p));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 64 * p + 32));
      sumi = mul_add_us8_scaled(sumi, _mm256_sign_epi8(v0, v0), _mm256_sign_epi8(x0, v0),
                                _mm256_shuffle_epi8(sc, bcast16(2 * p, 2 * p)));
      sumi = mul_add_us8_scaled(sumi, _mm256_sign_epi8(v1, v1), _mm256_sign_epi8(x1, v1),
                                _mm256_shuffle_epi8(sc, bcast16(2 * p + 1, 2 * p + 1)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(b.d) * xb.d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_ps(acc);
}

#else  // !KV_X86
// Portable scalar integer kernels (the same sums as the x86 ones).

inline float dot_q2k(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  const auto* w = reinterpret_cast<const BlockQ2_K*>(wrow);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ2_K& b = w[i];
    const BlockQ8_K& xb = x[i];
    int32_t total = 0, mins = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t p = 0;
      for (int k = 0; k < 16; ++k) {
        const int e = 16 * g + k;
        p += ((b.qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3) * xb.qs[e];
      }
      total += (b.scales[g] & 0x0f) * p;
      mins += (b.scales[g] >> 4) * xb.bsums[g];
    }
    acc += fp16_to_fp32(b.d) * xb.d * static_cast<float>(total) - fp16_to_fp32(b.dmin) * xb.d * static_cast<float>(mins);
  }
  return acc;
}

inline float dot_q3k(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  const auto* w = reinterpret_cast<const BlockQ3_K*>(wrow);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ3_K& b = w[i];
    const BlockQ8_K& xb = x[i];
    int32_t total = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t p = 0;
      for (int k = 0; k < 16; ++k) {
        const int e = 16 * g + k, h = e / 128, j = (e / 32) % 4, l = e % 32;
        const int q = ((b.qs[32 * h + l] >> (2 * j)) & 3) - (((b.hmask[l] >> (4 * h + j)) & 1) ? 0 : 4);
        p += q * xb.qs[e];
      }
      total += q3k_scale(g, b.scales) * p;
    }
    acc += fp16_to_fp32(b.d) * xb.d * static_cast<float>(total);
  }
  return acc;
}

inline float dot_iq4xs(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  const auto* w = reinterpret_cast<const BlockIQ4_XS*>(wrow);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const BlockIQ4_XS& b = w[i];
    const BlockQ8_K& xb = x[i];
    int32_t total = 0;
    for (int s = 0; s < 8; ++s) {
      int32_t p = 0;
      for (int j = 0; j < 16; ++j) {
        p += kIq4nlValues[b.qs[16 * s + j] & 0x0f] * xb.qs[32 * s + j];
        p += kIq4nlValues[b.qs[16 * s + j] >> 4] * xb.qs[32 * s + j + 16];
      }
      total += iq4xs_scale(s, b) * p;
    }
    acc += fp16_to_fp32(b.d) * xb.d * static_cast<float>(total);
  }
  return acc;
}
#endif  // KV_X86

#endif  // KVTRIM_OPS_LOWBIT_KERNELS_INL_H_
