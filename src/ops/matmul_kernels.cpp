// SIMD dot products of weight rows with an activation vector, compiled once per ISA by
// Highway (foreach_target) and chosen at run time (HWY_DYNAMIC_DISPATCH).
//
// Quantized weights follow llama.cpp's vec_dot scheme: the activation is quantized once to
// 8 bits (BlockQ8A per 32 for the legacy types and IQ4_NL, BlockQ8_K per 256 for the k-quants
// and IQ4_XS, see
// matmul_internal.h) and each block contributes an integer dot product times one f32
// scale. The integer products use x86 intrinsics where Highway 1.0.3 has no op for them:
//   AVX2 / AVX3:  _mm256_maddubs_epi16 (u8 x s8 -> i16 pairs) + _mm256_madd_epi16;
//   AVX3_DL:      AVX-512 VNNI vpdpbusd / vpdpwssd, EVEX-encoded (dpbusd256 / dpwssd256);
// every other target (EMU128, SCALAR, non-x86) runs the portable scalar integer code below,
// which computes the same sums. The weight nibbles are used unsigned (0..15 / 0..31 / 0..63)
// and the type's offset (8, 16, 32) or min is applied per block through the activation
// sums (BlockQ8A::s, BlockQ8_K::bsums), which keeps maddubs free of saturation.
// F32 / F16 / BF16 weights use portable Highway f32 FMAs on the unquantized activation.
// On x86 the legacy types and Q4_K run 8 rows at a time, the rows as SIMD lanes
// (ops/legacy_strips-inl.h, ops/kquant_strips-inl.h; Q8_0 only with VNNI); with AVX-512 VNNI a
// batch of Q4_K / Q6_K weights (2+ tokens) or of the legacy strip types (16+) runs 16 rows at a
// time on zmm registers, each block decoded once for all the call's tokens
// (ops/kquant_tiles-inl.h), and legacy-type weights with a packed copy (WeightView::packed)
// run 16-row tiles from it at every token count (ops/legacy_packed-inl.h); the row-at-a-time
// kernels (ops/row_kernels-inl.h; Q2_K, Q3_K, IQ4_XS in ops/lowbit_kernels-inl.h) serve the
// other cases. This file keeps the f32 / f16 / bf16 dot products, the row loops, the dispatch by weight
// type, the activation quantization and the exported entry points.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/fp16.h"
#include "core/quant_blocks.h"
#include "ops/matmul_internal.h"

// AVX3_DL (Ice Lake+: VNNI) is opt-in in Highway 1.0.3; SSSE3/SSE4 would only add compile
// time (they fall back to the baseline target, which is correct, just slower).
// Bytes ahead of the current weight row that the row loop prefetches (0: none).
#ifndef KVTRIM_PREFETCH_BYTES
#define KVTRIM_PREFETCH_BYTES 1536
#endif

#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
// These kernels have no SSE4 path (it takes the scalar one), beside what the build disables.
#ifndef KVTRIM_HWY_DISABLED
#define KVTRIM_HWY_DISABLED 0
#endif
#undef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | KVTRIM_HWY_DISABLED)

// foreach_target.h must precede highway.h (it re-includes this file once per target);
// include sorting would break that.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/matmul_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kvtrim::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#undef KV_X86
#undef KV_VNNI
#undef KV_AVX512
#undef KV_ATTR
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define KV_X86 1
#else
#define KV_X86 0
#endif
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define KV_AVX512 1
#else
#define KV_AVX512 0
#endif
#if HWY_TARGET == HWY_AVX3_DL
// Highway 1.0.3's AVX3_DL target string names "avxvnni" but its run-time check is for
// AVX512_VNNI; enable the latter explicitly for the functions that use it (with AVX512VL,
// which clang requires for the 256-bit forms).
#define KV_VNNI 1
#define KV_ATTR __attribute__((target("avx512vl,avx512vnni")))
#else
#define KV_VNNI 0
#define KV_ATTR
#endif

// ---------------------------------------------------------------------------------------
// f32 / f16 / bf16 weights (portable Highway).

