// UTF-8 decoding and encoding shared by the tokenizers (src/model/tokenizer*.cpp) and the
// Jinja interpreter (src/model/jinja/): decoding the way llama.cpp does it, an invalid or
// truncated sequence is one byte (utf8_next yields U+FFFD for it, utf8_chars keeps the byte).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvtrim {

// Decodes one code point at text[*pos] and advances *pos. Invalid or truncated sequences
// consume one byte and yield U+FFFD, as llama.cpp's unicode_cpts_from_utf8 does.
uint32_t utf8_next(std::string_view text, size_t* pos);
void utf8_append(uint32_t cpt, std::string* out);  // cpt > 0x10FFFF is written as U+FFFD
// Byte length of a UTF-8 sequence from its first byte (1 for continuation bytes).
inline size_t utf8_len(uint8_t c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}
// The characters of `s` as Python's str sees them when it holds UTF-8: one string per code
// point, an invalid byte as a one-byte string of its own.
std::vector<std::string> utf8_chars(std::string_view s);

}  // namespace kvtrim
