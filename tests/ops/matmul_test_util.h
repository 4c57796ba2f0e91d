// Test weights for the matmul tests (matmul_test.cpp, matmul_batch_test.cpp): every weight type
// quantized from N(0,1) data or as random blocks with sane scales, with its dequantized values.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "core/ggml_type.h"
#include "core/quant_blocks.h"
#include "ops/dequant.h"
#include "ops/matmul.h"

namespace kvtrim::testing_matmul {

// The types multiplied with 8-bit activations per 256 (BlockQ8_K): 256-element super-blocks.
inline bool is_kquant(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q2_K ||
         t == GgmlType::Q3_K || t == GgmlType::IQ4_XS;
}
inline bool is_float(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

inline std::string type_name(GgmlType t) {
  return std::string(ggml_type_name(t));
}

// A weight matrix with its storage and its dequantized values.
struct TestWeight {
  std::vector<uint8_t> data;
  std::vector<float> deq;  // [n_rows, n_cols]
  WeightView view;
};

// Sets the fp16 fields at `offsets` in each block to sane random scales.
inline void set_scales(uint8_t* row, size_t n_blocks, size_t block_bytes,
                std::initializer_list<size_t> offsets, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  for (size_t b = 0; b < n_blocks; ++b) {
    for (size_t off : offsets) {
      const uint16_t h = fp32_to_fp16(u(rng));
      std::memcpy(row + b * block_bytes + off, &h, 2);
    }
  }
}

// random_blocks = false: quantize_row of N(0,1) data (realistic weights);
// true: random bytes with sane fp16 scales (every bit pattern of q / scales / qh).
inline TestWeight make_weight(GgmlType t, int64_t n_rows, int64_t n_cols, bool random_blocks,
                       uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  TestWeight w;
  const size_t rb = ggml_row_size(t, n_cols);
  w.data.resize(rb * static_cast<size_t>(n_rows));
  std::vector<float> src(static_cast<size_t>(n_cols));
  const auto& tr = ggml_traits(t);
  for (int64_t r = 0; r < n_rows; ++r) {
    uint8_t* row = w.data.data() + rb * static_cast<size_t>(r);
    if (!random_blocks || is_float(t)) {
      for (auto& v : src) v = nd(rng);
      quantize_row(t, src.data(), row, n_cols);
      continue;
    }
    for (size_t i = 0; i < rb; ++i) row[i] = static_cast<uint8_t>(rng());
    const size_t nb = static_cast<size_t>(n_cols / tr.block_size), bb = tr.type_size;
    switch (t) {
      case GgmlType::Q4_0:
      case GgmlType::Q5_0:
      case GgmlType::Q8_0:
        set_scales(row, nb, bb, {0}, rng, -0.05f, 0.05f);
        break;
      case GgmlType::Q4_1:
      case GgmlType::Q5_1:
        set_scales(row, nb, bb, {0}, rng, 0.0f, 0.05f);
        set_scales(row, nb, bb, {2}, rng, -1.0f, 0.2f);
        break;
      case GgmlType::Q4_K:
      case GgmlType::Q5_K:
        set_scales(row, nb, bb, {0, 2}, rng, 0.0f, 0.01f);
        break;
      case GgmlType::Q6_K:
        set_scales(row, nb, bb, {offsetof(BlockQ6_K, d)}, rng, -0.01f, 0.01f);
        break;
      case GgmlType::Q2_K:
        set_scales(row, nb, bb, {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}, rng, 0.0f, 0.01f);
        break;
      case GgmlType::Q3_K:
        set_scales(row, nb, bb, {offsetof(BlockQ3_K, d)}, rng, -0.01f, 0.01f);
        break;
      case GgmlType::IQ4_NL:
        set_scales(row, nb, bb, {0}, rng, -0.005f, 0.005f);
        break;
      case GgmlType::IQ4_XS:
        set_scales(row, nb, bb, {0}, rng, -0.0005f, 0.0005f);
        break;
      default:
        break;
    }
  }
  w.deq.resize(static_cast<size_t>(n_rows * n_cols));
  for (int64_t r = 0; r < n_rows; ++r) {
    dequantize_row(t, w.data.data() + rb * static_cast<size_t>(r), w.deq.data() + r * n_cols,
                   n_cols);
  }
  w.view = WeightView{t, w.data.data(), n_rows, n_cols, rb};
  return w;
}

inline std::vector<float> make_x(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  // A few outliers, as real activations have.
  for (int64_t i = 0; i < n; i += 97) x[static_cast<size_t>(i)] *= 20.0f;
  return x;
}

}  // namespace kvtrim::testing_matmul
