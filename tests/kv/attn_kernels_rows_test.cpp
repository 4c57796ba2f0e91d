// The attention kernels of per-token rows (SPARK's and SWAN's channel rows: lists of kept
// coordinates and bitmasks) against plain loops, on every SIMD target (split from
// attn_kernels_test.cpp, which checks the dense rows' kernels).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "kernel_test_util.h"  // (before any other Highway include)
#include "kv/attn_kernels.h"
#include "kv/kv_type.h"
#include "kv/quant_formats.h"

namespace kvtrim {
namespace {

using kvtest::expect_accum;
using kvtest::expect_scores;
using kvtest::for_each_target;

// n rows of kept channels below dim, each strictly increasing: T per row (fixed), or random counts
// 0 .. dim with an empty row (1) and a full one (2); ch holds them packed, off [n + 1] the rows.
void random_rows(int64_t n, int64_t dim, int64_t T, bool fixed, std::mt19937& rng,
                 std::vector<uint32_t>* off, std::vector<int64_t>* ch) {
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
      default:  // a type without sparse-row kernels (kv_type(t).sparse_kernels false)
        ADD_FAILURE() << kv_dtype_name(type) << " sparse rows";
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
        default:
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
  const KvDtype types[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8,
                           KvDtype::kFP8};
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
            const int64_t t = std::upper_bound(off.begin(), off.end(), static_cast<uint32_t>(j)) -
                              off.begin() - 1;
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
          for (uint8_t& b : signs)
            b = static_cast<uint8_t>(byte(rng));  // bits past dim too: ignored
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
          SCOPED_TRACE(::testing::Message()
                       << "dim " << dim << " fixed " << fixed << " type " << static_cast<int>(type)
                       << " mode " << static_cast<int>(mode));
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

TEST(AttnKernels, SparseScoresAndAccumMatchLoops) {
  for_each_target(sparse_matches_loops);
}

TEST(AttnKernels, MaskedScoresAccumAndDecodeMatchLoops) {
  for_each_target(masked_matches_loops);
}

}  // namespace
}  // namespace kvtrim
