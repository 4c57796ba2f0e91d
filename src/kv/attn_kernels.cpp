// SIMD kernels of the cache's dense attention (see attn_kernels.h; the sparse-row kernels are
// in attn_kernels_sparse.cpp). One Highway translation unit compiled for every x86 target and
// dispatched at run time. Reference expressions:
//   scores:  s[g][t] = Σ_i q[g][i] · k[t][i]   (k in transposed tiles, lanes over tokens)
//   accum:   acc[g][i] += Σ_t p[g][t] · v[t][i]   (gemma.cpp's WeightedSumV)
// Quantised elements are widened to f32 in registers: int8 by promote + convert; fp8 E4M3 by
// the bit identity f16(sign << 15 | (code & 0x7F) << 7) = e4m3(code) · 2^-8 (widen u8 to u16,
// shift, move the sign bit from 14 to 15, F16C convert; the 2^8 goes into the scale); q4
// nibbles by promote to u32, mask / shift, convert, with the −8 offset taken out of the loop
// (Σ q·(c − 8) = Σ q·c − 8·Σ q per block) and the f16 block scales applied once per block.
#include "kv/attn_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/fp16.h"
#include "kv/quant_formats.h"
#include "ops/nn.h"

// foreach_target.h must come first: it re-includes this file once per target.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/attn_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace kvtrim::kv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kMaxG = 8;  // query heads handled per register batch

template <class DF>
HWY_INLINE hn::Vec<DF> load_row(DF df, const float* p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> load_row(DF df, const uint16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}
// bf16 is the top half of an f32: widen to u32 and shift.
template <class DF>
HWY_INLINE hn::Vec<DF> load_row(DF df, const hwy::bfloat16_t* p) {
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<uint32_t, DF> du32;
  const auto w = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
  return hn::BitCast(df, hn::ShiftLeft<16>(w));
}
template <class DF>
HWY_INLINE hn::Vec<DF> load_row(DF df, const int8_t* p) {
  const hn::Rebind<int8_t, DF> di8;
  const hn::Rebind<int32_t, DF> di32;
  return hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, p)));
}
// fp8 E4M3 codes: the value · 2^-8 (exact for every non-NaN code, subnormals included).
template <class DF>
HWY_INLINE hn::Vec<DF> load_row(DF df, const uint8_t* p) {
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto w = hn::ShiftLeft<7>(hn::PromoteTo(du16, hn::LoadU(du8, p)));
  const auto h = hn::Add(w, hn::And(w, hn::Set(du16, 0x4000)));  // sign: bit 14 -> bit 15
  return hn::PromoteTo(df, hn::BitCast(dh, h));
}
HWY_INLINE float scalar(uint8_t b) {
  return fp16_to_fp32(static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7)));
}
HWY_INLINE float scalar(hwy::bfloat16_t b) {
  uint16_t bits;
  std::memcpy(&bits, &b, sizeof(bits));
  return bf16_to_fp32(bits);
}
HWY_INLINE float scalar(int8_t x) {
  return static_cast<float>(x);
}
HWY_INLINE float scalar(float x) {
  return x;
}
HWY_INLINE float scalar(uint16_t h) {
  return fp16_to_fp32(h);
}

