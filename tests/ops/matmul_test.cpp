// matvec / matmul / get_row against ref:: (dequantize_row + double accumulation), for every
// weight type, odd shapes, 1/2/3 threads and every SIMD target this CPU supports.
//
// Tolerance. The quantized types multiply with x rounded to 8 bits per block (32 elements
// for Q4_0..Q8_0, 256 for the k-quants) with d = amax_block / 127, so each x_i is off by at
// most d/2 = amax_block(i) / 254. The exact result therefore differs from ref by at most
//   qbound = sum_i |w_i| * amax_block(i) / 254            (w_i dequantized)
// plus f32 accumulation error, bounded generously by 1e-4 * sum_i (|w_i| + wmax_block(i)) |x_i|
// (wmax_block: the largest |w| of the 32-block, covering the offset/min terms that cancel).
// The test asserts |y - ref| <= 1.001 * qbound + that term + 1e-6. For typical data the
// error is ~1/1000 of sum|w x|. F32/F16/BF16 weights are not quantized: only the f32 term.

#include "ops/matmul.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/ggml_type.h"
#include "core/quant_blocks.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "ops/dequant.h"
#include "ops/matmul_internal.h"
#include "ops/weight_pack.h"
#include "matmul_test_util.h"

namespace kvtrim {
namespace {

using testing_matmul::is_float;
using testing_matmul::is_kquant;
using testing_matmul::make_weight;
using testing_matmul::make_x;
using testing_matmul::TestWeight;
using testing_matmul::type_name;

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                           GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q2_K,
                           GgmlType::Q3_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

// The error bound of the header comment for row r against activation x.
double error_bound(const TestWeight& w, int64_t r, const float* x) {
  const GgmlType t = w.view.type;
  const int64_t n = w.view.n_cols;
  const float* wr = w.deq.data() + r * n;
  const int64_t qblk = is_kquant(t) ? kQK_K : kQK;
  double qbound = 0.0, fterm = 0.0;
  for (int64_t b0 = 0; b0 < n; b0 += qblk) {
    double amax = 0.0;
    for (int64_t i = b0; i < b0 + qblk && i < n; ++i)
      amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
    for (int64_t i = b0; i < b0 + qblk && i < n; ++i) qbound += std::fabs(wr[i]) * amax / 254.0;
  }
  for (int64_t b0 = 0; b0 < n; b0 += kQK) {
    double wmax = 0.0;
    for (int64_t i = b0; i < std::min(n, b0 + kQK); ++i)
      wmax = std::max(wmax, std::fabs(static_cast<double>(wr[i])));
    for (int64_t i = b0; i < std::min(n, b0 + kQK); ++i)
      fterm += (std::fabs(wr[i]) + wmax) * std::fabs(x[i]);
  }
  return (is_float(t) ? 0.0 : 1.001 * qbound) + 1e-4 * fterm + 1e-6;
}

// SIMD targets to test: each one this CPU supports, one at a time (restored afterwards).
class TargetSweep {
 public:
  TargetSweep() {
    const int64_t all = hwy::SupportedTargets();
    for (int64_t bit = 1; bit != 0 && bit <= all; bit <<= 1) {
      if ((all & bit) != 0) targets_.push_back(bit);
    }
  }
  ~TargetSweep() { hwy::SetSupportedTargetsForTest(0); }
  template <typename Fn>
  void each(const Fn& fn) {
    for (int64_t t : targets_) {
      hwy::SetSupportedTargetsForTest(t);
      const std::string name = detail::kernel_target_name();
      seen_.insert(name);
      SCOPED_TRACE("kernel target " + name);
      fn();
    }
    hwy::SetSupportedTargetsForTest(0);
  }

 private:
  std::vector<int64_t> targets_;

