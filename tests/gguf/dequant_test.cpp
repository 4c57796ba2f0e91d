// Reference (de)quantization: hand-built blocks with known values per type, quantize ->
// dequantize error bounds on random data, and the error paths.
#include "ops/dequant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace kvtrim {
namespace {

constexpr uint16_t kHalf = 0x3800;  // fp16 0.5
constexpr uint16_t kOne = 0x3c00;   // fp16 1.0
constexpr uint16_t kQuarter = 0x3400;  // fp16 0.25
constexpr uint16_t kMinusOne = 0xbc00;  // fp16 -1.0

std::vector<float> dequant(GgmlType t, const void* src, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n), -12345.0f);
  dequantize_row(t, src, y.data(), n);
  return y;
}

// ---- known values -----------------------------------------------------------------------

TEST(DequantKnown, Q4_0) {
  BlockQ4_0 b{};
  b.d = kHalf;
  // low nibble of qs[j] = j (element j), high nibble = 15 - j (element j + 16)
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(GgmlType::Q4_0, &b, 32);
  EXPECT_EQ(y[0], -4.0f);   // (0 - 8) * 0.5
  EXPECT_EQ(y[8], 0.0f);    // (8 - 8) * 0.5
  EXPECT_EQ(y[15], 3.5f);   // (15 - 8) * 0.5
  EXPECT_EQ(y[16], 3.5f);   // (15 - 8) * 0.5
  EXPECT_EQ(y[31], -4.0f);  // (0 - 8) * 0.5
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;
    EXPECT_EQ(y[j + 16], (7 - j) * 0.5f) << j;
  }
}

TEST(DequantKnown, Q4_1) {
  BlockQ4_1 b{};
  b.d = kQuarter;
  b.m = kMinusOne;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (j << 4));
  const auto y = dequant(GgmlType::Q4_1, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.25f - 1.0f) << j;
    EXPECT_EQ(y[j + 16], j * 0.25f - 1.0f) << j;
  }
}

TEST(DequantKnown, Q5_0) {
  BlockQ5_0 b{};
  b.d = kOne;
  b.qs[0] = 0x21;  // element 0: low 4 bits 1, element 16: low 4 bits 2
  b.qs[5] = 0xf0;  // element 5: 0, element 21: 15
  // qh (little-endian u32): bit 0 -> element 0, bit 21 -> element 21, bit 31 -> element 31
  const uint32_t qh = (1u << 0) | (1u << 21) | (1u << 31);
  std::memcpy(b.qh, &qh, 4);
  const auto y = dequant(GgmlType::Q5_0, &b, 32);
  EXPECT_EQ(y[0], 1.0f);     // (1 | 16) - 16
  EXPECT_EQ(y[16], -14.0f);  // 2 - 16
  EXPECT_EQ(y[5], -16.0f);   // 0 - 16
  EXPECT_EQ(y[21], 15.0f);   // (15 | 16) - 16
  EXPECT_EQ(y[31], 0.0f);    // (0 | 16) - 16
  EXPECT_EQ(y[1], -16.0f);
}

TEST(DequantKnown, Q5_1) {
  BlockQ5_1 b{};
  b.d = kHalf;
  b.m = kOne;
  b.qs[3] = 0x7f;  // element 3: 15, element 19: 7
  const uint32_t qh = (1u << 3) | (1u << 19);
  std::memcpy(b.qh, &qh, 4);
  const auto y = dequant(GgmlType::Q5_1, &b, 32);
  EXPECT_EQ(y[3], 31 * 0.5f + 1.0f);
  EXPECT_EQ(y[19], 23 * 0.5f + 1.0f);
  EXPECT_EQ(y[0], 1.0f);
}

TEST(DequantKnown, Q8_0) {
  BlockQ8_0 b{};
  b.d = 0x4000;  // 2.0
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
  const auto y = dequant(GgmlType::Q8_0, &b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 2.0f * static_cast<float>(j * 8 - 128)) << j;
}

