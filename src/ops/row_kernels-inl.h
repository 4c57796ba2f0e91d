// The row-at-a-time integer dot products of matvec / matmul (one weight row times one activation,
// or a few tokens for the legacy types and IQ4_NL, which multiplies as Q8_0 once its nibbles are
// looked up in the IQ4 grid): x86 intrinsics (256-bit; VNNI on AVX3_DL) and the
// portable scalar code of the other targets, which computes the same sums. Included by
// matmul_kernels.cpp inside its per-target namespace, after its target macros (KV_X86, KV_VNNI,
// KV_AVX512, KV_ATTR); the strips and tiles (legacy_strips-inl.h, kquant_strips-inl.h,
// kquant_tiles-inl.h) build on its helpers.
#if defined(KVTRIM_OPS_ROW_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVTRIM_OPS_ROW_KERNELS_INL_H_
#undef KVTRIM_OPS_ROW_KERNELS_INL_H_
#else
#define KVTRIM_OPS_ROW_KERNELS_INL_H_
#endif

#if KV_X86
// ---------------------------------------------------------------------------------------
// x86 integer kernels (256-bit; VNNI on AVX3_DL).

inline float half(uint16_t h) {
  return _cvtsh_ss(h);
}

inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#if KV_VNNI
// The 256-bit VNNI products in their EVEX encoding (AVX512-VNNI + AVX512VL). Highway 1.0.3's
// AVX3_DL target string also enables "avxvnni", and under it GCC emits _mm256_dpbusd_epi32 /
// _mm256_dpwssd_epi32 with a VEX prefix: that is AVX-VNNI (Alder Lake, Zen 5), which CPUs with
// AVX512-VNNI alone (Ice Lake server, Zen 4) do not have, while Highway's run-time check for
// AVX3_DL only asks for AVX512-VNNI — so those CPUs died of SIGILL in every strip (Qwen's and
// Gemma3's Q4_K decode, the legacy types' strips). The `{evex}` pseudo-prefix (written %{evex%}
// in an asm template) pins the encoding; tests/isa_encoding.sh checks the binaries for
// VEX-encoded VNNI.
KV_ATTR HWY_INLINE __m256i dpbusd256(__m256i acc, __m256i u, __m256i s) {
  __asm__("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));  // acc += u (u8) · s (s8)
  return acc;
}
KV_ATTR HWY_INLINE __m256i dpwssd256(__m256i acc, __m256i p, __m256i s) {
  __asm__("%{evex%} vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(p), "v"(s));  // acc += p (s16) · s (s16)
  return acc;
}
#endif

// acc (8 x i32) += sums of 4 adjacent u[j] * s[j] (u unsigned, s signed; |u*s| pairs must
// fit i16 without VNNI: u <= 128 with |s| <= 127).
KV_ATTR inline __m256i mul_add_us8(__m256i acc, __m256i u, __m256i s) {
#if KV_VNNI
  return dpbusd256(acc, u, s);
#else
  const __m256i p = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

// acc (8 x i32) += (u · s products, pairwise in i16) * scale16 (per i16 lane).
KV_ATTR inline __m256i mul_add_us8_scaled(__m256i acc, __m256i u, __m256i s, __m256i scale16) {
  const __m256i p = _mm256_maddubs_epi16(u, s);
#if KV_VNNI
  return dpwssd256(acc, p, scale16);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale16));
#endif
}

// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15), then high nibbles.
inline __m256i unpack_nibbles16(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

// 16 bytes of IQ4 nibbles -> the 32 signed levels kIq4nlValues[q] (unpack_nibbles16's order).
inline __m256i iq4_levels(const uint8_t* qs) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  return _mm256_shuffle_epi8(table, unpack_nibbles16(qs));
}

// Byte i = 0x10 where bit i of the little-endian u32 at qh is set, else 0.
inline __m256i bit5_bytes(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
#if KV_AVX512
  return _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(0x10));
#else
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101,
                                         0x0000000000000000);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  bytes = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
  return _mm256_and_si256(bytes, _mm256_set1_epi8(0x10));
