#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

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

int32_t Sampler::sample(const float* logits, int32_t n_vocab) {
  for (int32_t i = 0; i < n_vocab; ++i)
    KVTRIM_CHECK(!std::isnan(logits[i]), "model produced NaN logits (token %d)", i);
  if (p_.temperature <= 0.f) return argmax(logits, n_vocab);

  cand_.resize(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) cand_[static_cast<size_t>(i)] = {logits[i] / p_.temperature, i};
  size_t k = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < k) k = static_cast<size_t>(p_.top_k);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(k), cand_.end(), by_logit);
  cand_.resize(k);
  // softmax over the top-k
  const float mx = cand_[0].first;
  double sum = 0;
  for (auto& c : cand_) {
    c.first = std::exp(c.first - mx);
    sum += c.first;
  }
  // nucleus: smallest prefix whose mass reaches top_p
  double acc = 0;
  size_t keep = cand_.size();
  for (size_t i = 0; i < cand_.size(); ++i) {
    acc += cand_[i].first / sum;
    if (acc >= p_.top_p) {
      keep = i + 1;
      break;
    }
  }
  cand_.resize(keep);
  double mass = 0;
  for (const auto& c : cand_) mass += c.first;
  std::uniform_real_distribution<double> u(0.0, mass);
  double r = u(rng_);
  for (const auto& c : cand_) {
    r -= c.first;
    if (r <= 0) return c.second;
  }
  return cand_.back().second;
}

}  // namespace kvtrim
