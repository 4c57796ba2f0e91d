// Legacy-type weights from their packed copy (WeightView::packed, layout in ops/weight_pack.h):
// sixteen rows at a time on zmm registers, for any token count (a decode step, a batched step of
// several streams, a prefill). Included by matmul_kernels.cpp inside its per-target namespace,
// after kquant_tiles-inl.h (LTile, KV_ZMM); AVX3_DL only.
//
// Why: the tiles and strips that read the GGUF rows in place decode a 32-column block of 16 rows
// with two gathers and two 8 x 4 dword transposes (l_tile_decode), which a batch of a few tokens
// cannot pay back: SmolLM2's 4-stream steps stayed on the 8-row strips, bound by that work. From
// the packed copy the same block is four loads and a nibble split (Q4_0, Q4_1; Q5_0, Q5_1 add
// their fifth bits from one load by a shuffle and a byte test per register) or eight loads
// (Q8_0), its scales one f16 conversion, and each token's part is eight dpbusd with the
// activation's 4-byte groups broadcast; the tile is one contiguous stream for the prefetcher.
//
// Numerics: the strips' (so matvec's and llama.cpp's scheme): per row, token and block the exact
// integer dot product (minus the type's offset times the activation block's Σq), then
// acc ← fma(float(isum), d·x.d, acc) and, for Q4_1, acc ← fma(m, x.s, acc), the blocks in order.
// Each lane does the IEEE operations of a strip lane, so packed and unpacked weights give the same
// results bit for bit (tests/ops/matmul_test.cpp: PackedWeightsEqualUnpackedBitForBit).
#if defined(KVTRIM_OPS_LEGACY_PACKED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVTRIM_OPS_LEGACY_PACKED_INL_H_
#undef KVTRIM_OPS_LEGACY_PACKED_INL_H_
#else
#define KVTRIM_OPS_LEGACY_PACKED_INL_H_
#endif

#if KV_X86 && KV_AVX512 && KV_VNNI

template <GgmlType kT>
constexpr bool kPackType = kT == GgmlType::Q4_0 || kT == GgmlType::Q4_1 || kT == GgmlType::Q5_0 ||
                           kT == GgmlType::Q5_1 || kT == GgmlType::Q8_0;
// Bytes of one block's quants, and fifth bits (Q5), for the 16 rows of a tile.
template <GgmlType kT>
constexpr size_t kPackQs = kT == GgmlType::Q8_0 ? 512 : 256;
template <GgmlType kT>
constexpr size_t kPackQh = kFiveBit<kT> ? 64 : 0;

// Block i of a packed tile: quants at qs, fifth bits (Q5) at qh, scales at dm (16 f16), mins
// (Q4_1, Q5_1) m_off bytes further.
template <GgmlType kT>
KV_ZMM HWY_INLINE void p_tile_block(const uint8_t* qs, const uint8_t* qh, const uint8_t* dm, size_t m_off, LTile& s) {
  s.d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm)));
  if constexpr (kHasMin<kT>) s.m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + m_off)));
  if constexpr (kT == GgmlType::Q8_0) {
    for (int k = 0; k < 8; ++k) s.u[k] = _mm512_loadu_si512(qs + 64 * k);
  } else {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      const __m512i q = _mm512_loadu_si512(qs + 64 * j);
      s.u[j] = _mm512_and_si512(q, m4);
      s.u[4 + j] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    }
    if constexpr (kFiveBit<kT>) {
      // u[k] byte b of lane r gets 16 where bit 4k + b of row r's qh is set: byte k / 2 of the
      // lane's qh copied to its 4 bytes, tested against bits 0..3 (k even) or 4..7 (k odd)
      const __m512i h = _mm512_loadu_si512(qh);
      const __m512i lo_bits = _mm512_set1_epi32(0x08040201), hi_bits = _mm512_set1_epi32(static_cast<int>(0x80402010u));
      const __m512i five = _mm512_set1_epi8(0x10);
      for (int byte = 0; byte < 4; ++byte) {
        const int c = byte * 0x01010101;  // dword j of each 128-bit lane <- its byte 4 j + `byte`
        const __m512i sp = _mm512_shuffle_epi8(h, _mm512_set4_epi32(c + 0x0c0c0c0c, c + 0x08080808, c + 0x04040404, c));
        s.u[2 * byte] = _mm512_mask_add_epi8(s.u[2 * byte], _mm512_test_epi8_mask(sp, lo_bits), s.u[2 * byte], five);
        s.u[2 * byte + 1] =
            _mm512_mask_add_epi8(s.u[2 * byte + 1], _mm512_test_epi8_mask(sp, hi_bits), s.u[2 * byte + 1], five);
      }
    }
  }
}

// Bytes ahead of the quants being read that p_tile_dot prefetches, up to the end of the thread's
// tiles (the hardware prefetcher stops at page boundaries, and a step of a few tokens computes
// too little per byte to hide DRAM latency with a short distance). Measured (BM_SmolLM2Token
// packed, 2 threads, min of 3, two rounds; 1 / 2 / 4 / 8 tokens, ms): 2 KiB 2.50-2.59 /
// 2.65-2.78 / 3.18-3.43 / 3.94-4.23, 8 KiB 2.40-2.57 / 2.31-2.71 / 2.61-2.98 / 3.09-3.34,
// 16 KiB 2.42-2.58 / 2.51-2.76 / 2.45-2.76 / 2.89-3.07, 64 KiB 2.54-2.79 / 2.93-3.07 / 3.39-3.50.
constexpr size_t kPackAhead = 16384;

