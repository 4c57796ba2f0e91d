// Batched products on AVX-512 VNNI: sixteen rows at a time (the rows as the 16 dword lanes of a zmm
// register), each block decoded once per 16-row tile and shared by every token of the call: Q4_K
// and Q6_K from 2 tokens on (prefill and batched decode steps), the legacy strip types from 16
// (prefill). Included by matmul_kernels.cpp inside its per-target namespace, after
// kquant_strips-inl.h (whose k4_strip_header / k4_strip_qs, and legacy_strips-inl.h's strip_block,
// decode each half of a tile); AVX3_DL only.
//
// Why: the 8-row strips (kquant_strips-inl.h) decode a super-block for every group of 8 tokens and
// read the decoded nibbles back from the stack for each token: per 32 multiply-adds one dpbusd, one
// broadcast and one reload, so a 512-token prefill was load-bound at about half the VNNI rate
// (perf §7: dot_strip_k4<8> 67 % of Qwen's int8 pp512, ~23 % of it in reloads). Here one decoded
// zmm of weights (16 rows x 4 columns) serves 8 tokens held in registers (16 accumulators next to
// it), so each dpbusd does 64 multiply-adds for one broadcast and 1/8 of a weight load, and the
// decode is paid once per super-block and tile for all n_tok tokens (the float accumulators of
// all tokens live in a per-thread buffer between super-blocks).
//
// Numerics: exactly the strips' (and so matvec's): per row, token and super-block the exact
// integer Σ_j sc_j·isum_j and Σ_j m_j·sum_j, then acc ← fma(float(Σ sc·isum), d·x.d, acc) and
// acc ← fnmadd(float(Σ m·sum), dmin·x.d, acc), the super-blocks in order. Each lane runs the same
// IEEE operations as a strip lane, so a prefill through the tiles gives every token its decode
// result bit for bit (tests/ops/matmul_test.cpp: Int8PrefillGivesEachTokenItsDecodeResult).
#if defined(KVTRIM_OPS_KQUANT_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVTRIM_OPS_KQUANT_TILES_INL_H_
#undef KVTRIM_OPS_KQUANT_TILES_INL_H_
#else
#define KVTRIM_OPS_KQUANT_TILES_INL_H_
#endif

#if KV_X86 && KV_AVX512 && KV_VNNI

// (-DKVTRIM_KQUANT_TILES=0 keeps the strips for every token count: the A/B.)
#ifndef KVTRIM_KQUANT_TILES
#define KVTRIM_KQUANT_TILES 1
#endif

// The zmm forms (512-bit dpbusd, madd, mullo) on top of KV_ATTR's features.
#undef KV_ZMM
#define KV_ZMM __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

constexpr int kTileRows = 16;
constexpr int kTileTokens = 8;  // tokens in registers per pass over a decoded super-block
// From this many tokens on the tiles replace the strips: every batch (a batched decode step of
// several streams included); one token keeps the 8-row strips (a decode step streams the weights
// from DRAM, where 16 interleaved rows are more streams for the prefetcher). Measured
// (BM_Matmul, 8960 x 1536, 2 threads, min of 3, two alternations): Q4_K 4 / 8 tokens 0.36 / 0.58
// ms on the strips -> 0.19 / 0.26 on the tiles, Q6_K (row kernels before) 0.62 / 1.21 -> 0.33 / 0.43.
constexpr int64_t kKTileMinTokens = 2;
// The legacy types' tiles (below) from this many tokens on: a 32-column block's decode for 16 rows
// (two gathers, two transposes) needs more tokens to pay off than a super-block's. Measured
// (BM_SmolLM2Token, its Q4_1 weights from DRAM, 2 threads, min of 3, two alternations, strips ->
// tiles): 2 tokens 2.75-2.83 -> 3.39-3.49 ms, 4: 3.82-3.85 -> 4.73-5.26, 8: 5.47-6.30 -> 5.42-6.03,
// 16 (8-bit prefill): 8.74-8.93 -> 6.33-7.51, 64: 26.9-28.5 -> 18.0-19.5.
constexpr int64_t kLTileMinTokens = 16;