// Scores over tiled keys: lanes run over the kKeyTile tokens of a tile. k_scale (q8 / fp8,
// else nullptr): [whole tiles] per-token factor applied to the tile's dot products, times
// scale_mul (fp8: 2^8, undoing load_row's 2^-8).
template <typename T>
HWY_INLINE void scores_impl(const float* q, int n_g, int64_t d, const T* k, const float* k_scale,
                            int64_t t0, int64_t n_t, float* s, int64_t ld_s,
                            float scale_mul = 1.f) {
  const hn::CappedTag<float, kKeyTile> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t nv = kKeyTile / N;  // vectors per tile row (1 on AVX-512, 2 on AVX2)
  constexpr int kG = 4;             // query heads per register batch
  constexpr int64_t kMaxV = kKeyTile / HWY_MIN(HWY_LANES(float), kKeyTile);  // >= nv
  HWY_ALIGN float tmp[kKeyTile];
  const int64_t t_end = t0 + n_t;
  for (int64_t tile = t0 / kKeyTile; tile * kKeyTile < t_end; ++tile) {
    const T* kt = k + tile * d * kKeyTile;
    const int64_t lo = std::max(t0, tile * kKeyTile), hi = std::min(t_end, (tile + 1) * kKeyTile);
    for (int g0 = 0; g0 < n_g; g0 += kG) {
      const int ng = std::min(kG, n_g - g0);
      hn::Vec<decltype(df)> acc[kG][kMaxV];
      for (int g = 0; g < ng; ++g) {
        for (int64_t j = 0; j < nv; ++j) acc[g][j] = hn::Zero(df);
      }
      for (int64_t i = 0; i < d; ++i) {
        const T* row = kt + i * kKeyTile;
        for (int64_t j = 0; j < nv; ++j) {
          const auto kv = load_row(df, row + j * N);
          for (int g = 0; g < ng; ++g)
            acc[g][j] = hn::MulAdd(hn::Set(df, q[(g0 + g) * d + i]), kv, acc[g][j]);
        }
      }
      if (k_scale) {
        for (int64_t j = 0; j < nv; ++j) {
          const auto sc =
              hn::Mul(hn::LoadU(df, k_scale + tile * kKeyTile + j * N), hn::Set(df, scale_mul));
          for (int g = 0; g < ng; ++g) acc[g][j] = hn::Mul(acc[g][j], sc);
        }
      }
      for (int g = 0; g < ng; ++g) {
        for (int64_t j = 0; j < nv; ++j) hn::Store(acc[g][j], df, tmp + j * N);
        float* sg = s + (g0 + g) * ld_s - t0;
        for (int64_t t = lo; t < hi; ++t) sg[t] = tmp[t - tile * kKeyTile];
      }
    }
  }
}

// out_mul != 1 (fp8: 2^8): the sums start from zero and acc_out += out_mul · sum at the end.
template <typename T>
HWY_INLINE void accum_impl(const float* p, int n_g, int64_t ld_p, const T* v, int64_t n_t,
                           int64_t dv, float* acc_out, float out_mul = 1.f) {
  const bool scaled = out_mul != 1.f;
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t d_vec = dv / N * N;
  for (int g0 = 0; g0 < n_g; g0 += kMaxG) {
    const int ng = std::min(kMaxG, n_g - g0);
    for (int64_t i = 0; i < d_vec; i += N) {
      hn::Vec<decltype(df)> acc[kMaxG];
      for (int g = 0; g < ng; ++g)
        acc[g] = scaled ? hn::Zero(df) : hn::LoadU(df, acc_out + (g0 + g) * dv + i);
      for (int64_t t = 0; t < n_t; ++t) {
        const auto vv = load_row(df, v + t * dv + i);
        for (int g = 0; g < ng; ++g)
          acc[g] = hn::MulAdd(hn::Set(df, p[(g0 + g) * ld_p + t]), vv, acc[g]);
      }
      for (int g = 0; g < ng; ++g) {
        float* out = acc_out + (g0 + g) * dv + i;
        if (scaled) acc[g] = hn::MulAdd(acc[g], hn::Set(df, out_mul), hn::LoadU(df, out));
        hn::StoreU(acc[g], df, out);
      }
    }
    for (int64_t i = d_vec; i < dv; ++i) {
      for (int g = 0; g < ng; ++g) {
        float r = scaled ? 0.f : acc_out[(g0 + g) * dv + i];
        for (int64_t t = 0; t < n_t; ++t) r += p[(g0 + g) * ld_p + t] * scalar(v[t * dv + i]);
        acc_out[(g0 + g) * dv + i] = scaled ? acc_out[(g0 + g) * dv + i] + out_mul * r : r;
      }
    }
  }
}

