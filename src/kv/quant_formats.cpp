// Scalar reference codecs of the cache's quantised precisions (see quant_formats.h).
// fp8 E4M3 follows the OCP 8-bit floating point specification (E4M3: no infinities, one NaN
// mantissa pattern, saturating conversion); q4 follows llama.cpp's quantize_row_q4_0_ref
// (ggml/src/ggml-quants.c), evaluated in the same f32 steps (this file is compiled without
// FMA contraction, so x·id + 8.5 rounds twice as it does there).
#include "kv/quant_formats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/fp16.h"

namespace kvtrim::kv {

uint8_t fp8_e4m3_from_f32(float x) {
  const uint32_t w = fp32_to_bits(x);
  const auto sign = static_cast<uint8_t>((w >> 24) & 0x80u);
  const uint32_t a = w & 0x7fffffffu;
  if (a > 0x7f800000u) return 0;                                    // NaN -> +0
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf): ±448
  if (a < 0x3c800000u) {  // below 2^-6, the smallest normal: subnormal steps of 2^-9
    const float m = fp32_from_bits(a) * 512.f;  // exact, in [0, 8)
    auto q = static_cast<uint32_t>(m);
    const float frac = m - static_cast<float>(q);
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) ++q;  // 8 is 0x08, the smallest normal
    return static_cast<uint8_t>(sign | q);
  }
  // Normal: round the 23-bit mantissa to 3 bits, nearest even (a carry bumps the exponent);
  // (a >> 20) is then (f32 biased exponent << 3 | mantissa) and the biases differ by 120.
  const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  return static_cast<uint8_t>(sign | (r - (120u << 3)));
}

float fp8_e4m3_to_f32(uint8_t b) {
  if ((b & 0x7fu) == 0x7fu) return std::numeric_limits<float>::quiet_NaN();
  // f16 bits sign << 15 | exponent << 10 | mantissa << 7 are the value · 2^-8 (exponent bias
  // 15 instead of 7; subnormals m·2^-9 land on f16 subnormals m·2^-17): what the kernels use.
  const auto h = static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
  return fp16_to_fp32(h) * 256.f;
}

float q8_encode(const float* x, int64_t d, int8_t* codes, int64_t stride) {
  float amax = 0;
  for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / 127.f;
  const float inv = scale > 0 ? 1.f / scale : 0.f;
  for (int64_t i = 0; i < d; ++i) {
    const float c = std::nearbyint(x[i] * inv);
    // NaN (a NaN or inf in the row, from a damaged model) is stored as 0: converting it would
    // be undefined, and the row's scale is NaN or inf anyway.
    codes[i * stride] = c == c ? static_cast<int8_t>(std::clamp(c, -127.f, 127.f)) : int8_t{0};
  }
  return scale;
}

float fp8_encode(const float* x, int64_t d, uint8_t* codes, int64_t stride) {
  float amax = 0;
  for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / kFp8E4M3Max;
  for (int64_t i = 0; i < d; ++i)
    codes[i * stride] = scale > 0 ? fp8_e4m3_from_f32(x[i] / scale) : uint8_t{0};
  return scale;
}

uint16_t q4_encode_block(const float* x, int64_t n, uint8_t* codes) {
  float amax = 0, max = 0;  // largest |x| and the (first) element that has it
  for (int64_t j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float y = x[j] * id;  // in [-8, 8] up to rounding, so y + 8.5 > 0 and trunc = floor
    const float z = y + 8.5f;
    // Clamped as a float first (the same codes as llama.cpp's MIN(15, (int8_t)z) for every
    // finite z in range): a NaN or huge z from a non-finite row must not reach the conversion.
    codes[j] = static_cast<uint8_t>(static_cast<int>(std::clamp(z == z ? z : 8.f, 0.f, 15.f)));
  }
  return fp32_to_fp16(d);
}

void q4_encode_key(const float* x, int64_t d, int64_t t, uint8_t* k, uint16_t* k_scale) {
  uint8_t c[kQ4Block];
  const bool odd = t % 2 != 0;
  for (int64_t b = 0; b * kQ4Block < d; ++b) {
    const int64_t i0 = b * kQ4Block, n = std::min(kQ4Block, d - i0);
    k_scale[q4_key_scale_index(t, b, d)] = q4_encode_block(x + i0, n, c);
    for (int64_t j = 0; j < n; ++j) {
      uint8_t& byte = k[q4_key_byte(t, i0 + j, d)];
      byte = odd ? static_cast<uint8_t>((byte & 0x0fu) | (c[j] << 4)) : c[j];
    }
  }
}

void q4_decode_key(const uint8_t* k, const uint16_t* k_scale, int64_t t, int64_t d, float* x) {
  const int shift = t % 2 != 0 ? 4 : 0;
  for (int64_t i = 0; i < d; ++i) {
    const float s = fp16_to_fp32(k_scale[q4_key_scale_index(t, i / kQ4Block, d)]);
    const int c = (k[q4_key_byte(t, i, d)] >> shift) & 0xf;
    x[i] = s * static_cast<float>(c - 8);
  }
}

void q4_encode_row(const float* x, int64_t dv, uint8_t* row, uint16_t* scale) {
  uint8_t c[kQ4Block + 1];
  for (int64_t b = 0; b * kQ4Block < dv; ++b) {
    const int64_t i0 = b * kQ4Block, n = std::min(kQ4Block, dv - i0);
    scale[b] = q4_encode_block(x + i0, n, c);
    c[n] = 0;  // an odd tail leaves the last high nibble 0
    for (int64_t j = 0; j < n; j += 2)
      row[(i0 + j) / 2] = static_cast<uint8_t>(c[j] | (c[j + 1] << 4));
  }
}

void q4_decode_row(const uint8_t* row, const uint16_t* scale, int64_t dv, float* x) {
  for (int64_t i = 0; i < dv; ++i) {
    const int c = (row[i / 2] >> (4 * (i % 2))) & 0xf;
    x[i] = fp16_to_fp32(scale[i / kQ4Block]) * static_cast<float>(c - 8);
  }
}

namespace {
// The q4 code of z = x·id + 8.5: floor(z) clamped to [0, 15], clamped as a float so that a NaN
// or huge z (a non-finite row, from a damaged model) never reaches an undefined conversion; NaN
// gives 8 (zero).
int q4_code(float z) {
  return z == z ? static_cast<int>(std::clamp(std::floor(z), 0.f, 15.f)) : 8;
}

}  // namespace

// (quant_formats.h)
float q4_encode_search(const float* x, int64_t n, uint8_t* codes, bool round_f16) {
  float amax = 0, m = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      m = x[j];
    }
  }
  static constexpr float kShrink[] = {1.f, 15.f / 16, 7.f / 8, 13.f / 16, 3.f / 4};
  float best_d = m / -8.f, best_err = std::numeric_limits<float>::infinity();
  for (float f : kShrink) {
    const float d = m / -8.f * f, id = d != 0.f ? 1.f / d : 0.f;
    const float ds = round_f16 ? fp16_to_fp32(fp32_to_fp16(d)) : d;
    float err = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int c = q4_code(x[j] * id + 8.5f);
      const float e = x[j] - ds * static_cast<float>(c - 8);
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_d = d;
    }
  }
  const float id = best_d != 0.f ? 1.f / best_d : 0.f;
  for (int64_t j = 0; j < n; ++j)
    codes[j] = static_cast<uint8_t>(q4_code(x[j] * id + 8.5f));
  return best_d;
}

}  // namespace kvtrim::kv
