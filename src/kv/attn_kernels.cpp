// SIMD kernels of the cache's dense attention over f32 / f16 / bf16 / q8 / fp8 elements (see
// attn_kernels.h; q4 blocks: attn_kernels_q4.cpp, sparse rows: attn_kernels_sparse.cpp). One
// Highway translation unit compiled for every x86 target and dispatched at run time.
// Reference expressions:
//   scores:  s[g][t] = Σ_i q[g][i] · k[t][i]   (k in transposed tiles, lanes over tokens)
//   accum:   acc[g][i] += Σ_t p[g][t] · v[t][i]   (gemma.cpp's WeightedSumV)
// Quantised elements are widened to f32 in registers: int8 by promote + convert, fp8 E4M3 by
// rebuilding the f32 bit pattern (see load_row(uint8_t)) with the 2^120 it is off by folded
// into the scale.
#include "kv/attn_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/attn_batches.h"
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
// fp8 E4M3 codes: the value · 2^-120, as the f32 with the code's sign in bit 31 and its
// exponent and mantissa in bits 26..20 (sign-extend, shift left 20, clear bits 30..27): the
// normal codes are normal floats and the subnormal codes m·2^-9 the f32 subnormals m·2^-129,
// both exact; no conversion instruction (cheaper than the f16 route on AVX2).
template <class DF>
HWY_INLINE hn::Vec<DF> load_row(DF df, const uint8_t* p) {
  const hn::Rebind<int8_t, DF> di8;
  const hn::Rebind<int32_t, DF> di32;
  const auto w =
      hn::ShiftLeft<20>(hn::PromoteTo(di32, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p))));
  return hn::BitCast(df, hn::And(w, hn::Set(di32, static_cast<int32_t>(0x87ffffffu))));
}
// fp8 E5M2 codes (a type of their own: uint8_t is E4M3): the top byte of an f16, widened
// through it (exact, subnormal codes included).
struct E5m2 {
  uint8_t bits;
};
template <class DF>
HWY_INLINE hn::Vec<DF> load_row(DF df, const E5m2* p) {
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto h = hn::ShiftLeft<8>(hn::PromoteTo(du16, hn::LoadU(du8, &p->bits)));
  return hn::PromoteTo(df, hn::BitCast(dh, h));
}
template <int K, class DF, typename T>
HWY_INLINE void load_vecs(DF df, const T* p, hn::Vec<DF>* out) {
  constexpr int64_t N = hn::MaxLanes(df);
  for (int c = 0; c < K; ++c) out[c] = load_row(df, p + c * N);
}
constexpr float kFp8Mul = 0x1p120f;   // undoes load_row(uint8_t)'s 2^-120
HWY_INLINE float scalar(uint8_t b) {  // as load_row: the value · 2^-120
  const auto w = static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(b)) << 20);
  return fp32_from_bits(w & 0x87ffffffu);
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
HWY_INLINE float scalar(E5m2 c) {
  return fp16_to_fp32(static_cast<uint16_t>(c.bits << 8));
}

// The group's query heads are processed in batches of at most kMaxBatch (8 -> 4 + 4,
// 9 -> 5 + 4), each by a kernel compiled for its batch size G, whose accumulators stay in
// registers. Zen 2 / AVX2 needs about 10 independent FMA chains to hide the FMA latency (5
// cycles, 2 per cycle): with few query heads the kernels add chains by splitting the rows of a
// tile into P phases (scores) or by covering C vectors of channels at once (accumulate).
// (for_batches / with_batch / kMaxBatch: attn_batches.h)

