// Scalar reference dequantization of GGUF weight rows (the ground truth every SIMD kernel
// is tested against, itself tested against the `gguf` Python package on the real models).
#pragma once
#include <cstdint>

#include "core/ggml_type.h"

namespace kvtrim {

// dst[0..n) = dequantized elements of the row starting at src. n must be a multiple of the
// type's block size. Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Quantizers (reference, round-to-nearest) used to build test weights and tiny models.
// src has n elements (multiple of the block size); writes ggml_row_size(type, n) bytes.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace kvtrim