// Q4_K: 8 sub-blocks of 32, x = d*sc[s]*q - dmin*m[s]. The 12 scale bytes below are
// written out by hand from the 6-bit fields:
//   bytes 0-3: sc[0..3] in bits 0-5, bits 4-5 of sc[4..7] in bits 6-7
//   bytes 4-7: m[0..3] in bits 0-5, bits 4-5 of m[4..7] in bits 6-7
//   bytes 8-11: low 4 bits of sc[4..7] | low 4 bits of m[4..7] << 4
TEST(DequantKnown, Q4_K) {
  const int sc[8] = {1, 2, 3, 4, 17, 35, 50, 63};
  const int m[8] = {0, 5, 10, 63, 16, 33, 1, 48};
  BlockQ4_K b{};
  b.d = kOne;
  b.dmin = kHalf;
  const uint8_t scales[12] = {
      1 | (1 << 6),   // sc0 = 1,  sc4 = 17 = 0b01'0001 -> high bits 01
      2 | (2 << 6),   // sc1 = 2,  sc5 = 35 = 0b10'0011 -> 10
      3 | (3 << 6),   // sc2 = 3,  sc6 = 50 = 0b11'0010 -> 11
      4 | (3 << 6),   // sc3 = 4,  sc7 = 63 = 0b11'1111 -> 11
      0 | (1 << 6),   // m0 = 0,   m4 = 16 = 0b01'0000 -> 01
      5 | (2 << 6),   // m1 = 5,   m5 = 33 = 0b10'0001 -> 10
      10 | (0 << 6),  // m2 = 10,  m6 = 1  = 0b00'0001 -> 00
      63 | (3 << 6),  // m3 = 63,  m7 = 48 = 0b11'0000 -> 11
      0x1 | (0x0 << 4),  // sc4 low 0001, m4 low 0000
      0x3 | (0x1 << 4),  // sc5 low 0011, m5 low 0001
      0x2 | (0x1 << 4),  // sc6 low 0010, m6 low 0001
      0xf | (0x0 << 4),  // sc7 low 1111, m7 low 0000
  };
  std::memcpy(b.scales, scales, 12);
  // qs[32*p + l]: low nibble = element 64p + l (sub-block 2p), high = element 64p + 32 + l.
  // Choose q = l % 16 for even sub-blocks and 15 - l % 16 for odd ones.
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l) b.qs[32 * p + l] = static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4));
  const auto y = dequant(GgmlType::Q4_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32, l = e % 32;
    const int q = (s % 2 == 0) ? l % 16 : 15 - l % 16;
    EXPECT_EQ(y[e], 1.0f * static_cast<float>(sc[s] * q) - 0.5f * static_cast<float>(m[s])) << e;
  }
  EXPECT_EQ(y[0], 0.0f);                     // 1*1*0 - 0.5*0
  EXPECT_EQ(y[255], 63.0f * 0 - 24.0f);      // s=7, l=31: q = 15 - 15 = 0; - 0.5*48
  EXPECT_EQ(y[224], 63.0f * 15 - 24.0f);     // s=7, l=0: q = 15
  EXPECT_EQ(y[100], 4.0f * 11 - 31.5f);      // s=3, l=4: q = 15 - 4; - 0.5*63
}

// Q5_K: as Q4_K plus a 5th bit: bit s of qh[l] is bit 4 of element 32*s + l.
TEST(DequantKnown, Q5_K) {
  BlockQ5_K b{};
  b.d = kHalf;
  b.dmin = kOne;
  // all sc = 2, m = 3: bytes 0-3 = 2, bytes 4-7 = 3, bytes 8-11 = 2 | 3 << 4
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = 2;
    b.scales[j + 4] = 3;
    b.scales[j + 8] = 2 | (3 << 4);
  }
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l) b.qs[32 * p + l] = static_cast<uint8_t>((l % 16) | ((l / 2) << 4));
  for (int l = 0; l < 32; ++l) b.qh[l] = static_cast<uint8_t>(l % 2 ? 0xaa : 0x55);  // odd l: odd sub-blocks
  const auto y = dequant(GgmlType::Q5_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32, l = e % 32;
    const int lo = (s % 2 == 0) ? l % 16 : l / 2;
    const int hi = ((l % 2 == 1) == (s % 2 == 1)) ? 16 : 0;
    EXPECT_EQ(y[e], 0.5f * 2.0f * static_cast<float>(lo + hi) - 3.0f) << e;
  }
}

// Q6_K: 16 sub-blocks of 16 with int8 scales; element e in half h = e / 128 at position
// p = e % 128, l = p % 32, g = p / 32 takes its low 4 bits from ql[64h + l + 32*(g&1)]
// (low nibble for g < 2, high for g >= 2) and its 2 high bits from bits 2g..2g+1 of
// qh[32h + l]; x = d * scale[e / 16] * (q - 32).
TEST(DequantKnown, Q6_K) {
  BlockQ6_K b{};
  b.d = kHalf;
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s - 8);
  auto q_of = [](int e) { return (e * 7 + 3) % 64; };
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, p = e % 128, l = p % 32, g = p / 32;
    const int q = q_of(e);
    uint8_t& lo = b.ql[64 * h + l + 32 * (g & 1)];
    lo = static_cast<uint8_t>(lo | ((q & 0xf) << (g >= 2 ? 4 : 0)));
    uint8_t& hi = b.qh[32 * h + l];
    hi = static_cast<uint8_t>(hi | ((q >> 4) << (2 * g)));
  }
  const auto y = dequant(GgmlType::Q6_K, &b, 256);
  for (int e = 0; e < 256; ++e)
    EXPECT_EQ(y[e], 0.5f * static_cast<float>(e / 16 - 8) * static_cast<float>(q_of(e) - 32)) << e;
  EXPECT_EQ(y[0], 0.5f * -8 * (3 - 32));
  EXPECT_EQ(y[255], 0.5f * 7 * ((255 * 7 + 3) % 64 - 32));
}

