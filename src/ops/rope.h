// Rotary position embedding (RoPE) and its scalings: one RopeSpec describes the rotation of a
// layer's queries and keys, whatever the model family's variant (plain, linear, Llama 3's
// per-frequency factors, YaRN, Phi-3's LongRoPE factors). Every user — the forward pass, the
// reference forward, the presses and calibration that un-rotate keys or queries, the cache's
// pre-RoPE key bases — computes angles through rope_omega / rope_mscale, so a scaling is
// implemented once.
//
// Pair i (< n_rot / 2) of a head vector — (i, i + n_rot/2) with neox, else (2i, 2i+1) — turns by
// theta_i(pos) = pos · omega_i and is multiplied by mscale:
//   omega_i = base^(-2i/n_rot) / ff_i · s_i
//   ff_i    = freq_factors[i] (Llama 3 `rope_freqs.weight`, Phi-3 LongRoPE `rope_factors_*`), else 1
//   s_i     = freq_scale                                           (no YaRN: ext_factor = 0)
//           = freq_scale · (1 − mix_i) + mix_i                     (YaRN)
//   mix_i   = ext_factor · (1 − clamp((i − lo) / max(0.001, hi − lo), 0, 1))
//   lo, hi  = floor / ceil of n_rot · ln(n_ctx_orig / (2π·beta)) / (2 ln base), beta = beta_fast / beta_slow,
//             clamped to [0, n_rot − 1]
//   mscale  = attn_factor · (1 + 0.1 · ln(1 / freq_scale))         (YaRN), else attn_factor
// This is llama.cpp's ggml_rope_ext (rope_yarn, ggml_rope_yarn_corr_dims) and transformers'
// _compute_yarn_parameters / _compute_llama3_parameters written out; tests/ops/rope_test.cpp
// checks the closed forms.
#pragma once
#include <cstdint>

namespace kvtrim {

struct RopeSpec {
  int n_rot = 0;            // rotated dims of a head (even; the rest pass through)
  float base = 10000.f;     // theta base
  float freq_scale = 1.f;   // 1 / linear or YaRN factor
  bool neox = false;        // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
  // [n_rot / 2] per-pair divisors of the frequency, or nullptr. Points into the model (its
  // lifetime bounds every RopeSpec made from it); compared by address.
  const float* freq_factors = nullptr;
  float ext_factor = 0.f;   // YaRN's extrapolation mix (0 = no YaRN)
  float attn_factor = 1.f;  // magnitude of cos / sin (YaRN and LongRoPE attention scaling)
  float beta_fast = 32.f;   // YaRN ramp ends
  float beta_slow = 1.f;
  int n_ctx_orig = 0;       // YaRN: the training context the ramp is computed from
  bool operator==(const RopeSpec&) const = default;
};

// omega_i above (radians per position of pair i), in double.
double rope_omega(const RopeSpec& r, int i);
// The factor rope multiplies the rotated pairs by (1 unless YaRN or an attention factor).
double rope_mscale(const RopeSpec& r);

// Angles of position pos: c[i] = mscale·cos(theta_i), s[i] = mscale·sin(theta_i), i < n_rot/2
// (computed in double). inverse: the inverse rotation (cos, −sin) / mscale.
void rope_angles(const RopeSpec& r, int32_t pos, float* c, float* s, bool inverse = false);
// The rotation with the angles given: (x0, x1) -> (x0·c − x1·s, x0·s + x1·c) per pair.
void rope_rotate(float* x, int64_t n_rot, bool neox, const float* c, const float* s);
// Rotates one head vector x[>= n_rot] to position pos (inverse: back from it). Keeps the last
// position's angles per thread (every head of a token uses them).
void rope(float* x, const RopeSpec& r, int32_t pos, bool inverse = false);
// Plain RoPE with a linear scale (the spec's other fields at their defaults).
void rope(float* x, int64_t head_dim, int64_t n_rot, int32_t pos, float base, float freq_scale, bool neox);

namespace ref {
// The scalar reference: theta in double, each pair rotated in double.
void rope(float* x, const RopeSpec& r, int32_t pos, bool inverse = false);
void rope(float* x, int64_t head_dim, int64_t n_rot, int32_t pos, float base, float freq_scale, bool neox);
}  // namespace ref

}  // namespace kvtrim
