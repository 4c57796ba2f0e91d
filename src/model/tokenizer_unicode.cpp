// Unicode helpers for the tokenizers (see tokenizer_unicode.h).
#include "model/tokenizer_unicode.h"

#include <algorithm>
#include <array>

#include "model/tokenizer_unicode_data.h"

namespace kvtrim::tok {

namespace {

bool is_space_cpt(uint32_t c) {
  // llama.cpp's whitespace set (the \s of the tokenizer regexes).
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

uint16_t table_class(uint32_t c) {
  const auto* begin = std::begin(unicode_data::kCategoryRanges);
  const auto* end = std::end(unicode_data::kCategoryRanges);
  const auto* it = std::upper_bound(
      begin, end, c, [](uint32_t v, const unicode_data::CptRange& r) { return v < r.first; });
  if (it == begin) return 0;
  --it;
  return c <= it->last ? it->cls : 0;
}

struct AsciiTable {
  std::array<uint16_t, 128> cls{};
  AsciiTable() {
    for (uint32_t c = 0; c < 128; ++c) {
      cls[c] = static_cast<uint16_t>(table_class(c) | (is_space_cpt(c) ? kClsSpace : 0) | kClsValid);
    }
  }
};

struct ByteMap {
  std::array<uint32_t, 256> to_cpt{};
  std::array<int16_t, 512> from_cpt{};
  ByteMap() {
    from_cpt.fill(-1);
    std::array<bool, 256> direct{};
    for (int b = 0x21; b <= 0x7E; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) to_cpt[b] = direct[b] ? static_cast<uint32_t>(b) : 256 + n++;
    for (int b = 0; b < 256; ++b) from_cpt[to_cpt[b]] = static_cast<int16_t>(b);
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

uint16_t cpt_class(uint32_t c) {
  static const AsciiTable ascii;
  if (c < 128) return ascii.cls[c];
  return static_cast<uint16_t>(table_class(c) | (is_space_cpt(c) ? kClsSpace : 0) | kClsValid);
}

uint32_t byte_to_cpt(uint8_t b) {
  return byte_map().to_cpt[b];
}

int byte_from_cpt(uint32_t cpt) {
  return cpt < 512 ? byte_map().from_cpt[cpt] : -1;
}

}  // namespace kvtrim::tok
