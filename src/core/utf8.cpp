#include "core/utf8.h"

namespace kvtrim {

uint32_t utf8_next(std::string_view s, size_t* pos) {
  const size_t i = *pos;
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const uint8_t b0 = b(0);
  if (b0 < 0x80) {
    *pos = i + 1;
    return b0;
  }
  if ((b0 & 0xE0) == 0xC0 && cont(1)) {
    *pos = i + 2;
    return (uint32_t(b0 & 0x1F) << 6) | (b(1) & 0x3F);
  }
  if ((b0 & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    *pos = i + 3;
    return (uint32_t(b0 & 0x0F) << 12) | (uint32_t(b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  }
  if ((b0 & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    *pos = i + 4;
    return (uint32_t(b0 & 0x07) << 18) | (uint32_t(b(1) & 0x3F) << 12) |
           (uint32_t(b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
  *pos = i + 1;
  return 0xFFFD;
}

void utf8_append(uint32_t c, std::string* out) {
  if (c > 0x10FFFF) c = 0xFFFD;
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    utf8_next(s, &i);
    out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

}  // namespace kvtrim