TEST(DequantKnown, PlainTypes) {
  const float f[4] = {1.5f, -2.25f, 0.0f, 65504.0f};
  EXPECT_EQ(dequant(GgmlType::F32, f, 4), std::vector<float>(f, f + 4));
  const uint16_t h[4] = {0x3e00, 0xc080, 0x0000, 0x7bff};  // 1.5, -2.25, 0, 65504
  EXPECT_EQ(dequant(GgmlType::F16, h, 4), std::vector<float>(f, f + 4));
  const uint16_t bf[3] = {0x3fc0, 0xc010, 0x0000};  // 1.5, -2.25, 0
  EXPECT_EQ(dequant(GgmlType::BF16, bf, 3), std::vector<float>(f, f + 3));
}

TEST(DequantKnown, MultipleBlocksAdvance) {
  BlockQ8_0 b[3]{};
  for (int i = 0; i < 3; ++i) {
    b[i].d = fp32_to_fp16(static_cast<float>(i + 1));
    for (int j = 0; j < 32; ++j) b[i].qs[j] = 1;
  }
  const auto y = dequant(GgmlType::Q8_0, b, 96);
  for (int i = 0; i < 96; ++i) EXPECT_EQ(y[i], static_cast<float>(i / 32 + 1)) << i;
}

// ---- quantize -> dequantize -------------------------------------------------------------

struct Case {
  GgmlType type;
  double max_rel_rmse;  // rmse / std on standard normal data
};

class QuantRoundTrip : public ::testing::TestWithParam<Case> {};

// Per-block bound on |x - dequant(quant(x))|, derived from each quantizer's rule (see
// dequant.cpp); `blk` is one block of the input.
double error_bound(GgmlType t, const float* blk, int n) {
  double amax = 0, mn = 0, mx = 0, mn_raw = blk[0], mx_raw = blk[0];
  for (int i = 0; i < n; ++i) {
    amax = std::max(amax, std::fabs(double{blk[i]}));
    mn = std::min(mn, double{blk[i]});
    mx = std::max(mx, double{blk[i]});
    mn_raw = std::min(mn_raw, double{blk[i]});
    mx_raw = std::max(mx_raw, double{blk[i]});
  }
  // float rounding, plus fp16 scales that fall into the subnormal range (absolute
  // rounding 2^-25, times up to 128 levels) for the tiny-scale data
  const double slop = 1e-6 * amax + 128 * std::ldexp(1.0, -25);
  switch (t) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return amax * std::ldexp(1.0, -11) + 6e-8;
    case GgmlType::BF16: return amax * std::ldexp(1.0, -8);
    // the extreme opposite the largest magnitude clamps: one full step
    case GgmlType::Q4_0: return amax / 8 * (1 + 2e-3) + slop;
    case GgmlType::Q5_0: return amax / 16 * (1 + 2e-3) + slop;
    // half a step plus fp16 rounding of d and m
    case GgmlType::Q4_1: return 0.5 * (mx_raw - mn_raw) / 15 + 2e-3 * amax + slop;
    case GgmlType::Q5_1: return 0.5 * (mx_raw - mn_raw) / 31 + 2e-3 * amax + slop;
    case GgmlType::Q8_0: return 0.5 * amax / 127 + 1e-3 * amax + slop;
    // half a sub-block step; the step is at most range/levels inflated by the 6-bit
    // quantization of scale and min against the super-block maxima
    case GgmlType::Q4_K: return 0.5 * (mx - mn) / 15 * (1 + 3.0 / 63) + slop;
    case GgmlType::Q5_K: return 0.5 * (mx - mn) / 31 * (1 + 3.0 / 63) + slop;
    case GgmlType::Q6_K: return 0.5 * amax / 31 * (1 + 2.0 / 127) + slop;
    default: return 0;
  }
}

