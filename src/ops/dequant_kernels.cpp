// SIMD dequantization of weight rows into f32 (dequant.h: dequantize_rows_simd), for the
// prefill path that dequantizes a tile of weight rows before each sgemm. Highway
// (foreach_target), chosen at run time. Each type evaluates the scalar reference's expression
// (ops/dequant.cpp) with the same scalar factors (d, d·sc, dmin·m formed in f32 as there); the
// vector multiply and add may be fused by the compiler, so results agree with the reference to
// within one f32 rounding of each term (tests/ops/dequant_simd_test.cpp), not bit for bit.
// Types without a kernel here (Q5_0, Q5_1, F16, BF16, F32) take the scalar reference. IQ4_NL and
// IQ4_XS look their elements up in a 16-entry table of dl · level per sub-block (scalar code; the
// same products as the reference, so bit for bit).

// foreach_target.h must precede highway.h (it re-includes this file once per target).
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/dequant_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <cstring>

#include "core/fp16.h"
#include "core/ggml_type.h"
#include "core/quant_blocks.h"
#include "ops/dequant.h"

HWY_BEFORE_NAMESPACE();
namespace kvtrim::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 f32 lanes, so a 16-byte half block is a whole number of vectors.
using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;
using DU8 = hn::Rebind<uint8_t, DF>;
using DI8 = hn::Rebind<int8_t, DF>;

template <class V8>
HWY_INLINE hn::Vec<DF> u8_to_f32(V8 b) {
  const DF df;
  const DI di;
  return hn::ConvertTo(df, hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DI>(), b)));
}

// y = q · d + m over 16 bytes of nibbles: lo nibbles to y[0..16), hi to y[16..32).
HWY_INLINE void nibbles_affine(const uint8_t* qs, float d, float m, float* y) {
  const DF df;
  const DU8 du8;
  constexpr size_t N = hn::MaxLanes(df);
  const auto vd = hn::Set(df, d), vm = hn::Set(df, m);
  const auto lo_mask = hn::Set(du8, uint8_t{0x0f});
  for (size_t j = 0; j < 16; j += N) {
    const auto b = hn::LoadU(du8, qs + j);
    hn::StoreU(hn::Add(hn::Mul(u8_to_f32(hn::And(b, lo_mask)), vd), vm), df, y + j);
    hn::StoreU(hn::Add(hn::Mul(u8_to_f32(hn::ShiftRight<4>(b)), vd), vm), df, y + 16 + j);
  }
}

// Q4_K / Q5_K half of a 64-group: 32 elements y = d1 · q − m1, q = nibble (+16 if the bit).
template <bool kHi, bool kBit5>
HWY_INLINE void k_nibbles(const uint8_t* ql, const uint8_t* qh, int shift, float d1, float m1, float* y) {
  const DF df;
  const DU8 du8;
  constexpr size_t N = hn::MaxLanes(df);
  const auto vd = hn::Set(df, d1), vm = hn::Set(df, m1);
  const auto lo_mask = hn::Set(du8, uint8_t{0x0f}), one = hn::Set(du8, uint8_t{1});
  for (size_t l = 0; l < 32; l += N) {
    const auto b = hn::LoadU(du8, ql + l);
    auto q = kHi ? hn::ShiftRight<4>(b) : hn::And(b, lo_mask);
    if constexpr (kBit5) {
      const auto h = hn::And(hn::ShiftRightSame(hn::LoadU(du8, qh + l), shift), one);
      q = hn::Or(q, hn::ShiftLeft<4>(h));
    }
    hn::StoreU(hn::Sub(hn::Mul(vd, u8_to_f32(q)), vm), df, y + l);
  }
}

// Q2_K (kHighBit false: y = dl_g · q − ml_g) or Q3_K (true: y = dl_g · (q − 4 unless the hmask
// bit)) super-block: element e = 128 h + 32 j + l has q = bits 2j of qs[32 h + l], sub-block e / 16.
template <bool kHighBit>
HWY_INLINE void k_2bit(const uint8_t* qs, const uint8_t* hmask, const float* dl, const float* ml, float* y) {
  const DF df;
  const DI di;
  const DU8 du8;
  constexpr size_t N = hn::MaxLanes(df);
  const auto three = hn::Set(du8, uint8_t{3}), one = hn::Set(du8, uint8_t{1});
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) {
      for (size_t l = 0; l < 32; l += N) {
        const int e = 128 * h + 32 * j + static_cast<int>(l), g = e / 16;
        auto q = hn::And(hn::ShiftRightSame(hn::LoadU(du8, qs + 32 * h + l), 2 * j), three);
        if constexpr (kHighBit) {
          const auto hb = hn::And(hn::ShiftRightSame(hn::LoadU(du8, hmask + l), 4 * h + j), one);
          q = hn::Or(q, hn::ShiftLeft<2>(hb));  // q + 4
          const auto qi = hn::Sub(hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DI>(), q)), hn::Set(di, 4));
          hn::StoreU(hn::Mul(hn::Set(df, dl[g]), hn::ConvertTo(df, qi)), df, y + e);
        } else {
          hn::StoreU(hn::Sub(hn::Mul(hn::Set(df, dl[g]), u8_to_f32(q)), hn::Set(df, ml[g])), df, y + e);
        }
      }
    }
  }
}