 public:
  std::set<std::string> seen_;  // kernel targets actually dispatched to
};

struct Shape {
  int64_t n_rows, n_cols;
};

std::vector<Shape> shapes_for(GgmlType t) {
  if (is_kquant(t)) return {{1, 256}, {7, 512}, {33, 768}, {130, 1536}};
  return {{1, 32}, {7, 96}, {33, 576}, {130, 1536}};
}

// ref::matvec agrees with a dequantize-then-dot written here.
TEST(Matmul, RefMatvecMatchesNaiveDequantDot) {
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const int64_t n_cols = is_kquant(t) ? 512 : 96;
    const TestWeight w = make_weight(t, 5, n_cols, false, 11);
    const auto x = make_x(n_cols, 12);
    std::vector<float> y(5);
    ref::matvec(w.view, x.data(), y.data());
    std::vector<float> row(static_cast<size_t>(n_cols));
    for (int64_t r = 0; r < 5; ++r) {
      dequantize_row(t, w.data.data() + static_cast<size_t>(r) * w.view.row_bytes, row.data(),
                     n_cols);
      double s = 0.0;
      for (int64_t i = 0; i < n_cols; ++i)
        s += static_cast<double>(row[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
      EXPECT_NEAR(y[static_cast<size_t>(r)], s, 1e-5 * (1.0 + std::fabs(s)));
    }
  }
}

TEST(Matmul, MatvecMatchesRefAllTypesShapesThreadsTargets) {
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  TargetSweep sweep;
  int checked = 0;
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    for (bool random_blocks : {false, true}) {
      SCOPED_TRACE(random_blocks ? "random blocks" : "quantize_row");
      for (const Shape& s : shapes_for(t)) {
        SCOPED_TRACE(std::to_string(s.n_rows) + "x" + std::to_string(s.n_cols));
        const TestWeight w = make_weight(t, s.n_rows, s.n_cols, random_blocks,
                                         static_cast<uint32_t>(s.n_rows * 31 + s.n_cols));
        const auto x = make_x(s.n_cols, 7);
        std::vector<float> ref_y(static_cast<size_t>(s.n_rows));
        ref::matvec(w.view, x.data(), ref_y.data());
        sweep.each([&] {
          for (ThreadPool* p : pools) {
            std::vector<float> y(static_cast<size_t>(s.n_rows), NAN);
            matvec(w.view, x.data(), y.data(), p);
            for (int64_t r = 0; r < s.n_rows; ++r) {
              ASSERT_NEAR(y[static_cast<size_t>(r)], ref_y[static_cast<size_t>(r)],
                          error_bound(w, r, x.data()))
                  << "row " << r << " threads " << (p ? p->n_threads() : 1);
            }
            ++checked;
          }
        });
      }
    }
  }
  EXPECT_GT(checked, 0);
  std::string names;
  for (const auto& n : sweep.seen_) names += n + " ";
  std::cout << "kernel targets exercised: " << names << "\n";
#ifdef HWY_COMPILE_ONLY_STATIC
  // A build for this CPU only (KVTRIM_NATIVE: the release and debug presets): its one target.
  EXPECT_EQ(sweep.seen_.size(), 1u) << names;
#else
  // On x86 with AVX2 the AVX2 path and the portable one are both exercised.
  if ((hwy::SupportedTargets() & HWY_AVX2) != 0) {
    EXPECT_TRUE(sweep.seen_.count("AVX2") == 1 && sweep.seen_.size() >= 2) << names;
  }
#endif
}

TEST(Matmul, MatmulMatchesRefForTokenCounts) {
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const Shape s = is_kquant(t) ? Shape{67, 512} : Shape{67, 160};
    const TestWeight w = make_weight(t, s.n_rows, s.n_cols, false, 5);
    for (int64_t n_tok : {1, 7, 64}) {
      SCOPED_TRACE("n_tok " + std::to_string(n_tok));
      const auto x = make_x(n_tok * s.n_cols, 9);
      std::vector<float> ref_y(static_cast<size_t>(n_tok * s.n_rows));
      ref::matmul(w.view, x.data(), n_tok, ref_y.data());
      for (ThreadPool* p : pools) {
        std::vector<float> y(ref_y.size(), NAN);
        matmul(w.view, x.data(), n_tok, y.data(), p);
        for (int64_t tk = 0; tk < n_tok; ++tk) {
          for (int64_t r = 0; r < s.n_rows; ++r) {
            const size_t k = static_cast<size_t>(tk * s.n_rows + r);
            ASSERT_NEAR(y[k], ref_y[k], error_bound(w, r, x.data() + tk * s.n_cols))
                << "tok " << tk << " row " << r << " threads " << (p ? p->n_threads() : 1);
          }
        }
      }
    }
  }
}

// Under kMatmulGemmMinTokens tokens, matmul gives every token exactly matvec's result (the
// grouped legacy kernel decodes each weight block once for up to 4 tokens, in the same
// operations per token; a strip lane does what the single-token strip does): a batched decode
// step equals the solo ones bit for bit, on every SIMD target.
TEST(Matmul, SmallBatchesEqualMatvecBitForBit) {
  ThreadPool pool2(2);
  TargetSweep sweep;
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const Shape s = is_kquant(t) ? Shape{37, 512} : Shape{37, 160};
    const TestWeight w = make_weight(t, s.n_rows, s.n_cols, true, 6);
    // (9 = 8 + 1 or 4 + 4 + 1 per strip group: a group of one token inside a batch)
    for (int64_t n_tok : {int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{8}, int64_t{9}, kMatmulGemmMinTokens - 1}) {
      const auto x = make_x(n_tok * s.n_cols, 10 + static_cast<uint32_t>(n_tok));
      sweep.each([&] {
        std::vector<float> y(static_cast<size_t>(n_tok * s.n_rows)), one(static_cast<size_t>(s.n_rows));
        matmul(w.view, x.data(), n_tok, y.data(), &pool2);
        for (int64_t tk = 0; tk < n_tok; ++tk) {
          matvec(w.view, x.data() + tk * s.n_cols, one.data(), &pool2);
          for (int64_t r = 0; r < s.n_rows; ++r)
            ASSERT_EQ(y[static_cast<size_t>(tk * s.n_rows + r)], one[static_cast<size_t>(r)])
                << "n_tok " << n_tok << " tok " << tk << " row " << r;
        }
      });
    }
  }
}

// Each token of matmul equals ref::matvec of that token (ref::matmul's layout).
// The legacy types' kernels (the 8-row strips of ops/legacy_strips-inl.h where the type and
// target have them, the row kernels otherwise) against a scalar reference of the same arithmetic
// in double: the activation quantized exactly as the kernels quantize it (quantize_act), then
// Σ_i w_i · q_i · d_x per block. The integer part is exact in the kernels, so what remains is
// their f32 accumulation: far tighter than error_bound (which also covers the activation
// rounding). Every target, 1 to 11 tokens, strips cut by the row count and by the thread split.
// The integer kernels (row kernels and 8-row strips) equal the dot product of the dequantized
// weights with the quantized activation, computed in double: legacy types against BlockQ8A
// activations, k-quants against BlockQ8_K (Q4_K's strips included).
TEST(Matmul, IntegerKernelsEqualQuantizedActivationDotInDouble) {
  ThreadPool pool2(2), pool3(3);
  TargetSweep sweep;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
    SCOPED_TRACE(type_name(t));
    const detail::ActFormat fmt = detail::act_format(t);
    const bool kq = fmt == detail::ActFormat::kQ8K;
    const std::vector<Shape> shapes =
        kq ? std::vector<Shape>{Shape{13, 256}, Shape{40, 512}, Shape{130, 1536}}
           : std::vector<Shape>{Shape{13, 64}, Shape{40, 576}, Shape{130, 1536}};
    for (bool random_blocks : {false, true}) {
      for (const Shape& s : shapes) {
        SCOPED_TRACE(std::to_string(s.n_rows) + "x" + std::to_string(s.n_cols));
        const TestWeight w = make_weight(t, s.n_rows, s.n_cols, random_blocks, 17 + static_cast<uint32_t>(s.n_rows));
        for (int64_t n_tok : {int64_t{1}, int64_t{3}, int64_t{11}}) {
          const auto x = make_x(n_tok * s.n_cols, 23 + static_cast<uint32_t>(n_tok));
          const size_t stride = detail::act_row_bytes(fmt, s.n_cols);
          std::vector<uint8_t> q(stride * static_cast<size_t>(n_tok));
          for (int64_t tk = 0; tk < n_tok; ++tk)
            detail::quantize_act(fmt, x.data() + tk * s.n_cols, q.data() + stride * static_cast<size_t>(tk), s.n_cols);
          std::vector<double> want(static_cast<size_t>(n_tok * s.n_rows)), mag(want.size());
          for (int64_t tk = 0; tk < n_tok; ++tk) {
            const auto* xb = reinterpret_cast<const detail::BlockQ8A*>(q.data() + stride * static_cast<size_t>(tk));
            const auto* xk = reinterpret_cast<const BlockQ8_K*>(q.data() + stride * static_cast<size_t>(tk));
            auto xq = [&](int64_t i) {  // the quantized activation element i, in double
              return kq ? static_cast<double>(xk[i / kQK_K].qs[i % kQK_K]) * xk[i / kQK_K].d
                        : static_cast<double>(xb[i / kQK].qs[i % kQK]) * xb[i / kQK].d;
            };
            for (int64_t r = 0; r < s.n_rows; ++r) {
              double acc = 0.0, m = 0.0;
              for (int64_t i = 0; i < s.n_cols; ++i) {
                const double v = static_cast<double>(w.deq[static_cast<size_t>(r * s.n_cols + i)]) * xq(i);
                acc += v;
                m += std::fabs(v);
              }
              want[static_cast<size_t>(tk * s.n_rows + r)] = acc;
              mag[static_cast<size_t>(tk * s.n_rows + r)] = m;
            }
          }
          sweep.each([&] {
            for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
              std::vector<float> y(want.size(), NAN);
              matmul(w.view, x.data(), n_tok, y.data(), p);
              for (size_t k = 0; k < y.size(); ++k)
                ASSERT_NEAR(y[k], want[k], 2e-6 * mag[k] + 1e-6)
                    << "tok " << k / static_cast<size_t>(s.n_rows) << " row " << k % static_cast<size_t>(s.n_rows)
                    << " n_tok " << n_tok << " threads " << (p ? p->n_threads() : 1);
            }
          });
        }
      }
    }
  }
}