// One Q4_K super-block of a 16-row tile, decoded (lane r: row r of the tile).
struct K4Tile {
  __m512i u[64];  // u[8j + k] lane r: row r's nibbles of columns 32j + 4k .. 32j + 4k + 3
  __m512i sc[8];  // lane r: row r's 6-bit scale of sub-block j
  __m512i m2[4];  // lane r: row r's mins of sub-blocks 2i (low i16) and 2i + 1 (high i16)
  __m512 d, dm;
};

// A token's running sums for the 16 rows of a tile.
struct alignas(64) TileAcc {
  float v[kTileRows];
};

KV_ZMM HWY_INLINE __m512i join_si(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
KV_ZMM HWY_INLINE __m512 join_ps(__m256 lo, __m256 hi) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

// Super-block `off` of the 16 rows p[0..16): each 8-row half decoded as a strip's, joined.
KV_ZMM void k4_tile_decode(const uint8_t* const* p, size_t off, K4Tile& s) {
  K4StripBlock a, b;  // (only their headers are filled)
  k4_strip_header(p, off, a);
  k4_strip_header(p + 8, off, b);
  for (int j = 0; j < 8; ++j) s.sc[j] = join_si(a.sc[j], b.sc[j]);
  for (int i = 0; i < 4; ++i) s.m2[i] = join_si(a.m2[i], b.m2[i]);
  s.d = join_ps(a.d, b.d);
  s.dm = join_ps(a.dm, b.dm);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int j2 = 0; j2 < 4; ++j2) {
    __m256i qa[8], qb[8];
    k4_strip_qs(p, off, j2, qa);
    k4_strip_qs(p + 8, off, j2, qb);
    for (int k = 0; k < 8; ++k) {
      const __m512i q = join_si(qa[k], qb[k]);
      s.u[16 * j2 + k] = _mm512_and_si512(q, m4);
      s.u[16 * j2 + 8 + k] = _mm512_and_si512(_mm512_srli_epi32(q, 4), m4);
    }
  }
}

// acc[t] ← token t's contribution of the decoded super-block (x[t]: its activation block), for
// NT tokens: per sub-block j, 8 dpbusd per token sharing 8 weight registers, then × sc_j.
template <int NT>
KV_ZMM HWY_INLINE void k4_tile_tokens(const K4Tile& s, const BlockQ8_K* const* x, TileAcc* acc) {
  __m512i sumi[NT];
  for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
  for (int j = 0; j < 8; ++j) {
    __m512i ai[NT];
    for (int t = 0; t < NT; ++t) ai[t] = _mm512_setzero_si512();
    for (int k = 0; k < 8; ++k) {
      const __m512i w = s.u[8 * j + k];
      for (int t = 0; t < NT; ++t) {
        int32_t v;
        std::memcpy(&v, x[t]->qs + 32 * j + 4 * k, 4);
        ai[t] = _mm512_dpbusd_epi32(ai[t], w, _mm512_set1_epi32(v));
      }
    }
    for (int t = 0; t < NT; ++t) sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(ai[t], s.sc[j]));
  }
  for (int t = 0; t < NT; ++t) {
    const BlockQ8_K& xb = *x[t];
    // Σ_j m_j · sum_j as in k4_finish
    const __m128i pairs = k4_bsum_pairs(xb);
    __m512i summ = _mm512_madd_epi16(s.m2[0], _mm512_broadcastd_epi32(pairs));
    summ = _mm512_add_epi32(summ, _mm512_madd_epi16(s.m2[1], _mm512_broadcastd_epi32(_mm_shuffle_epi32(pairs, 1))));
    summ = _mm512_add_epi32(summ, _mm512_madd_epi16(s.m2[2], _mm512_broadcastd_epi32(_mm_shuffle_epi32(pairs, 2))));
    summ = _mm512_add_epi32(summ, _mm512_madd_epi16(s.m2[3], _mm512_broadcastd_epi32(_mm_shuffle_epi32(pairs, 3))));
    const __m512 xd = _mm512_set1_ps(xb.d);
    __m512 a = _mm512_load_ps(acc[t].v);
    a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(s.d, xd), a);
    a = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(s.dm, xd), a);
    _mm512_store_ps(acc[t].v, a);
  }
}

