// The storage types' table (kv/kv_type.h): every type has its entry, names and llama.cpp's aliases
// parse, an unknown name is an error naming the accepted ones, each codec round-trips within its
// format's own bound, the byte counts follow the formats, and the rotation rule is the one the
// cache applies.
#include "kv/kv_type.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/kv_cache.h"

namespace kvtrim {
namespace {

TEST(KvType, EveryTypeHasItsEntryInOrder) {
  const auto& all = kv_types();
  ASSERT_EQ(all.size(), static_cast<size_t>(kKvDtypeCount));
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(all[i].type), i);
    EXPECT_EQ(&kv_type(all[i].type), &all[i]);
    EXPECT_TRUE(all[i].code_bits == 32 || all[i].code_bits == 16 || all[i].code_bits == 8 || all[i].code_bits == 4);
    EXPECT_NE(all[i].ops.encode, nullptr);
    EXPECT_NE(all[i].ops.decode, nullptr);
    EXPECT_NE(all[i].ops.scores, nullptr);
    EXPECT_NE(all[i].ops.accum, nullptr);
  }
  EXPECT_THROW(kv_type(static_cast<KvDtype>(200)), Error);
}

TEST(KvType, NamesAndLlamaCppAliasesParse) {
  EXPECT_EQ(kv_dtype_from_name("f16"), KvDtype::kF16);
  EXPECT_EQ(kv_dtype_from_name("q8_0"), KvDtype::kQ8);  // llama.cpp's -ctk names
  EXPECT_EQ(kv_dtype_from_name("q4_0"), KvDtype::kQ4);
  EXPECT_EQ(kv_dtype_from_name("fp8_e4m3"), KvDtype::kFP8);
  for (const KvTypeInfo& t : kv_types()) {
    EXPECT_EQ(kv_dtype_from_name(t.name), t.type);
    EXPECT_STREQ(kv_dtype_name(t.type), t.name);
    if (t.alias) {
      EXPECT_EQ(kv_dtype_from_name(t.alias), t.type);
    }
  }
  const std::vector<std::string> names = kv_type_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size())
      << "a name twice";
  EXPECT_GE(names.size(), static_cast<size_t>(kKvDtypeCount));
  EXPECT_EQ(kv_pair_name(KvDtype::kQ8, KvDtype::kQ8), "q8");
  EXPECT_EQ(kv_pair_name(KvDtype::kQ8, KvDtype::kF16), "k=q8,v=f16");
  try {
    kv_dtype_from_name("q5_1");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'q5_1'"), std::string::npos) << msg;
    for (const std::string& n : names) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

// Bytes of one dense vector, from the formats (quant_formats.h), not from the table's formula.
TEST(KvType, DenseRowBytesFollowTheFormats) {
  EXPECT_EQ(kv_type(KvDtype::kF32).dense_row_bytes(64), 256u);
  EXPECT_EQ(kv_type(KvDtype::kF16).dense_row_bytes(64), 128u);
  EXPECT_EQ(kv_type(KvDtype::kBF16).dense_row_bytes(48), 96u);
  EXPECT_EQ(kv_type(KvDtype::kQ8).dense_row_bytes(64), 64u + 4);   // codes + f32 scale
  EXPECT_EQ(kv_type(KvDtype::kFP8).dense_row_bytes(80), 80u + 4);
  EXPECT_EQ(kv_type(KvDtype::kQ4).dense_row_bytes(64), 32u + 2 * 2);  // two f16 block scales
  EXPECT_EQ(kv_type(KvDtype::kQ4).dense_row_bytes(48), 24u + 2 * 2);  // a partial second block
  EXPECT_EQ(kv_type(KvDtype::kQ4).dense_row_bytes(33), 17u + 2 * 2);  // an odd width: a half byte
}

// encode then decode: exact for f32; otherwise within the format's rounding: half an ulp of the
// element (f16: 2^-11 relative, bf16: 2^-8; fp8 e4m3: 2^-4 of the scaled element) or half a grid
// step (q8: scale / 2 = max|x| / 254; q4: |scale| / 2, plus how far an element lies beyond the
// grid's ±7 steps: q4's search may pick a smaller scale that clips the largest elements).
TEST(KvType, CodecsRoundTripWithinTheirFormatsBound) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const KvTypeInfo& t : kv_types()) {
    for (int n : {1, 31, 64, 77}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = nd(rng);
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      std::vector<uint8_t> codes(static_cast<size_t>(n) * 4);
      const float scale = t.ops.encode(x.data(), n, codes.data(), /*round_f16=*/false);
      std::vector<uint8_t> packed = codes;
      if (t.code_bits == 4) {  // one code per byte from encode; decode reads nibbles
        std::fill(packed.begin(), packed.end(), uint8_t{0});
        for (int j = 0; j < n; ++j) packed[j / 2] |= static_cast<uint8_t>(codes[j] << ((j & 1) * 4));
      }
      for (int j = 0; j < n; ++j) {
        const float got = t.ops.decode(packed.data(), j, scale), want = x[static_cast<size_t>(j)];
        double bound = 0;
        switch (t.type) {
          case KvDtype::kF32: bound = 0; break;
          case KvDtype::kF16: bound = std::fabs(want) * std::ldexp(1.0, -11); break;
          case KvDtype::kBF16: bound = std::fabs(want) * std::ldexp(1.0, -8); break;
          case KvDtype::kFP8: bound = std::fabs(want) * std::ldexp(1.0, -4) + scale * std::ldexp(1.0, -10); break;
          case KvDtype::kQ8: bound = amax / 254.0 * 1.0001; break;
          case KvDtype::kQ4: {
            const double st = std::fabs(scale);
            bound = st * 0.5001 + std::max(0.0, std::fabs(want) - 7 * st);
            EXPECT_GE(st, amax / 8.0 * 0.75 * 0.999) << "q4's search tries scales down to 3/4 of q4_0's";
            break;
          }
          case KvDtype::kE5M2:  // half a step of 2 mantissa bits; subnormal steps of 2^-16
            bound = std::fabs(want) * std::ldexp(1.0, -3) + std::ldexp(1.0, -17);
            break;
          default:
            FAIL() << t.name << ": no round-trip bound for this type (add its format's bound here)";
        }
        EXPECT_LE(std::fabs(got - want), bound) << t.name << " n " << n << " element " << j;
      }
    }
  }
}

