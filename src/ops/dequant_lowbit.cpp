// Scalar reference dequantization of Q2_K, Q3_K, IQ4_NL and IQ4_XS, and simple round-to-nearest
// quantizers for building test weights (see ops/dequant_lowbit.h).
//
// Each dequantizer states the expression it evaluates. The products are formed in float32 in
// the order of ggml and the `gguf` Python package (the sub-block factor d * sc first, then
// times q, then minus dmin * m for Q2_K), so results agree with gguf.quants.dequantize bit for
// bit (tests/gguf/dequant_lowbit_test.cpp checks it on tests/data/dequant_lowbit_refs.bin).
//
// The quantizers are references for test weights, not ggml's error-minimising searches: each
// sub-block's scale maps its element of largest magnitude onto the extreme level (Q3_K: -4,
// IQ4: -127), Q2_K picks scale and min from the sub-block's range as ops/dequant.cpp's Q4_K
// quantizer does, and each element takes the nearest level.
#include "ops/dequant_lowbit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"

namespace kvtrim::detail {

namespace {

inline int clamp_int(long v, int lo, int hi) {
  return static_cast<int>(std::clamp<long>(v, lo, hi));
}

// Smallest fp16 value >= x (x >= 0, finite, below the fp16 maximum).
uint16_t fp16_ceil(float x) {
  uint16_t h = fp32_to_fp16(x);
  if (fp16_to_fp32(h) < x) ++h;
  return h;
}

// The element of largest magnitude of x[0..n), sign kept.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// Index of the IQ4_NL level nearest to t.
int nearest_iq4(float t) {
  int best = 0;
  float err = std::fabs(t - kIq4nlValues[0]);
  for (int k = 1; k < 16; ++k) {
    const float e = std::fabs(t - static_cast<float>(kIq4nlValues[k]));
    if (e < err) {
      err = e;
      best = k;
    }
  }
  return best;
}

// 32 IQ4_NL levels of x at step dl into 16 bytes of nibbles (Q4_0's order).
void pack_iq4(const float* x, float dl, uint8_t* qs) {
  const float id = dl != 0.0f ? 1.0f / dl : 0.0f;
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>(nearest_iq4(x[j] * id) | (nearest_iq4(x[j + 16] * id) << 4));
}

}  // namespace

// Element e = 128 h + 32 j + l: q = bits 2j..2j+1 of qs[32 h + l]; sub-block g = e / 16 has
// sc = scales[g] & 15, m = scales[g] >> 4; x = (d * sc) * q - (dmin * m).
void dequant_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    const float d = fp16_to_fp32(b[i].d);
    const float dmin = fp16_to_fp32(b[i].dmin);
    for (int g = 0; g < kQK_K / 16; ++g) {
      const float dl = d * static_cast<float>(b[i].scales[g] & 0x0f);
      const float ml = dmin * static_cast<float>(b[i].scales[g] >> 4);
      for (int k = 0; k < 16; ++k) {
        const int e = 16 * g + k, h = e / 128, j = (e / 32) % 4, l = e % 32;
        const int q = (b[i].qs[32 * h + l] >> (2 * j)) & 3;
        y[e] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// Element e = 128 h + 32 j + l: low 2 bits as Q2_K, q = low - 4 unless bit 4h + j of hmask[l] is
// set; x = (d * q3k_scale(e / 16)) * q.
void dequant_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    const float d = fp16_to_fp32(b[i].d);
    for (int g = 0; g < kQK_K / 16; ++g) {
      const float dl = d * static_cast<float>(q3k_scale(g, b[i].scales));
      for (int k = 0; k < 16; ++k) {
        const int e = 16 * g + k, h = e / 128, j = (e / 32) % 4, l = e % 32;
        const int lo = (b[i].qs[32 * h + l] >> (2 * j)) & 3;
        const int q = lo - (((b[i].hmask[l] >> (4 * h + j)) & 1) ? 0 : 4);
        y[e] = dl * static_cast<float>(q);
      }
    }
  }
}

// x[i] = d * kIq4nlValues[q[i]]
void dequant_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] & 0x0f]);
      y[j + kQK / 2] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] >> 4]);
    }
  }
}

// Sub-block s of 32: x = (d * iq4xs_scale(s)) * kIq4nlValues[q], q the nibbles of qs[16 s ..].
void dequant_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int s = 0; s < kQK_K / 32; ++s, y += 32) {
      const float dl = d * static_cast<float>(iq4xs_scale(s, b[i]));
      const uint8_t* qs = b[i].qs + 16 * s;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0x0f]);
        y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

