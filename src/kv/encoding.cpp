// Segment encodings (encoding.h): basis interning and the basis stage's maps.
#include "kv/encoding.h"
#include "kv/recovery.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

#include "kv/attn_kernels.h"
#include "kv/quant_formats.h"
#include "kv/sparse_code.h"

namespace kvtrim::kv {
namespace {

uint64_t hash_floats(const std::vector<float>& v, uint64_t h) {
  for (float x : v) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof(b));
    h = (h ^ b) * 0x100000001b3ull;  // FNV-1a over 32-bit words
  }
  return h;
}

}  // namespace

std::shared_ptr<const BasisMat> intern_basis(int d, int r, const std::vector<float>& enc,
                                             const std::vector<float>& dec) {
  static std::mutex mu;
  static std::multimap<uint64_t, std::weak_ptr<const BasisMat>> table;
  const uint64_t h = hash_floats(dec, hash_floats(enc, 0xcbf29ce484222325ull ^ (uint64_t(d) << 32 | uint32_t(r))));
  std::lock_guard<std::mutex> lock(mu);
  auto [b, e] = table.equal_range(h);
  for (auto it = b; it != e;) {
    std::shared_ptr<const BasisMat> m = it->second.lock();
    if (!m) {  // its last user is gone
      it = table.erase(it);
      continue;
    }
    if (m->d == d && m->r == r && m->enc == enc && m->dec == dec) return m;
    ++it;
  }
  auto m = std::make_shared<BasisMat>();
  m->d = d;
  m->r = r;
  m->enc = enc;
  m->dec = dec;
  table.emplace(h, m);
  return m;
}

void SideEncoding::sparse_encode(const float* x, int64_t n, int64_t ldx, int32_t* idx, float* coef) const {
  omp_encode(basis->enc.data(), d, basis->r, x, n, ldx, topk, idx, coef);
  // fp8 entries: coefficients fitted to the grid they are stored on (a 3-bit mantissa's rounding
  // of one large coefficient would otherwise stay in the vector; see refit_rounded)
  if (dtype == KvDtype::kFP8)
    refit_rounded(basis->enc.data(), d, basis->r, x, n, ldx, topk, idx, coef, fp8_grid_round, kFp8E4M3Max);
}

std::shared_ptr<const BasisMat> hadamard_basis(int d) {
  std::vector<float> h(static_cast<size_t>(d) * static_cast<size_t>(d));
  const float s = 1.f / std::sqrt(static_cast<float>(d));
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j)  // H[i, j] = (-1)^popcount(i & j)
      h[static_cast<size_t>(i) * d + j] = (__builtin_popcount(static_cast<unsigned>(i & j)) & 1) ? -s : s;
  return intern_basis(d, d, h, {});
}

float SideEncoding::pruned_magnitude(const float* f, int i) const {
  if (dist == RecoveryDist::kFill) return f[0];
  return recovery_draw(dist, seed, f[0], dist == RecoveryDist::kGaussian ? f[1] : 0.f, i, rec_sqrt);
}

void SideEncoding::to_coords(const float* x, int64_t n, int64_t ldx, float* c) const {
  if (!basis) {
    for (int64_t j = 0; j < n; ++j) std::copy(x + j * ldx, x + j * ldx + d, c + j * d);
    return;
  }
  const int r = basis->r;
  std::fill(c, c + n * r, 0.f);
  // c[j, :] = Σ_i x[j, i] U[i, :]: the weighted-sum kernel with U's rows as the "values"
  attn_accum_f32(x, static_cast<int>(n), ldx, basis->enc.data(), d, r, c);
}

void SideEncoding::query_coords(const float* q, int64_t n, float* qc) const {
  if (!basis) {
    std::copy(q, q + n * d, qc);
    return;
  }
  const int r = basis->r;
  std::fill(qc, qc + n * r, 0.f);
  attn_accum_f32(q, static_cast<int>(n), d, basis->decoder().data(), d, r, qc);
}

void SideEncoding::from_coords(const float* c, int64_t n, float* x, int64_t ldx) const {
  if (!basis) {
    for (int64_t j = 0; j < n; ++j) std::copy(c + j * d, c + (j + 1) * d, x + j * ldx);
    return;
  }
  // x[j, i] = Σ_k D[i, k] c[j, k]
  rows_dot_f32(basis->decoder().data(), d, basis->r, c, static_cast<int>(n), basis->r, x, ldx);
}

}  // namespace kvtrim::kv

namespace kvtrim::kv {

void SideEncoding::magnitude_channels(const float* c, int32_t* ch) const {
  const int w = width(), T = topk;
  thread_local std::vector<int32_t> order;
  order.resize(static_cast<size_t>(w));
  for (int j = 0; j < w; ++j) order[static_cast<size_t>(j)] = j;
  // decreasing |c|, ties to the lower index: a total order, so the chosen set is unique
  // (a NaN counts as the largest magnitude, so the order stays a strict weak order)
  auto mag = [c](int32_t i) {
    const float m = std::fabs(c[i]);
    return std::isnan(m) ? std::numeric_limits<float>::infinity() : m;
  };
  auto before = [&mag](int32_t a, int32_t b) {
    const float x = mag(a), y = mag(b);
    return x > y || (x == y && a < b);
  };
  if (T < w) std::nth_element(order.begin(), order.begin() + T, order.end(), before);
  std::sort(order.begin(), order.begin() + T);
  std::copy_n(order.begin(), T, ch);
}

}  // namespace kvtrim::kv