void ScoresF32(const float* q, int n_g, int64_t d, const float* k, int64_t t0, int64_t n_t,
               float* s, int64_t ld_s) {
  scores_impl(q, n_g, d, k, static_cast<const float*>(nullptr), t0, n_t, s, ld_s);
}
void ScoresF16(const float* q, int n_g, int64_t d, const uint16_t* k, int64_t t0, int64_t n_t,
               float* s, int64_t ld_s) {
  scores_impl(q, n_g, d, k, static_cast<const float*>(nullptr), t0, n_t, s, ld_s);
}
void ScoresBF16(const float* q, int n_g, int64_t d, const uint16_t* k, int64_t t0, int64_t n_t,
                float* s, int64_t ld_s) {
  scores_impl(q, n_g, d, reinterpret_cast<const hwy::bfloat16_t*>(k),
              static_cast<const float*>(nullptr), t0, n_t, s, ld_s);
}
void ScoresQ8(const float* q, int n_g, int64_t d, const int8_t* k, const float* k_scale, int64_t t0,
              int64_t n_t, float* s, int64_t ld_s) {
  scores_impl(q, n_g, d, k, k_scale, t0, n_t, s, ld_s);
}
void AccumF32(const float* p, int n_g, int64_t ld_p, const float* v, int64_t n_t, int64_t dv,
              float* acc) {
  accum_impl(p, n_g, ld_p, v, n_t, dv, acc);
}
void AccumF16(const float* p, int n_g, int64_t ld_p, const uint16_t* v, int64_t n_t, int64_t dv,
              float* acc) {
  accum_impl(p, n_g, ld_p, v, n_t, dv, acc);
}
void AccumBF16(const float* p, int n_g, int64_t ld_p, const uint16_t* v, int64_t n_t, int64_t dv,
               float* acc) {
  accum_impl(p, n_g, ld_p, reinterpret_cast<const hwy::bfloat16_t*>(v), n_t, dv, acc);
}
void AccumQ8(const float* p, int n_g, int64_t ld_p, const int8_t* v, int64_t n_t, int64_t dv,
             float* acc) {
  accum_impl(p, n_g, ld_p, v, n_t, dv, acc);
}

