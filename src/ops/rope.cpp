// RoPE angles and rotation for every scaling (ops/rope.h).
#include "ops/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvtrim {

namespace {

// YaRN's ramp ends (ggml_rope_yarn_corr_dims): the pair index below which the frequency is kept
// (extrapolated) and above which it is interpolated, from the rotations a pair makes over the
// original context.
double yarn_corr_dim(const RopeSpec& r, double beta) {
  return r.n_rot * std::log(r.n_ctx_orig / (beta * 2.0 * M_PI)) / (2.0 * std::log(static_cast<double>(r.base)));
}

}  // namespace

double rope_omega(const RopeSpec& r, int i) {
  double w = std::pow(static_cast<double>(r.base), -2.0 * static_cast<double>(i) / static_cast<double>(r.n_rot));
  if (r.freq_factors) w /= static_cast<double>(r.freq_factors[i]);
  if (r.ext_factor == 0.f) return w * static_cast<double>(r.freq_scale);
  const double lo = std::max(0.0, std::floor(yarn_corr_dim(r, r.beta_fast)));
  const double hi = std::min(static_cast<double>(r.n_rot - 1), std::ceil(yarn_corr_dim(r, r.beta_slow)));
  // ggml evaluates the ramp at i0 / 2 with i0 = 2i (the pair's first dim): at i.
  const double y = (static_cast<double>(i) - lo) / std::max(0.001, hi - lo);
  const double mix = (1.0 - std::clamp(y, 0.0, 1.0)) * static_cast<double>(r.ext_factor);
  const double fs = static_cast<double>(r.freq_scale);
  return w * (fs * (1.0 - mix) + mix);
}

double rope_mscale(const RopeSpec& r) {
  double m = static_cast<double>(r.attn_factor);
  if (r.ext_factor != 0.f) m *= 1.0 + 0.1 * std::log(1.0 / static_cast<double>(r.freq_scale));
  return m;
}

void rope_angles(const RopeSpec& r, int32_t pos, float* c, float* s, bool inverse) {
  const double m = rope_mscale(r);
  const double mc = inverse ? 1.0 / m : m, ms = inverse ? -1.0 / m : m;
  for (int i = 0; i < r.n_rot / 2; ++i) {
    const double theta = static_cast<double>(pos) * rope_omega(r, i);
    c[i] = static_cast<float>(mc * std::cos(theta));
    s[i] = static_cast<float>(ms * std::sin(theta));
  }
}

void rope_rotate(float* x, int64_t n_rot, bool neox, const float* c, const float* s) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t i0 = neox ? i : 2 * i;
    const int64_t i1 = neox ? i + half : 2 * i + 1;
    const float x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * c[i] - x1 * s[i];
    x[i1] = x0 * s[i] + x1 * c[i];
  }
}

void rope(float* x, const RopeSpec& r, int32_t pos, bool inverse) {
  // The last position's angles per thread: every head of a token (and every layer of a model
  // with one spec) uses the same, so decode computes them once per token.
  struct Table {
    RopeSpec spec;
    int32_t pos = 0;
    bool inverse = false;
    bool valid = false;
    std::vector<float> cos, sin;
  };
  thread_local Table t;
  if (!t.valid || !(t.spec == r) || t.pos != pos || t.inverse != inverse) {
    t.cos.resize(static_cast<size_t>(r.n_rot / 2));
    t.sin.resize(t.cos.size());
    rope_angles(r, pos, t.cos.data(), t.sin.data(), inverse);
    t.spec = r;
    t.pos = pos;
    t.inverse = inverse;
    t.valid = true;
  }
  rope_rotate(x, r.n_rot, r.neox, t.cos.data(), t.sin.data());
}

static RopeSpec plain_spec(int64_t n_rot, float base, float freq_scale, bool neox) {
  RopeSpec r;
  r.n_rot = static_cast<int>(n_rot);
  r.base = base;
  r.freq_scale = freq_scale;
  r.neox = neox;
  return r;
}

void rope(float* x, int64_t head_dim, int64_t n_rot, int32_t pos, float base, float freq_scale, bool neox) {
  rope(x, plain_spec(n_rot, base, freq_scale, neox), pos, false);
}

namespace ref {

void rope(float* x, const RopeSpec& r, int32_t pos, bool inverse) {
  const int64_t half = r.n_rot / 2;
  const double m = rope_mscale(r);
  for (int64_t i = 0; i < half; ++i) {
    const double theta = static_cast<double>(pos) * rope_omega(r, static_cast<int>(i));
    const double c = (inverse ? 1.0 / m : m) * std::cos(theta);
    const double s = (inverse ? -1.0 / m : m) * std::sin(theta);
    float& a = x[r.neox ? i : 2 * i];
    float& b = x[r.neox ? i + half : 2 * i + 1];
    const double x0 = a, x1 = b;
    a = static_cast<float>(x0 * c - x1 * s);
    b = static_cast<float>(x0 * s + x1 * c);
  }
}

void rope(float* x, int64_t head_dim, int64_t n_rot, int32_t pos, float base, float freq_scale, bool neox) {
  ref::rope(x, plain_spec(n_rot, base, freq_scale, neox), pos, false);
}

}  // namespace ref

}  // namespace kvtrim
