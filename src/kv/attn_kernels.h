// SIMD building blocks of the cache's attention (private to src/kv): block scores q·kᵀ and
// block weighted sums Σ p·v over K/V rows stored in f32, f16, bf16, int8 (q8), fp8 E4M3 or
// q4 (llama.cpp q4_0 blocks), over per-token sparse rows (channel subsets), plus a vectorised
// exp-and-sum for the softmax. Highway, dispatched at run time (the widest ISA the CPU has).
// Storage layouts: quant_formats.h. Every kernel is checked against plain loops in
// tests/kv/attn_kernels_test.cpp; bench/kv_kernels_bench.cpp times them against dense f16.
// No kernel reads or writes outside the buffers described here (key buffers cover whole
// tiles: the score kernels read the whole tile of the first and last token in range, codes
// and scales; lanes of tokens outside [t0, t0 + n_t) are computed and discarded, so their
// contents only need to be readable). No alignment is required of any pointer; kernels are
// thread-safe (no shared state) and use at most ~50 KiB of stack; only attn_scores_q4
// allocates, when q4_blocks(d) · (16 + n_g) > 1024 floats (d > 512 with many query heads).
// Speed (Zen 2, AVX2, cache resident): the dense kernels run at the FMA throughput; f16 /
// q8 / fp8 / q4 cost about the same per element, so from memory their time follows the bytes
// read only while the FMAs are hidden under the transfer (bench/kv_kernels_bench.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_dtype.h"