void ScoresFP8(const float* q, int n_g, int64_t d, const uint8_t* k, const float* k_scale,
               int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  scores_impl(q, n_g, d, k, k_scale, t0, n_t, s, ld_s, 256.f);
}
void AccumFP8(const float* p, int n_g, int64_t ld_p, const uint8_t* v, int64_t n_t, int64_t dv,
              float* acc) {
  accum_impl(p, n_g, ld_p, v, n_t, dv, acc, 256.f);
}

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
// start at −8·Σ_b q and are multiplied by the tile's 16 block scales.
void ScoresQ4(const float* q, int n_g, int64_t d, const uint8_t* k, const uint16_t* k_scale,
              int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  const hn::CappedTag<float, kKeyTile / 2> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  constexpr int64_t N = hn::MaxLanes(df);
  constexpr int64_t nv = kKeyTile / 2 / N;  // vectors per half tile (1 on AVX2)
  constexpr int kG = 4;                     // query heads per register batch
  const int64_t n_blk = q4_blocks(d);
  constexpr int64_t kStack = 512;
  HWY_ALIGN float q8s_stack[kStack], sc_stack[kStack];
  std::vector<float> heap;
  float* qs8 = q8s_stack;  // [n_g, n_blk]: 8 · Σ_{i in block} q[g][i]
  float* sc = sc_stack;    // [n_blk, 16]: the tile's block scales, permuted (evens, odds)
  if (n_g * n_blk > kStack || n_blk * kKeyTile > kStack) {
    heap.resize(static_cast<size_t>(n_g * n_blk + n_blk * kKeyTile));
    qs8 = heap.data();
    sc = heap.data() + n_g * n_blk;
  }
  for (int g = 0; g < n_g; ++g) {
    for (int64_t b = 0; b < n_blk; ++b) {
      float r = 0;
      for (int64_t i = b * kQ4Block; i < std::min(d, (b + 1) * kQ4Block); ++i) r += q[g * d + i];
      qs8[g * n_blk + b] = 8 * r;
    }
  }
  HWY_ALIGN float tot[kG][kKeyTile], tmp[kKeyTile];
  const int64_t t_end = t0 + n_t;
  for (int64_t tile = t0 / kKeyTile; tile * kKeyTile < t_end; ++tile) {
    const uint8_t* kt = k + tile * d * (kKeyTile / 2);
    const int64_t lo = std::max(t0, tile * kKeyTile), hi = std::min(t_end, (tile + 1) * kKeyTile);
    for (int64_t b = 0; b < n_blk; ++b) {
      const uint16_t* ks = k_scale + (tile * n_blk + b) * kKeyTile;
      for (int64_t j = 0; j < kKeyTile; j += N) {
        hn::Store(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(ks + j))),
                  df, tmp + j);
      }
      for (int64_t j = 0; j < kKeyTile / 2; ++j) {
        sc[b * kKeyTile + j] = tmp[2 * j];
        sc[b * kKeyTile + kKeyTile / 2 + j] = tmp[2 * j + 1];
      }
    }
    for (int g0 = 0; g0 < n_g; g0 += kG) {
      const int ng = std::min(kG, n_g - g0);
      for (int g = 0; g < ng; ++g) {
        for (int64_t j = 0; j < kKeyTile; j += N) hn::Store(hn::Zero(df), df, tot[g] + j);
      }
      for (int64_t b = 0; b < n_blk; ++b) {
        const int64_t i0 = b * kQ4Block, i1 = std::min(d, i0 + kQ4Block);
        hn::Vec<decltype(df)> acc[kG][2 * nv];
        for (int g = 0; g < ng; ++g) {
          for (int64_t j = 0; j < 2 * nv; ++j) acc[g][j] = hn::Set(df, -qs8[(g0 + g) * n_blk + b]);
        }
        for (int64_t i = i0; i < i1; ++i) {
          for (int64_t j = 0; j < nv; ++j) {
            hn::Vec<decltype(df)> ce, co;
            load_nibbles(df, kt + i * (kKeyTile / 2) + j * N, ce, co);
            for (int g = 0; g < ng; ++g) {
              const auto qb = hn::Set(df, q[(g0 + g) * d + i]);
              acc[g][j] = hn::MulAdd(qb, ce, acc[g][j]);
              acc[g][nv + j] = hn::MulAdd(qb, co, acc[g][nv + j]);
            }
          }
        }
        for (int g = 0; g < ng; ++g) {
          for (int64_t j = 0; j < 2 * nv; ++j) {
            const auto sv = hn::Load(df, sc + b * kKeyTile + j * N);
            hn::Store(hn::MulAdd(acc[g][j], sv, hn::Load(df, tot[g] + j * N)), df, tot[g] + j * N);
          }
        }
      }
      for (int g = 0; g < ng; ++g) {
        float* sg = s + (g0 + g) * ld_s - t0;
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t u = t - tile * kKeyTile;
          sg[t] = tot[g][(u % 2) * (kKeyTile / 2) + u / 2];
        }
      }
    }
  }
}

