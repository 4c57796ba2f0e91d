// Scalar reference codecs of the cache's quantised precisions (DESIGN.md §3, precision axis):
// fp8 E4M3 (OCP FP8), q8 (int8, one f32 scale per vector), fp8 vectors (one f32 scale per
// vector) and q4 (llama.cpp q4_0 blocks of 32 channels, one f16 scale per block), with the
// storage layouts the cache keeps them in and the attention kernels (attn_kernels.h) read.
// Inputs are finite floats. Tested in tests/kv/quant_formats_test.cpp.
//
// Layouts, one KV head of n tokens, key head dim d, value head dim dv (kKeyTile = 16):
//  - dense keys (f32 / f16 / bf16 / q8 / fp8 elements): transposed tiles [n_tiles, d, 16],
//    element (t, i) at key_tile_index(t, i, d); per-token scale (q8 / fp8) k_scale
//    [n_tiles · 16] f32. Buffers cover whole tiles (kernels read the whole last tile).
//  - dense values: row-major [n, dv]; per-row scale (q8 / fp8) v_scale [n] f32, which the
//    caller folds into the softmax weights p before attn_accum_q8 / attn_accum_fp8.
//  - q4 keys: codes [n_tiles, d, 8] bytes, byte q4_key_byte(t, i, d) = tile base + i·8 +
//    (t % 16) / 2 holds token 2j of the tile in its low nibble and token 2j + 1 in its high
//    nibble; scales f16 bits [n_tiles, n_blk, 16] (n_blk = q4_blocks(d)), the scale of
//    (token t, channel block b) at q4_key_scale_index(t, b, d). Whole tiles, as above.
//  - q4 values: row t is q4_row_bytes(dv) bytes, channel 2j in the low nibble of byte j and
//    channel 2j + 1 in the high nibble (an odd dv leaves the last high nibble 0); scales f16
//    bits [n, n_blk], (t, b) at t·n_blk + b.
//  - sparse rows (per-token channel subsets): see SparseRows in attn_kernels.h.
// A q4 code c (0..15) of block scale s stands for s·(c − 8).
#pragma once
#include <cstdint>

#include "kv/attn_kernels.h"

namespace kvtrim::kv {

// ---- fp8 E4M3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; subnormals m·2^-9;
// max finite 448; 0x7F / 0xFF are NaN and never produced) ----
constexpr float kFp8E4M3Max = 448.f;
// Round to nearest even; |x| >= 448 (and ±inf) saturates to ±448; NaN -> 0 (+0); the sign of
// a value that rounds to zero is kept (-0 = 0x80).
uint8_t fp8_e4m3_from_f32(float x);
// Exact; the NaN codes 0x7F / 0xFF decode to NaN.
float fp8_e4m3_to_f32(uint8_t b);

// ---- per-vector codecs of one vector x [d]; codes[i · stride] receives element i (keys:
// stride kKeyTile into a tile at &k[key_tile_index(t, 0, d)]; values: stride 1) ----
// q8: scale = max|x| / 127, code = clamp(rne(x / scale), -127, 127), x ≈ scale · code; an
// all-zero vector gets scale 0 and zero codes. Returns the scale.
float q8_encode(const float* x, int64_t d, int8_t* codes, int64_t stride);
// fp8: scale = max|x| / 448 (0 for an all-zero vector), code = fp8_e4m3_from_f32(x / scale),
// x ≈ scale · fp8_e4m3_to_f32(code). Returns the scale.
float fp8_encode(const float* x, int64_t d, uint8_t* codes, int64_t stride);

// ---- q4 (llama.cpp q4_0, bit-identical codes and scales to quantize_row_q4_0_ref) ----
constexpr int64_t kQ4Block = 32;  // channels per scale; a vector's last block may be shorter
inline int64_t q4_blocks(int64_t d) {
  return (d + kQ4Block - 1) / kQ4Block;
}
inline int64_t q4_row_bytes(int64_t dv) {
  return (dv + 1) / 2;
}
inline int64_t q4_key_byte(int64_t t, int64_t i, int64_t d) {
  return (t / kKeyTile) * d * (kKeyTile / 2) + i * (kKeyTile / 2) + (t % kKeyTile) / 2;
}
inline int64_t q4_key_scale_index(int64_t t, int64_t b, int64_t d) {
  return ((t / kKeyTile) * q4_blocks(d) + b) * kKeyTile + t % kKeyTile;
}
// One block x [n] (n <= kQ4Block): m = the first element of largest |x|, scale = m / -8,
// code = min(15, trunc(x · (1 / scale) + 8.5)) with the f32 scale (0 codes 8 when m = 0);
// codes [n] one per byte (0..15). Returns the scale as f16 bits (fp32_to_fp16, RNE).
uint16_t q4_encode_block(const float* x, int64_t n, uint8_t* codes);
// Key t into the q4 tile layout: k [n_tiles, d, 8] bytes, k_scale [n_tiles, n_blk, 16] f16.
// An even t writes whole bytes (clearing its odd partner's nibble), an odd t only its high
// nibble: encode the tokens of a pair in order (appends do), and uninitialised buffers are fine.
void q4_encode_key(const float* x, int64_t d, int64_t t, uint8_t* k, uint16_t* k_scale);
// x [d] = key t decoded from the q4 tile layout.
void q4_decode_key(const uint8_t* k, const uint16_t* k_scale, int64_t t, int64_t d, float* x);
// One value row: row [q4_row_bytes(dv)] bytes, scale [q4_blocks(dv)] f16.
void q4_encode_row(const float* x, int64_t dv, uint8_t* row, uint16_t* scale);
void q4_decode_row(const uint8_t* row, const uint16_t* scale, int64_t dv, float* x);

// q4 codes of x [n] (one per byte, 0..15; code c stands for scale·(c − 8)) under one scale,
// searched: q4_0's own choice m / −8 (m = the element of largest |x|, signed) and four smaller ones
// (m / −8 · {15/16, 7/8, 13/16, 3/4}, which clip the largest element for a finer grid elsewhere);
// the least squared error wins, computed with the scale as stored (f16 when round_f16: dense
// block scales); ties keep q4_0's. A NaN or huge element never reaches an undefined conversion
// (NaN codes 8, zero). Returns the scale. The cache's q4 encoder (kv_type.h).
float q4_encode_search(const float* x, int64_t n, uint8_t* codes, bool round_f16);

}  // namespace kvtrim::kv