#endif
}

// One legacy weight block, decoded once for every token it meets: the unsigned bytes u (|w|
// for Q8_0 and IQ4_NL, whose signed bytes wq also give the activation's signs), the block scale
// dw and the min m (Q4_1 / Q5_1).
template <GgmlType kT>
KV_ATTR inline void legacy_weights(const uint8_t* wrow, int64_t i, __m256i& u, __m256i& wq, float& dw, float& m) {
  if constexpr (kT == GgmlType::Q4_0) {
    const auto& b = reinterpret_cast<const BlockQ4_0*>(wrow)[i];
    dw = half(b.d);
    u = unpack_nibbles16(b.qs);
  } else if constexpr (kT == GgmlType::Q4_1) {
    const auto& b = reinterpret_cast<const BlockQ4_1*>(wrow)[i];
    dw = half(b.d);
    m = half(b.m);
    u = unpack_nibbles16(b.qs);
  } else if constexpr (kT == GgmlType::Q5_0) {
    const auto& b = reinterpret_cast<const BlockQ5_0*>(wrow)[i];
    dw = half(b.d);
    u = _mm256_or_si256(unpack_nibbles16(b.qs), bit5_bytes(b.qh));
  } else if constexpr (kT == GgmlType::Q5_1) {
    const auto& b = reinterpret_cast<const BlockQ5_1*>(wrow)[i];
    dw = half(b.d);
    m = half(b.m);
    u = _mm256_or_si256(unpack_nibbles16(b.qs), bit5_bytes(b.qh));
  } else if constexpr (kT == GgmlType::IQ4_NL) {  // the levels, then as Q8_0
    const auto& b = reinterpret_cast<const BlockIQ4_NL*>(wrow)[i];
    dw = half(b.d);
    wq = iq4_levels(b.qs);
    u = _mm256_sign_epi8(wq, wq);
  } else {  // Q8_0: signed x signed via |w| and sign(x, w)
    const auto& b = reinterpret_cast<const BlockQ8_0*>(wrow)[i];
    dw = half(b.d);
    wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
    u = _mm256_sign_epi8(wq, wq);
  }
}

// The block's product with one token's activations: returns the 8 x i32 partial integer dot
// and sets the additive correction (offset / min times the activation sum).
template <GgmlType kT>
KV_ATTR inline __m256i legacy_product(__m256i u, __m256i wq, float dw, float m, const BlockQ8A& xb, float& corr) {
  const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
  const __m256i zero = _mm256_setzero_si256();
  if constexpr (kT == GgmlType::Q8_0 || kT == GgmlType::IQ4_NL) {
    corr = 0.0f;
    return mul_add_us8(zero, u, _mm256_sign_epi8(xq, wq));
  } else {
    if constexpr (kT == GgmlType::Q4_0) corr = -8.0f * dw * xb.s;
    if constexpr (kT == GgmlType::Q5_0) corr = -16.0f * dw * xb.s;
    if constexpr (kT == GgmlType::Q4_1 || kT == GgmlType::Q5_1) corr = m * xb.s;
    return mul_add_us8(zero, u, xq);
  }
}

