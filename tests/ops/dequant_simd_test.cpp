// dequantize_rows_simd (the SIMD kernels of the prefill tiles) against the scalar reference
// dequantize_row, on every supported type, on random block bytes (every bit pattern of the
// codes, scales and high bits; only the f16 factors are kept finite) and on rows quantized
// from random floats, several rows at a stride larger than the row.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "core/ggml_type.h"
#include "ops/dequant.h"

namespace kvtrim {
namespace {

// Byte offsets of the f16 factors inside one block of each type (d, m / dmin).
std::vector<size_t> f16_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return {0};
    case GgmlType::Q4_1: return {0, 2};
    case GgmlType::Q5_0: return {0};
    case GgmlType::Q5_1: return {0, 2};
    case GgmlType::Q8_0: return {0};
    case GgmlType::Q4_K: return {0, 2};
    case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q6_K: return {208};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::IQ4_NL: return {0};
    case GgmlType::IQ4_XS: return {0};
    case GgmlType::F16: return {};
    default: return {};
  }
}

void check_all_types();

// Every SIMD target this CPU supports, one at a time (the dispatch re-resolves per target).
TEST(DequantSimd, MatchesScalarReferenceOnEveryTypeAndTarget) {
  const int64_t all = hwy::SupportedTargets();
  int n = 0;
  for (int64_t bit = 1; bit != 0 && bit <= all; bit <<= 1) {
    if ((all & bit) == 0) continue;
    hwy::SetSupportedTargetsForTest(bit);
    SCOPED_TRACE("target " + std::string(hwy::TargetName(bit)));
    check_all_types();
    ++n;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(n, 1);
}

void check_all_types() {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nrm(0.f, 1.f);
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q2_K, GgmlType::Q3_K,
                            GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::F16, GgmlType::F32};
  for (const GgmlType t : types) {
    const GgmlTypeTraits& tr = ggml_traits(t);
    for (const int64_t n_cols : {tr.block_size, 4 * tr.block_size > 1024 ? 2 * tr.block_size : 1024}) {
      const size_t row = ggml_row_size(t, n_cols);
      const size_t stride = row + 24;  // rows not packed back to back
      const int64_t n_rows = 5;
      for (const bool raw : {true, false}) {
        std::vector<uint8_t> src(stride * n_rows);
        std::vector<float> x(static_cast<size_t>(n_cols));
        for (int64_t r = 0; r < n_rows; ++r) {
          uint8_t* p = src.data() + r * stride;
          if (raw && t != GgmlType::F32 && t != GgmlType::F16) {
            for (size_t i = 0; i < row; ++i) p[i] = static_cast<uint8_t>(byte(rng));
            for (int64_t b = 0; b < n_cols / tr.block_size; ++b)
              for (const size_t off : f16_fields(t)) {
                const uint16_t h = fp32_to_fp16(nrm(rng) * 0.05f);
                std::memcpy(p + b * tr.type_size + off, &h, 2);
              }
          } else {
            for (auto& v : x) v = nrm(rng);
            quantize_row(t, x.data(), p, n_cols);
          }
        }
        std::vector<float> fast(static_cast<size_t>(n_rows * n_cols), -1.f), ref(static_cast<size_t>(n_cols));
        dequantize_rows_simd(t, src.data(), stride, fast.data(), n_rows, n_cols);
        for (int64_t r = 0; r < n_rows; ++r) {
          dequantize_row(t, src.data() + r * stride, ref.data(), n_cols);
          // one f32 rounding of a term: a fused d·q − m may differ from d·q then − m by half
          // an ulp of d·q, which is at most the row's largest magnitude (q = 0 gives −m)
          float row_max = 0.f;
          for (const float v : ref) row_max = std::max(row_max, std::fabs(v));
          for (int64_t i = 0; i < n_cols; ++i) {
            const float a = fast[static_cast<size_t>(r * n_cols + i)], b = ref[static_cast<size_t>(i)];
            ASSERT_NEAR(a, b, 2.4e-7f * row_max)
                << ggml_type_name(t) << " raw " << raw << " cols " << n_cols << " row " << r << " elem " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtrim
