// The attention SIMD kernels against plain loops.
#include "kv/attn_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/fp16.h"

namespace kvtrim {
namespace {

TEST(AttnKernels, ScoresAndAccumMatchLoops) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int64_t d : {1, 7, 16, 33, 64, 256}) {
    for (int n_g : {1, 3, 9}) {
      const int64_t n_t = 37, ld = 40;
      std::vector<float> q(n_g * d), k(n_t * d), p(n_g * ld), acc(n_g * d), acc16(n_g * d);
      std::vector<uint16_t> kh(n_t * d);  // row-major (for accum)
      for (float& x : q) x = nd(rng);
      for (size_t i = 0; i < k.size(); ++i) {
        kh[i] = fp32_to_fp16(nd(rng));
        k[i] = fp16_to_fp32(kh[i]);
      }
      // the same keys in transposed tiles (for scores), padded to whole tiles
      const int64_t n_tiles = (n_t + kv::kKeyTile - 1) / kv::kKeyTile;
      std::vector<float> kt(n_tiles * kv::kKeyTile * d, 0.f);
      std::vector<uint16_t> kth(kt.size(), 0);
      for (int64_t t = 0; t < n_t; ++t) {
        for (int64_t i = 0; i < d; ++i) {
          kt[kv::key_tile_index(t, i, d)] = k[t * d + i];
          kth[kv::key_tile_index(t, i, d)] = kh[t * d + i];
        }
      }
      for (float& x : p) x = std::fabs(nd(rng));
      for (size_t i = 0; i < acc.size(); ++i) acc[i] = acc16[i] = nd(rng);
      std::vector<float> want_acc = acc;
      std::vector<float> s32(n_g * ld), s16(n_g * ld);
      kv::attn_scores_f32(q.data(), n_g, d, kt.data(), 0, n_t, s32.data(), ld);
      kv::attn_scores_f16(q.data(), n_g, d, kth.data(), 0, n_t, s16.data(), ld);
      // a range that starts and ends inside tiles
      std::vector<float> part(n_g * ld, -1.f);
      kv::attn_scores_f16(q.data(), n_g, d, kth.data(), 5, n_t - 9, part.data(), ld);
      for (int g = 0; g < n_g; ++g) {
        for (int64_t t = 5; t < n_t - 4; ++t)
          EXPECT_FLOAT_EQ(part[g * ld + t - 5], s16[g * ld + t]);
      }
      for (int g = 0; g < n_g; ++g) {
        for (int64_t t = 0; t < n_t; ++t) {
          double r = 0;
          for (int64_t i = 0; i < d; ++i) r += double(q[g * d + i]) * k[t * d + i];
          EXPECT_NEAR(s32[g * ld + t], r, 1e-4 * (1 + std::fabs(r)));
          EXPECT_NEAR(s16[g * ld + t], r, 1e-4 * (1 + std::fabs(r)));
          for (int64_t i = 0; i < d; ++i) want_acc[g * d + i] += p[g * ld + t] * k[t * d + i];
        }
      }
      kv::attn_accum_f32(p.data(), n_g, ld, k.data(), n_t, d, acc.data());
      kv::attn_accum_f16(p.data(), n_g, ld, kh.data(), n_t, d, acc16.data());
      for (size_t i = 0; i < acc.size(); ++i) {
        EXPECT_NEAR(acc[i], want_acc[i], 1e-4 * (1 + std::fabs(want_acc[i])));
        EXPECT_NEAR(acc16[i], want_acc[i], 1e-4 * (1 + std::fabs(want_acc[i])));
      }
    }
  }
}

TEST(AttnKernels, ExpSubSumAndF16Conversion) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 4);
  for (int64_t n : {1, 5, 16, 100, 257}) {
    std::vector<float> x(n), want(n);
    for (float& v : x) v = nd(rng);
    const float m = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += want[i] = std::exp(x[i] - m);
    const float got = kv::exp_sub_sum(x.data(), n, m);
    EXPECT_NEAR(got, sum, 1e-5 * sum);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(x[i], want[i], 1e-6 + 1e-5 * want[i]);

    std::vector<float> y(n);
    for (float& v : y) v = nd(rng) * 1000;
    y[0] = 1e-7f;  // subnormal in f16
    std::vector<uint16_t> h(n);
    kv::f32_to_f16_row(y.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(h[i], fp32_to_fp16(y[i])) << y[i];
  }
}

}  // namespace
}  // namespace kvtrim