// Dot products of one weight row with NT tokens' activations x[t] (a batched decode step):
// every weight block is decoded once for all NT tokens. Each token's result is the same
// float, bit for bit, whatever NT (the same operations in the same order per token), so a
// batched step gives every stream what it gets alone.
template <GgmlType kT, int NT>
KV_ATTR void dot_legacy_n(const uint8_t* wrow, const BlockQ8A* const* x, int64_t nb, float* out) {
  __m256 acc0[NT], acc1[NT];
  float corr_sum[NT];
  for (int t = 0; t < NT; ++t) {
    acc0[t] = _mm256_setzero_ps();
    acc1[t] = _mm256_setzero_ps();
    corr_sum[t] = 0.0f;
  }
  __m256i u0, u1, w0 = _mm256_setzero_si256(), w1 = _mm256_setzero_si256();
  float d0, d1, m0 = 0.0f, m1 = 0.0f;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    legacy_weights<kT>(wrow, i, u0, w0, d0, m0);
    legacy_weights<kT>(wrow, i + 1, u1, w1, d1, m1);
    for (int t = 0; t < NT; ++t) {
      float c0, c1;
      const __m256i p0 = legacy_product<kT>(u0, w0, d0, m0, x[t][i], c0);
      const __m256i p1 = legacy_product<kT>(u1, w1, d1, m1, x[t][i + 1], c1);
      acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x[t][i].d), _mm256_cvtepi32_ps(p0), acc0[t]);
      acc1[t] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * x[t][i + 1].d), _mm256_cvtepi32_ps(p1), acc1[t]);
      corr_sum[t] += c0 + c1;
    }
  }
  for (; i < nb; ++i) {
    legacy_weights<kT>(wrow, i, u0, w0, d0, m0);
    for (int t = 0; t < NT; ++t) {
      float c0;
      const __m256i p0 = legacy_product<kT>(u0, w0, d0, m0, x[t][i], c0);
      acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x[t][i].d), _mm256_cvtepi32_ps(p0), acc0[t]);
      corr_sum[t] += c0;
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum_ps(_mm256_add_ps(acc0[t], acc1[t])) + corr_sum[t];
}

// The 8 scales and 8 mins of a Q4_K / Q5_K super-block as bytes sc[0..7], m[0..7] (the 6-bit
// fields of its 12 packed bytes moved into place with word operations; k4_scale_min per field).
inline __m128i scales_mins_k4(const uint8_t* q) {
  uint32_t u[4];
  std::memcpy(u, q, 12);
  constexpr uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);  // m[4..7]
  const uint32_t m03 = u[1] & k1;                          // m[0..3]
  u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);          // sc[4..7]
  u[2] = m03;
  u[0] &= k1;                                              // sc[0..3]
  return _mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]), static_cast<int>(u[1]),
                       static_cast<int>(u[0]));
}

// Shuffle control broadcasting i16 lane `lo` of each 128-bit half to the low half's lanes and
// i16 lane `hi` to the high half's.
inline __m256i bcast16(int lo, int hi) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(((2 * hi + 1) << 8) | (2 * hi))),
                          _mm_set1_epi16(static_cast<int16_t>(((2 * lo + 1) << 8) | (2 * lo))));
}

// Q4_K / Q5_K: x = d * sc_j * q - dmin * m_j per sub-block j of 32. The scales and mins stay in
// vectors: the sub-block scales are broadcast by byte shuffles, and the min term sum_j m_j *
// (sum of the activation's sub-block j) is one madd of the mins with the pairwise bsums.
template <GgmlType kT>
KV_ATTR float dot_q45k(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  using Block = std::conditional_t<kT == GgmlType::Q4_K, BlockQ4_K, BlockQ5_K>;
  const auto* w = reinterpret_cast<const Block*>(wrow);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_min = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const Block& b = w[i];
    const BlockQ8_K& xb = x[i];
    const __m256i sm16 = _mm256_cvtepu8_epi16(scales_mins_k4(b.scales));  // sc[0..7] | m[0..7]
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
    const __m128i bs_pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), bs_pairs);
    acc_min = _mm_fmadd_ps(_mm_set1_ps(half(b.dmin) * xb.d), _mm_cvtepi32_ps(mins), acc_min);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm16));
    __m256i sumi = _mm256_setzero_si256();
    [[maybe_unused]] __m256i hbits;
    if constexpr (kT == GgmlType::Q5_K)
      hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * j));
      __m256i lo = _mm256_and_si256(q, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kT == GgmlType::Q5_K) {
        const __m256i one = _mm256_set1_epi8(1), two = _mm256_set1_epi8(2);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(hbits, two), 3));
        hbits = _mm256_srli_epi16(hbits, 2);
      }
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 64 * j));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 64 * j + 32));
      sumi = mul_add_us8_scaled(sumi, lo, x0, _mm256_shuffle_epi8(scales, bcast16(2 * j, 2 * j)));
      sumi = mul_add_us8_scaled(sumi, hi, x1, _mm256_shuffle_epi8(scales, bcast16(2 * j + 1, 2 * j + 1)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(b.d) * xb.d), _mm256_cvtepi32_ps(sumi), acc);
  }
  const __m128 m = _mm_add_ps(acc_min, _mm_movehl_ps(acc_min, acc_min));
  return hsum_ps(acc) - _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

