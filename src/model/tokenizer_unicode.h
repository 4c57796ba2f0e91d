// Unicode helpers for the tokenizers (private to src/model/tokenizer*.cpp):
//  - UTF-8 decoding the way llama.cpp does it (an invalid byte becomes U+FFFD);
//  - code-point classes (\p{L}, \p{N}, \s) from generated range tables;
//  - GPT-2's bytes<->unicode map used by byte-level BPE;
//  - the BPE pre-tokenizers ("regex splits") of llama.cpp, hand-written over code points:
//      Gpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      Smollm: \p{N} (each digit its own piece), then Gpt2 on every piece
//      Qwen2:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
//              | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//      Llama3: as Qwen2 with \p{N}{1,3}
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvtrim::tok {

// Code-point class bits.
inline constexpr uint8_t kClsLetter = 1;  // \p{L}
inline constexpr uint8_t kClsNumber = 2;  // \p{N}
inline constexpr uint8_t kClsSpace = 4;   // \s (llama.cpp's whitespace set)
inline constexpr uint8_t kClsValid = 8;   // any code point (set for every in-range position)

uint8_t cpt_class(uint32_t cpt);

// Decodes one code point at text[*pos] and advances *pos. Invalid or truncated sequences
// consume one byte and yield U+FFFD, as llama.cpp's unicode_cpts_from_utf8 does.
uint32_t utf8_next(std::string_view text, size_t* pos);
void utf8_append(uint32_t cpt, std::string* out);  // cpt > 0x10FFFF is written as U+FFFD
// Byte length of a UTF-8 sequence from its first byte (1 for continuation bytes).
inline size_t utf8_len(uint8_t c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

// GPT-2 byte-level map: byte -> code point (printable bytes map to themselves, the others
// to 256 + n), and the inverse (-1 for a code point that is not in the map).
uint32_t byte_to_cpt(uint8_t b);
int byte_from_cpt(uint32_t cpt);

enum class PreSplit { Gpt2, Smollm, Qwen2, Llama3 };

// Splits text into pre-tokenizer words. norm receives the text re-encoded from its code
// points (identical to text for valid UTF-8); word_ends the byte offset in norm where
// each word ends (words are contiguous and cover norm).
void pre_tokenize(std::string_view text, PreSplit mode, std::string* norm,
                  std::vector<size_t>* word_ends);

}  // namespace kvtrim::tok
