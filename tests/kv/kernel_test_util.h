// Shared by the attention kernel tests: for_each_target (a test once per SIMD target) and the
// checks of scores and value sums against double-precision sums. Include it before any other header
// that includes Highway in the translation unit (a unity unit of the tests included): it asks
// Highway for the AVX3_DL target too (attn_kernels_q8q.cpp's VNNI path), a wish that must come
// before Highway's first inclusion — without it the targets swept
// (hwy::SupportedAndGeneratedTargets) stop at AVX3.
#pragma once
#if defined(HIGHWAY_HWY_DETECT_TARGETS_H_) && !defined(HWY_WANT_AVX3_DL)
#error "Highway is already included: HWY_WANT_AVX3_DL would not take effect"
#endif
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "hwy/targets.h"

namespace kvtrim::kvtest {

// Runs f once per SIMD target compiled in and supported by this CPU (e.g. AVX2, SSE4, SSSE3,
// EMU128 on an AVX2 machine), so the narrower targets' code paths are checked too.
template <class F>
void for_each_target(F f) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    f();
    if (::testing::Test::HasFatalFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Keys K [n_t, d] (decoded f32) against the score kernel's output for the range [t0, t0 + n):
// s[g * ld + t - t0] ≈ q_g · k_t within 1e-4 of Σ |q_i k_i|.
inline void expect_scores(const std::vector<float>& q, int n_g, int64_t d,
                          const std::vector<float>& k, int64_t t0, int64_t n,
                          const std::vector<float>& s, int64_t ld) {
  for (int g = 0; g < n_g; ++g) {
    for (int64_t t = t0; t < t0 + n; ++t) {
      double r = 0, a = 0;
      for (int64_t i = 0; i < d; ++i) {
        r += double(q[g * d + i]) * k[t * d + i];
        a += std::fabs(double(q[g * d + i]) * k[t * d + i]);
      }
      ASSERT_NEAR(s[g * ld + t - t0], r, 1e-4 * (1 + a)) << "g " << g << " t " << t << " d " << d;
    }
  }
}
// acc [n_g, dv] (started at acc0) against acc0 + Σ_t p[g, t] · v_t, v [n_t, dv] decoded f32.
inline void expect_accum(const std::vector<float>& p, int n_g, int64_t ld,
                         const std::vector<float>& v, int64_t n_t, int64_t dv,
                         const std::vector<float>& acc0, const std::vector<float>& acc) {
  for (int g = 0; g < n_g; ++g) {
    for (int64_t i = 0; i < dv; ++i) {
      double r = acc0[g * dv + i], a = std::fabs(r);
      for (int64_t t = 0; t < n_t; ++t) {
        r += double(p[g * ld + t]) * v[t * dv + i];
        a += std::fabs(double(p[g * ld + t]) * v[t * dv + i]);
      }
      ASSERT_NEAR(acc[g * dv + i], r, 1e-4 * (1 + a)) << "g " << g << " i " << i << " dv " << dv;
    }
  }
}

}  // namespace kvtrim::kvtest
