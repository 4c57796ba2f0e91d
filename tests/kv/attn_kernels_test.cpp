// The attention SIMD kernels against plain loops.
#include "kv/attn_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

// The kernels compiled for AVX3_DL (attn_kernels_q8q.cpp's VNNI path) are swept too: without
// this the test's target list (hwy::SupportedAndGeneratedTargets) stops at AVX3. In a unity
// build no earlier file of the unit may have included Highway already: the wish would come late.
#if defined(HIGHWAY_HWY_DETECT_TARGETS_H_) && !defined(HWY_WANT_AVX3_DL)
#error "Highway is already included: HWY_WANT_AVX3_DL would not take effect"
#endif
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#include "core/fp16.h"
#include "hwy/targets.h"
#include "kv/quant_formats.h"

namespace kvtrim {
namespace {

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

// Keys K [n_t, d] (decoded f32) against the score kernel's output for the range [t0, t0 + n):
// s[g * ld + t - t0] ≈ q_g · k_t within 1e-4 of Σ |q_i k_i|.
void expect_scores(const std::vector<float>& q, int n_g, int64_t d, const std::vector<float>& k,
                   int64_t t0, int64_t n, const std::vector<float>& s, int64_t ld) {
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
void expect_accum(const std::vector<float>& p, int n_g, int64_t ld, const std::vector<float>& v,
                  int64_t n_t, int64_t dv, const std::vector<float>& acc0,
                  const std::vector<float>& acc) {
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

// n rows of kept channels below dim, each strictly increasing: T per row (fixed), or random counts
// 0 .. dim with an empty row (1) and a full one (2); ch holds them packed, off [n + 1] the rows.
void random_rows(int64_t n, int64_t dim, int64_t T, bool fixed, std::mt19937& rng, std::vector<uint32_t>* off,
                 std::vector<int64_t>* ch) {
  off->assign(static_cast<size_t>(n) + 1, 0);
  ch->clear();
  for (int64_t t = 0; t < n; ++t) {
    int64_t cnt = fixed ? T : std::uniform_int_distribution<int64_t>(0, dim)(rng);
    if (!fixed && t == 1) cnt = 0;
    if (!fixed && t == 2) cnt = dim;
    std::vector<int64_t> all(dim);
    for (int64_t i = 0; i < dim; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(cnt);
    std::sort(all.begin(), all.end());
    ch->insert(ch->end(), all.begin(), all.end());
    (*off)[t + 1] = static_cast<uint32_t>(ch->size());
  }
}

// Packed per-token entries (rows off[t] .. off[t + 1]) of random values encoded in a KvDtype
// (q8 / fp8: one scale per row), with kv::kMaskedSlack bytes of readable slack after the last
// entry, and the values the kernels must read back (decoded, scales applied).
struct Packed {
  std::vector<float> f32, scale, decoded;
  std::vector<uint16_t> u16;
  std::vector<int8_t> q8;
  std::vector<uint8_t> fp8;
  const void* vals(KvDtype type) const {
    switch (type) {
      case KvDtype::kF32:
        return f32.data();
      case KvDtype::kQ8:
        return q8.data();
      case KvDtype::kFP8:
        return fp8.data();
      default:
        return u16.data();
    }
  }
  const float* row_scale(KvDtype type) const {
    return type == KvDtype::kQ8 || type == KvDtype::kFP8 ? scale.data() : nullptr;
  }
};
Packed pack(KvDtype type, const std::vector<uint32_t>& off, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  const size_t n = off.size() - 1, nnz = off.back(), slack = kv::kMaskedSlack;  // bytes
  Packed pk;  // exactly kMaskedSlack bytes past the last entry (so ASan sees any longer read)
  pk.f32.assign(nnz + slack / 4, 0.f);
  pk.u16.assign(nnz + slack / 2, 0);
  pk.q8.assign(nnz + slack, 0);
  pk.fp8.assign(nnz + slack, 0);
  pk.scale.assign(n, 0.f);
  pk.decoded.assign(nnz, 0.f);
  for (size_t t = 0; t < n; ++t) {
    std::vector<float> x(off[t + 1] - off[t]);
    for (float& e : x) e = nd(rng);
    const size_t b = off[t];
    switch (type) {
      case KvDtype::kF32:
        std::copy(x.begin(), x.end(), pk.f32.begin() + static_cast<std::ptrdiff_t>(b));
        break;
      case KvDtype::kF16:
      case KvDtype::kBF16:
        for (size_t j = 0; j < x.size(); ++j)
          pk.u16[b + j] = type == KvDtype::kF16 ? fp32_to_fp16(x[j]) : fp32_to_bf16(x[j]);
        break;
      case KvDtype::kQ8:
        pk.scale[t] = kv::q8_encode(x.data(), static_cast<int64_t>(x.size()), &pk.q8[b], 1);
        break;
      case KvDtype::kFP8:
        pk.scale[t] = kv::fp8_encode(x.data(), static_cast<int64_t>(x.size()), &pk.fp8[b], 1);
        break;
      case KvDtype::kQ4:  // no sparse-row kernels (kv_type(kQ4).sparse_kernels)
        ADD_FAILURE() << "q4 sparse rows";
        break;
    }
    for (size_t j = b; j < off[t + 1]; ++j) {
      switch (type) {
        case KvDtype::kF32:
          pk.decoded[j] = pk.f32[j];
          break;
        case KvDtype::kF16:
          pk.decoded[j] = fp16_to_fp32(pk.u16[j]);
          break;
        case KvDtype::kBF16:
          pk.decoded[j] = bf16_to_fp32(pk.u16[j]);
          break;
        case KvDtype::kQ8:
          pk.decoded[j] = pk.scale[t] * pk.q8[j];
          break;
        case KvDtype::kFP8:
          pk.decoded[j] = pk.scale[t] * kv::fp8_e4m3_to_f32(pk.fp8[j]);
          break;
        case KvDtype::kQ4:
          break;
      }
    }
  }
  return pk;
}

// Sparse rows (per-token channel subsets) of every value type, uint8 / uint16 indices, fixed
// and variable counts (rows with no entry and with every channel), against the same rows
// decoded to dense [n, dim] with zeros in the dropped channels; wide rows (600, 1100: Lexico's
// dictionaries) take the same SIMD kernels.
void sparse_matches_loops() {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  const KvDtype types[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16,
                              KvDtype::kQ8, KvDtype::kFP8};
  for (int64_t dim : {1, 7, 16, 33, 64, 128, 256, 300, 600, 1100}) {
    for (int idx_bytes : {1, 2}) {
      if (idx_bytes == 1 && dim > 256) continue;
      for (bool fixed : {true, false}) {
        for (KvDtype type : types) {
          const int64_t n = 45, T = std::max<int64_t>(1, dim / 4);
          // rows: channel lists and counts
          std::vector<uint32_t> off;
          std::vector<int64_t> ch;
          random_rows(n, dim, T, fixed, rng, &off, &ch);
          const size_t nnz = ch.size();
          std::vector<uint8_t> i8(nnz);
          std::vector<uint16_t> i16(nnz);
          for (size_t j = 0; j < nnz; ++j) {
            i8[j] = static_cast<uint8_t>(ch[j]);
            i16[j] = static_cast<uint16_t>(ch[j]);
          }
          // values in the type, and the dense decoded rows
          const Packed pk = pack(type, off, rng);
          std::vector<float> dense(n * dim, 0.f);
          for (size_t j = 0; j < nnz; ++j) {
            const int64_t t = std::upper_bound(off.begin(), off.end(), static_cast<uint32_t>(j)) - off.begin() - 1;
            dense[t * dim + ch[j]] = pk.decoded[j];
          }
          kv::SparseRows r;
          r.type = type;
          r.vals = pk.vals(type);
          r.idx = idx_bytes == 1 ? static_cast<const void*>(i8.data()) : i16.data();
          r.idx_bytes = idx_bytes;
          r.off = fixed ? nullptr : off.data();
          r.T = fixed ? static_cast<int>(T) : 0;
          r.scale = pk.row_scale(type);
          r.dim = dim;
          for (int n_g : {1, 3, 6, 9}) {
            const int64_t ldq = dim + 3, ld = 48, ld_acc = dim + 5;
            std::vector<float> q(n_g * ldq), qd(n_g * dim), p(n_g * ld);
            for (float& e : q) e = nd(rng);
            for (int g = 0; g < n_g; ++g) {
              for (int64_t i = 0; i < dim; ++i) qd[g * dim + i] = q[g * ldq + i];
            }
            for (float& e : p) e = std::fabs(nd(rng));
            for (auto [t0, m] : {std::pair<int64_t, int64_t>{0, n}, {3, n - 7}, {17, 13}}) {
              std::vector<float> sc(n_g * ld, -1.f);
              kv::sparse_scores(r, q.data(), n_g, ldq, t0, m, sc.data(), ld);
              expect_scores(qd, n_g, dim, dense, t0, m, sc, ld);
              // accum over rows [t0, t0 + m) with p indexed from t0; acc [n_g, ld_acc]
              std::vector<float> acc(n_g * ld_acc), acc0(n_g * dim), got(n_g * dim);
              for (float& e : acc) e = nd(rng);
              for (int g = 0; g < n_g; ++g) {
                for (int64_t i = 0; i < dim; ++i) acc0[g * dim + i] = acc[g * ld_acc + i];
              }
              const float pad = acc[dim];  // an element of the padding, never written
              kv::sparse_accum(r, p.data(), n_g, ld, t0, m, acc.data(), ld_acc);
              EXPECT_EQ(acc[dim], pad);
              for (int g = 0; g < n_g; ++g) {
                for (int64_t i = 0; i < dim; ++i) got[g * dim + i] = acc[g * ld_acc + i];
              }
              std::vector<float> rows(dense.begin() + t0 * dim, dense.begin() + (t0 + m) * dim);
              expect_accum(p, n_g, ld, rows, m, dim, acc0, got);
            }
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// Masked rows (bitmask of kept coordinates) of every value type, fixed and variable counts (rows
// with no entry and with every coordinate), with pruned coordinates reading 0, a fill, a weighted
// fill, or SPARK's signed recovery ±fill · w_c; scores, accumulation and decoding against the
// rows built here as dense f32. dim > 512 takes the scalar path.
void masked_matches_loops() {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> byte(0, 255);
  const KvDtype types[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8,
                              KvDtype::kFP8};
  enum class Pruned { kZero, kFill, kWeighted, kSigned };
  for (int64_t dim : {1, 7, 16, 33, 64, 128, 256, 512, 600}) {  // 512: the SIMD path's largest
    const int64_t n = 45, mb = (dim + 7) / 8, T = std::max<int64_t>(1, dim / 5);
    for (bool fixed : {true, false}) {
      for (KvDtype type : types) {
        for (Pruned mode : {Pruned::kZero, Pruned::kFill, Pruned::kWeighted, Pruned::kSigned}) {
          std::vector<uint32_t> off;
          std::vector<uint8_t> mask(n * mb, 0), signs(n * mb);
          std::vector<int64_t> ch;
          random_rows(n, dim, T, fixed, rng, &off, &ch);
          for (int64_t t = 0; t < n; ++t)
            for (uint32_t j = off[t]; j < off[t + 1]; ++j)
              mask[t * mb + ch[j] / 8] |= static_cast<uint8_t>(1u << (ch[j] % 8));
          for (uint8_t& b : signs) b = static_cast<uint8_t>(byte(rng));  // bits past dim too: ignored
          const Packed pk = pack(type, off, rng);
          std::vector<float> fill(n * 2), weight(dim), dense(n * dim, 0.f);
          for (float& e : fill) e = std::fabs(nd(rng));
          for (float& e : weight) e = 0.5f + std::fabs(nd(rng));
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t c = 0; c < dim; ++c) {
              if (mode == Pruned::kZero) break;
              const float w = mode == Pruned::kFill ? 1.f : weight[c];
              const bool neg = mode == Pruned::kSigned && ((signs[t * mb + c / 8] >> (c % 8)) & 1);
              dense[t * dim + c] = (neg ? -1.f : 1.f) * fill[t * 2] * w;
            }
            for (uint32_t j = off[t]; j < off[t + 1]; ++j) dense[t * dim + ch[j]] = pk.decoded[j];
          }
          kv::MaskedRows r;
          r.type = type;
          r.vals = pk.vals(type);
          r.mask = mask.data();
          r.off = fixed ? nullptr : off.data();
          r.T = fixed ? static_cast<int>(T) : 0;
          r.scale = pk.row_scale(type);
          r.signs = mode == Pruned::kSigned ? signs.data() : nullptr;
          r.fill = mode == Pruned::kZero ? nullptr : fill.data();
          r.fill_stride = 2;
          r.weight = mode == Pruned::kWeighted || mode == Pruned::kSigned ? weight.data() : nullptr;
          r.dim = dim;
          SCOPED_TRACE(::testing::Message() << "dim " << dim << " fixed " << fixed << " type "
                                            << static_cast<int>(type) << " mode " << static_cast<int>(mode));
          for (int n_g : {1, 2, 3, 4, 5, 9}) {  // every head bucket: 1 2 3 4, 6 (5 padded), 8 + 1
            const int64_t ldq = dim + 3, ld = 48, ld_acc = dim + 1;
            std::vector<float> q(n_g * ldq), qd(n_g * dim), p(n_g * ld);
            for (float& e : q) e = nd(rng);
            for (int g = 0; g < n_g; ++g)
              for (int64_t i = 0; i < dim; ++i) qd[g * dim + i] = q[g * ldq + i];
            for (float& e : p) e = std::fabs(nd(rng));
            for (auto [t0, m] : {std::pair<int64_t, int64_t>{0, n}, {3, n - 7}, {17, 13}}) {
              std::vector<float> sc(n_g * ld, -1.f);
              kv::masked_scores(r, q.data(), n_g, ldq, t0, m, sc.data(), ld);
              expect_scores(qd, n_g, dim, dense, t0, m, sc, ld);
              // accumulation into a strided acc [n_g, ld_acc] (a contiguous one for n_g = 1)
              const int64_t la = n_g == 1 ? dim : ld_acc;
              std::vector<float> acc(n_g * la + 1), acc0(n_g * dim), got(n_g * dim);
              for (float& e : acc) e = nd(rng);
              for (int g = 0; g < n_g; ++g)
                for (int64_t i = 0; i < dim; ++i) acc0[g * dim + i] = acc[g * la + i];
              std::vector<float> pads;  // the padding columns and the element past the last row
              for (int g = 0; g < n_g; ++g)
                for (int64_t i = dim; i < la; ++i) pads.push_back(acc[g * la + i]);
              pads.push_back(acc[n_g * la]);
              kv::masked_accum(r, p.data(), n_g, ld, t0, m, acc.data(), la);
              std::vector<float> pads_after;
              for (int g = 0; g < n_g; ++g)
                for (int64_t i = dim; i < la; ++i) pads_after.push_back(acc[g * la + i]);
              pads_after.push_back(acc[n_g * la]);
              EXPECT_EQ(pads_after, pads);
              for (int g = 0; g < n_g; ++g)
                for (int64_t i = 0; i < dim; ++i) got[g * dim + i] = acc[g * la + i];
              std::vector<float> rows(dense.begin() + t0 * dim, dense.begin() + (t0 + m) * dim);
              expect_accum(p, n_g, ld, rows, m, dim, acc0, got);
            }
            if (::testing::Test::HasFatalFailure()) return;
          }
          // decode: exactly the dense rows (values as the type reads them)
          std::vector<float> out(n * dim + 8, -7.f);
          kv::masked_decode(r, 0, n, out.data(), dim);
          for (int64_t i = 0; i < n * dim; ++i) ASSERT_EQ(out[i], dense[i]) << "element " << i;
        }
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
TEST(AttnKernels, SparseScoresAndAccumMatchLoops) {
  for_each_target(sparse_matches_loops);
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

TEST(AttnKernels, MaskedScoresAccumAndDecodeMatchLoops) {
  for_each_target(masked_matches_loops);
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
