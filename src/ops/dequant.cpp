// Scalar reference dequantization and round-to-nearest quantization of GGUF weight rows.
//
// Block layouts are those of ggml (see core/quant_blocks.h; Q2_K, Q3_K, IQ4_NL and IQ4_XS are
// in ops/dequant_lowbit.cpp); each dequantizer below states
// the expression it evaluates. Products are formed in float32 in the same order as ggml
// and the `gguf` Python package (d * sc first, then * q, then - dmin * m), so results
// agree with them bit for bit or to within one float32 rounding.
//
// The quantizers are simple references for building test weights, not ggml's
// error-minimising searches:
//   - legacy types follow ggml's reference rules (Q4_0/Q5_0: d = max / -8 (-16), the
//     element of largest magnitude maps to the lowest level; Q4_1/Q5_1: d = (max - min) /
//     levels, m = min; Q8_0: d = amax / 127), with q computed from the fp16-rounded d;
//   - k-quants pick each sub-block's scale and min from its range, quantize them to 6 bits
//     (Q6_K: 8-bit signed scales) against a super-block d / dmin rounded *up* to fp16, and
//     round the scale indices up so every element stays inside the representable range.
//     Each element is then within half a quantization step of its input.
#include "ops/dequant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"
#include "ops/dequant_lowbit.h"

namespace kvtrim {

namespace {

// ---- dequantization -------------------------------------------------------------------

// x[i] = (q[i] - 8) * d
void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0x0f) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

// x[i] = q[i] * d + m
void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0x0f) * d + m;
      y[j + kQK / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

uint32_t load_u32_le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// 5-bit q: low nibble as Q4_0, bit 4 of element j is bit j of qh.
inline int q5_lo(const uint8_t* qs, uint32_t qh, int j) {
  return (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
}
inline int q5_hi(const uint8_t* qs, uint32_t qh, int j) {
  return (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
}

// x[i] = (q[i] - 16) * d
void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const uint32_t qh = load_u32_le(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(q5_lo(b[i].qs, qh, j) - 16) * d;
      y[j + kQK / 2] = static_cast<float>(q5_hi(b[i].qs, qh, j) - 16) * d;
    }
  }
}

// x[i] = q[i] * d + m
void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    const uint32_t qh = load_u32_le(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(q5_lo(b[i].qs, qh, j)) * d + m;
      y[j + kQK / 2] = static_cast<float>(q5_hi(b[i].qs, qh, j)) * d + m;
    }
  }
}

