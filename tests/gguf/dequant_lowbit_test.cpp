// Dequantization of Q2_K, Q3_K, IQ4_NL and IQ4_XS against the `gguf` Python package, bit for bit:
// tests/data/dequant_lowbit_refs.json (scripts/ref/make_dequant_lowbit_refs.py) holds random
// blocks and gguf.quants.dequantize's values (in full for the first blocks, as a 64-bit FNV-1a
// hash of the f32 bytes for every block). Plus hand-built blocks with known values (the layout
// read independently of the reference data) and the reference quantizers' round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/ggml_type.h"
#include "core/quant_blocks.h"
#include "ops/dequant.h"

namespace kvtrim {
namespace {

using nlohmann::json;

const json& refs() {
  static const json j = [] {
    const std::string p = test::data_dir() + "/dequant_lowbit_refs.json";
    std::ifstream in(p);
    if (!in) throw Error(p + ": cannot open (run scripts/ref/make_dequant_lowbit_refs.py)");
    return json::parse(in);
  }();
  return j;
}

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> out(h.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

uint64_t fnv1a64(const float* v, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    for (int k = 0; k < 4; ++k) {  // little-endian bytes
      h ^= (bits >> (8 * k)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

void check_type(GgmlType t) {
  const std::string name(ggml_type_name(t));
  SCOPED_TRACE(name);
  const json& r = refs().at("types").at(name);
  const int64_t bs = r.at("block_size").get<int64_t>();
  const int64_t nb = r.at("n_blocks").get<int64_t>();
  ASSERT_EQ(bs, ggml_traits(t).block_size);
  ASSERT_EQ(r.at("type_size").get<size_t>(), ggml_traits(t).type_size);
  const std::vector<uint8_t> blocks = from_hex(r.at("blocks_hex").get<std::string>());
  ASSERT_EQ(blocks.size(), static_cast<size_t>(nb) * ggml_traits(t).type_size);
  // the whole set as one row, as a tensor row would be read
  std::vector<float> y(static_cast<size_t>(nb * bs), NAN);
  dequantize_row(t, blocks.data(), y.data(), nb * bs);
  const json& full = r.at("full_bits");
  for (size_t b = 0; b < full.size(); ++b)
    for (int64_t k = 0; k < bs; ++k)
      ASSERT_EQ(bits_of(y[b * static_cast<size_t>(bs) + static_cast<size_t>(k)]), full[b][static_cast<size_t>(k)].get<uint32_t>())
          << "block " << b << " element " << k << ": kvtrim " << y[b * static_cast<size_t>(bs) + static_cast<size_t>(k)];
  const json& hashes = r.at("fnv1a64");
  ASSERT_EQ(hashes.size(), static_cast<size_t>(nb));
  int mismatched = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const uint64_t want = std::stoull(hashes[static_cast<size_t>(b)].get<std::string>(), nullptr, 16);
    if (fnv1a64(y.data() + b * bs, static_cast<size_t>(bs)) != want) {
      if (++mismatched <= 3) ADD_FAILURE() << "block " << b << " differs from gguf.quants.dequantize";
    }
  }
  EXPECT_EQ(mismatched, 0);
}

TEST(DequantLowbit, MatchesGgufPythonBitForBit) {
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS}) check_type(t);
}

// ---- known values: the layouts, read without the reference data -------------------------------

TEST(DequantLowbit, Q2_KKnownValues) {
  BlockQ2_K b{};
  b.d = fp32_to_fp16(0.5f);
  b.dmin = fp32_to_fp16(0.25f);
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>((g % 16) | ((15 - g) << 4));
  // element e = 128 h + 32 j + l has q = bits 2j of qs[32 h + l]: q = (l + j) % 4
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l)
      for (int j = 0; j < 4; ++j) b.qs[32 * h + l] = static_cast<uint8_t>(b.qs[32 * h + l] | (((l + j) % 4) << (2 * j)));
  std::vector<float> y(256);
  dequantize_row(GgmlType::Q2_K, &b, y.data(), 256);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 16, j = (e / 32) % 4, l = e % 32;
    EXPECT_EQ(y[static_cast<size_t>(e)], 0.5f * static_cast<float>(g) * static_cast<float>((l + j) % 4) - 0.25f * static_cast<float>(15 - g)) << e;
  }
}

TEST(DequantLowbit, Q3_KKnownValues) {
  BlockQ3_K b{};
  b.d = fp32_to_fp16(0.5f);
  // sub-block g gets scale u = 2 g + 1 (sc - 32 = 2 g - 31)
  for (int g = 0; g < 16; ++g) {
    const int u = 2 * g + 1;
    b.scales[g % 8] = static_cast<uint8_t>(b.scales[g % 8] | ((u & 15) << (g < 8 ? 0 : 4)));
    b.scales[8 + g % 4] = static_cast<uint8_t>(b.scales[8 + g % 4] | ((u >> 4) << (2 * (g / 4))));
  }
  // element e: q + 4 = e % 8 (low bits in qs, third bit in hmask)
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, j = (e / 32) % 4, l = e % 32, u = e % 8;
    b.qs[32 * h + l] = static_cast<uint8_t>(b.qs[32 * h + l] | ((u & 3) << (2 * j)));
    if (u >= 4) b.hmask[l] = static_cast<uint8_t>(b.hmask[l] | (1 << (4 * h + j)));
  }
  std::vector<float> y(256);
  dequantize_row(GgmlType::Q3_K, &b, y.data(), 256);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 16;
    EXPECT_EQ(y[static_cast<size_t>(e)], 0.5f * static_cast<float>(2 * g - 31) * static_cast<float>(e % 8 - 4)) << e;
  }
}