// E5M2 against a brute force over its 256 codes: each code is the top byte of an f16 of the same
// value, and encoding picks the nearest finite code (ties: the even one, i.e. mantissa bit 0
// clear), saturating past the largest (±57344); NaN encodes as 0x7F.
TEST(KvType, E5m2IsTheNearestTopByteOfAnF16) {
  const KvTypeInfo& t = kv_type(KvDtype::kE5M2);
  std::vector<std::pair<float, uint8_t>> grid;  // finite codes by value
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float v = t.ops.decode(&code, 0, 1.f);
    ASSERT_EQ(fp32_to_bits(v), fp32_to_bits(fp16_to_fp32(static_cast<uint16_t>(c << 8)))) << c;
    if ((c & 0x7C) == 0x7C) continue;  // infinities and NaNs: never written
    grid.emplace_back(v, code);
    uint8_t back = 0;
    t.ops.encode(&v, 1, &back, false);
    if (v != 0.f) {
      EXPECT_EQ(back, code) << "a code's own value encodes to it: " << c;
    }
  }
  auto nearest = [&](float x) {
    if (std::fabs(x) >= 57344.f) return static_cast<uint8_t>(x < 0 ? 0xFB : 0x7B);
    uint8_t best = 0;
    double bd = INFINITY;
    for (auto [v, c] : grid) {
      const double dist = std::fabs(double(v) - double(x));
      if (dist < bd || (dist == bd && (c & 1) == 0 && (best & 1) == 1)) {
        bd = dist;
        best = c;
      }
    }
    if (x == 0.f || best == 0 || best == 0x80)
      best = std::signbit(x) ? 0x80 : 0;  // ±0 keeps x's sign
    return best;
  };
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> ex(-20, 17);
  std::vector<float> xs = {0.f,      -0.f,         1.125f,  1.375f,  -1.625f,
                           0x1p-17f, 3 * 0x1p-17f, 61440.f, 57344.f, 1e30f};
  for (int i = 0; i < 20000; ++i)
    xs.push_back(std::ldexp(mant(rng), ex(rng)) * (i & 1 ? -1.f : 1.f));
  for (size_t i = 0; i + 1 < grid.size(); ++i)  // every midpoint between neighbours: a tie
    if (grid[i].first >= 0 && grid[i + 1].first > grid[i].first)
      xs.push_back(0.5f * (grid[i].first + grid[i + 1].first));
  for (float x : xs) {
    uint8_t got = 0;
    t.ops.encode(&x, 1, &got, false);
    EXPECT_EQ(got, nearest(x)) << "x " << x;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  uint8_t got = 0;
  t.ops.encode(&nan, 1, &got, false);
  EXPECT_EQ(got, 0x7F);
}

TEST(KvType, RotationOnIntegerGridsOfPowerOfTwoWidths) {
  EXPECT_TRUE(kv_rotation_applies(KvDtype::kQ8, 64));
  EXPECT_TRUE(kv_rotation_applies(KvDtype::kQ4, 128));
  EXPECT_FALSE(kv_rotation_applies(KvDtype::kQ8, 48));  // no fast Hadamard transform of 48
  EXPECT_FALSE(kv_rotation_applies(KvDtype::kFP8, 64));  // a floating grid
  EXPECT_FALSE(kv_rotation_applies(KvDtype::kF16, 64));
  EXPECT_FALSE(kv_rotation_applies(KvDtype::kBF16, 64));
}

}  // namespace
}  // namespace kvtrim