// 16 sub-blocks of 16: m = -min(0, min x) on a 4-bit grid of dmin (rounded up), the range
// max + m in 3 steps of d * sc (sc 4-bit, rounded up), q = round((x + dmin * m) / (d * sc)).
void quant_q2_k(const float* x, BlockQ2_K* b, int64_t nb) {
  constexpr int kSub = 16, kLen = 16;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float neg_min[kSub], max_neg_min = 0.0f;
    for (int g = 0; g < kSub; ++g) {
      float mn = 0.0f;
      for (int k = 0; k < kLen; ++k) mn = std::min(mn, x[g * kLen + k]);
      neg_min[g] = -mn;
      max_neg_min = std::max(max_neg_min, neg_min[g]);
    }
    b[i].dmin = fp16_ceil(max_neg_min / 15.0f);
    const float dmin = fp16_to_fp32(b[i].dmin);
    int lm[kSub];
    float step[kSub], max_step = 0.0f;
    for (int g = 0; g < kSub; ++g) {
      lm[g] = dmin > 0.0f ? clamp_int(static_cast<long>(std::ceil(neg_min[g] / dmin)), 0, 15) : 0;
      float mx = 0.0f;
      for (int k = 0; k < kLen; ++k) mx = std::max(mx, x[g * kLen + k]);
      step[g] = (mx + dmin * static_cast<float>(lm[g])) / 3.0f;
      max_step = std::max(max_step, step[g]);
    }
    b[i].d = fp16_ceil(max_step / 15.0f);
    const float d = fp16_to_fp32(b[i].d);
    std::memset(b[i].qs, 0, sizeof b[i].qs);
    for (int g = 0; g < kSub; ++g) {
      const int ls = d > 0.0f ? clamp_int(static_cast<long>(std::ceil(step[g] / d)), 0, 15) : 0;
      b[i].scales[g] = static_cast<uint8_t>(ls | (lm[g] << 4));
      const float dl = d * static_cast<float>(ls), ml = dmin * static_cast<float>(lm[g]);
      const float idl = dl > 0.0f ? 1.0f / dl : 0.0f;
      for (int k = 0; k < kLen; ++k) {
        const int e = g * kLen + k;
        const int q = clamp_int(std::lround((x[e] + ml) * idl), 0, 3);
        b[i].qs[32 * (e / 128) + e % 32] = static_cast<uint8_t>(b[i].qs[32 * (e / 128) + e % 32] | (q << (2 * ((e / 32) % 4))));
      }
    }
  }
}

// 16 sub-blocks of 16, symmetric: step = (element of largest magnitude) / -4, sc = round(step / d)
// in [-32, 31] with d = max |step| / 31; q = round(x / (d * sc)) in [-4, 3].
void quant_q3_k(const float* x, BlockQ3_K* b, int64_t nb) {
  constexpr int kSub = 16, kLen = 16;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float step[kSub], max_step = 0.0f;
    for (int g = 0; g < kSub; ++g) {
      step[g] = signed_absmax(x + g * kLen, kLen) / -4.0f;
      max_step = std::max(max_step, std::fabs(step[g]));
    }
    b[i].d = fp32_to_fp16(max_step / 31.0f);
    const float d = fp16_to_fp32(b[i].d);
    std::memset(b[i].scales, 0, sizeof b[i].scales);
    std::memset(b[i].qs, 0, sizeof b[i].qs);
    std::memset(b[i].hmask, 0, sizeof b[i].hmask);
    for (int g = 0; g < kSub; ++g) {
      const int sc = d > 0.0f ? clamp_int(std::lround(step[g] / d), -32, 31) : 0;
      const int u = sc + 32;  // 6 bits: low nibble in scales[g % 8] (high half for g >= 8)
      b[i].scales[g % 8] = static_cast<uint8_t>(b[i].scales[g % 8] | ((u & 0x0f) << (g < 8 ? 0 : 4)));
      b[i].scales[8 + g % 4] = static_cast<uint8_t>(b[i].scales[8 + g % 4] | ((u >> 4) << (2 * (g / 4))));
      const float dl = d * static_cast<float>(sc);
      const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      for (int k = 0; k < kLen; ++k) {
        const int e = g * kLen + k, h = e / 128, j = (e / 32) % 4, l = e % 32;
        const int q = clamp_int(std::lround(x[e] * idl), -4, 3) + 4;  // 0..7
        b[i].qs[32 * h + l] = static_cast<uint8_t>(b[i].qs[32 * h + l] | ((q & 3) << (2 * j)));
        if (q >= 4) b[i].hmask[l] = static_cast<uint8_t>(b[i].hmask[l] | (1 << (4 * h + j)));
      }
    }
  }
}

// d = (element of largest magnitude) / -127; each element the nearest level.
void quant_iq4_nl(const float* x, BlockIQ4_NL* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    b[i].d = fp32_to_fp16(signed_absmax(x, kQK) / -127.0f);
    pack_iq4(x, fp16_to_fp32(b[i].d), b[i].qs);
  }
}

// Per sub-block of 32: step = (element of largest magnitude) / -127, ls - 32 = round(step / d)
// in [-32, 31] with d = max |step| / 31; each element the nearest level at d * (ls - 32).
void quant_iq4_xs(const float* x, BlockIQ4_XS* b, int64_t nb) {
  constexpr int kSub = kQK_K / 32;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float step[kSub], max_step = 0.0f;
    for (int s = 0; s < kSub; ++s) {
      step[s] = signed_absmax(x + 32 * s, 32) / -127.0f;
      max_step = std::max(max_step, std::fabs(step[s]));
    }
    b[i].d = fp32_to_fp16(max_step / 31.0f);
    const float d = fp16_to_fp32(b[i].d);
    b[i].scales_h = 0;
    std::memset(b[i].scales_l, 0, sizeof b[i].scales_l);
    for (int s = 0; s < kSub; ++s) {
      const int sc = d > 0.0f ? clamp_int(std::lround(step[s] / d), -32, 31) : 0;
      const int u = sc + 32;
      b[i].scales_l[s / 2] = static_cast<uint8_t>(b[i].scales_l[s / 2] | ((u & 0x0f) << (4 * (s % 2))));
      b[i].scales_h = static_cast<uint16_t>(b[i].scales_h | ((u >> 4) << (2 * s)));
      pack_iq4(x + 32 * s, d * static_cast<float>(sc), b[i].qs + 16 * s);
    }
  }
}

}  // namespace kvtrim::detail
