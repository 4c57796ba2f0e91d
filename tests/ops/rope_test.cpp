// RoPE scalings (ops/rope.h) against the formulas as Hugging Face transformers writes them
// (_compute_yarn_parameters, _compute_llama3_parameters: inverse frequencies as interpolation /
// extrapolation blends), computed here independently of rope_omega; the optimized rotation
// against the scalar reference with every scaling; the inverse undoes the rotation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "ops/rope.h"

namespace kvtrim {
namespace {

// transformers' YaRN inverse frequencies (dim = n_rot): the interpolated and extrapolated
// frequencies mixed by (1 - linear ramp between the correction dims) · extrapolation factor.
std::vector<double> yarn_inv_freq(int dim, double base, double factor, int orig_ctx, double beta_fast, double beta_slow) {
  auto corr = [&](double rot) { return dim * std::log(orig_ctx / (rot * 2 * M_PI)) / (2 * std::log(base)); };
  double low = std::max(std::floor(corr(beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<double> f(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(base, 2.0 * i / dim);
    const double extrap = 1.0 / pos_freq, interp = 1.0 / (factor * pos_freq);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrap_factor = 1 - ramp;
    f[static_cast<size_t>(i)] = interp * (1 - extrap_factor) + extrap * extrap_factor;
  }
  return f;
}

TEST(Rope, YarnFrequenciesAndMagnitudeMatchTransformersFormula) {
  for (int n_rot : {16, 64, 128}) {
    for (double factor : {2.0, 4.0, 8.0}) {
      for (int orig : {16, 64, 32768}) {
        RopeSpec r;
        r.n_rot = n_rot;
        r.base = 1e6f;
        r.neox = true;
        r.freq_scale = static_cast<float>(1 / factor);
        r.ext_factor = 1;
        r.n_ctx_orig = orig;
        const std::vector<double> want = yarn_inv_freq(n_rot, 1e6, factor, orig, 32, 1);
        for (int i = 0; i < n_rot / 2; ++i)
          EXPECT_NEAR(rope_omega(r, i), want[static_cast<size_t>(i)], 1e-6 * want[static_cast<size_t>(i)])
              << "n_rot " << n_rot << " factor " << factor << " orig " << orig << " pair " << i;
        EXPECT_NEAR(rope_mscale(r), 0.1 * std::log(factor) + 1, 1e-6);  // transformers' attention_factor
      }
    }
  }
}

TEST(Rope, FrequencyFactorsDivide) {
  RopeSpec r;
  r.n_rot = 8;
  r.base = 500000.f;
  const std::vector<float> ff = {1, 1, 2.5f, 8};
  r.freq_factors = ff.data();
  for (int i = 0; i < 4; ++i)
    EXPECT_DOUBLE_EQ(rope_omega(r, i), std::pow(500000.0, -2.0 * i / 8) / ff[static_cast<size_t>(i)]);
  EXPECT_EQ(rope_mscale(r), 1.0);
}

TEST(Rope, OptimizedMatchesReferenceAndInverseUndoes) {
  const std::vector<float> ff = {1, 1, 1.5f, 2, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
  std::vector<RopeSpec> specs(4);
  for (RopeSpec& r : specs) {
    r.n_rot = 32;
    r.base = 10000.f;
  }
  specs[1].freq_scale = 0.5f;                                                        // linear
  specs[2].freq_factors = ff.data();                                                 // llama3
  specs[3].freq_scale = 0.25f, specs[3].ext_factor = 1, specs[3].n_ctx_orig = 64;    // yarn
  specs[3].neox = true;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (const RopeSpec& r : specs) {
    for (int32_t pos : {0, 1, 63, 64, 1000, 131071}) {
      std::vector<float> x(40);
      for (float& v : x) v = nd(rng);
      std::vector<float> a = x, b = x;
      rope(a.data(), r, pos);
      ref::rope(b.data(), r, pos);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-5 * (1 + std::fabs(b[i])));
      for (size_t i = 32; i < x.size(); ++i) EXPECT_EQ(a[i], x[i]);  // past n_rot: untouched
      rope(a.data(), r, pos, /*inverse=*/true);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(a[i], x[i], 1e-4 * (1 + std::fabs(x[i])));
      // the angles' magnitude is mscale (the norm of a rotated pair grows by it)
      std::vector<float> c(16), s(16);
      rope_angles(r, pos, c.data(), s.data());
      EXPECT_NEAR(std::hypot(c[5], s[5]), rope_mscale(r), 1e-6);
    }
  }
}

}  // namespace
}  // namespace kvtrim