TEST(DequantLowbit, IQ4KnownValues) {
  BlockIQ4_NL nl{};
  nl.d = fp32_to_fp16(2.0f);
  for (int j = 0; j < 16; ++j) nl.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> y(256);
  dequantize_row(GgmlType::IQ4_NL, &nl, y.data(), 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[static_cast<size_t>(j)], 2.0f * kIq4nlValues[j]);
    EXPECT_EQ(y[static_cast<size_t>(j) + 16], 2.0f * kIq4nlValues[15 - j]);
  }
  BlockIQ4_XS xs{};
  xs.d = fp32_to_fp16(0.5f);
  for (int s = 0; s < 8; ++s) {  // ls = 8 s + 3 (ls - 32 = 8 s - 29)
    const int u = 8 * s + 3;
    xs.scales_l[s / 2] = static_cast<uint8_t>(xs.scales_l[s / 2] | ((u & 15) << (4 * (s % 2))));
    xs.scales_h = static_cast<uint16_t>(xs.scales_h | ((u >> 4) << (2 * s)));
  }
  for (int i = 0; i < 128; ++i) xs.qs[i] = static_cast<uint8_t>((i % 16) | (((i + 5) % 16) << 4));
  dequantize_row(GgmlType::IQ4_XS, &xs, y.data(), 256);
  for (int s = 0; s < 8; ++s)
    for (int j = 0; j < 16; ++j) {
      const float dl = 0.5f * static_cast<float>(8 * s - 29);
      const int i = 16 * s + j;
      EXPECT_EQ(y[static_cast<size_t>(32 * s + j)], dl * kIq4nlValues[i % 16]);
      EXPECT_EQ(y[static_cast<size_t>(32 * s + j + 16)], dl * kIq4nlValues[(i + 5) % 16]);
    }
}

// quantize_row then dequantize_row stays within a fraction of each sub-block's range (the
// quantizers build the test weights of tests/ops; they need to be sane, not optimal).
TEST(DequantLowbit, QuantizersRoundTrip) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Case {
    GgmlType t;
    int sub;        // sub-block length
    double max_rel;  // max error / sub-block max |x|
    double mean_rel;  // sum |error| / sum |x|
  };
  for (const Case c : {Case{GgmlType::Q2_K, 16, 0.5, 0.45}, Case{GgmlType::Q3_K, 16, 0.35, 0.2},
                       Case{GgmlType::IQ4_NL, 32, 0.15, 0.1}, Case{GgmlType::IQ4_XS, 32, 0.2, 0.1}}) {
    SCOPED_TRACE(std::string(ggml_type_name(c.t)));
    const int64_t n = 1024;
    std::vector<float> x(n), y(n);
    for (auto& v : x) v = nd(rng);
    std::vector<uint8_t> q(ggml_row_size(c.t, n));
    quantize_row(c.t, x.data(), q.data(), n);
    dequantize_row(c.t, q.data(), y.data(), n);
    double sum_err = 0.0, sum_abs = 0.0;
    for (int64_t s = 0; s < n; s += c.sub) {
      double amax = 0.0;
      for (int64_t i = s; i < s + c.sub; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[static_cast<size_t>(i)])));
      for (int64_t i = s; i < s + c.sub; ++i) {
        const double e = std::fabs(static_cast<double>(y[static_cast<size_t>(i)]) - x[static_cast<size_t>(i)]);
        EXPECT_LE(e, c.max_rel * amax) << "element " << i;
        sum_err += e;
        sum_abs += std::fabs(x[static_cast<size_t>(i)]);
      }
    }
    EXPECT_LT(sum_err / sum_abs, c.mean_rel);
  }
}

}  // namespace
}  // namespace kvtrim