// Q6_K: x = d * sc_g * (q - 32) per group g of 16, q = 4 low bits | 2 high bits << 4. The -32
// offset is one madd of the 16 group scales with the activation's 16 bsums, the group scales
// are broadcast by byte shuffles.
KV_ATTR inline float dot_q6k(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  const auto* w = reinterpret_cast<const BlockQ6_K*>(wrow);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  __m128 acc = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ6_K& b = w[i];
    const BlockQ8_K& xb = x[i];
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
    const __m256i off = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), bs);  // sum_g sc_g * bsum_g, in 8 parts
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b.ql + 64 * h;
      const int8_t* xq = xb.qs + 128 * h;
      const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(sc8, 8) : sc8));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4)),
          _mm256_or_si256(_mm256_and_si256(c, m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4)),
      };
      for (int k = 0; k < 4; ++k) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * k));
        sumi = mul_add_us8_scaled(sumi, u[k], xv, _mm256_shuffle_epi8(sc, bcast16(2 * k, 2 * k + 1)));
      }
    }
    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
    // the super-block's exact integer total, then one fma: the order of the 16-row tiles
    // (kquant_tiles-inl.h), so a prefill through them gives each token this result bit for bit
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256(sumi, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    const int32_t total = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
    acc = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), total), _mm_set_ss(fp16_to_fp32(b.d) * xb.d), acc);
  }
  return _mm_cvtss_f32(acc);
}

// One token (matvec): the same operations in the same order as dot_legacy_n for each token,
// with each block's weights decoded next to their use (measured faster for a single token
// than dot_legacy_n<kT, 1>: Q4_1 1536 x 576, 1 thread, 73-75 us vs 81-86 us).
template <GgmlType kT>
KV_ATTR float dot_legacy(const uint8_t* wrow, const BlockQ8A* x, int64_t nb) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float corr_sum = 0.0f;
  __m256i u, wq = _mm256_setzero_si256();
  float d0, d1, m = 0.0f, c0, c1;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    legacy_weights<kT>(wrow, i, u, wq, d0, m);
    const __m256i p0 = legacy_product<kT>(u, wq, d0, m, x[i], c0);
    legacy_weights<kT>(wrow, i + 1, u, wq, d1, m);
    const __m256i p1 = legacy_product<kT>(u, wq, d1, m, x[i + 1], c1);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x[i].d), _mm256_cvtepi32_ps(p0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1 * x[i + 1].d), _mm256_cvtepi32_ps(p1), acc1);
    corr_sum += c0 + c1;
  }
  for (; i < nb; ++i) {
    legacy_weights<kT>(wrow, i, u, wq, d0, m);
    const __m256i p0 = legacy_product<kT>(u, wq, d0, m, x[i], c0);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x[i].d), _mm256_cvtepi32_ps(p0), acc0);
    corr_sum += c0;
  }
  return hsum_ps(_mm256_add_ps(acc0, acc1)) + corr_sum;
}

#else   // !KV_X86
// ---------------------------------------------------------------------------------------
// Portable scalar integer kernels (same sums as the x86 ones).

inline float half(uint16_t h) {
  return fp16_to_fp32(h);
}