// out[t] lane r = row r of the tile · token t (NT tokens: activation rows x[t], blocks 0..nb; qsum[t]
// the type's offset times each block's Σq, token-major). Prefetches below pf_end only.
template <GgmlType kT, int NT>
KV_ZMM void p_tile_dot(const uint8_t* tile, int64_t nb, const BlockQ8A* const* x, const int32_t* const* qsum,
                       uintptr_t pf_end, __m512* out) {
  constexpr size_t kQs = kPackQs<kT>, kQh = kPackQh<kT>;
  const uint8_t* qh0 = tile + static_cast<size_t>(nb) * kQs;
  const uint8_t* dm = qh0 + static_cast<size_t>(nb) * kQh;
  const size_t m_off = static_cast<size_t>(nb) * 32;
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  LTile s;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* qs = tile + static_cast<size_t>(i) * kQs;
    const uintptr_t pf = reinterpret_cast<uintptr_t>(qs) + kPackAhead;  // (an integer: may pass the buffer)
    if (pf < pf_end) {
      for (size_t o = 0; o < kQs; o += 64) __builtin_prefetch(reinterpret_cast<const void*>(pf + o));
    }
    p_tile_block<kT>(qs, qh0 + kQh * static_cast<size_t>(i), dm + 32 * i, m_off, s);
    __m512i ai[NT];
    for (int t = 0; t < NT; ++t) ai[t] = _mm512_setzero_si512();
    for (int k = 0; k < 8; ++k) {
      for (int t = 0; t < NT; ++t) {
        int32_t v;
        std::memcpy(&v, x[t][i].qs + 4 * k, 4);
        ai[t] = _mm512_dpbusd_epi32(ai[t], s.u[k], _mm512_set1_epi32(v));
      }
    }
    for (int t = 0; t < NT; ++t)
      acc[t] = l_tile_finish<kT>(s, ai[t], x[t][i], kStripOffset<kT> != 0 ? qsum[t][i] : 0, acc[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = acc[t];
}

template <GgmlType kT>
KV_ZMM void p_tile_group(int nt, const uint8_t* tile, int64_t nb, const BlockQ8A* const* x, const int32_t* const* qsum,
                         uintptr_t pf_end, __m512* out) {
  switch (nt) {
    case 1: p_tile_dot<kT, 1>(tile, nb, x, qsum, pf_end, out); break;
    case 2: p_tile_dot<kT, 2>(tile, nb, x, qsum, pf_end, out); break;
    case 3: p_tile_dot<kT, 3>(tile, nb, x, qsum, pf_end, out); break;
    case 4: p_tile_dot<kT, 4>(tile, nb, x, qsum, pf_end, out); break;
    case 5: p_tile_dot<kT, 5>(tile, nb, x, qsum, pf_end, out); break;
    case 6: p_tile_dot<kT, 6>(tile, nb, x, qsum, pf_end, out); break;
    case 7: p_tile_dot<kT, 7>(tile, nb, x, qsum, pf_end, out); break;
    default: p_tile_dot<kT, 8>(tile, nb, x, qsum, pf_end, out); break;
  }
}

// Rows [r0, r1) of w (w.packed set) times n_tok activations (BlockQ8A rows act_stride apart): the
// tiles that hold them, 8 tokens at a time (a longer batch decodes each block once per 8 tokens:
// four loads and eight logic ops, against 64 dpbusd), only the lanes in [r0, r1) stored.
template <GgmlType kT>
KV_ZMM void p_tile_rows_loop(const WeightView& w, int64_t r0, int64_t r1, const void* act, size_t act_stride,
                             int64_t n_tok, float* y, int64_t ldy, int64_t nb) {
  constexpr int kR = kTileRows;
  const auto* a = static_cast<const uint8_t*>(act);
  const int32_t* qsums = offset_qsums<kT>(a, act_stride, n_tok, nb, /*block_major=*/false);
  const size_t tile_bytes = static_cast<size_t>(nb) * (kPackQs<kT> + kPackQh<kT> + (kHasMin<kT> ? 64 : 32));
  const auto* base = static_cast<const uint8_t*>(w.packed);
  const uintptr_t pf_end = reinterpret_cast<uintptr_t>(base) + static_cast<size_t>((r1 + kR - 1) / kR) * tile_bytes;
  __m512 out[kTileTokens];
  for (int64_t g = r0 / kR; g * kR < r1; ++g) {
    const int64_t row0 = g * kR;
    const unsigned lo = static_cast<unsigned>(std::max(r0, row0) - row0);
    const unsigned hi = static_cast<unsigned>(std::min(r1, row0 + kR) - row0);
    const auto keep = static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
    const uint8_t* tile = base + static_cast<size_t>(g) * tile_bytes;
    for (int64_t t0 = 0; t0 < n_tok; t0 += kTileTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(kTileTokens, n_tok - t0));
      const BlockQ8A* x[kTileTokens];
      const int32_t* qs[kTileTokens] = {};
      for (int t = 0; t < nt; ++t) {
        x[t] = reinterpret_cast<const BlockQ8A*>(a + static_cast<size_t>(t0 + t) * act_stride);
        if (qsums) qs[t] = qsums + (t0 + t) * nb;
      }
      p_tile_group<kT>(nt, tile, nb, x, qs, pf_end, out);
      for (int t = 0; t < nt; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ldy + row0, keep, out[t]);
    }
  }
}

#endif  // KV_X86 && KV_AVX512 && KV_VNNI
#endif  // KVTRIM_OPS_LEGACY_PACKED_INL_H_
