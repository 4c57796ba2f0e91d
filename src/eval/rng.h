// A small deterministic random generator for the evaluation data (xoshiro256** seeded by
// splitmix64). Unlike std::uniform_int_distribution, every draw here is specified, so the
// same seed gives the same samples with every compiler and standard library.
#pragma once
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "core/strings.h"  // fnv1a64

namespace kvtrim::eval {

// splitmix64 step: also used to derive independent seeds.
inline uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  // Uniform in [0, n) by rejection (n > 0).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = next();
    while (r >= limit);
    return r % n;
  }
  // Uniform in [lo, hi] (inclusive).
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
  }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }
  // Fisher-Yates.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }
  // k distinct indices from [0, n), in draw order (k <= n).
  std::vector<int64_t> sample_indices(int64_t n, int64_t k) {
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = i + static_cast<int64_t>(below(static_cast<uint64_t>(n - i)));
      std::swap(idx[static_cast<size_t>(i)], idx[static_cast<size_t>(j)]);
    }
    idx.resize(static_cast<size_t>(k));
    return idx;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace kvtrim::eval
