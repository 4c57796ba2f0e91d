// Token sampling: greedy, or temperature → top-k → top-p over the softmax, with a seeded
// generator so the same seed gives the same tokens.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace kvtrim {

struct SamplerParams {
  float temperature = 0.f;  // 0 = greedy (argmax)
  int top_k = 40;           // 0 = no top-k cut
  float top_p = 0.95f;      // 1 = no nucleus cut
  uint64_t seed = 42;
};

class Sampler {
 public:
  explicit Sampler(SamplerParams p);
  // Picks a token id from logits[n_vocab]. Throws Error if logits contain NaN.
  int32_t sample(const float* logits, int32_t n_vocab);
  const SamplerParams& params() const { return p_; }

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // scratch: (logit / T, id)
  std::vector<float> e_;                         // scratch: exp(logit / T - max) per id
};

// Index of the largest logit (lowest index on ties).
int32_t argmax(const float* logits, int32_t n);

}  // namespace kvtrim
