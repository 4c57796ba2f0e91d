// Byte layouts of the GGUF quantization blocks kvtrim reads (same as ggml's).
// d / m / dmin are IEEE binary16 stored as uint16_t; convert with fp16_to_fp32.
#pragma once
#include <cstdint>

namespace kvtrim {

constexpr int kQK = 32;    // elements per block of the legacy types
constexpr int kQK_K = 256;  // elements per super-block of the k-quants
constexpr int kKScaleBytes = 12;

// x[i] = (q[i] - 8) * d; q[i] for i < 16 is the low nibble of qs[i], else the high nibble of qs[i-16].
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
// x[i] = q[i] * d + m (nibble order as Q4_0).
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[kQK / 2]; };
// 5-bit: low 4 bits as Q4_0, bit 4 of element i is bit i of qh (little-endian u32); x = (q - 16) * d.
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
// x = q * d + m, 5-bit q as Q5_0.
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
// x[i] = qs[i] * d.
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };

// 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min packed in `scales`;
// x = d * sc * q - dmin * m, q 4-bit.
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[kKScaleBytes]; uint8_t qs[kQK_K / 2]; };
// As Q4_K with a 5th bit per element in qh.
struct BlockQ5_K {
  uint16_t d; uint16_t dmin; uint8_t scales[kKScaleBytes]; uint8_t qh[kQK_K / 8]; uint8_t qs[kQK_K / 2];
};
// 16 sub-blocks of 16 with int8 scales; 6-bit q = low 4 bits (ql) | 2 high bits (qh); x = d * sc * (q - 32).
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };
// Activation block for k-quant dot products: x = qs * d; bsums = sums of each group of 16 qs.
struct BlockQ8_K { float d; int8_t qs[kQK_K]; int16_t bsums[kQK_K / 16]; };

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block from its 12 packed
// bytes (ggml's get_scale_min_k4): j < 4: sc = q[j] & 63, m = q[j+4] & 63; j >= 4: low 4 bits
// in q[j+4] (sc low nibble, m high nibble), high 2 bits in the top bits of q[j-4] (sc) / q[j] (m).
inline void k4_scale_min(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace kvtrim