// A row's result does not depend on where its strip of 8 starts (the row range a thread gets,
// the rows left over at the end): the rows of a view that starts k rows into the matrix give
// bit for bit what they give in the whole matrix, for one token and for a batch.
TEST(Matmul, RowResultsDoNotDependOnTheStripTheyFallIn) {
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const Shape s = is_kquant(t) ? Shape{45, 512} : Shape{45, 160};
    const TestWeight w = make_weight(t, s.n_rows, s.n_cols, false, 31);
    for (int64_t n_tok : {int64_t{1}, int64_t{5}}) {
      const auto x = make_x(n_tok * s.n_cols, 32);
      std::vector<float> all(static_cast<size_t>(n_tok * s.n_rows));
      matmul(w.view, x.data(), n_tok, all.data(), nullptr);
      for (int64_t k : {1, 3, 7, 9}) {
        WeightView sub = w.view;
        sub.data = w.data.data() + static_cast<size_t>(k) * w.view.row_bytes;
        sub.n_rows = s.n_rows - k;
        std::vector<float> part(static_cast<size_t>(n_tok * sub.n_rows));
        matmul(sub, x.data(), n_tok, part.data(), nullptr);
        for (int64_t tk = 0; tk < n_tok; ++tk)
          for (int64_t r = 0; r < sub.n_rows; ++r)
            ASSERT_EQ(part[static_cast<size_t>(tk * sub.n_rows + r)], all[static_cast<size_t>(tk * s.n_rows + r + k)])
                << "offset " << k << " row " << r << " tok " << tk;
      }
    }
  }
}

