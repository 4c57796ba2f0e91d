// matmul_many and matmul_jobs (several products in one pool job) against matmul per product,
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "matmul_test_util.h"
#include "ops/matmul.h"

namespace kvtrim {
namespace {

using testing_matmul::make_weight;
using testing_matmul::make_x;
using testing_matmul::TestWeight;
using testing_matmul::type_name;

// matmul_many (q/k/v and gate/up in one pool job) equals matmul per weight bit for bit: weights
// of mixed types (so mixed activation formats: f32, 8-bit per 32, 8-bit per 256) and row
// counts that do not fall on the row grain, for a single token, small batches and the sgemm path.
TEST(Matmul, ManyWeightsEqualMatmulPerWeightBitForBit) {
  ThreadPool pool2(2), pool3(3);
  const int64_t n_cols = 512;
  const std::vector<GgmlType> mix = {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16, GgmlType::Q6_K,
                                     GgmlType::Q4_0};
  std::vector<TestWeight> w;
  for (size_t i = 0; i < mix.size(); ++i)
    w.push_back(make_weight(mix[i], 17 + 29 * static_cast<int64_t>(i), n_cols, false, 40 + static_cast<uint32_t>(i)));
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
    for (int64_t n_tok : {int64_t{1}, int64_t{3}, kMatmulGemmMinTokens - 1, kMatmulGemmMinTokens}) {
      const auto x = make_x(n_tok * n_cols, 70 + static_cast<uint32_t>(n_tok));
      for (int n : {1, 2, 5}) {
        std::vector<const WeightView*> ws;
        std::vector<std::vector<float>> ys, want;
        for (int i = 0; i < n; ++i) {
          ws.push_back(&w[static_cast<size_t>(i)].view);
          ys.emplace_back(static_cast<size_t>(n_tok * ws.back()->n_rows), -1.f);
          want.emplace_back(static_cast<size_t>(n_tok * ws.back()->n_rows));
          matmul(*ws.back(), x.data(), n_tok, want.back().data(), pool);
        }
        std::vector<float*> yp;
        for (auto& y : ys) yp.push_back(y.data());
        matmul_many(ws.data(), yp.data(), n, x.data(), n_tok, pool);
        for (int i = 0; i < n; ++i)
          ASSERT_EQ(ys[static_cast<size_t>(i)], want[static_cast<size_t>(i)])
              << "weight " << i << " (" << type_name(mix[static_cast<size_t>(i)]) << "), " << n << " weights, n_tok "
              << n_tok << ", threads " << (pool ? pool->n_threads() : 1);
      }
    }
  }
  const TestWeight narrow = make_weight(GgmlType::Q8_0, 8, 256, false, 3);
  const WeightView* bad[2] = {&w[0].view, &narrow.view};
  std::vector<float> y0(64 * 1000), y1(64 * 1000);
  float* yb[2] = {y0.data(), y1.data()};
  const auto x = make_x(n_cols, 1);
  EXPECT_THROW(matmul_many(bad, yb, 2, x.data(), 1, &pool2), Error);
}

// matmul_jobs (a MoE layer's experts: each product its own input and token count) equals matmul
// per job bit for bit: mixed types and widths, inputs shared by several jobs (quantized once) or
// not, token counts on both sides of the sgemm threshold (those jobs run on their own), a job
// with no tokens.
TEST(Matmul, JobsEqualMatmulPerJobBitForBit) {
  ThreadPool pool2(2), pool3(3);
  const std::vector<std::pair<GgmlType, int64_t>> mix = {{GgmlType::Q4_K, 512}, {GgmlType::Q6_K, 512},
                                                         {GgmlType::Q8_0, 256}, {GgmlType::F16, 256},
                                                         {GgmlType::Q4_0, 512}, {GgmlType::IQ4_XS, 256}};
  std::vector<TestWeight> w;
  for (size_t i = 0; i < mix.size(); ++i)
    w.push_back(make_weight(mix[i].first, 9 + 23 * static_cast<int64_t>(i), mix[i].second, false,
                            90 + static_cast<uint32_t>(i)));
  const int64_t counts[] = {1, 2, 5, 0, kMatmulGemmMinTokens, 3};
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
    std::vector<std::vector<float>> xs, ys, want;
    std::vector<MatmulJob> jobs;
    for (size_t i = 0; i < w.size(); ++i) {
      const int64_t n_tok = counts[i];
      const int64_t n_cols = w[i].view.n_cols;
      // jobs 1 and 4 read job 0's input (same width and count: quantized once)
      const bool shared = (i == 1 || i == 4);
      xs.push_back(make_x(std::max<int64_t>(n_tok, 1) * n_cols, 200 + static_cast<uint32_t>(i)));
      ys.emplace_back(static_cast<size_t>(std::max<int64_t>(n_tok, 1) * w[i].view.n_rows), -1.f);
      want.push_back(ys.back());
      jobs.push_back(MatmulJob{&w[i].view, shared ? nullptr : xs.back().data(), n_tok, nullptr});
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (!jobs[i].x) {
        jobs[i].x = xs[0].data();
        jobs[i].n_tok = jobs[0].n_tok;
        ys[i].assign(static_cast<size_t>(jobs[i].n_tok * w[i].view.n_rows), -1.f);
        want[i] = ys[i];
      }
      jobs[i].y = ys[i].data();
      matmul(w[i].view, jobs[i].x, jobs[i].n_tok, want[i].data(), pool);
    }
    matmul_jobs(jobs.data(), static_cast<int>(jobs.size()), pool);
    for (size_t i = 0; i < jobs.size(); ++i)
      ASSERT_EQ(ys[i], want[i]) << "job " << i << " (" << type_name(mix[i].first) << ", " << jobs[i].n_tok
                                << " tokens), threads " << (pool ? pool->n_threads() : 1);
  }
}

}  // namespace
}  // namespace kvtrim