template <GgmlType kT>
float dot_float(const void* wrow, const float* x, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  auto load_w = [&](int64_t i) {
    if constexpr (kT == GgmlType::F32) {
      return hn::LoadU(df, static_cast<const float*>(wrow) + i);
    } else if constexpr (kT == GgmlType::F16) {
      const hn::Rebind<hwy::float16_t, decltype(df)> dh;
      return hn::PromoteTo(df, hn::LoadU(dh, static_cast<const hwy::float16_t*>(wrow) + i));
    } else {
      const hn::Rebind<uint16_t, decltype(df)> d16;
      const hn::Rebind<uint32_t, decltype(df)> d32;
      const auto u = hn::PromoteTo(d32, hn::LoadU(d16, static_cast<const uint16_t*>(wrow) + i));
      return hn::BitCast(df, hn::ShiftLeft<16>(u));
    }
  };
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 4 * nl <= n; i += 4 * nl) {
    a0 = hn::MulAdd(load_w(i), hn::LoadU(df, x + i), a0);
    a1 = hn::MulAdd(load_w(i + nl), hn::LoadU(df, x + i + nl), a1);
    a2 = hn::MulAdd(load_w(i + 2 * nl), hn::LoadU(df, x + i + 2 * nl), a2);
    a3 = hn::MulAdd(load_w(i + 3 * nl), hn::LoadU(df, x + i + 3 * nl), a3);
  }
  for (; i + nl <= n; i += nl) a0 = hn::MulAdd(load_w(i), hn::LoadU(df, x + i), a0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) {
    float wv;
    if constexpr (kT == GgmlType::F32) {
      wv = static_cast<const float*>(wrow)[i];
    } else if constexpr (kT == GgmlType::F16) {
      wv = fp16_to_fp32(static_cast<const uint16_t*>(wrow)[i]);
    } else {
      wv = bf16_to_fp32(static_cast<const uint16_t*>(wrow)[i]);
    }
    s += wv * x[i];
  }
  return s;
}

#include "ops/row_kernels-inl.h"
#include "ops/lowbit_kernels-inl.h"

// ---------------------------------------------------------------------------------------
// Row loops and activation quantization (exported).

template <typename DotFn>
KV_ATTR inline void rows_loop(const WeightView& w, int64_t r0, int64_t r1, const void* act,
                              size_t act_stride, int64_t n_tok, float* y, int64_t ldy, DotFn dot) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const auto* a = static_cast<const uint8_t*>(act);
  // Software prefetch of the row ~kPrefetchBytes ahead: decode streams W from DRAM and the
  // hardware prefetcher stops at 4 KiB page boundaries. Measured on one SmolLM2 token of
  // weights (96 MB Q4_1 + Q8_0), 1 thread: 0 B 15.7-18.7 ms, 768-3072 B 7.8-14.6 ms.
  constexpr size_t kPrefetchBytes = KVTRIM_PREFETCH_BYTES;
  const int64_t pf_rows = static_cast<int64_t>((kPrefetchBytes + w.row_bytes - 1) / w.row_bytes);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = base + static_cast<size_t>(r) * w.row_bytes;
    if (kPrefetchBytes > 0 && r + pf_rows < r1) {
      const uint8_t* next = row + static_cast<size_t>(pf_rows) * w.row_bytes;
      for (size_t off = 0; off < w.row_bytes; off += 64) __builtin_prefetch(next + off);
    }
    for (int64_t t = 0; t < n_tok; ++t)
      y[t * ldy + r] = dot(row, a + static_cast<size_t>(t) * act_stride);
  }
}

