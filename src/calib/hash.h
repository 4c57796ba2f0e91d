// The calibration module's 64-bit content hash (the calibration file's checksum, the
// StiefAttention checkpoint's identity).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvtrim {

// A 64-bit hash over 8-byte words (FNV-1a's xor-multiply step per word, then a final mix).
// Every step is a bijection of the state, so any change confined to one word changes the result.
struct Hasher {
  uint64_t h = 0xcbf29ce484222325ULL;
  void word(uint64_t w) {
    h ^= w;
    h *= 0x100000001b3ULL;
    h ^= h >> 29;
  }
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, b + i, 8);
      word(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, b + i, n - i);
    word(tail ^ (static_cast<uint64_t>(n) << 56));
  }
  uint64_t finish() const {
    uint64_t z = h;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};

}  // namespace kvtrim