namespace kvtrim::kv {

// Keys are stored in tiles of kKeyTile tokens, transposed inside the tile: element (t, i)
// of a head's K [n_tok, d] lives at k[(t / kKeyTile) * d * kKeyTile + i * kKeyTile + t % kKeyTile].
// The score kernel then runs with SIMD lanes over tokens (broadcast q_i, FMA a tile row),
// so no horizontal reduction per (token, head) is needed.
constexpr int64_t kKeyTile = 16;
inline int64_t key_tile_index(int64_t t, int64_t i, int64_t d) {
  return (t / kKeyTile) * d * kKeyTile + i * kKeyTile + t % kKeyTile;
}

// Dense keys / values of any element-coded type (one code of 8 bits or more per element:
// every type but q4, whose block scales have their own kernels below), chosen by type: the
// scores and sums below, with k the type's codes in tiles, k_scale its per-token scales (kRow
// types, kv_type.h; nullptr otherwise) and the value scales folded into p by the caller.
// Throws Error for a type without such a kernel. The kv_type.h table calls these.
void attn_scores_dense(KvDtype t, const float* q, int n_g, int64_t d, const void* k,
                       const float* k_scale, int64_t t0, int64_t n_t, float* s, int64_t ld_s);
void attn_accum_dense(KvDtype t, const float* p, int n_g, int64_t ld_p, const void* v, int64_t n_t,
                      int64_t dv, float* acc);

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
// The same scores with the query in 8 bits (attn_kernels_q8q.cpp): each query row quantized per
// block of 32 channels (QueryQ8), exact int32 dot products with the codes per block,
// s = k_scale[t] · Σ_b fma(float(isum_b), dq_b, ·) in block order — equal bit for bit on every
// CPU (llama.cpp scores its q8_0 keys this way). Not yet what the cache runs: its reference
// attention (attention_reference_cache) uses f32 queries and the cache tests compare with it to
// 2e-5 (the 8-bit query moves scores by ~3e-3 there), so wiring it into dense_scores needs the
// reference to quantize the query in each segment's stored key space first. On Zen 4 it scores
// 2.1× faster than f16 (docs/results/perf §7); WikiText-2 PPL with it: SmolLM2 q8 cache 15.948
// → 15.946, Qwen 13.521 → 13.530 (f16 15.940).
// QueryQ8::set(q [n_g, d]): qi [n_g, dp] int8 (dp = 32 · nblk >= d, zero past d), per block b of
// 32 channels dq [n_g, nblk] = max|q| / 127 (0 for an all-zero or non-finite block, whose codes
// are 0) and qsum [n_g, nblk] = Σ qi; qi = clamp(rint(q · 127 / max|q|), ±127). Set it once per
// attention call and score every block of keys with it.
struct QueryQ8 {
  std::vector<int8_t> qi;
  std::vector<float> dq;
  std::vector<int32_t> qsum;
  int n_g = 0;
  int64_t d = 0;
  int64_t nblk() const { return (d + 31) / 32; }
  int64_t dp() const { return 32 * nblk(); }
  void set(const float* q, int n_g, int64_t d);
};
void attn_scores_q8q(const QueryQ8& q, const int8_t* k, const float* k_scale, int64_t t0, int64_t n_t,
                     float* s, int64_t ld_s);

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

// fp8 E4M3 keys: k holds uint8 codes in the same tiles and k_scale [whole tiles] the per-token
// f32 scale (key_t = k_scale[t] · e4m3(code_t)); the NaN codes 0x7F / 0xFF must not occur.
// Both fp8 kernels decode a code to the f32 e4m3(code) · 2^-120 (bit shuffling, no conversion
// instruction), which is an f32 subnormal for the subnormal codes: under DAZ (denormals-are-
// zero, set by -ffast-math startup code) those read as 0, an error of at most 2^-6 · scale per
// element, below the format's own rounding step of the largest elements.
void attn_scores_fp8(const float* q, int n_g, int64_t d, const uint8_t* k, const float* k_scale,
                     int64_t t0, int64_t n_t, float* s, int64_t ld_s);
// fp8 values: v [n_t, dv] uint8 codes; the caller folds the per-row value scale into p.
void attn_accum_fp8(const float* p, int n_g, int64_t ld_p, const uint8_t* v, int64_t n_t,
                    int64_t dv, float* acc);
// q4 keys (quant_formats.h): k [whole tiles, d, 8] bytes of nibble codes, k_scale_f16 [whole
// tiles, q4_blocks(d), 16] f16 bits; key_t[i] = scale(t, i / 32) · (code(t, i) − 8).
void attn_scores_q4(const float* q, int n_g, int64_t d, const uint8_t* k,
                    const uint16_t* k_scale_f16, int64_t t0, int64_t n_t, float* s, int64_t ld_s);
// q4 values: v [n_t, q4_row_bytes(dv)], v_scale_f16 [n_t, q4_blocks(dv)] f16 bits; the kernel
// applies the block scales (p is the plain softmax weight).
void attn_accum_q4(const float* p, int n_g, int64_t ld_p, const uint8_t* v,
                   const uint16_t* v_scale_f16, int64_t n_t, int64_t dv, float* acc);

// Sparse rows: per-token channel subsets of keys or values (SPARK / SWAN per-token top-k).
// Row t keeps cnt_t (value, channel) pairs, entries [off_t, off_t + cnt_t) of vals and idx,
// packed row-major; off == nullptr: a fixed count T per row (off_t = t · T, cnt_t = T), else
// off is uint32 [n + 1] (off_t = off[t], cnt_t = off[t + 1] − off[t]). Channels within a row are
// strictly increasing and < dim. q8 / fp8 rows have one f32 scale per row over the row's kept
// values, scale [n] (element value = scale[t] · code); other types: scale == nullptr.
struct SparseRows {
  KvDtype type = KvDtype::kF16;  // a type with kernels for these rows: kv_type(type).sparse_kernels
  const void* vals = nullptr;     // [off_n] elements of type
  const void* idx = nullptr;      // [off_n] channel indices: uint8 (idx_bytes 1) or uint16 (2)
  int idx_bytes = 1;              // 1 (dim <= 256) or 2
  const uint32_t* off = nullptr;  // [n + 1] row offsets, or nullptr: fixed count T
  int T = 0;                      // entries per row when off == nullptr
  const float* scale = nullptr;   // [n] per-row scale (q8 / fp8 only)
  int64_t dim = 0;                // channels of a full row (head dim or basis rank): idx < dim
};
// s[g * ld_s + (t - t0)] = scale_t · Σ_j q[g * ldq + idx_tj] · val_tj   for g < n_g,
// t0 <= t < t0 + n_t. q: [n_g, ldq] f32 (ldq >= dim); s: [n_g, ld_s]. The group's query
// heads are the SIMD lanes (q staged transposed per call, [dim, 4 or 8], in per-thread scratch,
// any dim). Per call: O(n_g · dim) staging, then about one load per kept entry.
void sparse_scores(const SparseRows& r, const float* q, int n_g, int64_t ldq, int64_t t0,
                   int64_t n_t, float* s, int64_t ld_s);
// acc[g * ld_acc + idx_tj] += p[g * ld_p + (t - t0)] · scale_t · val_tj   for g < n_g,
// t0 <= t < t0 + n_t (the row scale is applied here, not folded into p). acc: [n_g, ld_acc];
// only its first dim columns are read or written. acc is staged transposed per call, so one
// call per block of tokens (not per token) amortises O(n_g · dim).
void sparse_accum(const SparseRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0,
                  int64_t n_t, float* acc, int64_t ld_acc);

// Masked rows: per-token channel subsets whose kept coordinates are a bitmask (the cache's
// bitmask index layout: SWAN, SPARK). Row t keeps the coordinates whose bits are set in
// mask[t · mask_bytes ..] (bit c of byte c / 8; mask_bytes = ceil(dim / 8), bits >= dim clear),
// its values packed in increasing coordinate order from entry off_t of vals (as SparseRows: off
// == nullptr: off_t = t · T; q8 / fp8: one f32 scale per row over its kept values). A pruned
// coordinate c of row t reads
//   0                                         when fill == nullptr,
//   ±fill[t · fill_stride] · w_c              otherwise, w_c = weight[c] (1 when weight == nullptr),
//                                             negative where bit c of signs[t · mask_bytes ..] is set
//                                             (signs == nullptr: positive),
// which covers SWAN's zeros, SPARK's degenerate key recovery (±sqrt(μ_t) · r_c) and SPARK's value
// fill (fill_t). The kernels read up to kMaskedSlack bytes past the last entry of any row (whole
// SIMD loads at a row's last kept values): vals must stay readable that far (the cache's sparse
// stores allocate the slack). Rows are addressed absolutely: t0 ..  t0 + n_t - 1.
constexpr int64_t kMaskedSlack = 32;
struct MaskedRows {
  KvDtype type = KvDtype::kF16;
  const void* vals = nullptr;      // entries of type
  const uint8_t* mask = nullptr;   // [n][mask_bytes]
  const uint32_t* off = nullptr;   // [n + 1] row offsets, or nullptr: fixed count T
  int T = 0;
  const float* scale = nullptr;    // [n] (q8 / fp8 only)
  const uint8_t* signs = nullptr;  // [n][mask_bytes] or nullptr
  const float* fill = nullptr;     // [n · fill_stride] or nullptr
  int64_t fill_stride = 1;
  const float* weight = nullptr;   // [dim] or nullptr
  int64_t dim = 0;                 // coordinates of a full row
};
// s[g * ld_s + (t - t0)] = q[g * ldq ..] · row_t (pruned coordinates as above), g < n_g.
// Channels are the SIMD lanes: a row's kept values are expanded to their coordinates (no
// per-entry gather) — 16 at a time on AVX-512 (the mask bits as a k-register, vexpandps; kv/
// attn_kernels_masked_zmm-inl.h), 8 at a time by one table permutation elsewhere — merged with
// the pruned coordinates' value, and met by one FMA per query head; dim > 512 takes a scalar loop.
void masked_scores(const MaskedRows& r, const float* q, int n_g, int64_t ldq, int64_t t0,
                   int64_t n_t, float* s, int64_t ld_s);
// acc[g * ld_acc + c] += Σ_t p[g * ld_p + (t - t0)] · row_t[c]   for c < dim, g < n_g (every
// coordinate: the pruned ones read their fill). AVX-512: the output rows stay in registers across
// the tokens; elsewhere rows are expanded into an f32 scratch block and summed by attn_accum_f32.
void masked_accum(const MaskedRows& r, const float* p, int n_g, int64_t ld_p, int64_t t0,
                  int64_t n_t, float* acc, int64_t ld_acc);
// out[(t - t0) * ld_out + c] = row_t[c] for c < dim (the rows as dense f32; out needs 8 floats of
// slack past its last row).
void masked_decode(const MaskedRows& r, int64_t t0, int64_t n_t, float* out, int64_t ld_out);

// y[g * ld_y + i] = Σ_j m[i * cols + j] · x[g * ld_x + j]   for i < rows, g < n_g.
// m: row-major f32 [rows, cols]; x: [n_g, ld_x]. The basis axis lifts coefficient vectors with
// it (x·Dᵀ, D [d, r]); the projection x·U is attn_accum_f32 with U as the "values".
void rows_dot_f32(const float* m, int64_t rows, int64_t cols, const float* x, int n_g,
                  int64_t ld_x, float* y, int64_t ld_y);

// x[i] = exp(x[i] - m) for i < n; returns Σ x[i] (after the update).
float exp_sub_sum(float* x, int64_t n, float m);
// max of x[0..n) (-inf for n = 0).
float max_of(const float* x, int64_t n);

// y[i] = f16(x[i]) (round to nearest even), i < n.
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n);

}  // namespace kvtrim::kv
