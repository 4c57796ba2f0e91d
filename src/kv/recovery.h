// Sampled recovery of pruned key coordinates (SPARK's Gaussian / exponential F;
// channel_stage.h KeyRecovery): the magnitude a pruned coordinate c of a token with parameters
// (μ, σ) reads, drawn by a counter-based hash so that every read (every decode step, the reference
// path, a clone of the cache) sees the same value without storing it. The draw depends only on the
// seed, the token's parameters and c, so evicting other tokens never changes it.
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

// The draws come from 4096 equiprobable quantiles of the standard distribution (the midpoint of
// each 1/4096 slice of probability), picked by 12 bits of the hash: a stratified discrete
// approximation whose CDF is within 1/8192 of the exact one everywhere, at one table load per
// draw instead of a log and a cosine (each pruned coordinate of each token is drawn again at
// every read, so this is the recovery's inner loop).
constexpr int kRecoveryQuantileBits = 12;
struct RecoveryQuantiles {
  static constexpr int kN = 1 << kRecoveryQuantileBits;
  float gauss[kN];  // Φ⁻¹((i + 0.5) / kN)
  float expo[kN];   // −log(1 − (i + 0.5) / kN)
  RecoveryQuantiles() {
    for (int i = 0; i < kN; ++i) {
      const double p = (i + 0.5) / kN;
      expo[i] = static_cast<float>(-std::log1p(-p));
      double lo = -10, hi = 10;  // Φ(x) = p by bisection: Φ(x) = erfc(−x/√2) / 2
      for (int it = 0; it < 80; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
      }
      gauss[i] = static_cast<float>(0.5 * (lo + hi));
    }
  }
};
inline const RecoveryQuantiles& recovery_quantiles() {
  static const RecoveryQuantiles q;
  return q;
}

// The drawn saliency w̃ (≥ 0) and the magnitude m(w̃) (sqrt when `sqrt_mag`): Gaussian
// max(0, μ + σ·z), exponential μ·e, z / e a quantile of N(0, 1) / Exp(1).
inline float recovery_draw(RecoveryDist dist, uint32_t seed, float mu, float sigma, int c, bool sqrt_mag) {
  const uint64_t h = recovery_hash(seed, mu, sigma, c);
  const int i = static_cast<int>(h >> (64 - kRecoveryQuantileBits));
  const RecoveryQuantiles& q = recovery_quantiles();
  const float w = dist == RecoveryDist::kGaussian ? std::max(0.f, mu + sigma * q.gauss[i]) : mu * q.expo[i];
  return sqrt_mag ? std::sqrt(w) : w;
}

}  // namespace kvtrim::kv
