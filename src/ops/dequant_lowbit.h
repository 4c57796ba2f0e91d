// Scalar reference dequantization and round-to-nearest quantization of the low-bit weight types
// Q2_K, Q3_K, IQ4_NL and IQ4_XS (block layouts in core/quant_blocks.h). Internal to ops/: the
// public entry points are dequantize_row / quantize_row (ops/dequant.h), which dispatch here.
#pragma once
#include <cstdint>

#include "core/quant_blocks.h"

namespace kvtrim::detail {

// y[256 nb] (Q2_K, Q3_K, IQ4_XS) or y[32 nb] (IQ4_NL) from nb blocks.
void dequant_q2_k(const BlockQ2_K* b, float* y, int64_t nb);
void dequant_q3_k(const BlockQ3_K* b, float* y, int64_t nb);
void dequant_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb);
void dequant_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb);

// nb blocks from x[256 nb] / x[32 nb].
void quant_q2_k(const float* x, BlockQ2_K* b, int64_t nb);
void quant_q3_k(const float* x, BlockQ3_K* b, int64_t nb);
void quant_iq4_nl(const float* x, BlockIQ4_NL* b, int64_t nb);
void quant_iq4_xs(const float* x, BlockIQ4_XS* b, int64_t nb);

}  // namespace kvtrim::detail