// IQ4 sub-block of 32: y = dl · kIq4nlValues[q] through a 16-entry table of the products (the
// reference's products, so bit for bit).
HWY_INLINE void iq4_32(const uint8_t* qs, float dl, float* y) {
  float t[16];
  for (int k = 0; k < 16; ++k) t[k] = dl * static_cast<float>(kIq4nlValues[k]);
  for (int j = 0; j < 16; ++j) {
    y[j] = t[qs[j] & 0x0f];
    y[j + 16] = t[qs[j] >> 4];
  }
}

void DequantRows(GgmlType type, const uint8_t* src, size_t row_bytes, float* dst, int64_t n_rows,
                 int64_t n_cols) {
  const DF df;
  const DI di;
  const DI8 di8;
  const DU8 du8;
  constexpr size_t N = hn::MaxLanes(df);
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = src + static_cast<size_t>(r) * row_bytes;
    float* y = dst + r * n_cols;
    switch (type) {
      case GgmlType::Q4_0: {
        const auto* b = reinterpret_cast<const BlockQ4_0*>(row);
        const auto lo_mask = hn::Set(du8, uint8_t{0x0f});
        const auto eight = hn::Set(df, 8.f);
        for (int64_t i = 0; i < n_cols / kQK; ++i, y += kQK) {
          // (q − 8) · d as the reference: the subtraction is exact, then one product
          const auto vd = hn::Set(df, fp16_to_fp32(b[i].d));
          for (size_t j = 0; j < 16; j += N) {
            const auto q = hn::LoadU(du8, b[i].qs + j);
            hn::StoreU(hn::Mul(hn::Sub(u8_to_f32(hn::And(q, lo_mask)), eight), vd), df, y + j);
            hn::StoreU(hn::Mul(hn::Sub(u8_to_f32(hn::ShiftRight<4>(q)), eight), vd), df, y + 16 + j);
          }
        }
        break;
      }
      case GgmlType::Q4_1: {
        const auto* b = reinterpret_cast<const BlockQ4_1*>(row);
        for (int64_t i = 0; i < n_cols / kQK; ++i, y += kQK)
          nibbles_affine(b[i].qs, fp16_to_fp32(b[i].d), fp16_to_fp32(b[i].m), y);
        break;
      }
      case GgmlType::Q8_0: {
        const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
        for (int64_t i = 0; i < n_cols / kQK; ++i, y += kQK) {
          const auto vd = hn::Set(df, fp16_to_fp32(b[i].d));
          for (size_t j = 0; j < static_cast<size_t>(kQK); j += N) {
            const auto q = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, b[i].qs + j)));
            hn::StoreU(hn::Mul(q, vd), df, y + j);
          }
        }
        break;
      }
      case GgmlType::Q4_K:
      case GgmlType::Q5_K: {
        const bool q5 = type == GgmlType::Q5_K;
        const size_t bs = q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
        for (int64_t i = 0; i < n_cols / kQK_K; ++i) {
          const uint8_t* blk = row + static_cast<size_t>(i) * bs;
          uint16_t dh, mh;
          std::memcpy(&dh, blk, 2);
          std::memcpy(&mh, blk + 2, 2);
          const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(mh);
          const uint8_t* scales = blk + 4;
          const uint8_t* qh = q5 ? blk + 4 + kKScaleBytes : nullptr;
          const uint8_t* ql = blk + 4 + kKScaleBytes + (q5 ? kQK_K / 8 : 0);
          for (int j = 0; j < 8; j += 2, ql += 32) {
            int sc[2], m[2];
            k4_scale_min(j, scales, &sc[0], &m[0]);
            k4_scale_min(j + 1, scales, &sc[1], &m[1]);
            const float d1 = d * static_cast<float>(sc[0]), m1 = dmin * static_cast<float>(m[0]);
            const float d2 = d * static_cast<float>(sc[1]), m2 = dmin * static_cast<float>(m[1]);
            if (q5) {
              k_nibbles<false, true>(ql, qh, j, d1, m1, y);
              k_nibbles<true, true>(ql, qh, j + 1, d2, m2, y + 32);
            } else {
              k_nibbles<false, false>(ql, nullptr, 0, d1, m1, y);
              k_nibbles<true, false>(ql, nullptr, 0, d2, m2, y + 32);
            }
            y += 64;
          }
        }
        break;
      }
      case GgmlType::Q6_K: {
        const auto* b = reinterpret_cast<const BlockQ6_K*>(row);
        const auto lo_mask = hn::Set(du8, uint8_t{0x0f}), three = hn::Set(du8, uint8_t{3});
        const auto v32 = hn::Set(di, 32);
        for (int64_t i = 0; i < n_cols / kQK_K; ++i) {
          const float d = fp16_to_fp32(b[i].d);
          const uint8_t* ql = b[i].ql;
          const uint8_t* qh = b[i].qh;
          const int8_t* sc = b[i].scales;
          for (int n = 0; n < kQK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (size_t l = 0; l < 32; l += N) {
              const int is = static_cast<int>(l / 16);
              const auto a = hn::LoadU(du8, ql + l), c = hn::LoadU(du8, ql + l + 32);
              const auto h = hn::LoadU(du8, qh + l);
              const hn::Vec<DU8> q[4] = {
                  hn::Or(hn::And(a, lo_mask), hn::ShiftLeft<4>(hn::And(h, three))),
                  hn::Or(hn::And(c, lo_mask), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(h), three))),
                  hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(h), three))),
                  hn::Or(hn::ShiftRight<4>(c), hn::ShiftLeft<4>(hn::ShiftRight<6>(h)))};
              for (int k = 0; k < 4; ++k) {
                const float s = d * static_cast<float>(sc[is + 2 * k]);
                const auto qi = hn::Sub(hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DI>(), q[k])), v32);
                hn::StoreU(hn::Mul(hn::Set(df, s), hn::ConvertTo(df, qi)), df, y + 32 * k + l);
              }
            }
          }
        }
        break;
      }
      case GgmlType::Q2_K: {
        const auto* b = reinterpret_cast<const BlockQ2_K*>(row);
        for (int64_t i = 0; i < n_cols / kQK_K; ++i, y += kQK_K) {
          const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
          float dl[16], ml[16];
          for (int g = 0; g < 16; ++g) {
            dl[g] = d * static_cast<float>(b[i].scales[g] & 0x0f);
            ml[g] = dmin * static_cast<float>(b[i].scales[g] >> 4);
          }
          k_2bit<false>(b[i].qs, nullptr, dl, ml, y);
        }
        break;
      }
      case GgmlType::Q3_K: {
        const auto* b = reinterpret_cast<const BlockQ3_K*>(row);
        for (int64_t i = 0; i < n_cols / kQK_K; ++i, y += kQK_K) {
          const float d = fp16_to_fp32(b[i].d);
          float dl[16];
          for (int g = 0; g < 16; ++g) dl[g] = d * static_cast<float>(q3k_scale(g, b[i].scales));
          k_2bit<true>(b[i].qs, b[i].hmask, dl, nullptr, y);
        }
        break;
      }
      case GgmlType::IQ4_NL: {
        const auto* b = reinterpret_cast<const BlockIQ4_NL*>(row);
        for (int64_t i = 0; i < n_cols / kQK; ++i, y += kQK) iq4_32(b[i].qs, fp16_to_fp32(b[i].d), y);
        break;
      }
      case GgmlType::IQ4_XS: {
        const auto* b = reinterpret_cast<const BlockIQ4_XS*>(row);
        for (int64_t i = 0; i < n_cols / kQK_K; ++i) {
          const float d = fp16_to_fp32(b[i].d);
          for (int sb = 0; sb < kQK_K / 32; ++sb, y += 32)
            iq4_32(b[i].qs + 16 * sb, d * static_cast<float>(iq4xs_scale(sb, b[i])), y);
        }
        break;
      }
      default:
        dequantize_row(type, row, y, n_cols);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvtrim {
namespace detail {
HWY_EXPORT(DequantRows);
// Dispatched here, beside HWY_EXPORT: a build for one target (KVTRIM_NATIVE) resolves the call to
// N_<target>::DequantRows, which exists only in this namespace.
void dequant_rows(GgmlType type, const uint8_t* src, size_t row_bytes, float* dst, int64_t n_rows, int64_t n_cols) {
  HWY_DYNAMIC_DISPATCH(DequantRows)(type, src, row_bytes, dst, n_rows, n_cols);
}
}  // namespace detail

void dequantize_rows_simd(GgmlType type, const void* src, size_t row_bytes, float* dst, int64_t n_rows,
                          int64_t n_cols) {
  if (n_rows <= 0) return;
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
      // validates the row length (block multiple) the way the reference does
      if (n_cols % ggml_traits(type).block_size == 0) {
        detail::dequant_rows(type, static_cast<const uint8_t*>(src), row_bytes, dst, n_rows, n_cols);
        return;
      }
      break;
    default:
      break;
  }
  for (int64_t r = 0; r < n_rows; ++r)
    dequantize_row(type, static_cast<const uint8_t*>(src) + static_cast<size_t>(r) * row_bytes, dst + r * n_cols,
                   n_cols);
}
}  // namespace kvtrim
#endif  // HWY_ONCE