// One Q6_K super-block of a 16-row tile, decoded (lane r: row r of the tile).
struct K6Tile {
  __m512i u[64];   // u[m] lane r: row r's 6-bit q (0..63, unsigned) of columns 4m .. 4m + 3
  __m512i sc[16];  // lane r: row r's signed 8-bit scale of sub-block s (16 columns)
  __m512i sc2[8];  // lane r: row r's scales of sub-blocks 2i (low i16) and 2i + 1 (high i16)
  __m512 d;
};

// Super-block `off` of the 16 rows p[0..16). Columns 128h + 32g + l (l < 32) take ql byte
// 64h + 32(g & 1) + l (low nibble for g < 2, high for g >= 2) and bits 2g, 2g + 1 of qh byte
// 32h + l; each 16-byte run of ql / qh is an 8 x 4 dword transpose per half of the tile.
KV_ZMM void k6_tile_decode(const uint8_t* const* p, size_t off, K6Tile& s) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  for (int h = 0; h < 2; ++h) {
    for (int lb = 0; lb < 2; ++lb) {
      __m256i u[2][16];  // [half][4g + j]
      for (int half = 0; half < 2; ++half) {
        __m256i a[4], c[4], q[4];
        const size_t o = off + static_cast<size_t>(64 * h + 16 * lb);
        transpose_dwords(p + 8 * half, o + offsetof(BlockQ6_K, ql), a);
        transpose_dwords(p + 8 * half, o + offsetof(BlockQ6_K, ql) + 32, c);
        transpose_dwords(p + 8 * half, off + offsetof(BlockQ6_K, qh) + static_cast<size_t>(32 * h + 16 * lb), q);
        for (int j = 0; j < 4; ++j) {
          auto hi = [&](int g) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q[j], 2 * g), m2), 4); };
          u[half][j] = _mm256_or_si256(_mm256_and_si256(a[j], m4), hi(0));
          u[half][4 + j] = _mm256_or_si256(_mm256_and_si256(c[j], m4), hi(1));
          u[half][8 + j] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a[j], 4), m4), hi(2));
          u[half][12 + j] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c[j], 4), m4), hi(3));
        }
      }
      for (int g = 0; g < 4; ++g)
        for (int j = 0; j < 4; ++j) s.u[32 * h + 8 * g + 4 * lb + j] = join_si(u[0][4 * g + j], u[1][4 * g + j]);
    }
  }
  for (int half = 0; half < 2; ++half) {
    __m256i sv[4];  // lane r: row r's scales 4j .. 4j + 3
    transpose_dwords(p + 8 * half, off + offsetof(BlockQ6_K, scales), sv);
    for (int j = 0; j < 4; ++j)
      for (int b = 0; b < 4; ++b) {
        const __m256i v = _mm256_srai_epi32(_mm256_slli_epi32(sv[j], 24 - 8 * b), 24);
        s.sc[4 * j + b] = half ? _mm512_inserti64x4(s.sc[4 * j + b], v, 1) : _mm512_castsi256_si512(v);
      }
  }
  const __m512i lo16 = _mm512_set1_epi32(0xffff);
  for (int i = 0; i < 8; ++i)
    s.sc2[i] = _mm512_or_si512(_mm512_and_si512(s.sc[2 * i], lo16), _mm512_slli_epi32(s.sc[2 * i + 1], 16));
  alignas(32) uint16_t dh[kTileRows];
  for (int r = 0; r < kTileRows; ++r) std::memcpy(&dh[r], p[r] + off + offsetof(BlockQ6_K, d), 2);
  s.d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dh)));
}

