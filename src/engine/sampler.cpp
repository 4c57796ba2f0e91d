#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/nn.h"

namespace kvtrim {

int32_t argmax(const float* logits, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

Sampler::Sampler(SamplerParams p) : p_(p), rng_(p.seed) {
  KVTRIM_CHECK(p_.temperature >= 0.f, "temperature must be >= 0 (got %g)", p_.temperature);
  KVTRIM_CHECK(p_.top_k >= 0, "top-k must be >= 0 (got %d)", p_.top_k);
  KVTRIM_CHECK(p_.top_p > 0.f && p_.top_p <= 1.f, "top-p must be in (0, 1] (got %g)", p_.top_p);
}

namespace {

// Candidates whose scaled logit is within this of the largest are listed first; the walk leaves
// them only with probability below n_vocab * e^-16 (relative to the top token's weight: < 0.6 %
// for 49k tokens), and then the list is completed (the same walk, the same draw).
constexpr float kFirstSpan = 16.f;

// Σ x in double over 8 interleaved partial sums (a single chain waits on each add's latency:
// ~50 us for 49k tokens).
double sum_double(const float* x, size_t n) {
  double a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) a[j] += static_cast<double>(x[i + static_cast<size_t>(j)]);
  }
  for (; i < n; ++i) a[0] += static_cast<double>(x[i]);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

}  // namespace

// Only as much of the candidate list is built and sorted as the walk reads. The list starts with
// the tokens within kFirstSpan of the largest scaled logit, a set that precedes every other token
// in the order of a full sort (logit descending, lower id first on ties); it is completed with the
// rest only if the top-k cut, the nucleus or the draw needs more (rare). The cut to the top k is
// one selection (nth_element); the sorted prefix grows by partial sorts of the rest, doubling, so
// a step that stops after a few candidates (the usual case: the top tokens hold the mass) costs
// O(V) in SIMD-friendly passes plus the exponentials, where a full sort of a 49k-151k vocabulary
// cost ~ms per token (the server's default, top_k = 0 and top_p = 1, sorted it all). The
// candidates are visited in the order of a full sort, so a seed gives the tokens the full sort
// gave; the exponentials are the SIMD ones of ops/nn.h (exp_sub_sum) and the softmax sum is added
// in 8 interleaved double sums in token order (last-bit differences from a sorted std::exp sum).
int32_t Sampler::sample(const float* logits, int32_t n_vocab) {
  bool nan = false;
  for (int32_t i = 0; i < n_vocab; ++i) nan |= logits[i] != logits[i];  // (no branch: vectorizes)
  if (nan) {
    for (int32_t i = 0; i < n_vocab; ++i)
      KVTRIM_CHECK(!std::isnan(logits[i]), "model produced NaN logits (token %d)", i);
  }
  if (p_.temperature <= 0.f) return argmax(logits, n_vocab);

  // e_[i] = exp(l_i / T - max) for every token (SIMD)
  const size_t n = static_cast<size_t>(n_vocab);
  e_.resize(n);
  const float inv_t = 1.f / p_.temperature;
  for (size_t i = 0; i < n; ++i) e_[i] = logits[i] * inv_t;
  const float mx = max_of(e_.data(), n_vocab);
  const float first_cut = mx - kFirstSpan;
  cand_.resize(n);
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {  // (stored always, kept by the count: no branch to mispredict)
    cand_[m] = {e_[i], static_cast<int32_t>(i)};
    m += e_[i] >= first_cut ? 1 : 0;
  }
  cand_.resize(m);
  bool complete = m == n;
  auto complete_list = [&] {  // every token, the scaled logits recomputed as above
    cand_.resize(n);
    for (size_t i = 0; i < n; ++i) cand_[i] = {logits[i] * inv_t, static_cast<int32_t>(i)};
    complete = true;
  };
  exp_sub_sum(e_.data(), n_vocab, mx);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t k = n;
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < k) {
    k = static_cast<size_t>(p_.top_k);
    if (cand_.size() < k) complete_list();
    std::nth_element(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(k - 1), cand_.end(), by_logit);
    cand_.resize(k);  // exactly the top k
    complete = true;
  }
  double sum = 0;
  if (k == n) {
    sum = sum_double(e_.data(), n);
  } else {
    for (const auto& c : cand_) sum += e_[static_cast<size_t>(c.second)];
  }
  auto weight = [&](const std::pair<float, int32_t>& c) { return static_cast<double>(e_[static_cast<size_t>(c.second)]); };
  size_t sorted = 0;  // [0, sorted) of the top k is in final order
  auto at = [&](size_t i) -> const std::pair<float, int32_t>& {
    if (i >= cand_.size() && !complete) {
      complete_list();  // its first `sorted` entries, once sorted again, are the same tokens
      sorted = 0;
    }
    if (i >= sorted) {
      const size_t upto = std::min(cand_.size(), std::max({i + 1, 2 * sorted, size_t{64}}));
      std::partial_sort(cand_.begin() + static_cast<std::ptrdiff_t>(sorted), cand_.begin() + static_cast<std::ptrdiff_t>(upto),
                        cand_.end(), by_logit);
      sorted = upto;
    }
    return cand_[i];
  };
  // nucleus: the smallest prefix whose mass reaches top_p (top_p = 1: every candidate)
  size_t keep = k;
  double mass = sum;
  if (p_.top_p < 1.f) {
    double acc = 0;
    for (size_t i = 0; i < k; ++i) {
      acc += weight(at(i));
      if (acc / sum >= p_.top_p) {
        keep = i + 1;
        mass = acc;
        break;
      }
    }
  }
  std::uniform_real_distribution<double> u(0.0, mass);
  double r = u(rng_);
  for (size_t i = 0; i < keep; ++i) {
    const auto& c = at(i);
    r -= weight(c);
    if (r <= 0) return c.second;
  }
  return at(keep - 1).second;
}

}  // namespace kvtrim