#if KV_X86
// rows_loop for the legacy types: each row meets the tokens in groups of up to 4, every weight
// block decoded once per group (dot_legacy_n).
template <GgmlType kT>
KV_ATTR void legacy_rows_loop(const WeightView& w, int64_t r0, int64_t r1, const void* act, size_t act_stride,
                              int64_t n_tok, float* y, int64_t ldy, int64_t nb) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const auto* a = static_cast<const uint8_t*>(act);
  constexpr size_t kPrefetchBytes = KVTRIM_PREFETCH_BYTES;
  const int64_t pf_rows = static_cast<int64_t>((kPrefetchBytes + w.row_bytes - 1) / w.row_bytes);
  const BlockQ8A* x[4];
  float out[4];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = base + static_cast<size_t>(r) * w.row_bytes;
    if (kPrefetchBytes > 0 && r + pf_rows < r1) {
      const uint8_t* next = row + static_cast<size_t>(pf_rows) * w.row_bytes;
      for (size_t off = 0; off < w.row_bytes; off += 64) __builtin_prefetch(next + off);
    }
    for (int64_t t0 = 0; t0 < n_tok; t0 += 4) {
      const int nt = static_cast<int>(std::min<int64_t>(4, n_tok - t0));
      for (int t = 0; t < nt; ++t)
        x[t] = reinterpret_cast<const BlockQ8A*>(a + static_cast<size_t>(t0 + t) * act_stride);
      switch (nt) {
        case 4: dot_legacy_n<kT, 4>(row, x, nb, out); break;
        case 3: dot_legacy_n<kT, 3>(row, x, nb, out); break;
        case 2: dot_legacy_n<kT, 2>(row, x, nb, out); break;
        default: out[0] = dot_legacy<kT>(row, x[0], nb); break;
      }
      for (int t = 0; t < nt; ++t) y[(t0 + t) * ldy + r] = out[t];
    }
  }
}
#endif

#include "ops/legacy_strips-inl.h"
#include "ops/kquant_strips-inl.h"
#include "ops/kquant_tiles-inl.h"
#include "ops/legacy_packed-inl.h"

#if KV_X86
// A legacy type's rows: in strips of 8 where the type has a strip kernel, else one row at a time
// (tokens grouped by 4 for a batch; a single token keeps the plain row loop, the grouped one
// costs it 5-10 % on Q4_1 rows).
template <GgmlType kT>
KV_ATTR void legacy_dot_rows(const WeightView& w, int64_t r0, int64_t r1, const void* act, size_t act_stride,
                             int64_t n_tok, float* y, int64_t ldy, int64_t nb) {
  if constexpr (kStripType<kT>) {
#if KV_AVX512 && KV_VNNI
    if constexpr (kPackType<kT>) {
      if (w.packed) {
        p_tile_rows_loop<kT>(w, r0, r1, act, act_stride, n_tok, y, ldy, nb);
        return;
      }
    }
    if (KVTRIM_KQUANT_TILES && n_tok >= kLTileMinTokens) {
      l_tile_rows_loop<kT>(w, r0, r1, act, act_stride, n_tok, y, ldy, nb);
      return;
    }
#endif
    strip_rows_loop<kT>(w, r0, r1, act, act_stride, n_tok, y, ldy, nb);
  } else if (n_tok > 1) {
    legacy_rows_loop<kT>(w, r0, r1, act, act_stride, n_tok, y, ldy, nb);
  } else {
    rows_loop(w, r0, r1, act, act_stride, n_tok, y, ldy, [nb](const uint8_t* row, const uint8_t* a) {
      return dot_legacy<kT>(row, reinterpret_cast<const BlockQ8A*>(a), nb);
    });
  }
}
#endif

