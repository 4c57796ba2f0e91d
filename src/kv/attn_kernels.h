// SIMD building blocks of the cache's attention (private to src/kv): block scores q·kᵀ and
// block weighted sums Σ p·v over K/V rows stored in f32, f16, bf16 or int8 (q8), plus a
// vectorised exp-and-sum for the softmax. Highway, dispatched at run time (the widest ISA the CPU
// has). Every kernel is checked against plain loops in tests/kv/attn_kernels_test.cpp.
#pragma once
#include <cstdint>

namespace kvtrim::kv {

// Keys are stored in tiles of kKeyTile tokens, transposed inside the tile: element (t, i)
// of a head's K [n_tok, d] lives at k[(t / kKeyTile) * d * kKeyTile + i * kKeyTile + t % kKeyTile].
// The score kernel then runs with SIMD lanes over tokens (broadcast q_i, FMA a tile row),
// so no horizontal reduction per (token, head) is needed.
constexpr int64_t kKeyTile = 16;
inline int64_t key_tile_index(int64_t t, int64_t i, int64_t d) {
  return (t / kKeyTile) * d * kKeyTile + i * kKeyTile + t % kKeyTile;
}

// s[g * ld_s + (t - t0)] = q[g * d .. +d] · k_t   for g < n_g, t0 <= t < t0 + n_t.
// q: [n_g, d] f32; k: tiled keys of one head (f32 or f16 bits); s: [n_g, ld_s].
void attn_scores_f32(const float* q, int n_g, int64_t d, const float* k, int64_t t0, int64_t n_t,
                     float* s, int64_t ld_s);
void attn_scores_f16(const float* q, int n_g, int64_t d, const uint16_t* k, int64_t t0, int64_t n_t,
                     float* s, int64_t ld_s);
void attn_scores_bf16(const float* q, int n_g, int64_t d, const uint16_t* k, int64_t t0,
                      int64_t n_t, float* s, int64_t ld_s);
// q8 keys: k holds int8 codes in the same tiles and k_scale [whole tiles] the per-token f32
// scale (key_t = k_scale[t] · code_t), applied here: s = k_scale[t] · (q · code_t).
void attn_scores_q8(const float* q, int n_g, int64_t d, const int8_t* k, const float* k_scale,
                    int64_t t0, int64_t n_t, float* s, int64_t ld_s);

// acc[g * dv .. +dv] += Σ_t p[g * ld_p + t] · v[t * dv .. +dv]   for g < n_g.
// p: [n_g, ld_p]; v: [n_t, dv] (f32 or f16 bits); acc: [n_g, dv].
void attn_accum_f32(const float* p, int n_g, int64_t ld_p, const float* v, int64_t n_t, int64_t dv,
                    float* acc);
void attn_accum_f16(const float* p, int n_g, int64_t ld_p, const uint16_t* v, int64_t n_t,
                    int64_t dv, float* acc);
void attn_accum_bf16(const float* p, int n_g, int64_t ld_p, const uint16_t* v, int64_t n_t,
                     int64_t dv, float* acc);
// q8 values: v holds int8 codes; the caller folds the per-token value scale into p.
void attn_accum_q8(const float* p, int n_g, int64_t ld_p, const int8_t* v, int64_t n_t, int64_t dv,
                   float* acc);

// y[g * ld_y + i] = Σ_j m[i * cols + j] · x[g * ld_x + j]   for i < rows, g < n_g.
// m: row-major f32 [rows, cols]; x: [n_g, ld_x]. The basis axis lifts coefficient vectors with
// it (x·Dᵀ, D [d, r]); the projection x·U is attn_accum_f32 with U as the "values".
void rows_dot_f32(const float* m, int64_t rows, int64_t cols, const float* x, int n_g,
                  int64_t ld_x, float* y, int64_t ld_y);

// x[i] = exp(x[i] - m) for i < n; returns Σ x[i] (after the update).
float exp_sub_sum(float* x, int64_t n, float m);

// y[i] = f16(x[i]) (round to nearest even), i < n.
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n);

}  // namespace kvtrim::kv