// acc[t] ← fma(float(Σ_s sc_s·Σ q·x − 32·Σ_s sc_s·bsum_s), d·x.d, acc[t]): per sub-block s of 16
// columns 4 dpbusd per token sharing 4 weight registers, then × sc_s; the offset is 8 madd of
// the scales' i16 pairs with the activation's bsums (dword i of bsums is the pair 2i, 2i + 1).
template <int NT>
KV_ZMM HWY_INLINE void k6_tile_tokens(const K6Tile& s, const BlockQ8_K* const* x, TileAcc* acc) {
  __m512i sumi[NT];
  for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
  for (int sb = 0; sb < 16; ++sb) {
    __m512i ai[NT];
    for (int t = 0; t < NT; ++t) ai[t] = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m512i w = s.u[4 * sb + k];
      for (int t = 0; t < NT; ++t) {
        int32_t v;
        std::memcpy(&v, x[t]->qs + 16 * sb + 4 * k, 4);
        ai[t] = _mm512_dpbusd_epi32(ai[t], w, _mm512_set1_epi32(v));
      }
    }
    for (int t = 0; t < NT; ++t) sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(ai[t], s.sc[sb]));
  }
  for (int t = 0; t < NT; ++t) {
    const BlockQ8_K& xb = *x[t];
    __m512i o = _mm512_setzero_si512();
    for (int i = 0; i < 8; ++i) {
      int32_t v;
      std::memcpy(&v, xb.bsums + 2 * i, 4);
      o = _mm512_add_epi32(o, _mm512_madd_epi16(s.sc2[i], _mm512_set1_epi32(v)));
    }
    const __m512i total = _mm512_sub_epi32(sumi[t], _mm512_slli_epi32(o, 5));
    const __m512 a = _mm512_load_ps(acc[t].v);
    _mm512_store_ps(acc[t].v, _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(s.d, _mm512_set1_ps(xb.d)), a));
  }
}

template <GgmlType kT>
using KTile = std::conditional_t<kT == GgmlType::Q4_K, K4Tile, K6Tile>;
template <GgmlType kT>
using KBlock = std::conditional_t<kT == GgmlType::Q4_K, BlockQ4_K, BlockQ6_K>;
template <GgmlType kT>
constexpr bool kKTileType = KVTRIM_KQUANT_TILES && (kT == GgmlType::Q4_K || kT == GgmlType::Q6_K);

template <GgmlType kT, int NT>
KV_ZMM HWY_INLINE void k_tile_tokens(const KTile<kT>& s, const BlockQ8_K* const* x, TileAcc* acc) {
  if constexpr (kT == GgmlType::Q4_K) {
    k4_tile_tokens<NT>(s, x, acc);
  } else {
    k6_tile_tokens<NT>(s, x, acc);
  }
}

// k_tile_tokens for a group of nt (1..kTileTokens) tokens.
template <GgmlType kT>
KV_ZMM void k_tile_group(int nt, const KTile<kT>& s, const BlockQ8_K* const* x, TileAcc* acc) {
  switch (nt) {
    case 1: k_tile_tokens<kT, 1>(s, x, acc); break;
    case 2: k_tile_tokens<kT, 2>(s, x, acc); break;
    case 3: k_tile_tokens<kT, 3>(s, x, acc); break;
    case 4: k_tile_tokens<kT, 4>(s, x, acc); break;
    case 5: k_tile_tokens<kT, 5>(s, x, acc); break;
    case 6: k_tile_tokens<kT, 6>(s, x, acc); break;
    case 7: k_tile_tokens<kT, 7>(s, x, acc); break;
    default: k_tile_tokens<kT, 8>(s, x, acc); break;
  }
}

// Rows [r0, r1) of a Q4_K / Q6_K w times n_tok activations (BlockQ8_K rows act_stride apart), in
// tiles of 16 rows (the last one padded by repeating its last row; the padding lanes are not
// stored). Per tile: each super-block decoded once, then every token in groups of kTileTokens.
template <GgmlType kT>
KV_ZMM void k_tile_rows_loop(const WeightView& w, int64_t r0, int64_t r1, const void* act, size_t act_stride,
                             int64_t n_tok, float* y, int64_t ldy, int64_t nbk) {
  using B = KBlock<kT>;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const auto* a = static_cast<const uint8_t*>(act);
  thread_local std::vector<TileAcc> acc_buf;
  acc_buf.resize(static_cast<size_t>(n_tok));
  TileAcc* acc = acc_buf.data();
  KTile<kT> s;
  for (int64_t r = r0; r < r1; r += kTileRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kTileRows, r1 - r));
    const uint8_t* p[kTileRows];
    for (int k = 0; k < kTileRows; ++k) p[k] = base + static_cast<size_t>(r + std::min(k, nr - 1)) * w.row_bytes;
    const bool next_tile = r + kTileRows < r1;
    std::memset(static_cast<void*>(acc), 0, static_cast<size_t>(n_tok) * sizeof(TileAcc));
    for (int64_t i = 0; i < nbk; ++i) {
      const size_t off = static_cast<size_t>(i) * sizeof(B);
      // the next tile's super-block i, while this one's tokens run (the tile is read once); the
      // addresses as integers: a partial next tile's rows may lie past the matrix, which a
      // prefetch may touch freely
      if (next_tile) {
        for (int k = 0; k < kTileRows; ++k) {
          const uintptr_t q = reinterpret_cast<uintptr_t>(p[k]) + kTileRows * w.row_bytes + off;
          for (size_t o = 0; o < sizeof(B); o += 64) __builtin_prefetch(reinterpret_cast<const void*>(q + o));
        }
      }
      if constexpr (kT == GgmlType::Q4_K) {
        k4_tile_decode(p, off, s);
      } else {
        k6_tile_decode(p, off, s);
      }
      for (int64_t t0 = 0; t0 < n_tok; t0 += kTileTokens) {
        const int nt = static_cast<int>(std::min<int64_t>(kTileTokens, n_tok - t0));
        const BlockQ8_K* x[kTileTokens];
        for (int t = 0; t < nt; ++t)
          x[t] = reinterpret_cast<const BlockQ8_K*>(a + static_cast<size_t>(t0 + t) * act_stride) + i;
        k_tile_group<kT>(nt, s, x, acc + t0);
      }
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << nr) - 1u);
    for (int64_t t = 0; t < n_tok; ++t) _mm512_mask_storeu_ps(y + t * ldy + r, keep, _mm512_load_ps(acc[t].v));
  }
}