// With set_int8_prefill(true) the types with an integer prefill kernel (8-row strips; Q4_K / Q6_K
// 16-row tiles with AVX-512 VNNI, from kKTileMinTokens tokens on) give every token of a product
// matvec's result bit for bit (and matmul_many's), on every SIMD target; off, the same product is
// the f32 sgemm path, which differs from matvec (8-bit activations) but is close. 45 rows: two
// tiles and a padded one; 16 and 45 tokens: one group and 5 groups of 8 plus a 5-token group.
TEST(Matmul, Int8PrefillGivesEachTokenItsDecodeResult) {
  ThreadPool pool2(2);
  TargetSweep sweep;
  std::set<std::string> with_q6k_kernel;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K,
                     GgmlType::Q6_K}) {
    SCOPED_TRACE(type_name(t));
    const int64_t nc = is_kquant(t) ? 512 : 160;
    const TestWeight w = make_weight(t, 45, nc, false, 12);
    for (int64_t n_tok : {kMatmulGemmMinTokens, int64_t{45}}) {
      const auto x = make_x(n_tok * nc, 13 + static_cast<uint32_t>(n_tok));
      sweep.each([&] {
        std::vector<float> f32(static_cast<size_t>(n_tok * 45)), int8(f32.size()), many(f32.size()), one(45);
        set_int8_prefill(false);
        matmul(w.view, x.data(), n_tok, f32.data(), &pool2);
        set_int8_prefill(true);
        EXPECT_TRUE(int8_prefill());
        matmul(w.view, x.data(), n_tok, int8.data(), &pool2);
        const WeightView* ws[2] = {&w.view, &w.view};
        std::vector<float> many2(many.size());
        float* ys[2] = {many.data(), many2.data()};
        matmul_many(ws, ys, 2, x.data(), n_tok, &pool2);
        set_int8_prefill(false);
        const bool integer = detail::has_strip_kernel(t);
        if (integer && t == GgmlType::Q6_K) with_q6k_kernel.insert(detail::kernel_target_name());
        int differ = 0;
        for (int64_t tk = 0; tk < n_tok; ++tk) {
          matvec(w.view, x.data() + tk * nc, one.data(), &pool2);
          for (int64_t r = 0; r < 45; ++r) {
            const size_t k = static_cast<size_t>(tk * 45 + r);
            if (integer) {
              ASSERT_EQ(int8[k], one[static_cast<size_t>(r)]) << "n_tok " << n_tok << " tok " << tk << " row " << r;
              ASSERT_EQ(many[k], int8[k]);
              ASSERT_EQ(many2[k], int8[k]);
            } else {
              ASSERT_EQ(int8[k], f32[k]) << "no integer prefill kernel: the sgemm path either way";
            }
            differ += f32[k] != one[static_cast<size_t>(r)];
            ASSERT_NEAR(f32[k], one[static_cast<size_t>(r)], error_bound(w, r, x.data() + tk * nc));
          }
        }
        EXPECT_GT(differ, 0) << "the f32 path should not equal the 8-bit one";
      });
    }
  }
  // the tiles ran wherever this CPU has AVX-512 VNNI
  if (sweep.seen_.count("AVX3_DL") != 0) {
    EXPECT_EQ(with_q6k_kernel.count("AVX3_DL"), 1u);
  }
}

