// The attention SIMD kernels against plain loops.
#include "kv/attn_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "kernel_test_util.h"  // (before any other Highway include)
#include "kv/kv_type.h"
#include "kv/quant_formats.h"

namespace kvtrim {
namespace {

using kvtest::expect_accum;
using kvtest::expect_scores;
using kvtest::for_each_target;

// f32 / f16 against plain loops; query-head counts cover one batch (1..6) and split ones (7 ->
// 4 + 3, 9 -> 5 + 4, 12 -> 6 + 6), with phases (few heads) and channel groups of every size.
void f32_f16_match_loops() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int64_t d : {1, 7, 16, 33, 64, 128, 256}) {
    for (int n_g : {1, 2, 3, 4, 5, 6, 7, 9, 12}) {
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
void bf16_q8_match_loops() {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> code(-127, 127);
  for (int64_t d : {1, 7, 16, 33, 64, 128, 256}) {
    for (int n_g : {1, 3, 6, 9}) {
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

// fp8 (E4M3 codes, per-token key scale; value scale folded into p by the caller) and q4
// (q4_0 blocks in the key tiles / value rows of quant_formats.h), over whole and partial ranges.
void fp8_and_q4_match_loops() {
  std::mt19937 rng(19);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> code(0, 255);
  for (int64_t d : {1, 7, 16, 33, 64, 128, 256}) {
    for (int n_g : {1, 3, 6, 9, 12}) {
      const int64_t n_t = 45, ld = 48;
      const int64_t n_tiles = (n_t + kv::kKeyTile - 1) / kv::kKeyTile, nb = kv::q4_blocks(d);
      const int64_t rb = kv::q4_row_bytes(d);
      std::vector<float> q(n_g * d), p(n_g * ld), x(n_t * d);
      std::vector<float> kf(n_t * d), vf(n_t * d), k4(n_t * d), v4(n_t * d);
      std::vector<uint8_t> ktf(n_tiles * kv::kKeyTile * d), vtf(n_t * d);
      std::vector<float> ksc(n_tiles * kv::kKeyTile, 1.f);
      std::vector<uint8_t> kt4(n_tiles * kv::kKeyTile * d / 2 + d), vt4(n_t * rb);
      std::vector<uint16_t> ks4(n_tiles * nb * kv::kKeyTile, 0), vs4(n_t * nb);
      for (float& e : q) e = nd(rng);
      for (float& e : p) e = std::fabs(nd(rng));
      for (float& e : x) e = nd(rng);
      for (int64_t t = 0; t < n_t; ++t) {
        ksc[t] = 0.01f + std::fabs(nd(rng)) * 0.02f;
        for (int64_t i = 0; i < d; ++i) {
          uint8_t c = static_cast<uint8_t>(code(rng));
          if ((c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
          ktf[kv::key_tile_index(t, i, d)] = c;
          kf[t * d + i] = ksc[t] * kv::fp8_e4m3_to_f32(c);
          c = static_cast<uint8_t>(code(rng));
          if ((c & 0x7f) == 0x7f) c ^= 2;
          vtf[t * d + i] = c;
          vf[t * d + i] = kv::fp8_e4m3_to_f32(c);
        }
        kv::q4_encode_key(x.data() + t * d, d, t, kt4.data(), ks4.data());
        kv::q4_decode_key(kt4.data(), ks4.data(), t, d, k4.data() + t * d);
        kv::q4_encode_row(x.data() + t * d, d, vt4.data() + t * rb, vs4.data() + t * nb);
        kv::q4_decode_row(vt4.data() + t * rb, vs4.data() + t * nb, d, v4.data() + t * d);
      }
      // whole range, then ranges that start and end inside tiles
      for (auto [t0, n] : {std::pair<int64_t, int64_t>{0, n_t}, {3, n_t - 7}, {17, 13}, {40, 5}}) {
        std::vector<float> sf(n_g * ld, -1.f), s4(n_g * ld, -1.f);
        kv::attn_scores_fp8(q.data(), n_g, d, ktf.data(), ksc.data(), t0, n, sf.data(), ld);
        kv::attn_scores_q4(q.data(), n_g, d, kt4.data(), ks4.data(), t0, n, s4.data(), ld);
        expect_scores(q, n_g, d, kf, t0, n, sf, ld);
        expect_scores(q, n_g, d, k4, t0, n, s4, ld);
      }
      for (int64_t n : {n_t, int64_t{1}, int64_t{20}}) {
        std::vector<float> acc0(n_g * d);
        for (float& e : acc0) e = nd(rng);
        std::vector<float> af = acc0, a4 = acc0;
        kv::attn_accum_fp8(p.data(), n_g, ld, vtf.data(), n, d, af.data());
        kv::attn_accum_q4(p.data(), n_g, ld, vt4.data(), vs4.data(), n, d, a4.data());
        expect_accum(p, n_g, ld, vf, n, d, acc0, af);
        expect_accum(p, n_g, ld, v4, n, d, acc0, a4);
      }
    }
  }
}

// Every element-coded type of the registry (kv_type.h: one code of 8 bits or more per element)
// through the table's own entry points: rows encoded by ops.encode, the keys laid out in tiles,
// and ops.scores / ops.accum against plain loops over ops.decode — so a type added to the table
// is checked on every target without a new test (q4's block layout: fp8_and_q4_match_loops).
void every_element_type_matches_its_decode() {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  for (const KvTypeInfo& tt : kv_types()) {
    if (tt.code_bits < 8) continue;
    SCOPED_TRACE(tt.name);
    const int64_t w = tt.code_bits / 8;  // bytes per code
    for (int64_t d : {1, 7, 33, 64, 128}) {
      for (int n_g : {1, 4, 9}) {
        const int64_t n_t = 45, ld = 48, n_tiles = (n_t + kv::kKeyTile - 1) / kv::kKeyTile;
        std::vector<float> q(n_g * d), p(n_g * ld), kf(n_t * d), vf(n_t * d),
            ksc(n_tiles * kv::kKeyTile, 1.f);
        std::vector<float> vsc(n_t);
        std::vector<uint8_t> kt(n_tiles * kv::kKeyTile * d * w, 0), vr(n_t * d * w), row(d * w);
        for (float& e : q) e = nd(rng);
        for (float& e : p) e = std::fabs(nd(rng));
        for (int64_t t = 0; t < n_t; ++t) {
          std::vector<float> x(d);
          for (float& e : x) e = nd(rng) * (t % 3 == 0 ? 4.f : 0.5f);
          ksc[t] = tt.ops.encode(x.data(), d, row.data(), false);
          for (int64_t i = 0; i < d; ++i) {
            std::copy_n(row.data() + i * w, w, kt.data() + kv::key_tile_index(t, i, d) * w);
            kf[t * d + i] = tt.ops.decode(row.data(), i, ksc[t]);
          }
          for (float& e : x) e = nd(rng);
          vsc[t] = tt.ops.encode(x.data(), d, vr.data() + t * d * w, false);
          for (int64_t i = 0; i < d; ++i)
            vf[t * d + i] = tt.ops.decode(vr.data() + t * d * w, i, vsc[t]);
        }
        const bool row_scaled = tt.scale == KvScale::kRow;
        for (auto [t0, n] : {std::pair<int64_t, int64_t>{0, n_t}, {3, n_t - 7}, {40, 5}}) {
          std::vector<float> s(n_g * ld, -1.f);
          tt.ops.scores(q.data(), n_g, d, kt.data(), row_scaled ? ksc.data() : nullptr, nullptr, t0,
                        n, s.data(), ld);
          expect_scores(q, n_g, d, kf, t0, n, s, ld);
        }
        std::vector<float> pf = p;  // kRow types: the caller folds the value scales into p
        for (int g = 0; g < n_g && row_scaled; ++g)
          for (int64_t t = 0; t < n_t; ++t) pf[g * ld + t] *= vsc[t];
        std::vector<float> acc0(n_g * d);
        for (float& e : acc0) e = nd(rng);
        std::vector<float> acc = acc0;
        tt.ops.accum(pf.data(), n_g, ld, vr.data(), nullptr, n_t, d, acc.data());
        expect_accum(p, n_g, ld, vf, n_t, d, acc0, acc);
      }
    }
  }
}

// q8 keys scored with an 8-bit query (attn_scores_q8q): every target gives exactly the
// reference of the header (the query quantized per 32 channels, exact integer block sums, one
// f32 fma per block in order, times the key scale), and the result stays within the query's
// rounding of the f32 dot product. Channel counts cover partial blocks and partial 4-channel
// groups; ranges start and end inside tiles; query-head batches as elsewhere.
void q8_query_scores_match_reference() {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> code(-127, 127);
  for (int64_t d : {1, 3, 7, 16, 33, 64, 100, 128, 256}) {
    for (int n_g : {1, 3, 6, 9}) {
      const int64_t n_t = 45, ld = 48;
      const int64_t n_tiles = (n_t + kv::kKeyTile - 1) / kv::kKeyTile;
      std::vector<float> q(n_g * d);
      std::vector<int8_t> kt8(n_tiles * kv::kKeyTile * d);
      std::vector<float> ksc(n_tiles * kv::kKeyTile);
      for (float& x : q) x = nd(rng) * (rng() % 4 == 0 ? 8.f : 1.f);  // some outlier channels
      for (int8_t& c : kt8) c = static_cast<int8_t>(code(rng));        // whole tiles readable
      for (float& x : ksc) x = 0.01f + std::fabs(nd(rng)) * 0.02f;
      kv::QueryQ8 qq;
      qq.set(q.data(), n_g, d);
      const int64_t nblk = qq.nblk(), dp = qq.dp();
      ASSERT_EQ(dp, 32 * ((d + 31) / 32));
      const std::vector<int8_t>& qi = qq.qi;
      const std::vector<float>& dq = qq.dq;
      const std::vector<int32_t>& qsum = qq.qsum;
      std::vector<float> s(n_g * ld, -1.f), part(n_g * ld, -1.f);
      kv::attn_scores_q8q(qq, kt8.data(), ksc.data(), 0, n_t, s.data(), ld);
      kv::attn_scores_q8q(qq, kt8.data(), ksc.data(), 3, n_t - 7, part.data(), ld);
      for (int g = 0; g < n_g; ++g) {
        for (int64_t t = 0; t < n_t; ++t) {
          float want = 0.f;
          double exact = 0, bound = 0;
          for (int64_t b = 0; b < nblk; ++b) {
            int32_t is = 0;
            int32_t sum = 0;
            for (int64_t i = 32 * b; i < std::min(d, 32 * b + 32); ++i) {
              const int c = kt8[kv::key_tile_index(t, i, d)];
              is += qi[g * dp + i] * c;
              sum += qi[g * dp + i];
              exact += double(q[g * d + i]) * c * ksc[t];
              bound += 0.5 * dq[g * nblk + b] * std::abs(c) * ksc[t];  // the query's rounding
            }
            ASSERT_EQ(sum, qsum[g * nblk + b]);
            want = std::fma(static_cast<float>(is), dq[g * nblk + b], want);
          }
          want *= ksc[t];
          ASSERT_EQ(s[g * ld + t], want) << "d " << d << " n_g " << n_g << " g " << g << " t " << t;
          if (t >= 3 && t < n_t - 4) {
            ASSERT_EQ(part[g * ld + t - 3], want);
          }
          EXPECT_NEAR(s[g * ld + t], exact, bound * 1.001 + 1e-5 * (1 + std::fabs(exact)));
        }
      }
    }
  }
}

TEST(AttnKernels, ScoresAndAccumMatchLoops) {
  for_each_target(f32_f16_match_loops);
}
TEST(AttnKernels, Bf16AndQ8ScoresAndAccumMatchLoops) {
  for_each_target(bf16_q8_match_loops);
}
TEST(AttnKernels, Fp8AndQ4ScoresAndAccumMatchLoops) {
  for_each_target(fp8_and_q4_match_loops);
}

TEST(AttnKernels, EveryElementCodedTypeOfTheTableMatchesItsDecode) {
  for_each_target(every_element_type_matches_its_decode);
}

TEST(AttnKernels, Q8KeysWithAnEightBitQueryEqualTheReferenceOnEveryTarget) {
  for_each_target(q8_query_scores_match_reference);
}

// The query's 8-bit form: max|q| of a block maps to ±127, an all-zero block has scale 0 and
// codes 0, a non-finite one (a damaged model) scale 0 and codes 0, channels past d are 0.
TEST(AttnKernels, QueryQuantizationEdges) {
  const int64_t d = 70, dp = 96;
  std::vector<float> q(d, 0.f);
  for (int64_t i = 0; i < 32; ++i) q[i] = 0.5f * static_cast<float>(i) - 3.f;  // block 0
  q[40] = std::numeric_limits<float>::quiet_NaN();                             // block 1
  q[65] = -2.f;                                                                // block 2
  kv::QueryQ8 qq;
  qq.set(q.data(), 1, d);
  ASSERT_EQ(qq.dp(), dp);
  const std::vector<int8_t>& qi = qq.qi;
  const std::vector<float>& dq = qq.dq;
  const std::vector<int32_t>& qsum = qq.qsum;
  EXPECT_FLOAT_EQ(dq[0], 12.5f / 127.f);
  EXPECT_EQ(qi[31], 127);
  EXPECT_EQ(qi[6], 0);  // q = 0
  EXPECT_EQ(dq[1], 0.f);
  for (int64_t i = 32; i < 64; ++i) EXPECT_EQ(qi[i], 0);
  EXPECT_FLOAT_EQ(dq[2], 2.f / 127.f);
  EXPECT_EQ(qi[65], -127);
  EXPECT_EQ(qsum[2], -127);
  for (int64_t i = d; i < dp; ++i) EXPECT_EQ(qi[i], 0);
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
