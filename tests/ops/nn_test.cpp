// nn.h kernels against their scalar references (double accumulation) on every SIMD target
// this CPU supports, for lengths that exercise the vector body and the scalar tail.

#include "ops/nn.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace kvtrim {
namespace {

const int64_t kLens[] = {1, 7, 16, 64, 100, 576, 1000};

std::vector<float> rand_vec(int64_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

template <typename Fn>
void each_target(const Fn& fn) {
  const int64_t all = hwy::SupportedTargets();
  for (int64_t bit = 1; bit != 0 && bit <= all; bit <<= 1) {
    if ((all & bit) == 0) continue;
    hwy::SetSupportedTargetsForTest(bit);
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(bit));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel,
                  double abs_tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], abs_tol + rel * std::fabs(b[i])) << "i=" << i;
}

TEST(Nn, RmsNormMatchesRef) {
  each_target([] {
    for (int64_t n : kLens) {
      const auto x = rand_vec(n, 1, 3.0f), w = rand_vec(n, 2);
      std::vector<float> y(x.size()), r(x.size());
      rms_norm(x.data(), w.data(), y.data(), n, 1e-5f);
      ref::rms_norm(x.data(), w.data(), r.data(), n, 1e-5f);
      expect_close(y, r, 1e-5, 1e-6);
      // in place, no weight
      std::vector<float> z = x;
      rms_norm(z.data(), nullptr, z.data(), n, 1e-6f);
      ref::rms_norm(x.data(), nullptr, r.data(), n, 1e-6f);
      expect_close(z, r, 1e-5, 1e-6);
    }
  });
}

TEST(Nn, LayerNormMatchesFormula) {
  each_target([] {
    for (int64_t n : kLens) {
      const auto x = rand_vec(n, 3, 2.0f), w = rand_vec(n, 4), b = rand_vec(n, 5);
      std::vector<float> y(x.size()), r(x.size());
      layer_norm(x.data(), w.data(), b.data(), y.data(), n, 1e-5f);
      double mean = 0.0, var = 0.0;
      for (float v : x) mean += v;
      mean /= static_cast<double>(n);
      for (float v : x) var += (v - mean) * (v - mean);
      var /= static_cast<double>(n);
      for (size_t i = 0; i < x.size(); ++i) {
        r[i] = static_cast<float>((x[i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i]);
      }
      expect_close(y, r, 1e-5, 1e-5);
    }
  });
}

TEST(Nn, SoftmaxMatchesRef) {
  each_target([] {
    for (int64_t n : kLens) {
      auto x = rand_vec(n, 6, 5.0f);
      x[0] = 80.0f;  // large logits must not overflow
      auto r = x;
      softmax(x.data(), n);
      ref::softmax(r.data(), n);
      expect_close(x, r, 1e-5, 1e-7);
      double s = 0.0;
      for (float v : x) s += v;
      EXPECT_NEAR(s, 1.0, 1e-5);
    }
  });
}

TEST(Nn, SwigluAndGegluMatchRef) {
  each_target([] {
    for (int64_t n : kLens) {
      const auto g = rand_vec(n, 7, 4.0f), u = rand_vec(n, 8);
      std::vector<float> y(g.size()), r(g.size());
      swiglu(g.data(), u.data(), y.data(), n);
      ref::swiglu(g.data(), u.data(), r.data(), n);
      expect_close(y, r, 2e-6, 1e-6);
      geglu_tanh(g.data(), u.data(), y.data(), n);
      ref::geglu_tanh(g.data(), u.data(), r.data(), n);
      expect_close(y, r, 2e-6, 1e-6);
      // aliasing: y = g
      auto ga = g;
      swiglu(ga.data(), u.data(), ga.data(), n);
      ref::swiglu(g.data(), u.data(), r.data(), n);
      expect_close(ga, r, 2e-6, 1e-6);
    }
  });
}

TEST(Nn, DotAxpyAddScaleMatchRef) {
  each_target([] {
    for (int64_t n : kLens) {
      const auto a = rand_vec(n, 9), b = rand_vec(n, 10);
      double mag = 0.0;
      for (size_t i = 0; i < a.size(); ++i) mag += std::fabs(a[i] * b[i]);
      EXPECT_NEAR(dot(a.data(), b.data(), n), ref::dot(a.data(), b.data(), n), 1e-6 * mag + 1e-7);
      std::vector<float> y = a, r(a.size());
      axpy(y.data(), 0.75f, b.data(), n);
      for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] + 0.75f * b[i];
      expect_close(y, r, 1e-6, 1e-7);
      y = a;
      add(y.data(), b.data(), n);
      for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] + b[i];
      expect_close(y, r, 0.0, 0.0);
      y = a;
      scale(y.data(), -1.5f, n);
      for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] * -1.5f;
      expect_close(y, r, 0.0, 0.0);
    }
  });
}

TEST(Nn, RopeMatchesRefBothPairings) {
  for (bool neox : {false, true}) {
    for (int64_t n_rot : {64, 32}) {
      for (int32_t pos : {0, 1, 17, 4095, 32767}) {
        const auto x = rand_vec(64, static_cast<uint32_t>(pos + 1));
        auto y = x, r = x;
        // twice: the second call hits the per-thread angle table
        for (int rep = 0; rep < 2; ++rep) {
          y = x;
          rope(y.data(), 64, n_rot, pos, 10000.0f, 1.0f, neox);
        }
        ref::rope(r.data(), 64, n_rot, pos, 10000.0f, 1.0f, neox);
        expect_close(y, r, 1e-5, 1e-5);
        for (int64_t i = n_rot; i < 64; ++i)
          EXPECT_EQ(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)]);
      }
    }
  }
}

TEST(Nn, RopePairings) {
  // pos 1, n_rot 4, base 1: theta_i = 1 for both pairs. neox rotates (0,2) and (1,3);
  // normal rotates (0,1) and (2,3).
  const float c = std::cos(1.0f), s = std::sin(1.0f);
  std::vector<float> x = {1, 0, 0, 0};
  rope(x.data(), 4, 4, 1, 1.0f, 1.0f, true);
  EXPECT_NEAR(x[0], c, 1e-6);
  EXPECT_NEAR(x[2], s, 1e-6);
  EXPECT_EQ(x[1], 0.0f);
  x = {1, 0, 0, 0};
  rope(x.data(), 4, 4, 1, 1.0f, 1.0f, false);
  EXPECT_NEAR(x[0], c, 1e-6);
  EXPECT_NEAR(x[1], s, 1e-6);
  EXPECT_EQ(x[2], 0.0f);
}

}  // namespace
}  // namespace kvtrim
