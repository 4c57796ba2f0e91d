// The scalar reference codecs (kv/quant_formats.h) against independent formulas: fp8 E4M3
// exhaustively, q4 against a transcription of llama.cpp's quantize_row_q4_0_ref, and the
// storage layouts round-tripped.
#include "kv/quant_formats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/fp16.h"

namespace kvtrim {
namespace {

// E4M3 value of code b from the definition (sign, exponent bias 7, 3 mantissa bits).
double e4m3_value(int b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7);
  return (b & 0x80) ? -v : v;
}
bool e4m3_nan(int b) {
  return (b & 0x7f) == 0x7f;
}

TEST(QuantFormats, Fp8DecodesEveryCode) {
  for (int b = 0; b < 256; ++b) {
    const float got = kv::fp8_e4m3_to_f32(static_cast<uint8_t>(b));
    if (e4m3_nan(b)) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), e4m3_value(b)) << b;
    EXPECT_EQ(std::signbit(got), (b & 0x80) != 0) << b;
  }
  EXPECT_EQ(kv::fp8_e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(kv::fp8_e4m3_to_f32(0x01), std::ldexp(1.f, -9));
  EXPECT_EQ(kv::fp8_e4m3_to_f32(0x08), std::ldexp(1.f, -6));
}

TEST(QuantFormats, Fp8RoundTripsAndRoundsToNearestEven) {
  for (int b = 0; b < 256; ++b) {
    if (e4m3_nan(b)) continue;
    EXPECT_EQ(kv::fp8_e4m3_from_f32(kv::fp8_e4m3_to_f32(static_cast<uint8_t>(b))), b) << b;
  }
  // Midpoints between consecutive codes (same sign) round to the even code; anything just
  // off the midpoint goes to the nearer code.
  for (int sign : {0, 0x80}) {
    for (int b = 0; b < 0x7e; ++b) {
      const int lo = sign | b, hi = sign | (b + 1);
      const double a = e4m3_value(lo), c = e4m3_value(hi), mid = (a + c) / 2;
      const int even = (b % 2 == 0) ? lo : hi;
      EXPECT_EQ(kv::fp8_e4m3_from_f32(static_cast<float>(mid)), even) << lo;
      const float below = std::nextafter(static_cast<float>(mid), static_cast<float>(a));
      const float above = std::nextafter(static_cast<float>(mid), static_cast<float>(c));
      EXPECT_EQ(kv::fp8_e4m3_from_f32(below), lo) << lo;
      EXPECT_EQ(kv::fp8_e4m3_from_f32(above), hi) << lo;
    }
  }
  // Every float rounds to the nearest code (random sweep over magnitudes, ties excluded).
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> ex(-14, 9), u(1, 2);
  for (int it = 0; it < 100000; ++it) {
    const float x = std::ldexp(u(rng), static_cast<int>(ex(rng))) * (it % 2 ? -1.f : 1.f);
    if (std::fabs(x) >= 448) continue;
    const int got = kv::fp8_e4m3_from_f32(x);
    const double err = std::fabs(e4m3_value(got) - x);
    for (int b = 0; b < 256; ++b) {
      if (!e4m3_nan(b)) {
        ASSERT_LE(err, std::fabs(e4m3_value(b) - x)) << x << " -> " << got;
      }
    }
  }
}