// x[i] = qs[i] * d
void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// Sub-block s (32 elements) of each 64: x = (d * sc_s) * q - (dmin * m_s); q is the low
// nibble of qs[32*(s/2) + l] for even s, the high nibble for odd s.
void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const float dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < kQK_K; j += 64, q += 32) {
      int sc = 0, m = 0;
      k4_scale_min(j / 32, b[i].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      k4_scale_min(j / 32 + 1, b[i].scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// As Q4_K with a 5th bit: element l of sub-block s has bit 4 = bit s of qh[l].
void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const float dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    unsigned u1 = 1, u2 = 2;
    for (int j = 0; j < kQK_K; j += 64, ql += 32, u1 <<= 2, u2 <<= 2) {
      int sc = 0, m = 0;
      k4_scale_min(j / 32, b[i].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      k4_scale_min(j / 32 + 1, b[i].scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

// Per half (128 elements): for l < 32, q of elements l, l+32, l+64, l+96 take their low 4
// bits from ql[l] lo, ql[l+32] lo, ql[l] hi, ql[l+32] hi and their high 2 bits from bits
// 0-1, 2-3, 4-5, 6-7 of qh[l]; x = (d * sc[16-group]) * (q - 32).
void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < kQK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

// ---- quantization ---------------------------------------------------------------------

// Smallest fp16 value >= x (x >= 0, finite, below the fp16 maximum).
uint16_t fp16_ceil(float x) {
  uint16_t h = fp32_to_fp16(x);
  if (fp16_to_fp32(h) < x) ++h;  // x > 0 here, so the next bit pattern is the next value up
  return h;
}

inline int clamp_int(long v, int lo, int hi) {
  return static_cast<int>(std::clamp<long>(v, lo, hi));
}

// Q4_0 / Q5_0: d = max / -2^(bits-1) where max is the element of largest magnitude (sign
// kept); q = round(x / d) + 2^(bits-1), clamped to [0, 2^bits - 1].
// Returns d as fp16 bits.
template <int kLevels>
uint16_t quant_symmetric(const float* x, int* q) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const uint16_t dh = fp32_to_fp16(max / -static_cast<float>(kLevels / 2));
  const float d = fp16_to_fp32(dh);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) q[j] = clamp_int(std::lround(x[j] * id) + kLevels / 2, 0, kLevels - 1);
  return dh;
}

void quant_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    int q[kQK];
    b[i].d = quant_symmetric<16>(x, q);
    for (int j = 0; j < kQK / 2; ++j) b[i].qs[j] = static_cast<uint8_t>(q[j] | (q[j + kQK / 2] << 4));
  }
}

void quant_q5_0(const float* x, BlockQ5_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    int q[kQK];
    b[i].d = quant_symmetric<32>(x, q);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      b[i].qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + kQK / 2] & 0x0f) << 4));
      qh |= static_cast<uint32_t>(q[j] >> 4) << j;
      qh |= static_cast<uint32_t>(q[j + kQK / 2] >> 4) << (j + kQK / 2);
    }
    for (int k = 0; k < 4; ++k) b[i].qh[k] = static_cast<uint8_t>(qh >> (8 * k));
  }
}

// Q4_1 / Q5_1: m = min (fp16), d = (max - min) / (2^bits - 1); q = round((x - m) / d).
template <int kLevels>
void quant_affine(const float* x, uint16_t* dh, uint16_t* mh, int* q) {
  float mn = x[0], mx = x[0];
  for (int j = 1; j < kQK; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  *mh = fp32_to_fp16(mn);
  *dh = fp32_to_fp16((mx - mn) / static_cast<float>(kLevels - 1));
  const float m = fp16_to_fp32(*mh), d = fp16_to_fp32(*dh);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) q[j] = clamp_int(std::lround((x[j] - m) * id), 0, kLevels - 1);
}

void quant_q4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    int q[kQK];
    quant_affine<16>(x, &b[i].d, &b[i].m, q);
    for (int j = 0; j < kQK / 2; ++j) b[i].qs[j] = static_cast<uint8_t>(q[j] | (q[j + kQK / 2] << 4));
  }
}

void quant_q5_1(const float* x, BlockQ5_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    int q[kQK];
    quant_affine<32>(x, &b[i].d, &b[i].m, q);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      b[i].qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + kQK / 2] & 0x0f) << 4));
      qh |= static_cast<uint32_t>(q[j] >> 4) << j;
      qh |= static_cast<uint32_t>(q[j + kQK / 2] >> 4) << (j + kQK / 2);
    }
    for (int k = 0; k < 4; ++k) b[i].qh[k] = static_cast<uint8_t>(qh >> (8 * k));
  }
}

// d = amax / 127; q = round(x / d).
void quant_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    b[i].d = fp32_to_fp16(amax / 127.0f);
    const float d = fp16_to_fp32(b[i].d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK; ++j) b[i].qs[j] = static_cast<int8_t>(clamp_int(std::lround(x[j] * id), -127, 127));
  }
}