// A weight with a packed copy (ops/weight_pack.h, read by ops/legacy_packed-inl.h) gives the
// results of the same weight without one, bit for bit: every packable type, row counts that fill
// no tile (1), one (16) and leave a partial one (37, 130), an odd block count (160 columns),
// random block bytes, 1 to 45 tokens (one token, batched decode steps, an 8-bit prefill of whole
// and partial 8-token groups), 1-3 threads (splits inside a tile), every SIMD target (elsewhere
// than AVX3_DL the copy is ignored), and matmul_many with row offsets off the tile grid.
TEST(Matmul, PackedWeightsEqualUnpackedBitForBit) {
  ThreadPool pool2(2), pool3(3);
  TargetSweep sweep;
  EXPECT_FALSE(PackedWeight::available(GgmlType::Q4_K));
  EXPECT_FALSE(PackedWeight::available(GgmlType::F16));
  const TestWeight k4 = make_weight(GgmlType::Q4_K, 40, 256, false, 2);
  EXPECT_THROW(PackedWeight{k4.view}, Error);
  set_int8_prefill(true);
  int packed_runs = 0;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0}) {
    SCOPED_TRACE(type_name(t));
    for (const Shape& s : {Shape{1, 64}, Shape{16, 160}, Shape{37, 160}, Shape{130, 576}}) {
      SCOPED_TRACE(std::to_string(s.n_rows) + "x" + std::to_string(s.n_cols));
      const TestWeight w = make_weight(t, s.n_rows, s.n_cols, s.n_rows != 37, 50 + static_cast<uint32_t>(s.n_rows));
      const PackedWeight pw(w.view);
      EXPECT_EQ(pw.size(), PackedWeight::bytes(t, s.n_rows, s.n_cols));
      EXPECT_EQ(pw.size(), static_cast<size_t>((s.n_rows + 15) / 16) * 16 * w.view.row_bytes);
      const WeightView pv = pw.view(w.view);
      for (int64_t n_tok : {1, 2, 3, 4, 5, 8, 9, 15, 16, 45}) {
        const auto x = make_x(n_tok * s.n_cols, 60 + static_cast<uint32_t>(n_tok));
        sweep.each([&] {
          if (PackedWeight::available(t)) ++packed_runs;
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
            std::vector<float> want(static_cast<size_t>(n_tok * s.n_rows)), got(want.size(), NAN);
            matmul(w.view, x.data(), n_tok, want.data(), p);
            matmul(pv, x.data(), n_tok, got.data(), p);
            ASSERT_EQ(got, want) << "n_tok " << n_tok << " threads " << (p ? p->n_threads() : 1);
          }
        });
      }
    }
  }
  // matmul_many: the packed weights' rows start at 37 and 37 + 130 of the concatenation
  const TestWeight a = make_weight(GgmlType::Q4_1, 37, 576, false, 71), b = make_weight(GgmlType::Q8_0, 130, 576, true, 72),
                   c = make_weight(GgmlType::Q5_1, 21, 576, true, 73);
  const PackedWeight pb(b.view), pc(c.view);
  const WeightView vb = pb.view(b.view), vc = pc.view(c.view);
  for (int64_t n_tok : {1, 4, 20}) {
    const auto x = make_x(n_tok * 576, 80 + static_cast<uint32_t>(n_tok));
    const WeightView* plain[3] = {&a.view, &b.view, &c.view};
    const WeightView* packed[3] = {&a.view, &vb, &vc};
    std::vector<std::vector<float>> want(3), got(3);
    float *yw[3], *yg[3];
    for (int i = 0; i < 3; ++i) {
      want[i].resize(static_cast<size_t>(n_tok * plain[i]->n_rows));
      got[i].assign(want[i].size(), NAN);
      yw[i] = want[i].data();
      yg[i] = got[i].data();
    }
    matmul_many(plain, yw, 3, x.data(), n_tok, &pool3);
    matmul_many(packed, yg, 3, x.data(), n_tok, &pool3);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(got[i], want[i]) << "weight " << i << " n_tok " << n_tok;
  }
  set_int8_prefill(false);
  if (sweep.seen_.count("AVX3_DL") != 0) {
    EXPECT_GT(packed_runs, 0);
  }
}

