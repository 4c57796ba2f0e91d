// SIMD kernels of the cache's attention over q4 storage (llama.cpp q4_0 blocks of 32 channels
// with an f16 scale, in the layouts of quant_formats.h; see attn_kernels.h). One Highway
// translation unit compiled for every x86 target and dispatched at run time. Reference:
//   scores:  s[g][t] = Σ_b scale(t, b) · Σ_{i in b} q[g][i] · (code(t, i) − 8)
//   accum:   acc[g][i] += Σ_t p[g][t] · scale(t, i / 32) · (code(t, i) − 8)
// The nibbles are widened to u32, split (mask / shift) and converted to f32 in registers;
// the −8 offset is taken out of the inner loops (Σ x·(c − 8) = Σ x·c − 8·Σ x per block) and
// the f16 block scales are applied once per block (scores) or folded into the weights
// (accum). Nibble order puts even tokens (channels) in one vector and odd ones in another, so
// the scales are permuted to match and the results interleaved back when stored. Query heads
// are batched and the loops split into phases as in attn_kernels.cpp (enough FMA chains,
// accumulators kept in the 16 AVX2 registers).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/fp16.h"
#include "kv/attn_kernels.h"
#include "kv/attn_batches.h"
#include "kv/quant_formats.h"

// foreach_target.h must come first: it re-includes this file once per target.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/attn_kernels_q4.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace kvtrim::kv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Query-head batches of at most kMaxBatch (8 -> 4 + 4, 9 -> 5 + 4), as in attn_kernels.cpp.
// (for_batches / with_batch / kMaxBatch: attn_batches.h)

// The nibbles of Lanes(df) consecutive bytes as f32 codes 0..15: lo = low nibbles, hi = high.
template <class DF>
HWY_INLINE void load_nibbles(DF df, const uint8_t* p, hn::Vec<DF>& lo, hn::Vec<DF>& hi) {
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<uint32_t, DF> du32;
  const hn::Rebind<int32_t, DF> di32;
  const auto w = hn::PromoteTo(du32, hn::LoadU(du8, p));
  lo = hn::ConvertTo(df, hn::BitCast(di32, hn::And(w, hn::Set(du32, 15))));
  hi = hn::ConvertTo(df, hn::BitCast(di32, hn::ShiftRight<4>(w)));
}