// q4 values, lanes over channels: a 16-channel group of a row is 8 bytes, decoded to the even
// channels (low nibbles) and the odd ones (high nibbles). Per block the weights w = p · scale
// and −8·Σ w are formed once per chunk of tokens; a dv that is not a multiple of 16 leaves a
// tail of channels done in scalar.
void AccumQ4(const float* p, int n_g, int64_t ld_p, const uint8_t* v, const uint16_t* v_scale,
             int64_t n_t, int64_t dv, float* acc_out) {
  const hn::CappedTag<float, 8> df;
  constexpr int64_t N = hn::MaxLanes(df);
  constexpr int64_t nv = 8 / N;  // vectors per 8 bytes (1 on AVX2)
  constexpr int kG = 6;          // query heads per register batch
  constexpr int64_t kChunk = 64;
  const int64_t rb = q4_row_bytes(dv), n_blk = q4_blocks(dv), n_grp = dv / 16;
  HWY_ALIGN float w[kG][kChunk], tmp[2][8];
  float sct[kChunk], wsum8[kG];
  for (int64_t c0 = 0; c0 < n_t; c0 += kChunk) {
    const int64_t nc = std::min(kChunk, n_t - c0);
    const uint8_t* vc = v + c0 * rb;
    for (int g0 = 0; g0 < n_g; g0 += kG) {
      const int ng = std::min(kG, n_g - g0);
      for (int64_t b = 0; b < n_blk; ++b) {
        for (int64_t t = 0; t < nc; ++t) sct[t] = fp16_to_fp32(v_scale[(c0 + t) * n_blk + b]);
        for (int g = 0; g < ng; ++g) {
          const float* pg = p + (g0 + g) * ld_p + c0;
          float sum = 0;
          for (int64_t t = 0; t < nc; ++t) sum += w[g][t] = pg[t] * sct[t];
          wsum8[g] = 8 * sum;
        }
        const int64_t ch1 = std::min(dv, (b + 1) * kQ4Block);
        for (int64_t h = 2 * b; h < std::min(2 * b + 2, n_grp); ++h) {
          hn::Vec<decltype(df)> acc[kG][2 * nv];
          for (int g = 0; g < ng; ++g) {
            for (int64_t j = 0; j < 2 * nv; ++j) acc[g][j] = hn::Set(df, -wsum8[g]);
          }
          for (int64_t t = 0; t < nc; ++t) {
            for (int64_t j = 0; j < nv; ++j) {
              hn::Vec<decltype(df)> ce, co;
              load_nibbles(df, vc + t * rb + h * 8 + j * N, ce, co);
              for (int g = 0; g < ng; ++g) {
                const auto wb = hn::Set(df, w[g][t]);
                acc[g][j] = hn::MulAdd(wb, ce, acc[g][j]);
                acc[g][nv + j] = hn::MulAdd(wb, co, acc[g][nv + j]);
              }
            }
          }
          for (int g = 0; g < ng; ++g) {
            for (int64_t j = 0; j < nv; ++j) {
              hn::Store(acc[g][j], df, tmp[0] + j * N);
              hn::Store(acc[g][nv + j], df, tmp[1] + j * N);
            }
            float* out = acc_out + (g0 + g) * dv + h * 16;
            for (int64_t m = 0; m < 8; ++m) {
              out[2 * m] += tmp[0][m];
              out[2 * m + 1] += tmp[1][m];
            }
          }
        }
        for (int64_t ch = std::max(b * kQ4Block, n_grp * 16); ch < ch1; ++ch) {
          for (int g = 0; g < ng; ++g) {
            float r = -wsum8[g];
            for (int64_t t = 0; t < nc; ++t)
              r += w[g][t] * static_cast<float>((vc[t * rb + ch / 2] >> (4 * (ch % 2))) & 15);
            acc_out[(g0 + g) * dv + ch] += r;
          }
        }
      }
    }
  }
}

// y[g][i] = m[i] · x[g] over rows i of a row-major [rows, cols] matrix (the basis lift x·mᵀ):
// lanes over cols, the group's queries share each row load, one horizontal sum per (g, i).
void RowsDotF32(const float* m, int64_t rows, int64_t cols, const float* x, int n_g,
                int64_t ld_x, float* y, int64_t ld_y) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t c_vec = cols / N * N;
  for (int g0 = 0; g0 < n_g; g0 += kMaxG) {
    const int ng = std::min(kMaxG, n_g - g0);
    for (int64_t i = 0; i < rows; ++i) {
      const float* mi = m + i * cols;
      hn::Vec<decltype(df)> acc[kMaxG];
      for (int g = 0; g < ng; ++g) acc[g] = hn::Zero(df);
      for (int64_t j = 0; j < c_vec; j += N) {
        const auto mv = hn::LoadU(df, mi + j);
        for (int g = 0; g < ng; ++g)
          acc[g] = hn::MulAdd(mv, hn::LoadU(df, x + (g0 + g) * ld_x + j), acc[g]);
      }
      for (int g = 0; g < ng; ++g) {
        float r = hn::GetLane(hn::SumOfLanes(df, acc[g]));
        for (int64_t j = c_vec; j < cols; ++j) r += mi[j] * x[(g0 + g) * ld_x + j];
        y[(g0 + g) * ld_y + i] = r;
      }
    }
  }
}

