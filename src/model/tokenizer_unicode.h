// Unicode helpers for the tokenizers (private to src/model/tokenizer*.cpp):
//  - UTF-8 decoding (src/core/utf8.h, re-exported here);
//  - code-point classes (\p{L} and its case, \p{N}, \p{M}, \p{P}, \p{S}, \s) from generated
//    range tables (tokenizer_unicode_data.h);
//  - GPT-2's bytes<->unicode map used by byte-level BPE.
// The pre-tokenizers that use them are in tokenizer_pretok.h.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/utf8.h"

namespace kvtrim::tok {

// Code-point class bits (cpt_class).
inline constexpr uint16_t kClsLetter = 1;    // \p{L}
inline constexpr uint16_t kClsNumber = 2;    // \p{N}
inline constexpr uint16_t kClsSpace = 4;     // \s (llama.cpp's whitespace set = Unicode White_Space)
inline constexpr uint16_t kClsValid = 8;     // any code point (set for every in-range position)
inline constexpr uint16_t kClsMark = 16;     // \p{M}
inline constexpr uint16_t kClsPunct = 32;    // \p{P}
inline constexpr uint16_t kClsSymbol = 64;   // \p{S}
inline constexpr uint16_t kClsUpper = 128;   // \p{Lu} or \p{Lt} (with kClsLetter)
inline constexpr uint16_t kClsLower = 256;   // \p{Ll} (with kClsLetter)

uint16_t cpt_class(uint32_t cpt);

// UTF-8: utf8_next, utf8_append, utf8_len (src/core/utf8.h).
using kvtrim::utf8_append;
using kvtrim::utf8_len;
using kvtrim::utf8_next;

// GPT-2 byte-level map: byte -> code point (printable bytes map to themselves, the others
// to 256 + n), and the inverse (-1 for a code point that is not in the map).
uint32_t byte_to_cpt(uint8_t b);
int byte_from_cpt(uint32_t cpt);

}  // namespace kvtrim::tok