void check_round_trip(GgmlType t, const std::vector<float>& x, const char* what) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(ggml_row_size(t, n));
  quantize_row(t, x.data(), q.data(), n);
  std::vector<float> y(x.size());
  dequantize_row(t, q.data(), y.data(), n);
  const int bs = static_cast<int>(ggml_traits(t).block_size);
  const int span = bs == 1 ? 1 : bs;  // k-quants: bound per super-block
  for (int64_t b0 = 0; b0 < n; b0 += span) {
    const double bound = error_bound(t, x.data() + b0, span);
    for (int64_t i = b0; i < b0 + span; ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << what << " " << ggml_type_name(t) << " element " << i;
      ASSERT_LE(std::fabs(double{x[i]} - y[i]), bound)
          << what << " " << ggml_type_name(t) << " element " << i << " x=" << x[i] << " y=" << y[i];
    }
  }
}

TEST_P(QuantRoundTrip, ErrorWithinBoundOnRandomData) {
  const GgmlType t = GetParam().type;
  std::mt19937 rng(1234);
  const int64_t n = 4096;
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    check_round_trip(t, x, "normal");
    std::uniform_real_distribution<float> ud(-scale, 3 * scale);  // offset: exercises mins
    for (auto& v : x) v = ud(rng);
    check_round_trip(t, x, "uniform");
    for (auto& v : x) v = std::fabs(nd(rng));  // all positive
    check_round_trip(t, x, "positive");
    for (auto& v : x) v = -std::fabs(nd(rng));  // all negative
    check_round_trip(t, x, "negative");
    for (auto& v : x) v = nd(rng);
    for (int64_t i = 0; i < n; i += 97) x[i] *= 20;  // outliers
    check_round_trip(t, x, "outliers");
  }
}

TEST_P(QuantRoundTrip, RmseOnNormalData) {
  const GgmlType t = GetParam().type;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd;
  const int64_t n = 1 << 14;
  std::vector<float> x(n), y(n);
  for (auto& v : x) v = nd(rng);
  std::vector<uint8_t> q(ggml_row_size(t, n));
  quantize_row(t, x.data(), q.data(), n);
  dequantize_row(t, q.data(), y.data(), n);
  double se = 0, ss = 0;
  for (int64_t i = 0; i < n; ++i) {
    se += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    ss += double{x[i]} * x[i];
  }
  EXPECT_LE(std::sqrt(se / ss), GetParam().max_rel_rmse) << ggml_type_name(t);
}

TEST_P(QuantRoundTrip, ZeroAndConstantBlocks) {
  const GgmlType t = GetParam().type;
  const int64_t n = 512;
  std::vector<uint8_t> q(ggml_row_size(t, n));
  std::vector<float> y(n);
  for (float c : {0.0f, 1.0f, -3.5f}) {
    std::vector<float> x(n, c);
    quantize_row(t, x.data(), q.data(), n);
    dequantize_row(t, q.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << ggml_type_name(t) << " c=" << c;
      ASSERT_NEAR(y[i], c, std::fabs(c) * 0.13 + 1e-7) << ggml_type_name(t) << " c=" << c << " i=" << i;
    }
  }
}

// Thresholds: measured rmse/rms on N(0,1) plus ~15% (ggml's own reference quantizers give
// 0.087 / 0.079 / 0.043 / 0.038 / 0.0054 for the legacy types).
INSTANTIATE_TEST_SUITE_P(AllTypes, QuantRoundTrip,
                         ::testing::Values(Case{GgmlType::F32, 0.0}, Case{GgmlType::F16, 3e-4},
                                           Case{GgmlType::BF16, 2.5e-3}, Case{GgmlType::Q4_0, 0.10},
                                           Case{GgmlType::Q4_1, 0.092}, Case{GgmlType::Q5_0, 0.05},
                                           Case{GgmlType::Q5_1, 0.044}, Case{GgmlType::Q8_0, 0.0063},
                                           Case{GgmlType::Q4_K, 0.095}, Case{GgmlType::Q5_K, 0.045},
                                           Case{GgmlType::Q6_K, 0.023}),
                         [](const auto& info) { return std::string(ggml_type_name(info.param.type)); });

// ---- errors -----------------------------------------------------------------------------

TEST(DequantErrors, UnsupportedTypeNamesIt) {
  std::vector<uint8_t> buf(84);
  std::vector<float> y(256);
  try {
    dequantize_row(GgmlType::IQ2_XXS, buf.data(), y.data(), 256);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq2_xxs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_row(GgmlType::Q8_K, y.data(), buf.data(), 256), Error);
  EXPECT_THROW(dequantize_row(static_cast<GgmlType>(77), buf.data(), y.data(), 1), Error);
}

TEST(DequantErrors, PartialBlockRejected) {
  std::vector<uint8_t> buf(1024);
  std::vector<float> y(512);
  try {
    dequantize_row(GgmlType::Q4_K, buf.data(), y.data(), 100);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_row(GgmlType::Q4_0, y.data(), buf.data(), 33), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q8_0, buf.data(), y.data(), -32), Error);
}

}  // namespace
}  // namespace kvtrim
