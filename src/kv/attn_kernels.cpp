// SIMD kernels of the cache's attention (see attn_kernels.h). One Highway translation unit
// compiled for every x86 target and dispatched at run time. Reference expressions:
//   scores:  s[g][t] = Σ_i q[g][i] · k[t][i]   (k in transposed tiles, lanes over tokens)
//   accum:   acc[g][i] += Σ_t p[g][t] · v[t][i]   (gemma.cpp's WeightedSumV)
#include "kv/attn_kernels.h"
#include "ops/nn.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"

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

// Scores over tiled keys: lanes run over the kKeyTile tokens of a tile. k_scale (q8 only,
// else nullptr): [whole tiles] per-token factor applied to the tile's dot products.
template <typename T>
HWY_INLINE void scores_impl(const float* q, int n_g, int64_t d, const T* k, const float* k_scale,
                            int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
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
          const auto sc = hn::LoadU(df, k_scale + tile * kKeyTile + j * N);
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

template <typename T>
HWY_INLINE void accum_impl(const float* p, int n_g, int64_t ld_p, const T* v, int64_t n_t,
                           int64_t dv, float* acc_out) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t d_vec = dv / N * N;
  for (int g0 = 0; g0 < n_g; g0 += kMaxG) {
    const int ng = std::min(kMaxG, n_g - g0);
    for (int64_t i = 0; i < d_vec; i += N) {
      hn::Vec<decltype(df)> acc[kMaxG];
      for (int g = 0; g < ng; ++g) acc[g] = hn::LoadU(df, acc_out + (g0 + g) * dv + i);
      for (int64_t t = 0; t < n_t; ++t) {
        const auto vv = load_row(df, v + t * dv + i);
        for (int g = 0; g < ng; ++g)
          acc[g] = hn::MulAdd(hn::Set(df, p[(g0 + g) * ld_p + t]), vv, acc[g]);
      }
      for (int g = 0; g < ng; ++g) hn::StoreU(acc[g], df, acc_out + (g0 + g) * dv + i);
    }
    for (int64_t i = d_vec; i < dv; ++i) {
      for (int g = 0; g < ng; ++g) {
        float r = acc_out[(g0 + g) * dv + i];
        for (int64_t t = 0; t < n_t; ++t) r += p[(g0 + g) * ld_p + t] * scalar(v[t * dv + i]);
        acc_out[(g0 + g) * dv + i] = r;
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
