// BPE pre-tokenizers ("regex splits"), hand-written over code points (private to
// src/model/tokenizer*.cpp and its tests). Each family is the Hugging Face pre_tokenizer of the
// models that use it: a sequence of regexes, each splitting every piece so far into its
// matches and the text between them (a `Split` with behavior "Isolated"). The patterns:
//
//  Gpt2:     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//  Smollm:   \p{N}, then Gpt2
//  Qwen2:    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
//            | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//  Llama3:   Qwen2 with \p{N}{1,3}
//  Qwen35:   Qwen2 with [\p{L}\p{M}]+ for words and [^\s\p{L}\p{M}\p{N}]+ for punctuation
//  SeedCoder: Qwen2 without the [\r\n]* after punctuation
//  Tekken:   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
//            |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*
//            |\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//  Gpt4o:    Tekken with (?i:'s|'t|'re|'ve|'m|'ll|'d)? after both word forms and \p{N}{1,3}
//  DeepseekLlm: [\r\n], then \s?[<Latin/Greek/Cyrillic/... letters>]+,
//            then \s?[!-/:-~！-／：-～‘-‟　-。]+, then \s+$, then [一-龥ࠀ-一가-퟿]+,
//            then \p{N}+
//  DeepseekCoder: [\r\n], then \s?\p{L}+, then \s?\p{P}+, then [一-龥ࠀ-一가-퟿]+, then \p{N}
//  Deepseek3: \p{N}{1,3}, then [一-龥぀-ゟ゠-ヿ]+, then
//            [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//            | ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//  Falcon:   [\p{P}\$\+<=>\^~\|`]+, then Gpt2, then [0-9][0-9][0-9]
//  Gemma4:   [^\n]+|[\n]+ (SentencePiece-like BPE over raw UTF-8: spaces are escaped to
//            U+2581 before it, and words are not byte-mapped; see PreTokenizer::raw_utf8)
//
// scripts/ref/make_pretok_refs.py splits a multilingual text set with these patterns using
// Python's `regex` module; tests/tokenizer/pretok_test.cpp compares piece for piece.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvtrim::tok {

enum class PreSplit {
  Gpt2,
  Smollm,
  Qwen2,
  Llama3,
  Qwen35,
  SeedCoder,
  Tekken,
  Gpt4o,
  DeepseekLlm,
  DeepseekCoder,
  Deepseek3,
  Falcon,
  Gemma4,
};

// What llama.cpp does for one tokenizer.ggml.pre value.
struct PreTokenizer {
  PreSplit split = PreSplit::Gpt2;
  bool ignore_merges = false;  // a word that is a token is taken whole (llama3, tekken)
  bool add_bos = false;        // BOS added when tokenizer.ggml.add_bos_token is absent
  // Gemma 4: tokens are raw UTF-8 (no GPT-2 byte map), spaces become U+2581 before the split,
  // bytes without a token fall back to <0xXX> tokens, and a word of newlines that is a token
  // is taken whole.
  bool raw_utf8 = false;
};

// The pre-tokenizer of tokenizer.ggml.pre = name (llama.cpp's names); false if kvtrim does not
// implement it.
bool pre_tokenizer_by_name(std::string_view name, PreTokenizer* out);
// The names pre_tokenizer_by_name accepts, comma-separated (for error messages).
std::string pre_tokenizer_names();

// Splits text into pre-tokenizer words. norm receives the text re-encoded from its code
// points (identical to text for valid UTF-8); word_ends the byte offset in norm where
// each word ends (words are contiguous and cover norm).
void pre_tokenize(std::string_view text, PreSplit mode, std::string* norm,
                  std::vector<size_t>* word_ends);

}  // namespace kvtrim::tok