// s [G, ld_s] for tokens [t0, t0 + n_t) of one tile-aligned run; see scores_impl.
template <int G, typename T>
HWY_NOINLINE void scores_batch(const float* q, int64_t d, const T* k, const float* k_scale,
                               float scale_mul, int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  const hn::CappedTag<float, kKeyTile> df;
  using V = hn::Vec<decltype(df)>;
  constexpr int64_t N = hn::MaxLanes(df);
  constexpr int64_t nv = kKeyTile / N;  // vectors per tile row (1 on AVX-512, 2 on AVX2)
  constexpr int P = static_cast<int>(HWY_MAX(1, HWY_MIN(4, 12 / (G * nv))));  // row phases
  const int64_t d_main = d / P * P;
  HWY_ALIGN float tmp[kKeyTile];
  const int64_t t_end = t0 + n_t;
  for (int64_t tile = t0 / kKeyTile; tile * kKeyTile < t_end; ++tile) {
    const T* kt = k + tile * d * kKeyTile;
    V acc[P][G][nv];
    for (int ph = 0; ph < P; ++ph) {
      for (int g = 0; g < G; ++g) {
        for (int64_t j = 0; j < nv; ++j) acc[ph][g][j] = hn::Zero(df);
      }
    }
    // per row: its nv vectors, then one broadcast of q at a time (few registers live)
    for (int64_t i = 0; i < d_main; i += P) {
      for (int ph = 0; ph < P; ++ph) {
        V kv[nv];
        load_vecs<nv>(df, kt + (i + ph) * kKeyTile, kv);
        for (int g = 0; g < G; ++g) {
          const V qb = hn::Set(df, q[g * d + i + ph]);
          for (int64_t j = 0; j < nv; ++j) acc[ph][g][j] = hn::MulAdd(qb, kv[j], acc[ph][g][j]);
        }
      }
    }
    for (int64_t i = d_main; i < d; ++i) {
      V kv[nv];
      load_vecs<nv>(df, kt + i * kKeyTile, kv);
      for (int g = 0; g < G; ++g) {
        const V qb = hn::Set(df, q[g * d + i]);
        for (int64_t j = 0; j < nv; ++j) acc[0][g][j] = hn::MulAdd(qb, kv[j], acc[0][g][j]);
      }
    }
    for (int ph = 1; ph < P; ++ph) {
      for (int g = 0; g < G; ++g) {
        for (int64_t j = 0; j < nv; ++j) acc[0][g][j] = hn::Add(acc[0][g][j], acc[ph][g][j]);
      }
    }
    if (k_scale) {
      for (int64_t j = 0; j < nv; ++j) {
        const V sc = hn::LoadU(df, k_scale + tile * kKeyTile + j * N);
        for (int g = 0; g < G; ++g)
          acc[0][g][j] = hn::Mul(hn::Mul(acc[0][g][j], sc), hn::Set(df, scale_mul));
      }
    }
    const int64_t lo = std::max(t0, tile * kKeyTile), hi = std::min(t_end, (tile + 1) * kKeyTile);
    for (int g = 0; g < G; ++g) {
      float* sg = s + g * ld_s - t0;
      if (hi - lo == kKeyTile) {  // whole tile in range
        for (int64_t j = 0; j < nv; ++j) hn::StoreU(acc[0][g][j], df, sg + lo + j * N);
      } else {
        for (int64_t j = 0; j < nv; ++j) hn::Store(acc[0][g][j], df, tmp + j * N);
        for (int64_t t = lo; t < hi; ++t) sg[t] = tmp[t - tile * kKeyTile];
      }
    }
  }
}

// Scores over tiled keys: lanes run over the kKeyTile tokens of a tile. k_scale (q8 / fp8,
// else nullptr): [whole tiles] per-token factor applied to the tile's dot products, times
// scale_mul (fp8: 2^8, undoing load_row's 2^-8).
template <typename T>
HWY_INLINE void scores_impl(const float* q, int n_g, int64_t d, const T* k, const float* k_scale,
                            int64_t t0, int64_t n_t, float* s, int64_t ld_s,
                            float scale_mul = 1.f) {
  for_batches(n_g, [&](int g0, int ng) {
    with_batch(ng, [&](auto G) {
      scores_batch<decltype(G)::value>(q + g0 * d, d, k, k_scale, scale_mul, t0, n_t, s + g0 * ld_s,
                                       ld_s);
    });
  });
}

