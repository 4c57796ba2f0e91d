// Helpers shared by the tokenizer tests.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "model/tokenizer_unicode.h"

namespace kvtrim::test {

// GPT-2 byte-level form of raw bytes ("a b" -> "aĠb").
inline std::string bl(std::string_view bytes) {
  std::string out;
  for (char c : bytes) tok::utf8_append(tok::byte_to_cpt(static_cast<uint8_t>(c)), &out);
  return out;
}

}  // namespace kvtrim::test
