// Scalar reference dequantization of GGUF weight rows (the ground truth every SIMD kernel
// is tested against, itself tested against the `gguf` Python package on the real models).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/ggml_type.h"

namespace kvtrim {

// dst[0..n) = dequantized elements of the row starting at src. n must be a multiple of the
// type's block size. Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_NL, IQ4_XS.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// dst [n_rows, n_cols] = rows r of src (r * row_bytes bytes apart), dequantized with SIMD
// kernels (ops/dequant_kernels.cpp) for Q4_0, Q4_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL
// and IQ4_XS, the reference above for the other types. Equal to dequantize_row to within one f32 rounding per term
// (the kernels may fuse its multiply and add); for the prefill tiles, not for reference data.
void dequantize_rows_simd(GgmlType type, const void* src, size_t row_bytes, float* dst, int64_t n_rows,
                          int64_t n_cols);

// Quantizers (reference, round-to-nearest) used to build test weights and tiny models.
// src has n elements (multiple of the block size); writes ggml_row_size(type, n) bytes.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace kvtrim
