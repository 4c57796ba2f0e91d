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

// bf16 and q8 (int8 codes, per-token key scale) against plain loops over the decoded rows.
TEST(AttnKernels, Bf16AndQ8ScoresAndAccumMatchLoops) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> code(-127, 127);
  for (int64_t d : {1, 7, 16, 64, 128, 256}) {
    for (int n_g : {1, 3, 6}) {
      const int64_t n_t = 45, ld = 48;
      const int64_t n_tiles = (n_t + kv::kKeyTile - 1) / kv::kKeyTile;
      std::vector<float> q(n_g * d), kb(n_t * d), k8(n_t * d), p(n_g * ld);
      std::vector<uint16_t> vb(n_t * d), ktb(n_tiles * kv::kKeyTile * d, 0);  // bf16 bits
      std::vector<int8_t> v8(n_t * d), kt8(n_tiles * kv::kKeyTile * d, 0);
      std::vector<float> ksc(n_tiles * kv::kKeyTile, 0.f);  // [whole tiles] key scales
      for (float& x : q) x = nd(rng);
      for (float& x : p) x = std::fabs(nd(rng));
      for (int64_t t = 0; t < n_t; ++t) {
        ksc[t] = 0.01f + std::fabs(nd(rng)) * 0.02f;
        for (int64_t i = 0; i < d; ++i) {
          const uint16_t b = fp32_to_bf16(nd(rng));
          const int8_t c = static_cast<int8_t>(code(rng));
          kb[t * d + i] = bf16_to_fp32(b);
          ktb[kv::key_tile_index(t, i, d)] = b;
          vb[t * d + i] = b;
          k8[t * d + i] = c * ksc[t];
          kt8[kv::key_tile_index(t, i, d)] = c;
          v8[t * d + i] = c;
        }
      }
      std::vector<float> sb(n_g * ld), s8(n_g * ld), ab(n_g * d, 0.f), a8(n_g * d, 0.f);
      kv::attn_scores_bf16(q.data(), n_g, d, ktb.data(), 0, n_t, sb.data(), ld);
      kv::attn_scores_q8(q.data(), n_g, d, kt8.data(), ksc.data(), 0, n_t, s8.data(), ld);
      kv::attn_accum_bf16(p.data(), n_g, ld, vb.data(), n_t, d, ab.data());
      kv::attn_accum_q8(p.data(), n_g, ld, v8.data(), n_t, d, a8.data());
      std::vector<float> part(n_g * ld, -1.f);  // a range that starts and ends inside tiles
      kv::attn_scores_q8(q.data(), n_g, d, kt8.data(), ksc.data(), 3, n_t - 7, part.data(), ld);
      for (int g = 0; g < n_g; ++g) {
        for (int64_t t = 3; t < n_t - 4; ++t) EXPECT_FLOAT_EQ(part[g * ld + t - 3], s8[g * ld + t]);
        for (int64_t t = 0; t < n_t; ++t) {
          double rb = 0, r8 = 0;
          for (int64_t i = 0; i < d; ++i) {
            rb += double(q[g * d + i]) * kb[t * d + i];
            r8 += double(q[g * d + i]) * k8[t * d + i];
          }
          EXPECT_NEAR(sb[g * ld + t], rb, 1e-4 * (1 + std::fabs(rb)));
          EXPECT_NEAR(s8[g * ld + t], r8, 1e-4 * (1 + std::fabs(r8)));
        }
        for (int64_t i = 0; i < d; ++i) {
          double wb = 0, w8 = 0;
          for (int64_t t = 0; t < n_t; ++t) {
            wb += double(p[g * ld + t]) * bf16_to_fp32(vb[t * d + i]);
            w8 += double(p[g * ld + t]) * v8[t * d + i];
          }
          EXPECT_NEAR(ab[g * d + i], wb, 1e-4 * (1 + std::fabs(wb)));
          EXPECT_NEAR(a8[g * d + i], w8, 1e-4 * (1 + std::fabs(w8)));
        }
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
