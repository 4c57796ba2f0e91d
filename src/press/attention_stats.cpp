// Attention statistics shared by the presses and the session's observer (see the header).
#include "press/attention_stats.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/ggml_type.h"
#include "core/thread_pool.h"
#include "ops/matmul.h"
#include "ops/nn.h"

namespace kvtrim {

namespace {

// Query rows per block so that the block's logits [rows, n_k] stay around 16 MiB.
constexpr int64_t kLogitBudget = int64_t{4} << 20;  // floats

}  // namespace

void attention_max_sum(const float* q, const int32_t* q_pos, int64_t n_q, int n_head, int ih, int group,
                       int head_dim, const float* k, const int32_t* k_pos, int64_t n_k, float scale, int window,
                       float* acc_max, float* acc_sum, ThreadPool* pool, const float* extra_lse) {
  if (n_q <= 0 || n_k <= 0 || (acc_max == nullptr && acc_sum == nullptr)) return;
  KVTRIM_ASSERT(group > 0 && (ih + 1) * group <= n_head && head_dim > 0);
  const size_t d = static_cast<size_t>(head_dim);
  const size_t g_sz = static_cast<size_t>(group);
  // The head's keys as an f32 "weight" [n_k, head_dim], so logits = Q · Kᵀ runs as sgemm.
  const WeightView kw{GgmlType::F32, k, n_k, head_dim, d * sizeof(float)};
  const int64_t q_block = std::max<int64_t>(1, kLogitBudget / (n_k * group));
  std::vector<float> qb, logits;
  std::vector<int64_t> lo, hi;  // [rows] visible key run of each row
  for (int64_t i0 = 0; i0 < n_q; i0 += q_block) {
    const int64_t nb = std::min(q_block, n_q - i0);
    const int64_t rows = nb * group;  // row r = i * group + g
    qb.resize(static_cast<size_t>(rows) * d);
    for (int64_t i = 0; i < nb; ++i) {
      for (int g = 0; g < group; ++g) {
        const float* src = q + (static_cast<size_t>(i0 + i) * static_cast<size_t>(n_head) +
                                static_cast<size_t>(ih * group + g)) * d;
        std::copy(src, src + d, qb.data() + (static_cast<size_t>(i) * g_sz + static_cast<size_t>(g)) * d);
      }
    }
    logits.resize(static_cast<size_t>(rows) * static_cast<size_t>(n_k));
    matmul(kw, qb.data(), rows, logits.data(), pool);  // [rows, n_k] = q·k
    lo.assign(static_cast<size_t>(rows), 0);
    hi.assign(static_cast<size_t>(rows), 0);
    // eq. 3: softmax over the visible run [lo, hi) of each row, in place.
    for_range(pool, rows, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int32_t qp = q_pos[i0 + r / group];
        const int64_t h = std::upper_bound(k_pos, k_pos + n_k, qp) - k_pos;
        const int64_t l =
            window > 0 ? std::lower_bound(k_pos, k_pos + n_k, qp - window + 1) - k_pos : 0;
        lo[static_cast<size_t>(r)] = l;
        hi[static_cast<size_t>(r)] = h;
        if (l >= h) continue;
        float* row = logits.data() + static_cast<size_t>(r) * static_cast<size_t>(n_k) + l;
        const int64_t w = h - l;
        for (int64_t c = 0; c < w; ++c) row[c] *= scale;
        const float extra =
            extra_lse ? extra_lse[static_cast<size_t>(i0 + r / group) * static_cast<size_t>(n_head) +
                                  static_cast<size_t>(ih * group + static_cast<int>(r % group))]
                      : -INFINITY;
        const float mx = std::max(max_of(row, w), extra);
        float sum = exp_sub_sum(row, w, mx);  // SIMD exp (ops/nn.h)
        if (extra > -INFINITY) sum += std::exp(extra - mx);  // -inf without extra_lse
        const float inv = 1.f / sum;
        for (int64_t c = 0; c < w; ++c) row[c] *= inv;
      }
    });
    // eq. 14: fold the block into acc, threads split the key (column) range.
    for_range(pool, n_k, 256, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t l = std::max(c0, lo[static_cast<size_t>(r)]);
        const int64_t h = std::min(c1, hi[static_cast<size_t>(r)]);
        const float* row = logits.data() + static_cast<size_t>(r) * static_cast<size_t>(n_k);
        const size_t g = static_cast<size_t>(r % group);
        if (acc_max) {
          float* a = acc_max + g;
          for (int64_t c = l; c < h; ++c) {
            float& dst = a[static_cast<size_t>(c) * g_sz];
            dst = std::max(dst, row[c]);
          }
        }
        if (acc_sum) {
          float* a = acc_sum + g;
          for (int64_t c = l; c < h; ++c) a[static_cast<size_t>(c) * g_sz] += row[c];
        }
      }
    });
  }
}

void self_logsumexp(const float* q, const int32_t* q_pos, int64_t n_q, int n_head, int n_head_kv, int head_dim,
                    const float* k, const int32_t* k_pos, int64_t n_k, float scale, int window, float* out) {
  KVTRIM_ASSERT(n_head_kv > 0 && n_head % n_head_kv == 0);
  const int group = n_head / n_head_kv;
  const size_t d = static_cast<size_t>(head_dim);
  std::vector<double> logit(static_cast<size_t>(n_k));
  for (int64_t i = 0; i < n_q; ++i)
    for (int h = 0; h < n_head; ++h) {
      const float* qi = q + (static_cast<size_t>(i) * static_cast<size_t>(n_head) + static_cast<size_t>(h)) * d;
      double mx = -INFINITY;
      for (int64_t j = 0; j < n_k; ++j) {
        const bool vis = k_pos[j] <= q_pos[i] && (window <= 0 || q_pos[i] - k_pos[j] < window);
        if (!vis) {
          logit[static_cast<size_t>(j)] = -INFINITY;
          continue;
        }
        const float* kj = k + (static_cast<size_t>(j) * static_cast<size_t>(n_head_kv) + static_cast<size_t>(h / group)) * d;
        double dot = 0;
        for (size_t c = 0; c < d; ++c) dot += static_cast<double>(qi[c]) * static_cast<double>(kj[c]);
        logit[static_cast<size_t>(j)] = dot * static_cast<double>(scale);
        mx = std::max(mx, logit[static_cast<size_t>(j)]);
      }
      double z = 0;
      if (mx > -INFINITY)
        for (int64_t j = 0; j < n_k; ++j)
          if (logit[static_cast<size_t>(j)] > -INFINITY) z += std::exp(logit[static_cast<size_t>(j)] - mx);
      out[static_cast<size_t>(i) * static_cast<size_t>(n_head) + static_cast<size_t>(h)] =
          mx > -INFINITY ? static_cast<float>(mx + std::log(z)) : -INFINITY;
    }
}

}  // namespace kvtrim