TEST(QuantFormats, Fp8SaturatesAndFlushes) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.f, 449.f, 464.f, 480.f, 1e6f, 3e38f, inf})
    EXPECT_EQ(kv::fp8_e4m3_from_f32(x), 0x7e) << x;
  for (float x : {-448.f, -470.f, -1e9f, -inf}) EXPECT_EQ(kv::fp8_e4m3_from_f32(x), 0xfe) << x;
  EXPECT_EQ(kv::fp8_e4m3_from_f32(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(kv::fp8_e4m3_from_f32(447.f), 0x7e);  // rounds to 448
  EXPECT_EQ(kv::fp8_e4m3_from_f32(431.f), 0x7d);  // nearer 416 than 448
  // tiny: the smallest subnormal 2^-9, half of it (a tie to 0), just above half, zero, -0
  const float s = std::ldexp(1.f, -9);
  EXPECT_EQ(kv::fp8_e4m3_from_f32(s), 0x01);
  EXPECT_EQ(kv::fp8_e4m3_from_f32(s / 2), 0x00);
  EXPECT_EQ(kv::fp8_e4m3_from_f32(std::nextafter(s / 2, 1.f)), 0x01);
  EXPECT_EQ(kv::fp8_e4m3_from_f32(1.5f * s), 0x02);  // tie between 1 and 2: even
  EXPECT_EQ(kv::fp8_e4m3_from_f32(1e-30f), 0x00);
  EXPECT_EQ(kv::fp8_e4m3_from_f32(-1e-30f), 0x80);
  EXPECT_EQ(kv::fp8_e4m3_from_f32(0.f), 0x00);
  EXPECT_EQ(kv::fp8_e4m3_from_f32(-0.f), 0x80);
  EXPECT_EQ(kv::fp8_e4m3_from_f32(std::ldexp(1.f, -6) * 0.99f), 0x08);  // rounds up to normal
}

TEST(QuantFormats, Q8AndFp8Vectors) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (int64_t d : {1, 7, 64, 256}) {
    for (int64_t stride : {1, 16}) {
      std::vector<float> x(d);
      for (float& v : x) v = nd(rng) * 3;
      std::vector<int8_t> c8(d * stride);
      std::vector<uint8_t> cf(d * stride);
      const float s8 = kv::q8_encode(x.data(), d, c8.data(), stride);
      const float sf = kv::fp8_encode(x.data(), d, cf.data(), stride);
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      EXPECT_EQ(s8, amax / 127.f);
      EXPECT_EQ(sf, amax / 448.f);
      for (int64_t i = 0; i < d; ++i) {
        const int8_t c = c8[i * stride];
        EXPECT_EQ(c, static_cast<int8_t>(std::clamp(std::nearbyint(x[i] / s8), -127.f, 127.f)))
            << i;
        EXPECT_NEAR(c * s8, x[i], 0.5001 * s8);
        EXPECT_EQ(cf[i * stride], kv::fp8_e4m3_from_f32(x[i] / sf));
        EXPECT_NEAR(sf * kv::fp8_e4m3_to_f32(cf[i * stride]), x[i], std::fabs(x[i]) / 16 + 1e-6);
      }
    }
  }
  std::vector<float> z(9, 0.f);
  std::vector<int8_t> c8(9, 1);
  std::vector<uint8_t> cf(9, 1);
  EXPECT_EQ(kv::q8_encode(z.data(), 9, c8.data(), 1), 0.f);
  EXPECT_EQ(kv::fp8_encode(z.data(), 9, cf.data(), 1), 0.f);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(c8[i] | cf[i], 0);
}

// llama.cpp's quantize_row_q4_0_ref (ggml/src/ggml-quants.c) for one block of qk = n values,
// transcribed as is: codes one per byte instead of packed.
uint16_t q4_0_ref(const float* x, int n, uint8_t* q) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; j++) {
    const float v = x[j];
    if (amax < std::fabs(v)) {
      amax = std::fabs(v);
      max = v;
    }
  }
  const float d = max / -8;
  const float id = d ? 1.0f / d : 0.0f;
  for (int j = 0; j < n; ++j) {
    const float x0 = x[j] * id;
    q[j] = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f))));
  }
  return fp32_to_fp16(d);
}