template <GgmlType kT>
float dot_legacy(const uint8_t* wrow, const BlockQ8A* x, int64_t nb) {
  float acc = 0.0f, corr = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int u[32];
    float dw;
    if constexpr (kT == GgmlType::Q8_0) {
      const auto& b = reinterpret_cast<const BlockQ8_0*>(wrow)[i];
      dw = half(b.d);
      for (int j = 0; j < 32; ++j) u[j] = b.qs[j];
    } else if constexpr (kT == GgmlType::IQ4_NL) {
      const auto& b = reinterpret_cast<const BlockIQ4_NL*>(wrow)[i];
      dw = half(b.d);
      for (int j = 0; j < 16; ++j) {
        u[j] = kIq4nlValues[b.qs[j] & 0x0f];
        u[j + 16] = kIq4nlValues[b.qs[j] >> 4];
      }
    } else {
      const uint8_t* qs;
      uint32_t qh = 0;
      if constexpr (kT == GgmlType::Q4_0) {
        const auto& b = reinterpret_cast<const BlockQ4_0*>(wrow)[i];
        qs = b.qs;
        dw = half(b.d);
        corr += -8.0f * dw * x[i].s;
      } else if constexpr (kT == GgmlType::Q4_1) {
        const auto& b = reinterpret_cast<const BlockQ4_1*>(wrow)[i];
        qs = b.qs;
        dw = half(b.d);
        corr += half(b.m) * x[i].s;
      } else if constexpr (kT == GgmlType::Q5_0) {
        const auto& b = reinterpret_cast<const BlockQ5_0*>(wrow)[i];
        qs = b.qs;
        std::memcpy(&qh, b.qh, 4);
        dw = half(b.d);
        corr += -16.0f * dw * x[i].s;
      } else {
        const auto& b = reinterpret_cast<const BlockQ5_1*>(wrow)[i];
        qs = b.qs;
        std::memcpy(&qh, b.qh, 4);
        dw = half(b.d);
        corr += half(b.m) * x[i].s;
      }
      for (int j = 0; j < 16; ++j) {
        u[j] = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
        u[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      }
    }
    int32_t p = 0;
    for (int j = 0; j < 32; ++j) p += u[j] * x[i].qs[j];
    acc += dw * x[i].d * static_cast<float>(p);
  }
  return acc + corr;
}

template <GgmlType kT>
float dot_q45k(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  using Block = std::conditional_t<kT == GgmlType::Q4_K, BlockQ4_K, BlockQ5_K>;
  const auto* w = reinterpret_cast<const Block*>(wrow);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const Block& b = w[i];
    const BlockQ8_K& xb = x[i];
    int32_t sumi = 0, sum_min = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      k4_scale_min(j, b.scales, &sc, &mn);
      sum_min += mn * (xb.bsums[2 * j] + xb.bsums[2 * j + 1]);
      const uint8_t* qs = b.qs + 32 * (j / 2);
      int32_t p = 0;
      for (int l = 0; l < 32; ++l) {
        int q = (j % 2 == 0) ? (qs[l] & 0xF) : (qs[l] >> 4);
        if constexpr (kT == GgmlType::Q5_K) {
          const auto& b5 = reinterpret_cast<const BlockQ5_K&>(b);
          q |= ((b5.qh[l] >> j) & 1) << 4;
        }
        p += q * xb.qs[32 * j + l];
      }
      sumi += sc * p;
    }
    acc += half(b.d) * xb.d * static_cast<float>(sumi) -
           half(b.dmin) * xb.d * static_cast<float>(sum_min);
  }
  return acc;
}

inline float dot_q6k(const uint8_t* wrow, const BlockQ8_K* x, int64_t nb) {
  const auto* w = reinterpret_cast<const BlockQ6_K*>(wrow);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ6_K& b = w[i];
    const BlockQ8_K& xb = x[i];
    int32_t sumi = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b.ql + 64 * h;
      const uint8_t* qh = b.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int q[4] = {(ql[l] & 0xF) | ((qh[l] & 3) << 4),
                          (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                          (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                          (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)};
        for (int k = 0; k < 4; ++k) {
          const int e = 128 * h + 32 * k + l;
          sumi += b.scales[e / 16] * (q[k] - 32) * xb.qs[e];
        }
      }
    }
    acc += fp16_to_fp32(b.d) * xb.d * static_cast<float>(sumi);
  }
  return acc;
}
#endif  // KV_X86

#endif  // KVTRIM_OPS_ROW_KERNELS_INL_H_