void DotRows(const WeightView& w, int64_t r0, int64_t r1, const void* act, size_t act_stride,
             int64_t n_tok, float* y, int64_t ldy) {
  const int64_t n = w.n_cols, nb = n / kQK, nbk = n / kQK_K;
#define KV_FLOAT(T)                                                                       \
  case GgmlType::T:                                                                       \
    rows_loop(w, r0, r1, act, act_stride, n_tok, y, ldy,                                  \
              [n](const uint8_t* row, const uint8_t* a) {                                 \
                return dot_float<GgmlType::T>(row, reinterpret_cast<const float*>(a), n); \
              });                                                                         \
    return;
#if KV_X86
#define KV_LEGACY(T)                                                                   \
  case GgmlType::T:                                                                    \
    legacy_dot_rows<GgmlType::T>(w, r0, r1, act, act_stride, n_tok, y, ldy, nb);      \
    return;
#else
#define KV_LEGACY(T)                                                                           \
  case GgmlType::T:                                                                            \
    rows_loop(w, r0, r1, act, act_stride, n_tok, y, ldy,                                       \
              [nb](const uint8_t* row, const uint8_t* a) {                                     \
                return dot_legacy<GgmlType::T>(row, reinterpret_cast<const BlockQ8A*>(a), nb); \
              });                                                                              \
    return;
#endif
  switch (w.type) {
    KV_FLOAT(F32)
    KV_FLOAT(F16)
    KV_FLOAT(BF16)
    KV_LEGACY(Q4_0)
    KV_LEGACY(Q4_1)
    KV_LEGACY(Q5_0)
    KV_LEGACY(Q5_1)
    KV_LEGACY(Q8_0)
    KV_LEGACY(IQ4_NL)
    case GgmlType::Q4_K:
#if KV_X86
      if constexpr (kKStripType<GgmlType::Q4_K>) {
#if KV_AVX512 && KV_VNNI
        if (kKTileType<GgmlType::Q4_K> && n_tok >= kKTileMinTokens) {
          k_tile_rows_loop<GgmlType::Q4_K>(w, r0, r1, act, act_stride, n_tok, y, ldy, nbk);
          return;
        }
#endif
        k4_strip_rows_loop(w, r0, r1, act, act_stride, n_tok, y, ldy, nbk);
        return;
      }
#endif
      rows_loop(w, r0, r1, act, act_stride, n_tok, y, ldy,
                [nbk](const uint8_t* row, const uint8_t* a) {
                  return dot_q45k<GgmlType::Q4_K>(row, reinterpret_cast<const BlockQ8_K*>(a), nbk);
                });
      return;
    case GgmlType::Q5_K:
      rows_loop(w, r0, r1, act, act_stride, n_tok, y, ldy,
                [nbk](const uint8_t* row, const uint8_t* a) {
                  return dot_q45k<GgmlType::Q5_K>(row, reinterpret_cast<const BlockQ8_K*>(a), nbk);
                });
      return;
    case GgmlType::Q6_K:
#if KV_X86 && KV_AVX512 && KV_VNNI
      if (kKTileType<GgmlType::Q6_K> && n_tok >= kKTileMinTokens) {
        k_tile_rows_loop<GgmlType::Q6_K>(w, r0, r1, act, act_stride, n_tok, y, ldy, nbk);
        return;
      }
#endif
      rows_loop(w, r0, r1, act, act_stride, n_tok, y, ldy,
                [nbk](const uint8_t* row, const uint8_t* a) {
                  return dot_q6k(row, reinterpret_cast<const BlockQ8_K*>(a), nbk);
                });
      return;
#define KV_KROW(T, fn)                                                            \
  case GgmlType::T:                                                               \
    rows_loop(w, r0, r1, act, act_stride, n_tok, y, ldy,                          \
              [nbk](const uint8_t* row, const uint8_t* a) {                       \
                return fn(row, reinterpret_cast<const BlockQ8_K*>(a), nbk);       \
              });                                                                 \
    return;
    KV_KROW(Q2_K, dot_q2k)
    KV_KROW(Q3_K, dot_q3k)
    KV_KROW(IQ4_XS, dot_iq4xs)
#undef KV_KROW
    default:
      return;  // matmul.cpp checked matmul_supported
  }
#undef KV_FLOAT
#undef KV_LEGACY
}

// Rounds x[0..n) (n a multiple of the lane count, n <= 256) by 1/d into q (int8) and returns
// the sum of the rounded values.
template <class D>
inline float round_block(D df, const float* x, float id, int8_t* q, int n) {
  const hn::Rebind<int32_t, D> di;
  const hn::Rebind<int8_t, D> d8;
  const int nl = static_cast<int>(hn::Lanes(df));
  auto vsum = hn::Zero(df);
  for (int j = 0; j < n; j += nl) {
    const auto r = hn::Round(hn::Mul(hn::LoadU(df, x + j), hn::Set(df, id)));
    vsum = hn::Add(vsum, r);
    hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, r)), d8, q + j);
  }
  return hn::GetLane(hn::SumOfLanes(df, vsum));
}

template <class D>
inline float abs_max(D df, const float* x, int n) {
  const int nl = static_cast<int>(hn::Lanes(df));
  auto m = hn::Zero(df);
  for (int j = 0; j < n; j += nl) m = hn::Max(m, hn::Abs(hn::LoadU(df, x + j)));
  return hn::GetLane(hn::MaxOfLanes(df, m));
}

