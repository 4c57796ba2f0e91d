// Internal interface between matmul.cpp (API, threading, BLAS prefill) and
// matmul_kernels.cpp (per-ISA SIMD dot products compiled by Highway). Not a public header.
//
// Activation formats. The quantized weight types are multiplied with an activation vector
// quantized once per call to 8 bits (llama.cpp's vec_dot scheme), so the inner loops are
// integer dot products (AVX2 maddubs / AVX-512 VNNI dpbusd) with one f32 scale per block:
//   legacy types (Q4_0..Q8_0) and IQ4_NL: BlockQ8A per 32 elements, x[i] ≈ qs[i] * d;
//   k-quants (Q2_K..Q6_K) and IQ4_XS: BlockQ8_K per 256 elements (d f32, bsums per 16);
//   F32 / F16 / BF16 weights: the f32 activation itself (no quantization).
// Rounding x to nearest with d = amax/127 errs by at most d/2 = amax/254 per element; that
// is the tolerance of the quantized paths (see tests/ops/matmul_test.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/ggml_type.h"
#include "ops/matmul.h"

namespace kvtrim::detail {

// Activation block for the legacy types: x[i] ≈ qs[i] * d; s = d * sum(qs) (for the
// weight offset / min terms).
struct BlockQ8A {
  float d;
  float s;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8A) == 40);

enum class ActFormat { kF32, kQ8A, kQ8K };

// Format the activation must have for weights of type t (t must be matmul_supported).
ActFormat act_format(GgmlType t);
// True for the weight types matvec / matmul accept.
bool matmul_supported(GgmlType t);
// Bytes of one activation row of n_cols elements in format f.
size_t act_row_bytes(ActFormat f, int64_t n_cols);

// Quantizes x[n_cols] into dst (act_row_bytes(f, n_cols) bytes); kF32 copies.
void quantize_act(ActFormat f, const float* x, void* dst, int64_t n_cols);

// y[t * ldy + r] = W[r] · act_t for r in [r0, r1), t in [0, n_tok). act_t starts at
// act + t * act_stride bytes, in act_format(w.type). Single-threaded.
void dot_rows(const WeightView& w, int64_t r0, int64_t r1, const void* act, size_t act_stride,
              int64_t n_tok, float* y, int64_t ldy);

// Name of the SIMD target dot_rows dispatches to now ("AVX3_DL", "AVX2", "EMU128", ...).
const char* kernel_target_name();

// True if dot_rows has an integer prefill kernel for weights of type t on the current target (8-row
// strips, ops/legacy_strips-inl.h and kquant_strips-inl.h; 16-row tiles, kquant_tiles-inl.h) that
// gives every token matvec's result: then matmul with int8_prefill() uses it at every token count.
bool has_strip_kernel(GgmlType t);

// True if dot_rows reads weights of type t from a packed copy (WeightView::packed, layout in
// ops/weight_pack.h) on the current target.
bool has_packed_kernel(GgmlType t);

}  // namespace kvtrim::detail
