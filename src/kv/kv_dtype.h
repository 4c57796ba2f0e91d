// The cache's storage types as an enum (kv_type.h has their table): a header of its own so that
// the kernels (attn_kernels.h) can name a type without depending on the table, which calls them.
#pragma once
#include <cstdint>

namespace kvtrim {

// Precision of stored K or V elements (keys and values may differ: KvCacheConfig::dtype_k /
// dtype_v, and each epoch of a plan may set its own).
//  kF32 / kF16 / kBF16: IEEE float, half, bfloat16 (round to nearest even).
//  kQ8:  int8 codes, one f32 scale per stored vector (scale = max|x| / 127).
//  kFP8: fp8 E4M3 codes (OCP), one f32 scale per stored vector (scale = max|x| / 448).
//  kQ4:  4-bit codes in blocks of 32 elements, one f16 scale per block (llama.cpp's q4_0 rule);
//        in per-token channel rows (sparse) one f32 scale per row instead.
//  kE5M2: fp8 E5M2 codes (the top byte of an f16: 5 exponent bits, 2 of mantissa), no scale,
//        saturating at ±57344 — vLLM's fp8_e5m2 cache: a plain cast, more range and less
//        precision than E4M3.
enum class KvDtype : uint8_t { kF32, kF16, kBF16, kQ8, kFP8, kQ4, kE5M2 };
inline constexpr int kKvDtypeCount = 7;  // values of KvDtype (kv_type.h's table has one entry each)

}  // namespace kvtrim