void F32ToF16Row(const float* x, uint16_t* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, x + i)), dh,
               reinterpret_cast<hwy::float16_t*>(y + i));
  }
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim::kv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvtrim::kv {

HWY_EXPORT(ScoresF32);
HWY_EXPORT(ScoresF16);
HWY_EXPORT(AccumF32);
HWY_EXPORT(AccumF16);
HWY_EXPORT(ScoresBF16);
HWY_EXPORT(ScoresQ8);
HWY_EXPORT(AccumBF16);
HWY_EXPORT(AccumQ8);
HWY_EXPORT(F32ToF16Row);
HWY_EXPORT(RowsDotF32);
HWY_EXPORT(ScoresFP8);
HWY_EXPORT(AccumFP8);
HWY_EXPORT(ScoresQ4);
HWY_EXPORT(AccumQ4);

void attn_scores_fp8(const float* q, int n_g, int64_t d, const uint8_t* k, const float* k_scale,
                     int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(ScoresFP8)(q, n_g, d, k, k_scale, t0, n_t, s, ld_s);
}
void attn_accum_fp8(const float* p, int n_g, int64_t ld_p, const uint8_t* v, int64_t n_t,
                    int64_t dv, float* acc) {
  HWY_DYNAMIC_DISPATCH(AccumFP8)(p, n_g, ld_p, v, n_t, dv, acc);
}
void attn_scores_q4(const float* q, int n_g, int64_t d, const uint8_t* k,
                    const uint16_t* k_scale_f16, int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(ScoresQ4)(q, n_g, d, k, k_scale_f16, t0, n_t, s, ld_s);
}
void attn_accum_q4(const float* p, int n_g, int64_t ld_p, const uint8_t* v,
                   const uint16_t* v_scale_f16, int64_t n_t, int64_t dv, float* acc) {
  HWY_DYNAMIC_DISPATCH(AccumQ4)(p, n_g, ld_p, v, v_scale_f16, n_t, dv, acc);
}

void attn_scores_f32(const float* q, int n_g, int64_t d, const float* k, int64_t t0, int64_t n_t,
                     float* s, int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(ScoresF32)(q, n_g, d, k, t0, n_t, s, ld_s);
}
void attn_scores_f16(const float* q, int n_g, int64_t d, const uint16_t* k, int64_t t0, int64_t n_t,
                     float* s, int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(ScoresF16)(q, n_g, d, k, t0, n_t, s, ld_s);
}
void attn_accum_f32(const float* p, int n_g, int64_t ld_p, const float* v, int64_t n_t, int64_t dv,
                    float* acc) {
  HWY_DYNAMIC_DISPATCH(AccumF32)(p, n_g, ld_p, v, n_t, dv, acc);
}
void attn_accum_f16(const float* p, int n_g, int64_t ld_p, const uint16_t* v, int64_t n_t,
                    int64_t dv, float* acc) {
  HWY_DYNAMIC_DISPATCH(AccumF16)(p, n_g, ld_p, v, n_t, dv, acc);
}
void attn_scores_bf16(const float* q, int n_g, int64_t d, const uint16_t* k, int64_t t0,
                      int64_t n_t, float* s, int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(ScoresBF16)(q, n_g, d, k, t0, n_t, s, ld_s);
}
void attn_scores_q8(const float* q, int n_g, int64_t d, const int8_t* k, const float* k_scale,
                    int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  HWY_DYNAMIC_DISPATCH(ScoresQ8)(q, n_g, d, k, k_scale, t0, n_t, s, ld_s);
}
void attn_accum_bf16(const float* p, int n_g, int64_t ld_p, const uint16_t* v, int64_t n_t,
                     int64_t dv, float* acc) {
  HWY_DYNAMIC_DISPATCH(AccumBF16)(p, n_g, ld_p, v, n_t, dv, acc);
}
void attn_accum_q8(const float* p, int n_g, int64_t ld_p, const int8_t* v, int64_t n_t, int64_t dv,
                   float* acc) {
  HWY_DYNAMIC_DISPATCH(AccumQ8)(p, n_g, ld_p, v, n_t, dv, acc);
}
void rows_dot_f32(const float* m, int64_t rows, int64_t cols, const float* x, int n_g,
                  int64_t ld_x, float* y, int64_t ld_y) {
  HWY_DYNAMIC_DISPATCH(RowsDotF32)(m, rows, cols, x, n_g, ld_x, y, ld_y);
}
float exp_sub_sum(float* x, int64_t n, float m) { return kvtrim::exp_sub_sum(x, n, m); }  // ops/nn.h
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToF16Row)(x, y, n);
}

}  // namespace kvtrim::kv
#endif  // HWY_ONCE