// Model::load packs every matrix into one huge-page buffer (PackedWeight's caller-storage
// constructor): the same bytes as a copy in its own buffer, back to back without overlap (a
// slice written past its end would show as a changed neighbour), and a misaligned slice refused.
TEST(Matmul, PackedWeightsInOneHugePageBufferAreTheSameBytes) {
  const TestWeight a = make_weight(GgmlType::Q4_1, 37, 576, false, 91), b = make_weight(GgmlType::Q8_0, 130, 160, true, 92),
                   c = make_weight(GgmlType::Q5_0, 16, 64, true, 93);
  const TestWeight* ws[3] = {&a, &b, &c};
  size_t slot[3], total = 0;
  for (int i = 0; i < 3; ++i) {
    slot[i] = (PackedWeight::bytes(ws[i]->view.type, ws[i]->view.n_rows, ws[i]->view.n_cols) + 63) / 64 * 64;
    total += slot[i];
  }
  HugePageBuffer buf(total);
  ASSERT_EQ(buf.size(), total);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % 64, 0u);  // (a few KiB: 4 KiB pages)
  std::memset(buf.data(), 0xA5, total);
  // packed last slice first: a slice written past its end would spoil the one after it
  size_t off[3] = {0, slot[0], slot[0] + slot[1]};
  std::vector<std::unique_ptr<PackedWeight>> in_buf(3);
  for (int i = 2; i >= 0; --i) in_buf[static_cast<size_t>(i)] = std::make_unique<PackedWeight>(ws[i]->view, buf.data() + off[i]);
  for (int i = 0; i < 3; ++i) {
    const PackedWeight own(ws[i]->view);
    const PackedWeight& in = *in_buf[static_cast<size_t>(i)];
    ASSERT_EQ(in.size(), own.size());
    EXPECT_EQ(std::memcmp(in.data(), own.data(), own.size()), 0) << "weight " << i;
    EXPECT_EQ(in.view(ws[i]->view).packed, in.data());
  }
  EXPECT_THROW(PackedWeight(a.view, buf.data() + 32), Error);
  // pack_all (Model::load): the same slices in one new buffer
  HugePageBuffer all;
  const std::vector<PackedWeight> ps = PackedWeight::pack_all({a.view, b.view, c.view}, &all);
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(all.size(), total);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(static_cast<const uint8_t*>(ps[static_cast<size_t>(i)].data()), all.data() + off[i]);
    EXPECT_EQ(std::memcmp(ps[static_cast<size_t>(i)].data(), in_buf[static_cast<size_t>(i)]->data(), ps[static_cast<size_t>(i)].size()), 0);
  }
  EXPECT_THROW(PackedWeight::pack_all({a.view, TestWeight(make_weight(GgmlType::Q4_K, 16, 256, false, 2)).view}, &all), Error);
}

TEST(Matmul, RefMatmulRowsAreRefMatvecs) {
  const TestWeight w = make_weight(GgmlType::Q4_1, 9, 64, false, 3);
  const auto x = make_x(3 * 64, 4);
  std::vector<float> y(27), yv(9);
  ref::matmul(w.view, x.data(), 3, y.data());
  for (int64_t tk = 0; tk < 3; ++tk) {
    ref::matvec(w.view, x.data() + tk * 64, yv.data());
    for (int64_t r = 0; r < 9; ++r)
      EXPECT_EQ(y[static_cast<size_t>(tk * 9 + r)], yv[static_cast<size_t>(r)]);
  }
}

TEST(Matmul, GetRowIsDequantizedRow) {
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const int64_t n_cols = 256;
    const TestWeight w = make_weight(t, 4, n_cols, true, 21);
    std::vector<float> out(static_cast<size_t>(n_cols));
    get_row(w.view, 3, out.data());
    for (int64_t i = 0; i < n_cols; ++i)
      EXPECT_EQ(out[static_cast<size_t>(i)], w.deq[static_cast<size_t>(3 * n_cols + i)]);
    EXPECT_THROW(get_row(w.view, 4, out.data()), Error);
  }
}

TEST(Matmul, RejectsUnsupportedTypeAndBadShape) {
  std::vector<uint8_t> data(4096);
  std::vector<float> x(256), y(4);
  WeightView w{GgmlType::IQ2_XXS, data.data(), 4, 256, 66};
  EXPECT_THROW(matvec(w, x.data(), y.data(), nullptr), Error);
  WeightView bad{GgmlType::Q4_0, data.data(), 4, 48, ggml_row_size(GgmlType::Q4_0, 32)};
  EXPECT_THROW(matvec(bad, x.data(), y.data(), nullptr), Error);
}

// Constant activations make every block's rounding exact: results then agree to f32 precision.
TEST(Matmul, ExactWhenActivationIsRepresentable) {
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const TestWeight w = make_weight(t, 5, 512, false, 8);
    std::vector<float> x(512, 0.5f), y(5), ref_y(5);
    matvec(w.view, x.data(), y.data(), nullptr);
    ref::matvec(w.view, x.data(), ref_y.data());
    for (size_t r = 0; r < 5; ++r) {
      double mag = 0.0;
      for (int64_t i = 0; i < 512; ++i)
        mag += std::fabs(w.deq[r * 512 + static_cast<size_t>(i)]) * 0.5;
      EXPECT_NEAR(y[r], ref_y[r], 1e-5 * mag + 1e-6);
    }
  }
}

}  // namespace
}  // namespace kvtrim