TEST(QuantFormats, Q4BlocksMatchLlamaCpp) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> small(-8, 8);
  for (int it = 0; it < 4000; ++it) {
    const int n = it % 5 == 0 ? 1 + it % 32 : 32;
    std::vector<float> x(n);
    for (float& v : x) {
      switch (it % 4) {
        case 0:
          v = nd(rng);
          break;
        case 1:
          v = nd(rng) * 1e-3f;
          break;
        case 2:
          v = static_cast<float>(small(rng)) * 0.25f;
          break;  // exact ties and equal |max|
        default:
          v = nd(rng) * 100;
          break;
      }
    }
    if (it % 97 == 0) std::fill(x.begin(), x.end(), 0.f);
    std::vector<uint8_t> got(n), want(n);
    EXPECT_EQ(kv::q4_encode_block(x.data(), n, got.data()), q4_0_ref(x.data(), n, want.data()));
    EXPECT_EQ(got, want) << it;
  }
  // the first element of largest |x| gives the sign of the scale
  const float a[4] = {-2.f, 1.f, 2.f, 0.5f};
  uint8_t c[4];
  EXPECT_EQ(fp16_to_fp32(kv::q4_encode_block(a, 4, c)), 0.25f);
  EXPECT_EQ(c[0], 0);
  EXPECT_EQ(c[2], 15);  // x·id + 8.5 = 16.5: truncated to 16, clamped to 15
}

TEST(QuantFormats, Q4KeyTilesAndValueRows) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  for (int64_t d : {1, 7, 16, 33, 64, 128, 256}) {
    const int64_t n = 37, n_tiles = (n + kv::kKeyTile - 1) / kv::kKeyTile;
    const int64_t nb = kv::q4_blocks(d), rb = kv::q4_row_bytes(d);
    std::vector<float> x(n * d), y(d);
    for (float& v : x) v = nd(rng);
    std::vector<uint8_t> k(n_tiles * d * kv::kKeyTile / 2, 0xaa), v(n * rb, 0xaa);
    std::vector<uint16_t> ks(n_tiles * nb * kv::kKeyTile), vs(n * nb);
    for (int64_t t = 0; t < n; ++t) {
      kv::q4_encode_key(x.data() + t * d, d, t, k.data(), ks.data());
      kv::q4_encode_row(x.data() + t * d, d, v.data() + t * rb, vs.data() + t * nb);
    }
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x.data() + t * d;
      std::vector<uint8_t> want(d);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t i0 = b * kv::kQ4Block, m = std::min(kv::kQ4Block, d - i0);
        const uint16_t s = q4_0_ref(xt + i0, static_cast<int>(m), want.data() + i0);
        EXPECT_EQ(ks[kv::q4_key_scale_index(t, b, d)], s);
        EXPECT_EQ(vs[t * nb + b], s);
      }
      for (int64_t i = 0; i < d; ++i) {
        EXPECT_EQ((k[kv::q4_key_byte(t, i, d)] >> (t % 2 ? 4 : 0)) & 15, want[i]) << t << " " << i;
        EXPECT_EQ((v[t * rb + i / 2] >> (i % 2 ? 4 : 0)) & 15, want[i]) << t << " " << i;
      }
      if (d % 2) {
        EXPECT_EQ(v[t * rb + rb - 1] >> 4, 0);
      }
      kv::q4_decode_key(k.data(), ks.data(), t, d, y.data());
      std::vector<float> yr(d);
      kv::q4_decode_row(v.data() + t * rb, vs.data() + t * nb, d, yr.data());
      for (int64_t i = 0; i < d; ++i) {
        const float s = fp16_to_fp32(ks[kv::q4_key_scale_index(t, i / kv::kQ4Block, d)]);
        EXPECT_EQ(y[i], s * (want[i] - 8));
        EXPECT_EQ(yr[i], y[i]);
        // within half a step, or one step for -m (code 16 clamped to 15)
        EXPECT_NEAR(y[i], xt[i], std::fabs(s) * 1.0001 + 1e-3 * std::fabs(xt[i]));
      }
    }
    // an even token written last clears its odd partner's nibble (appends write in order)
    if (n % 2) {
      EXPECT_EQ(k[kv::q4_key_byte(n - 1, 0, d)] >> 4, 0);
    }
  }
}

}  // namespace
}  // namespace kvtrim