// Shared by Q4_K and Q5_K: 8 sub-blocks of 32 with x ~ (d*sc) * q - (dmin*m), q in
// [0, kLevels). Writes d, dmin, the packed 6-bit scales and the levels L[256].
template <int kLevels>
void quant_k_affine(const float* x, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scales, int* L) {
  constexpr int kSub = 8, kLen = 32;
  float neg_min[kSub];  // -min(0, min x) >= 0: the offset subtracted after scaling
  float max_neg_min = 0.0f;
  for (int s = 0; s < kSub; ++s) {
    float mn = 0.0f;
    for (int l = 0; l < kLen; ++l) mn = std::min(mn, x[s * kLen + l]);
    neg_min[s] = -mn;
    max_neg_min = std::max(max_neg_min, neg_min[s]);
  }
  *dmin_out = fp16_ceil(max_neg_min / 63.0f);
  const float dmin = fp16_to_fp32(*dmin_out);
  int ls[kSub], lm[kSub];
  float range[kSub];  // max + dmin * lm: the span the levels must cover
  float max_step = 0.0f;
  for (int s = 0; s < kSub; ++s) {
    lm[s] = dmin > 0.0f ? clamp_int(static_cast<long>(std::ceil(neg_min[s] / dmin)), 0, 63) : 0;
    float mx = 0.0f;
    for (int l = 0; l < kLen; ++l) mx = std::max(mx, x[s * kLen + l]);
    range[s] = mx + dmin * static_cast<float>(lm[s]);
    max_step = std::max(max_step, range[s] / static_cast<float>(kLevels - 1));
  }
  *d_out = fp16_ceil(max_step / 63.0f);
  const float d = fp16_to_fp32(*d_out);
  for (int s = 0; s < kSub; ++s) {
    const float step = range[s] / static_cast<float>(kLevels - 1);
    ls[s] = d > 0.0f ? clamp_int(static_cast<long>(std::ceil(step / d)), 0, 63) : 0;
    const float dl = d * static_cast<float>(ls[s]);
    const float ml = dmin * static_cast<float>(lm[s]);
    const float idl = dl > 0.0f ? 1.0f / dl : 0.0f;
    for (int l = 0; l < kLen; ++l)
      L[s * kLen + l] = clamp_int(std::lround((x[s * kLen + l] + ml) * idl), 0, kLevels - 1);
  }
  // Pack (inverse of k4_scale_min, core/quant_blocks.h).
  std::memset(scales, 0, kKScaleBytes);
  for (int j = 0; j < kSub; ++j) {
    if (j < 4) {
      scales[j] = static_cast<uint8_t>(ls[j]);
      scales[j + 4] = static_cast<uint8_t>(lm[j]);
    } else {
      scales[j + 4] = static_cast<uint8_t>((ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4));
      scales[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

void quant_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    int L[kQK_K];
    quant_k_affine<16>(x, &b[i].d, &b[i].dmin, b[i].scales, L);
    for (int j = 0; j < kQK_K; j += 64)
      for (int l = 0; l < 32; ++l) b[i].qs[j / 2 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

void quant_q5_k(const float* x, BlockQ5_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    int L[kQK_K];
    quant_k_affine<32>(x, &b[i].d, &b[i].dmin, b[i].scales, L);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    uint8_t* ql = b[i].qs;
    unsigned m1 = 1, m2 = 2;
    for (int n = 0; n < kQK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j], l2 = L[n + j + 32];
        if (l1 > 15) {
          l1 -= 16;
          b[i].qh[j] = static_cast<uint8_t>(b[i].qh[j] | m1);
        }
        if (l2 > 15) {
          l2 -= 16;
          b[i].qh[j] = static_cast<uint8_t>(b[i].qh[j] | m2);
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
    }
  }
}

// 16 sub-blocks of 16, symmetric: per sub-block step = amax / 31, int8 scale index
// sc = ceil(step / d) with d = max step / 127 (fp16, rounded up); q = round(x / (d*sc)) + 32.
void quant_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  constexpr int kSub = 16, kLen = 16;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float step[kSub];
    float max_step = 0.0f;
    for (int s = 0; s < kSub; ++s) {
      float amax = 0.0f;
      for (int l = 0; l < kLen; ++l) amax = std::max(amax, std::fabs(x[s * kLen + l]));
      step[s] = amax / 31.0f;
      max_step = std::max(max_step, step[s]);
    }
    b[i].d = fp16_ceil(max_step / 127.0f);
    const float d = fp16_to_fp32(b[i].d);
    int L[kQK_K];
    for (int s = 0; s < kSub; ++s) {
      const int sc = d > 0.0f ? clamp_int(static_cast<long>(std::ceil(step[s] / d)), 0, 127) : 0;
      b[i].scales[s] = static_cast<int8_t>(sc);
      const float dl = d * static_cast<float>(sc);
      const float idl = dl > 0.0f ? 1.0f / dl : 0.0f;
      for (int l = 0; l < kLen; ++l)
        L[s * kLen + l] = clamp_int(std::lround(x[s * kLen + l] * idl), -32, 31) + 32;
    }
    uint8_t* ql = b[i].ql;
    uint8_t* qh = b[i].qh;
    for (int j = 0; j < kQK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0x0f) | ((q3 & 0x0f) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0x0f) | ((q4 & 0x0f) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

// Number of blocks in a row of n elements of type t; fails if n is not a whole number of blocks.
int64_t n_blocks(GgmlType t, int64_t n, const char* what) {
  const auto tr = ggml_type_traits(static_cast<uint32_t>(t));
  if (!tr) fail("%s: unknown ggml type id %u", what, static_cast<unsigned>(t));
  KVTRIM_CHECK(n >= 0 && n % tr->block_size == 0,
               "%s: row of %lld elements is not a multiple of the %s block size %lld", what,
               static_cast<long long>(n), std::string(tr->name).c_str(),
               static_cast<long long>(tr->block_size));
  return n / tr->block_size;
}

}  // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const int64_t nb = n_blocks(type, n, "dequantize_row");
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = fp16_to_fp32(h);
      }
      return;
    }
    case GgmlType::BF16: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16_to_fp32(h);
      }
      return;
    }
    case GgmlType::Q4_0: return dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case GgmlType::Q4_1: return dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case GgmlType::Q5_0: return dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case GgmlType::Q5_1: return dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case GgmlType::Q8_0: return dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case GgmlType::Q4_K: return dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case GgmlType::Q5_K: return dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case GgmlType::Q6_K: return dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    case GgmlType::Q2_K: return detail::dequant_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb);
    case GgmlType::Q3_K: return detail::dequant_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb);
    case GgmlType::IQ4_NL: return detail::dequant_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, nb);
    case GgmlType::IQ4_XS: return detail::dequant_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, nb);
    default:
      fail("dequantize_row: tensor type %s is not supported by kvtrim",
           std::string(ggml_type_name(type)).c_str());
  }
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const int64_t nb = n_blocks(type, n, "quantize_row");
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    }
    case GgmlType::BF16: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    }
    case GgmlType::Q4_0: return quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case GgmlType::Q4_1: return quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    case GgmlType::Q5_0: return quant_q5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case GgmlType::Q5_1: return quant_q5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    case GgmlType::Q8_0: return quant_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case GgmlType::Q4_K: return quant_q4_k(src, static_cast<BlockQ4_K*>(dst), nb);
    case GgmlType::Q5_K: return quant_q5_k(src, static_cast<BlockQ5_K*>(dst), nb);
    case GgmlType::Q6_K: return quant_q6_k(src, static_cast<BlockQ6_K*>(dst), nb);
    case GgmlType::Q2_K: return detail::quant_q2_k(src, static_cast<BlockQ2_K*>(dst), nb);
    case GgmlType::Q3_K: return detail::quant_q3_k(src, static_cast<BlockQ3_K*>(dst), nb);
    case GgmlType::IQ4_NL: return detail::quant_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), nb);
    case GgmlType::IQ4_XS: return detail::quant_iq4_xs(src, static_cast<BlockIQ4_XS*>(dst), nb);
    default:
      fail("quantize_row: tensor type %s is not supported by kvtrim",
           std::string(ggml_type_name(type)).c_str());
  }
}

}  // namespace kvtrim