// C vectors of channels [i, i + C·N) of acc [G, dv] += Σ_t p[g][t] · v[t][...]; scaled: the
// sums start at zero and acc += out_mul · sum.
template <int G, int C, typename T>
HWY_INLINE void accum_group(const float* p, int64_t ld_p, const T* v, int64_t n_t, int64_t dv,
                            float* acc_out, bool scaled, float out_mul) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  constexpr int64_t N = hn::MaxLanes(df);
  V acc[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c)
      acc[g][c] = scaled ? hn::Zero(df) : hn::LoadU(df, acc_out + g * dv + c * N);
  }
  for (int64_t t = 0; t < n_t; ++t) {
    const T* row = v + t * dv;
    if constexpr (C > G) {  // the G weights live, one row vector at a time
      V bp[G];
      for (int g = 0; g < G; ++g) bp[g] = hn::Set(df, p[g * ld_p + t]);
      for (int c = 0; c < C; ++c) {
        const V vv = load_row(df, row + c * N);
        for (int g = 0; g < G; ++g) acc[g][c] = hn::MulAdd(bp[g], vv, acc[g][c]);
      }
    } else {  // the C row vectors live, one weight at a time
      V vv[C];
      load_vecs<C>(df, row, vv);
      for (int g = 0; g < G; ++g) {
        const V bp = hn::Set(df, p[g * ld_p + t]);
        for (int c = 0; c < C; ++c) acc[g][c] = hn::MulAdd(bp, vv[c], acc[g][c]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) {
      float* out = acc_out + g * dv + c * N;
      if (scaled) acc[g][c] = hn::MulAdd(acc[g][c], hn::Set(df, out_mul), hn::LoadU(df, out));
      hn::StoreU(acc[g][c], df, out);
    }
  }
}

// The last r < C vectors of channels as one group (accum_group<G, r>).
template <int G, int R, typename T>
HWY_INLINE void accum_tail(int64_t r, const float* p, int64_t ld_p, const T* v, int64_t n_t,
                           int64_t dv, float* acc_out, bool scaled, float out_mul) {
  if constexpr (R > 0) {
    if (r == R) return accum_group<G, R>(p, ld_p, v, n_t, dv, acc_out, scaled, out_mul);
    accum_tail<G, R - 1>(r, p, ld_p, v, n_t, dv, acc_out, scaled, out_mul);
  }
}

template <int G, typename T>
HWY_NOINLINE void accum_batch(const float* p, int64_t ld_p, const T* v, int64_t n_t, int64_t dv,
                              float* acc_out, float out_mul) {
  const hn::ScalableTag<float> df;
  constexpr int64_t N = hn::MaxLanes(df);
  // vectors of channels at once: G·C accumulators + the live row vectors / weights fit the 16
  // AVX2 registers (fp8 decoding holds a mask constant: one register less)
  constexpr bool kMask = std::is_same_v<T, uint8_t>;
  constexpr int C = G == 1   ? 8
                    : G == 2 ? 6
                    : G == 3 ? (kMask ? 3 : 4)
                    : G == 4 ? (kMask ? 2 : 3)
                             : 2;
  const bool scaled = out_mul != 1.f;
  const int64_t d_vec = dv / N * N;
  int64_t i = 0;
  for (; i + C * N <= d_vec; i += C * N)
    accum_group<G, C>(p, ld_p, v + i, n_t, dv, acc_out + i, scaled, out_mul);
  accum_tail<G, C - 1>((d_vec - i) / N, p, ld_p, v + i, n_t, dv, acc_out + i, scaled, out_mul);
  i = d_vec;
  for (; i < dv; ++i) {
    for (int g = 0; g < G; ++g) {
      float r = scaled ? 0.f : acc_out[g * dv + i];
      for (int64_t t = 0; t < n_t; ++t) r += p[g * ld_p + t] * scalar(v[t * dv + i]);
      acc_out[g * dv + i] = scaled ? acc_out[g * dv + i] + out_mul * r : r;
    }
  }
}

// out_mul != 1 (fp8: 2^8): the sums start from zero and acc_out += out_mul · sum at the end.
template <typename T>
HWY_INLINE void accum_impl(const float* p, int n_g, int64_t ld_p, const T* v, int64_t n_t,
                           int64_t dv, float* acc_out, float out_mul = 1.f) {
  for_batches(n_g, [&](int g0, int ng) {
    with_batch(ng, [&](auto G) {
      accum_batch<decltype(G)::value>(p + g0 * ld_p, ld_p, v, n_t, dv, acc_out + g0 * dv, out_mul);
    });
  });
}

// Calls f.template operator()<T>(mul) with the element type T that load_row / scalar read a
// dense type's codes as, and the factor that undoes load_row's offset (fp8: 2^120); false for a
// type without such codes (q4: attn_kernels_q4.cpp). A new element-coded type adds its case here
// and its load_row / scalar overloads above.
template <class F>
HWY_INLINE bool with_elem(KvDtype t, F&& f) {
  switch (t) {
    case KvDtype::kF32:
      f.template operator()<float>(1.f);
      return true;
    case KvDtype::kF16:
      f.template operator()<uint16_t>(1.f);
      return true;
    case KvDtype::kBF16:
      f.template operator()<hwy::bfloat16_t>(1.f);
      return true;
    case KvDtype::kQ8:
      f.template operator()<int8_t>(1.f);
      return true;
    case KvDtype::kFP8:
      f.template operator()<uint8_t>(kFp8Mul);
      return true;
    case KvDtype::kE5M2:
      f.template operator()<E5m2>(1.f);
      return true;
    default:
      return false;
  }
}

bool ScoresDense(KvDtype t, const float* q, int n_g, int64_t d, const void* k, const float* k_scale,
                 int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  return with_elem(t, [&]<typename T>(float mul) {
    scores_impl(q, n_g, d, static_cast<const T*>(k), k_scale, t0, n_t, s, ld_s, mul);
  });
}
bool AccumDense(KvDtype t, const float* p, int n_g, int64_t ld_p, const void* v, int64_t n_t,
                int64_t dv, float* acc) {
  return with_elem(t, [&]<typename T>(float mul) {
    accum_impl(p, n_g, ld_p, static_cast<const T*>(v), n_t, dv, acc, mul);
  });
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

HWY_EXPORT(ScoresDense);
HWY_EXPORT(AccumDense);
HWY_EXPORT(F32ToF16Row);
HWY_EXPORT(RowsDotF32);

void attn_scores_dense(KvDtype t, const float* q, int n_g, int64_t d, const void* k,
                       const float* k_scale, int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  KVTRIM_CHECK(HWY_DYNAMIC_DISPATCH(ScoresDense)(t, q, n_g, d, k, k_scale, t0, n_t, s, ld_s),
               "no dense attention kernel for KV cache type %d", static_cast<int>(t));
}
void attn_accum_dense(KvDtype t, const float* p, int n_g, int64_t ld_p, const void* v, int64_t n_t,
                      int64_t dv, float* acc) {
  KVTRIM_CHECK(HWY_DYNAMIC_DISPATCH(AccumDense)(t, p, n_g, ld_p, v, n_t, dv, acc),
               "no dense attention kernel for KV cache type %d", static_cast<int>(t));
}

void attn_scores_f32(const float* q, int n_g, int64_t d, const float* k, int64_t t0, int64_t n_t,
                     float* s, int64_t ld_s) {
  attn_scores_dense(KvDtype::kF32, q, n_g, d, k, nullptr, t0, n_t, s, ld_s);
}
void attn_scores_f16(const float* q, int n_g, int64_t d, const uint16_t* k, int64_t t0, int64_t n_t,
                     float* s, int64_t ld_s) {
  attn_scores_dense(KvDtype::kF16, q, n_g, d, k, nullptr, t0, n_t, s, ld_s);
}
void attn_scores_bf16(const float* q, int n_g, int64_t d, const uint16_t* k, int64_t t0,
                      int64_t n_t, float* s, int64_t ld_s) {
  attn_scores_dense(KvDtype::kBF16, q, n_g, d, k, nullptr, t0, n_t, s, ld_s);
}
void attn_scores_q8(const float* q, int n_g, int64_t d, const int8_t* k, const float* k_scale,
                    int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  attn_scores_dense(KvDtype::kQ8, q, n_g, d, k, k_scale, t0, n_t, s, ld_s);
}
void attn_scores_fp8(const float* q, int n_g, int64_t d, const uint8_t* k, const float* k_scale,
                     int64_t t0, int64_t n_t, float* s, int64_t ld_s) {
  attn_scores_dense(KvDtype::kFP8, q, n_g, d, k, k_scale, t0, n_t, s, ld_s);
}
void attn_accum_f32(const float* p, int n_g, int64_t ld_p, const float* v, int64_t n_t, int64_t dv,
                    float* acc) {
  attn_accum_dense(KvDtype::kF32, p, n_g, ld_p, v, n_t, dv, acc);
}
void attn_accum_f16(const float* p, int n_g, int64_t ld_p, const uint16_t* v, int64_t n_t,
                    int64_t dv, float* acc) {
  attn_accum_dense(KvDtype::kF16, p, n_g, ld_p, v, n_t, dv, acc);
}
void attn_accum_bf16(const float* p, int n_g, int64_t ld_p, const uint16_t* v, int64_t n_t,
                     int64_t dv, float* acc) {
  attn_accum_dense(KvDtype::kBF16, p, n_g, ld_p, v, n_t, dv, acc);
}
void attn_accum_q8(const float* p, int n_g, int64_t ld_p, const int8_t* v, int64_t n_t, int64_t dv,
                   float* acc) {
  attn_accum_dense(KvDtype::kQ8, p, n_g, ld_p, v, n_t, dv, acc);
}
void attn_accum_fp8(const float* p, int n_g, int64_t ld_p, const uint8_t* v, int64_t n_t,
                    int64_t dv, float* acc) {
  attn_accum_dense(KvDtype::kFP8, p, n_g, ld_p, v, n_t, dv, acc);
}
void rows_dot_f32(const float* m, int64_t rows, int64_t cols, const float* x, int n_g,
                  int64_t ld_x, float* y, int64_t ld_y) {
  HWY_DYNAMIC_DISPATCH(RowsDotF32)(m, rows, cols, x, n_g, ld_x, y, ld_y);
}
float exp_sub_sum(float* x, int64_t n, float m) { return kvtrim::exp_sub_sum(x, n, m); }  // ops/nn.h
float max_of(const float* x, int64_t n) { return kvtrim::max_of(x, n); }                  // ops/nn.h
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToF16Row)(x, y, n);
}

}  // namespace kvtrim::kv
#endif  // HWY_ONCE
