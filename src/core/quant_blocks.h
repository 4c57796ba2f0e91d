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
// 16 sub-blocks of 16, 2-bit q: q of element e = 128 h + 32 j + l (h < 2, j < 4, l < 32) is bits
// 2j..2j+1 of qs[32 h + l]; scales[e / 16] holds the sub-block's 4-bit scale (low nibble) and
// 4-bit min (high nibble); x = (d * sc) * q - (dmin * m).
struct BlockQ2_K { uint8_t scales[kQK_K / 16]; uint8_t qs[kQK_K / 4]; uint16_t d; uint16_t dmin; };
// 16 sub-blocks of 16, 3-bit signed q in [-4, 3]: its low 2 bits as Q2_K's, its third bit is
// bit (4 h + j) of hmask[l] with q = low - 4 where that bit is clear; 6-bit scales packed in 12
// bytes (q3k_scale); x = (d * (sc - 32)) * q.
struct BlockQ3_K { uint8_t hmask[kQK_K / 8]; uint8_t qs[kQK_K / 4]; uint8_t scales[kKScaleBytes]; uint16_t d; };
// Non-linear 4-bit, 32 per block: x[i] = d * kIq4nlValues[q[i]], nibble order as Q4_0.
struct BlockIQ4_NL { uint16_t d; uint8_t qs[kQK / 2]; };
// IQ4_NL's grid in 8 sub-blocks of 32 with 6-bit scales: sub-block s has ls = low nibble s of
// scales_l (byte s / 2, nibble s % 2) | bits 2s..2s+1 of scales_h << 4; x = (d * (ls - 32)) *
// kIq4nlValues[q], q the nibbles of qs[16 s ..] in Q4_0's order.
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[kQK_K / 64]; uint8_t qs[kQK_K / 2]; };
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
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);

// The 16 levels of IQ4_NL / IQ4_XS (a fixed table of the format: ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Signed scale (sc - 32, in [-32, 31]) of sub-block s (0..15) of a Q3_K super-block from its 12
// packed bytes q: the low 4 bits are the low (s < 8) or high (s >= 8) nibble of q[s % 8], the
// high 2 bits are bits 2 (s / 4) .. +1 of q[8 + s % 4].
inline int q3k_scale(int s, const uint8_t* q) {
  const int lo = (s < 8 ? q[s] : q[s - 8] >> 4) & 0x0f;
  const int hi = (q[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Signed scale (ls - 32, in [-32, 31]) of sub-block s (0..7) of an IQ4_XS super-block.
inline int iq4xs_scale(int s, const BlockIQ4_XS& b) {
  const int lo = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0f;
  const int hi = (b.scales_h >> (2 * s)) & 3;
  return (lo | (hi << 4)) - 32;
}

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