// ---------------------------------------------------------------------------------------
// Legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; legacy_strips-inl.h's strip types): the same scheme
// per 32-column block. A block of a 16-row tile is its two 8-row halves decoded as the strips
// decode them (strip_block) and joined; per token 8 dpbusd, the offset's Σq (Q4_0, Q5_0, Q8_0) or
// the min term (Q4_1, Q5_1), and the strips' f32 operations in their order, so the tiles give
// every token its strip (decode) result bit for bit.

struct LTile {
  __m512i u[8];  // u[k] lane r: row r's 4 unsigned weight bytes of columns 4k .. 4k + 3
  __m512 d, m;   // lane r: row r's scale, min
};

template <GgmlType kT>
KV_ZMM void l_tile_decode(const uint8_t* const* p, const __m256i* gidx, int64_t i, LTile& s) {
  StripBlockVecs a, b;
  strip_block<kT>(p, gidx[0], i, a);
  strip_block<kT>(p + 8, gidx[1], i, b);
  for (int k = 0; k < 8; ++k) s.u[k] = join_si(a.u[k], b.u[k]);
  s.d = join_ps(a.d, b.d);
  if constexpr (kHasMin<kT>) s.m = join_ps(a.m, b.m);
}

// acc + token x's part of a decoded block whose exact integer dot products are isum (qsum: the
// type's offset times x's Σq): the strips' f32 operations in their order, so every tile kernel
// (these, and the packed ones of legacy_packed-inl.h) gives a row a strip lane's bits.
template <GgmlType kT>
KV_ZMM HWY_INLINE __m512 l_tile_finish(const LTile& s, __m512i isum, const BlockQ8A& x, int32_t qsum, __m512 acc) {
  if constexpr (kStripOffset<kT> != 0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(qsum));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s.d, _mm512_set1_ps(x.d)), acc);
  if constexpr (kHasMin<kT>) acc = _mm512_fmadd_ps(s.m, _mm512_set1_ps(x.s), acc);
  return acc;
}

// acc[t] ← token t's contribution of the decoded block (x[t]: its activation block; qsum[t]: the
// type's offset times its Σq) for NT tokens sharing the 8 weight registers.
template <GgmlType kT, int NT>
KV_ZMM HWY_INLINE void l_tile_tokens(const LTile& s, const BlockQ8A* const* x, const int32_t* qsum, TileAcc* acc) {
  __m512i ai[NT];
  for (int t = 0; t < NT; ++t) ai[t] = _mm512_setzero_si512();
  for (int k = 0; k < 8; ++k) {
    const __m512i w = s.u[k];
    for (int t = 0; t < NT; ++t) {
      int32_t v;
      std::memcpy(&v, x[t]->qs + 4 * k, 4);
      ai[t] = _mm512_dpbusd_epi32(ai[t], w, _mm512_set1_epi32(v));
    }
  }
  for (int t = 0; t < NT; ++t) {
    const int32_t q = kStripOffset<kT> != 0 ? qsum[t] : 0;
    _mm512_store_ps(acc[t].v, l_tile_finish<kT>(s, ai[t], *x[t], q, _mm512_load_ps(acc[t].v)));
  }
}

