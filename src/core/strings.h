// Small string helpers shared across layers.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace kvtrim {

// s without the spaces, tabs, CRs and LFs at its ends.
inline std::string trim_space(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1));
}

// s with its ASCII letters in lower case (press names, option values, units).
inline std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

// FNV-1a 64-bit hash of bytes, continuing from h (stable across platforms and runs: seeds, config
// hashes, the server's derived conversation keys).
inline uint64_t fnv1a64(std::string_view s, uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace kvtrim