// q4 keys, lanes over tokens in the order the nibbles give them: the 8 even tokens of a tile
// (low nibbles of a row's 8 bytes), then the 8 odd ones; the block scales are permuted to
// match and the scores un-permuted when written. Per block b of 32 channels the code dots
// start at −8·Σ_b q (qs8 [G, n_blk]) and are multiplied by the tile's 16 block scales; the
// rows of a block are split into P phases for enough FMA chains. sc: scratch [n_blk, 16].
template <int G>
HWY_NOINLINE void scores_q4_batch(const float* q, const float* qs8, int64_t d, const uint8_t* k,
                                  const uint16_t* k_scale, int64_t t0, int64_t n_t, float* s,
                                  int64_t ld_s, float* HWY_RESTRICT sc) {
  const hn::CappedTag<float, kKeyTile / 2> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  using V = hn::Vec<decltype(df)>;
  constexpr int64_t N = hn::MaxLanes(df);
  constexpr int64_t nv = kKeyTile / 2 / N;  // vectors per half tile (1 on AVX2)
  constexpr int P = static_cast<int>(HWY_MAX(1, HWY_MIN(4, 12 / (G * 2 * nv))));
  const int64_t n_blk = q4_blocks(d);
  HWY_ALIGN float tot[G][kKeyTile], tmp[kKeyTile];
  const int64_t t_end = t0 + n_t;
  for (int64_t tile = t0 / kKeyTile; tile * kKeyTile < t_end; ++tile) {
    const uint8_t* kt = k + tile * d * (kKeyTile / 2);
    for (int64_t b = 0; b < n_blk; ++b) {
      const auto* ks =
          reinterpret_cast<const hwy::float16_t*>(k_scale + (tile * n_blk + b) * kKeyTile);
      float* sb = sc + b * kKeyTile;
#if HWY_TARGET != HWY_SCALAR
      if constexpr (N == 8) {  // evens and odds of tokens 0..15
        const V s0 = hn::PromoteTo(df, hn::LoadU(dh, ks));
        const V s1 = hn::PromoteTo(df, hn::LoadU(dh, ks + 8));
        hn::StoreU(hn::ConcatEven(df, s1, s0), df, sb);
        hn::StoreU(hn::ConcatOdd(df, s1, s0), df, sb + 8);
        continue;
      }
#endif
      {
        for (int64_t j = 0; j < kKeyTile; j += N)
          hn::Store(hn::PromoteTo(df, hn::LoadU(dh, ks + j)), df, tmp + j);
        for (int64_t j = 0; j < kKeyTile / 2; ++j) {
          sb[j] = tmp[2 * j];
          sb[kKeyTile / 2 + j] = tmp[2 * j + 1];
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      for (int64_t j = 0; j < kKeyTile; j += N) hn::Store(hn::Zero(df), df, tot[g] + j);
    }
    for (int64_t b = 0; b < n_blk; ++b) {
      const int64_t i0 = b * kQ4Block, i1 = std::min(d, i0 + kQ4Block);
      V acc[P][G][2 * nv];
      for (int ph = 0; ph < P; ++ph) {
        for (int g = 0; g < G; ++g) {
          for (int64_t j = 0; j < 2 * nv; ++j)
            acc[ph][g][j] = ph == 0 ? hn::Set(df, -qs8[g * n_blk + b]) : hn::Zero(df);
        }
      }
      int64_t i = i0;
      for (; i + P <= i1; i += P) {
        for (int ph = 0; ph < P; ++ph) {
          for (int64_t j = 0; j < nv; ++j) {
            V ce, co;
            load_nibbles(df, kt + (i + ph) * (kKeyTile / 2) + j * N, ce, co);
            for (int g = 0; g < G; ++g) {
              const V qb = hn::Set(df, q[g * d + i + ph]);
              acc[ph][g][j] = hn::MulAdd(qb, ce, acc[ph][g][j]);
              acc[ph][g][nv + j] = hn::MulAdd(qb, co, acc[ph][g][nv + j]);
            }
          }
        }
      }
      for (; i < i1; ++i) {
        for (int64_t j = 0; j < nv; ++j) {
          V ce, co;
          load_nibbles(df, kt + i * (kKeyTile / 2) + j * N, ce, co);
          for (int g = 0; g < G; ++g) {
            const V qb = hn::Set(df, q[g * d + i]);
            acc[0][g][j] = hn::MulAdd(qb, ce, acc[0][g][j]);
            acc[0][g][nv + j] = hn::MulAdd(qb, co, acc[0][g][nv + j]);
          }
        }
      }
      for (int g = 0; g < G; ++g) {
        for (int64_t j = 0; j < 2 * nv; ++j) {
          V a = acc[0][g][j];
          for (int ph = 1; ph < P; ++ph) a = hn::Add(a, acc[ph][g][j]);
          const V sv = hn::LoadU(df, sc + b * kKeyTile + j * N);
          hn::Store(hn::MulAdd(a, sv, hn::Load(df, tot[g] + j * N)), df, tot[g] + j * N);
        }
      }
    }
    const int64_t lo = std::max(t0, tile * kKeyTile), hi = std::min(t_end, (tile + 1) * kKeyTile);
    for (int g = 0; g < G; ++g) {
      float* sg = s + g * ld_s - t0;
#if HWY_TARGET != HWY_SCALAR
      if constexpr (N == 8) {
        if (hi - lo == kKeyTile) {  // whole tile: interleave evens and odds in registers
          const V e = hn::Load(df, tot[g]), o = hn::Load(df, tot[g] + 8);
          const V il = hn::InterleaveLower(df, e, o), iu = hn::InterleaveUpper(df, e, o);
          hn::StoreU(hn::ConcatLowerLower(df, iu, il), df, sg + lo);
          hn::StoreU(hn::ConcatUpperUpper(df, iu, il), df, sg + lo + 8);
          continue;
        }
      }
#endif
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t u = t - tile * kKeyTile;
        sg[t] = tot[g][(u % 2) * (kKeyTile / 2) + u / 2];
      }
    }
  }
}

void ScoresQ4(const float* q, int n_g, int64_t d, const uint8_t* k, const uint16_t* k_scale,
              int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  const int64_t n_blk = q4_blocks(d);
  constexpr int64_t kStack = 1024;
  HWY_ALIGN float stack[kStack];
  std::vector<float> heap;
  const int64_t n_qs = (n_g * n_blk + kKeyTile - 1) / kKeyTile * kKeyTile;  // keeps sc aligned
  float* sc = stack;  // [n_blk, 16] the tile's block scales, permuted
  if (n_blk * kKeyTile + n_qs > kStack) {
    heap.resize(static_cast<size_t>(n_blk * kKeyTile + n_qs));
    sc = heap.data();
  }
  float* qs8 = sc + n_blk * kKeyTile;  // [n_g, n_blk]: 8 · Σ_{i in block} q[g][i]
  const hn::CappedTag<float, 8> df;
  constexpr int64_t N = hn::MaxLanes(df);
  for (int g = 0; g < n_g; ++g) {
    for (int64_t b = 0; b < n_blk; ++b) {
      const int64_t i0 = b * kQ4Block, i1 = std::min(d, i0 + kQ4Block);
      auto sv = hn::Zero(df);
      int64_t i = i0;
      for (; i + N <= i1; i += N) sv = hn::Add(sv, hn::LoadU(df, q + g * d + i));
      float r = hn::GetLane(hn::SumOfLanes(df, sv));
      for (; i < i1; ++i) r += q[g * d + i];
      qs8[g * n_blk + b] = 8 * r;
    }
  }
  for_batches(n_g, [&](int g0, int ng) {
    with_batch(ng, [&](auto G) {
      scores_q4_batch<decltype(G)::value>(q + g0 * d, qs8 + g0 * n_blk, d, k, k_scale, t0, n_t,
                                          s + g0 * ld_s, ld_s, sc);
    });
  });
}

constexpr int64_t kQ4Chunk = 256;  // tokens whose weights are formed at once (accum)
// One 16-channel group (8 bytes of each row) of rows [0, nc): acc_out[g][0 .. 16) +=
// Σ_t w[g][t] · code − wsum8[g], lanes in nibble order (even channels, odd channels); the
// tokens are split into P phases for enough FMA chains.
template <int G>
HWY_INLINE void accum_q4_group(const float (*w)[kQ4Chunk], const float* wsum8, const uint8_t* v,
                               int64_t rb, int64_t nc, float* acc_out, int64_t dv) {
  const hn::CappedTag<float, 8> df;
  using V = hn::Vec<decltype(df)>;
  constexpr int64_t N = hn::MaxLanes(df);
  constexpr int64_t nv = 8 / N;  // vectors per 8 bytes (1 on AVX2)
  constexpr int P = static_cast<int>(HWY_MAX(1, HWY_MIN(4, 12 / (G * 2 * nv))));
  V accp[P][G][2 * nv];
  for (int ph = 0; ph < P; ++ph) {
    for (int g = 0; g < G; ++g) {
      for (int64_t j = 0; j < 2 * nv; ++j)
        accp[ph][g][j] = ph == 0 ? hn::Set(df, -wsum8[g]) : hn::Zero(df);
    }
  }
  int64_t t = 0;
  for (; t + P <= nc; t += P) {
    for (int ph = 0; ph < P; ++ph) {
      for (int64_t j = 0; j < nv; ++j) {
        V ce, co;
        load_nibbles(df, v + (t + ph) * rb + j * N, ce, co);
        for (int g = 0; g < G; ++g) {
          const V wb = hn::Set(df, w[g][t + ph]);
          accp[ph][g][j] = hn::MulAdd(wb, ce, accp[ph][g][j]);
          accp[ph][g][nv + j] = hn::MulAdd(wb, co, accp[ph][g][nv + j]);
        }
      }
    }
  }
  for (; t < nc; ++t) {
    for (int64_t j = 0; j < nv; ++j) {
      V ce, co;
      load_nibbles(df, v + t * rb + j * N, ce, co);
      for (int g = 0; g < G; ++g) {
        const V wb = hn::Set(df, w[g][t]);
        accp[0][g][j] = hn::MulAdd(wb, ce, accp[0][g][j]);
        accp[0][g][nv + j] = hn::MulAdd(wb, co, accp[0][g][nv + j]);
      }
    }
  }
  HWY_ALIGN float tmp[2][8];
  for (int g = 0; g < G; ++g) {
    V acc[2 * nv];
    for (int64_t j = 0; j < 2 * nv; ++j) {
      acc[j] = accp[0][g][j];
      for (int ph = 1; ph < P; ++ph) acc[j] = hn::Add(acc[j], accp[ph][g][j]);
    }
    float* out = acc_out + g * dv;
#if HWY_TARGET != HWY_SCALAR
    if constexpr (N == 8) {  // channels 0..15 = interleaved evens and odds
      const V il = hn::InterleaveLower(df, acc[0], acc[1]),
              iu = hn::InterleaveUpper(df, acc[0], acc[1]);
      hn::StoreU(hn::Add(hn::LoadU(df, out), hn::ConcatLowerLower(df, iu, il)), df, out);
      hn::StoreU(hn::Add(hn::LoadU(df, out + 8), hn::ConcatUpperUpper(df, iu, il)), df, out + 8);
      continue;
    }
#endif
    for (int64_t j = 0; j < nv; ++j) {
      hn::Store(acc[j], df, tmp[0] + j * N);
      hn::Store(acc[nv + j], df, tmp[1] + j * N);
    }
    for (int64_t c = 0; c < 8; ++c) {
      out[2 * c] += tmp[0][c];
      out[2 * c + 1] += tmp[1][c];
    }
  }
}

// q4 values, lanes over channels: a 16-channel group of a row is 8 bytes, decoded to the even
// channels (low nibbles) and the odd ones (high nibbles). Per block and chunk of tokens the
// weights w = p · scale and 8·Σ w are formed once (vectorised: a scalar running sum would be a
// 3-cycle dependency chain per token); a dv that is not a multiple of 16 leaves a scalar tail.
template <int G>
HWY_NOINLINE void accum_q4_batch(const float* p, int64_t ld_p, const uint8_t* v,
                                 const uint16_t* v_scale, int64_t n_t, int64_t dv, float* acc_out) {
  const hn::CappedTag<float, 8> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  constexpr int64_t N = hn::MaxLanes(df);
  constexpr int64_t kScales = 2048;  // f32 block scales staged per chunk
  const int64_t rb = q4_row_bytes(dv), n_blk = q4_blocks(dv), n_grp = dv / 16;
  const int64_t chunk = HWY_MAX(1, HWY_MIN(kQ4Chunk, kScales / n_blk));
  HWY_ALIGN float w[G][kQ4Chunk];
  HWY_ALIGN float scf[kScales];   // [nc, n_blk] the chunk's scales
  HWY_ALIGN float sct[kQ4Chunk];  // one block's scales [nc]
  float wsum8[G];
  for (int64_t c0 = 0; c0 < n_t; c0 += chunk) {
    const int64_t nc = std::min(chunk, n_t - c0), ns = nc * n_blk, nc_vec = nc / N * N;
    const uint8_t* vc = v + c0 * rb;
    const auto* vs = reinterpret_cast<const hwy::float16_t*>(v_scale + c0 * n_blk);
    int64_t j = 0;
    for (; j + N <= ns; j += N) hn::Store(hn::PromoteTo(df, hn::LoadU(dh, vs + j)), df, scf + j);
    for (; j < ns; ++j) scf[j] = fp16_to_fp32(v_scale[c0 * n_blk + j]);
    for (int64_t b = 0; b < n_blk; ++b) {
      for (int64_t t = 0; t < nc; ++t) sct[t] = scf[t * n_blk + b];
      for (int g = 0; g < G; ++g) {  // w = p · scale, and 8 · Σ w
        const float* pg = p + g * ld_p + c0;
        auto sv = hn::Zero(df);
        for (int64_t t = 0; t < nc_vec; t += N) {
          const auto wv = hn::Mul(hn::LoadU(df, pg + t), hn::Load(df, sct + t));
          hn::Store(wv, df, w[g] + t);
          sv = hn::Add(sv, wv);
        }
        float sum = hn::GetLane(hn::SumOfLanes(df, sv));
        for (int64_t t = nc_vec; t < nc; ++t) sum += w[g][t] = pg[t] * sct[t];
        wsum8[g] = 8 * sum;
      }
      for (int64_t h = 2 * b; h < std::min(2 * b + 2, n_grp); ++h)
        accum_q4_group<G>(w, wsum8, vc + h * 8, rb, nc, acc_out + h * 16, dv);
      for (int64_t ch = std::max(b * kQ4Block, n_grp * 16); ch < std::min(dv, (b + 1) * kQ4Block);
           ++ch) {
        for (int g = 0; g < G; ++g) {
          float r = -wsum8[g];
          for (int64_t t = 0; t < nc; ++t)
            r += w[g][t] * static_cast<float>((vc[t * rb + ch / 2] >> (4 * (ch % 2))) & 15);
          acc_out[g * dv + ch] += r;
        }
      }
    }
  }
}

void AccumQ4(const float* p, int n_g, int64_t ld_p, const uint8_t* v, const uint16_t* v_scale,
             int64_t n_t, int64_t dv, float* acc_out) {
  for_batches(n_g, [&](int g0, int ng) {
    with_batch(ng, [&](auto G) {
      accum_q4_batch<decltype(G)::value>(p + g0 * ld_p, ld_p, v, v_scale, n_t, dv,
                                         acc_out + g0 * dv);
    });
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim::kv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvtrim::kv {

HWY_EXPORT(ScoresQ4);
HWY_EXPORT(AccumQ4);

void attn_scores_q4(const float* q, int n_g, int64_t d, const uint8_t* k,
                    const uint16_t* k_scale_f16, int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(ScoresQ4)(q, n_g, d, k, k_scale_f16, t0, n_t, s, ld_s);
}
void attn_accum_q4(const float* p, int n_g, int64_t ld_p, const uint8_t* v,
                   const uint16_t* v_scale_f16, int64_t n_t, int64_t dv, float* acc) {
  HWY_DYNAMIC_DISPATCH(AccumQ4)(p, n_g, ld_p, v, v_scale_f16, n_t, dv, acc);
}

}  // namespace kvtrim::kv
#endif  // HWY_ONCE
