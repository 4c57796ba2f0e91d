// Sampled recovery of pruned key coordinates (SPARK's Gaussian / exponential F; plan.h
// ChannelSpec): the magnitude a pruned coordinate c of a token with parameters (μ, σ) reads,
// drawn by a counter-based hash so that every read (every decode step, the reference path, a
// clone of the cache) sees the same value without storing it. The draw depends only on the seed,
// the token's parameters and c, so evicting other tokens never changes it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kv/kv_types.h"

namespace kvtrim::kv {

inline uint64_t recovery_hash(uint32_t seed, float mu, float sigma, int c) {
  uint32_t a, b;
  std::memcpy(&a, &mu, 4);
  std::memcpy(&b, &sigma, 4);
  uint64_t x = (static_cast<uint64_t>(seed) << 32 | static_cast<uint32_t>(c)) ^
               (static_cast<uint64_t>(a) << 32 | b) * 0x9E3779B97F4A7C15ULL;
  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The drawn saliency w̃ (≥ 0) and the magnitude m(w̃) (sqrt when `sqrt_mag`).
inline float recovery_draw(RecoveryDist dist, uint32_t seed, float mu, float sigma, int c, bool sqrt_mag) {
  const uint64_t h = recovery_hash(seed, mu, sigma, c);
  // two uniforms: u1 in (0, 1], u2 in [0, 1)
  const double u1 = (static_cast<double>(h >> 40) + 1.0) * (1.0 / 16777216.0);
  const double u2 = static_cast<double>((h >> 16) & 0xFFFFFF) * (1.0 / 16777216.0);
  double w = 0;
  if (dist == RecoveryDist::kGaussian) {
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    w = std::max(0.0, static_cast<double>(mu) + static_cast<double>(sigma) * z);
  } else {
    w = -std::log(u1) * static_cast<double>(mu);
  }
  return static_cast<float>(sqrt_mag ? std::sqrt(w) : w);
}

}  // namespace kvtrim::kv
