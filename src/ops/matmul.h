// Products with (possibly quantized) weight matrices. A weight W has n_rows rows of n_cols
// elements, each row stored contiguously in its GGUF type (GGUF ne = [n_cols, n_rows]).
// The optimized paths read quantized blocks directly (no dequantized copy of W), use SIMD
// chosen at run time (Highway), and split rows over the thread pool.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/ggml_type.h"

namespace kvtrim {

class ThreadPool;

struct WeightView {
  GgmlType type;
  const void* data;  // n_rows * row_bytes bytes
  int64_t n_rows;
  int64_t n_cols;
  size_t row_bytes;  // ggml_row_size(type, n_cols)
  // Optional copy of the same weights in the 16-row tile order (ops/weight_pack.h: a
  // PackedWeight's data, made by Model::load). Where set, the kernels that know the layout read
  // it instead of `data` (with the same result, bit for bit); everything else reads `data`.
  const void* packed = nullptr;
};

// y[n_rows] = W · x[n_cols]. pool may be nullptr (single thread).
void matvec(const WeightView& w, const float* x, float* y, ThreadPool* pool);

// From this many tokens on, matmul dequantizes W to f32 tiles and runs sgemm; below it, it runs
// the decode kernel (8-bit activations for quantized W) row by row, giving every token exactly
// matvec's result (with AVX-512 VNNI, Q4_K and Q6_K batches run 16-row tiles, ops/kquant_tiles-inl.h,
// and legacy-type weights with a packed copy run 16-row tiles from it at every token count,
// ops/legacy_packed-inl.h).
// With set_int8_prefill(true), the types with an integer prefill kernel on this CPU
// (detail::has_strip_kernel: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 with VNNI in 8-row strips, and in 16-row
// tiles from 16 tokens on with AVX-512 VNNI; Q4_K in strips or tiles; Q6_K in tiles) take it at
// every token count, and their prefill gives each token matvec's result too.
constexpr int64_t kMatmulGemmMinTokens = 16;

// Prefill precision, process-wide. The library's default is off (f32 activations times the
// dequantized weights on sgemm: the numerics of the reference checks in tests/); the kvtrim CLI
// turns it on unless --f32-prefill (tools/kvtrim/common.cpp). On = 8-bit activations on the
// integer kernels for the types that have them, as decode and llama.cpp compute: on this Zen 4
// (docs/results/perf §8) pp512 1.9x (SmolLM2), 1.8x (Gemma3), 4.2x (Qwen2.5-1.5B) faster than
// off, for WikiText-2 PPL 15.940 -> 15.982 on SmolLM2.
void set_int8_prefill(bool on);
bool int8_prefill();

// True if matmul gives every token matvec's result for w at every token count (int8_prefill() and
// an integer prefill kernel for w's type on this CPU): then how tokens are grouped into matmul
// calls does not change any result.
bool matmul_token_exact(const WeightView& w);

// y[n_tok, n_rows] = x[n_tok, n_cols] · Wᵀ (prefill). pool may be nullptr.
void matmul(const WeightView& w, const float* x, int64_t n_tok, float* y, ThreadPool* pool);

// One product of a batch: y[n_tok, w.n_rows] = x[n_tok, w.n_cols] · wᵀ.
struct MatmulJob {
  const WeightView* w;
  const float* x;
  int64_t n_tok;
  float* y;
};

// Several products at once (a MoE layer's experts, each with its own rows; q/k/v). The jobs
// whose weights take the decode kernel (below kMatmulGemmMinTokens tokens, or strip types with
// int8_prefill()) run in one pool job, their rows laid end to end, so the threads meet once
// instead of once per weight; an input that several of them read (same x, n_tok and activation
// format) is quantized once. The other jobs run as matmul, one after the other. Each y equals
// matmul's, bit for bit.
void matmul_jobs(const MatmulJob* jobs, int n, ThreadPool* pool);

// ys[i][n_tok, ws[i].n_rows] = x[n_tok, n_cols] · ws[i]ᵀ for up to 16 weights with the same
// n_cols that read the same x (q/k/v, gate/up): matmul_jobs with one input.
void matmul_many(const WeightView* const* ws, float* const* ys, int n, const float* x, int64_t n_tok,
                 ThreadPool* pool);

// Copies row `row` of W dequantized into out[n_cols] (embedding lookup).
void get_row(const WeightView& w, int64_t row, float* out);

namespace ref {
// Scalar reference: dequantize each row with dequantize_row and accumulate in double.
void matvec(const WeightView& w, const float* x, float* y);
void matmul(const WeightView& w, const float* x, int64_t n_tok, float* y);
}  // namespace ref

}  // namespace kvtrim