void QuantizeQ8A(const float* x, BlockQ8A* y, int64_t nb) {
  const hn::CappedTag<float, 16> df;  // lane count divides 32
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQK;
    const float amax = abs_max(df, xb, kQK);
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    y[b].d = d;
    y[b].s = d * round_block(df, xb, id, y[b].qs, kQK);
  }
}

void QuantizeQ8K(const float* x, BlockQ8_K* y, int64_t nb) {
  const hn::CappedTag<float, 16> df;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQK_K;
    const float amax = abs_max(df, xb, kQK_K);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    y[b].d = amax / 127.0f;
    for (int g = 0; g < kQK_K / 16; ++g) {
      // |sum| <= 16 * 127 fits int16 for finite activations. A NaN (from a NaN or inf weight of
      // a damaged file) makes the sum NaN, or hides a lane's maximum from abs_max so the sum
      // overflows; converting either would be undefined. The block's result is garbage anyway.
      const float sum = round_block(df, xb + 16 * g, id, y[b].qs + 16 * g, 16);
      y[b].bsums[g] = sum == sum ? static_cast<int16_t>(std::clamp(sum, -32768.f, 32767.f)) : int16_t{0};
    }
  }
}

bool PackedKernel(GgmlType t) {
#if KV_X86 && KV_AVX512 && KV_VNNI
  switch (t) {
    case GgmlType::Q4_0: return kPackType<GgmlType::Q4_0>;
    case GgmlType::Q4_1: return kPackType<GgmlType::Q4_1>;
    case GgmlType::Q5_0: return kPackType<GgmlType::Q5_0>;
    case GgmlType::Q5_1: return kPackType<GgmlType::Q5_1>;
    case GgmlType::Q8_0: return kPackType<GgmlType::Q8_0>;
    default: return false;
  }
#else
  (void)t;
  return false;
#endif
}

const char* TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

bool StripKernel(GgmlType t) {
#if KV_X86
  switch (t) {
    case GgmlType::Q4_0: return kStripType<GgmlType::Q4_0>;
    case GgmlType::Q4_1: return kStripType<GgmlType::Q4_1>;
    case GgmlType::Q5_0: return kStripType<GgmlType::Q5_0>;
    case GgmlType::Q5_1: return kStripType<GgmlType::Q5_1>;
    case GgmlType::Q8_0: return kStripType<GgmlType::Q8_0>;
    case GgmlType::Q4_K: return kKStripType<GgmlType::Q4_K>;
#if KV_AVX512 && KV_VNNI
    case GgmlType::Q6_K: return kKTileType<GgmlType::Q6_K>;  // the tiles from kKTileMinTokens tokens on
#endif
    default: return false;
  }
#else
  (void)t;
  return false;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvtrim::detail {

HWY_EXPORT(DotRows);
HWY_EXPORT(QuantizeQ8A);
HWY_EXPORT(QuantizeQ8K);
HWY_EXPORT(TargetName);
HWY_EXPORT(StripKernel);
HWY_EXPORT(PackedKernel);

void dot_rows(const WeightView& w, int64_t r0, int64_t r1, const void* act, size_t act_stride,
              int64_t n_tok, float* y, int64_t ldy) {
  HWY_DYNAMIC_DISPATCH(DotRows)(w, r0, r1, act, act_stride, n_tok, y, ldy);
}

void quantize_act(ActFormat f, const float* x, void* dst, int64_t n_cols) {
  switch (f) {
    case ActFormat::kF32:
      std::memcpy(dst, x, static_cast<size_t>(n_cols) * sizeof(float));
      return;
    case ActFormat::kQ8A:
      HWY_DYNAMIC_DISPATCH(QuantizeQ8A)(x, static_cast<BlockQ8A*>(dst), n_cols / kQK);
      return;
    case ActFormat::kQ8K:
      HWY_DYNAMIC_DISPATCH(QuantizeQ8K)(x, static_cast<BlockQ8_K*>(dst), n_cols / kQK_K);
      return;
  }
}

const char* kernel_target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}

bool has_strip_kernel(GgmlType t) {
  return HWY_DYNAMIC_DISPATCH(StripKernel)(t);
}

bool has_packed_kernel(GgmlType t) {
  return HWY_DYNAMIC_DISPATCH(PackedKernel)(t);
}

}  // namespace kvtrim::detail
#endif  // HWY_ONCE