template <GgmlType kT>
KV_ZMM void l_tile_group(int nt, const LTile& s, const BlockQ8A* const* x, const int32_t* qsum, TileAcc* acc) {
  switch (nt) {
    case 1: l_tile_tokens<kT, 1>(s, x, qsum, acc); break;
    case 2: l_tile_tokens<kT, 2>(s, x, qsum, acc); break;
    case 3: l_tile_tokens<kT, 3>(s, x, qsum, acc); break;
    case 4: l_tile_tokens<kT, 4>(s, x, qsum, acc); break;
    case 5: l_tile_tokens<kT, 5>(s, x, qsum, acc); break;
    case 6: l_tile_tokens<kT, 6>(s, x, qsum, acc); break;
    case 7: l_tile_tokens<kT, 7>(s, x, qsum, acc); break;
    default: l_tile_tokens<kT, 8>(s, x, qsum, acc); break;
  }
}

// Rows [r0, r1) of a legacy-type w times n_tok activations (BlockQ8A rows act_stride apart) in
// 16-row tiles (as k_tile_rows_loop).
template <GgmlType kT>
KV_ZMM void l_tile_rows_loop(const WeightView& w, int64_t r0, int64_t r1, const void* act, size_t act_stride,
                             int64_t n_tok, float* y, int64_t ldy, int64_t nb) {
  using B = StripBlock<kT>;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const auto* a = static_cast<const uint8_t*>(act);
  // the offset times Σq per block and token, block-major (a block's tokens side by side)
  const int32_t* qsums = offset_qsums<kT>(a, act_stride, n_tok, nb, /*block_major=*/true);
  thread_local std::vector<TileAcc> acc_buf;
  acc_buf.resize(static_cast<size_t>(n_tok));
  TileAcc* acc = acc_buf.data();
  LTile s;
  for (int64_t r = r0; r < r1; r += kTileRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kTileRows, r1 - r));
    const uint8_t* p[kTileRows];
    alignas(32) int32_t off[kTileRows];
    for (int k = 0; k < kTileRows; ++k) {
      p[k] = base + static_cast<size_t>(r + std::min(k, nr - 1)) * w.row_bytes;
      off[k] = static_cast<int32_t>(p[k] - p[k < 8 ? 0 : 8]);
    }
    const __m256i gidx[2] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(off)),
                             _mm256_load_si256(reinterpret_cast<const __m256i*>(off + 8))};
    const bool next_tile = r + kTileRows < r1;
    std::memset(static_cast<void*>(acc), 0, static_cast<size_t>(n_tok) * sizeof(TileAcc));
    for (int64_t i = 0; i < nb; ++i) {
      // the next tile's block i (addresses as integers, as in k_tile_rows_loop)
      if (next_tile && i % 2 == 0) {
        for (int k = 0; k < kTileRows; ++k)
          __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p[k]) + kTileRows * w.row_bytes +
                                                           static_cast<size_t>(i) * sizeof(B)));
      }
      l_tile_decode<kT>(p, gidx, i, s);
      for (int64_t t0 = 0; t0 < n_tok; t0 += kTileTokens) {
        const int nt = static_cast<int>(std::min<int64_t>(kTileTokens, n_tok - t0));
        const BlockQ8A* x[kTileTokens];
        for (int t = 0; t < nt; ++t)
          x[t] = reinterpret_cast<const BlockQ8A*>(a + static_cast<size_t>(t0 + t) * act_stride) + i;
        const int32_t* qs = qsums ? qsums + i * n_tok + t0 : nullptr;
        l_tile_group<kT>(nt, s, x, qs, acc + t0);
      }
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << nr) - 1u);
    for (int64_t t = 0; t < n_tok; ++t) _mm512_mask_storeu_ps(y + t * ldy + r, keep, _mm512_load_ps(acc[t].v));
  }
}

#endif  // KV_X86 && KV_AVX512 && KV_VNNI
#endif  // KVTRIM_OPS_KQUANT_TILES_INL_H_
