// Building tokenizers from plain vectors (private to the tokenizer module and its tests).
// Tokenizer::from_gguf reads tokenizer.ggml.* into a VocabData and calls make_tokenizer();
// unit tests build tiny vocabularies by hand the same way.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace kvtrim {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

struct VocabData {
  std::string source = "vocab";  // names the origin (GGUF path) in error messages
  std::string model;  // tokenizer.ggml.model: "gpt2" (byte-level BPE), "gemma4" (BPE over raw
                      // UTF-8) or "llama" (SentencePiece)
  std::string pre;    // tokenizer.ggml.pre: "smollm", "qwen2", "tekken", ... (tokenizer_pretok.h)
  std::vector<std::string> tokens;  // [n_vocab] token texts
  std::vector<float> scores;        // [n_vocab] or empty; SentencePiece merge scores (higher first)
  std::vector<int32_t> types;       // [n_vocab] TokenType values, or empty (all Normal)
  std::vector<std::string> merges;  // BPE merges "left right"; rank = index (lower merges first)
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1;  // -1: none
  bool add_bos = false;                                      // tokenizer.ggml.add_bos_token
  bool add_space_prefix = false;  // tokenizer.ggml.add_space_prefix (SentencePiece only)
};

// Validates v and builds the tokenizer. Throws Error naming the problem: no tokens, array
// lengths that differ from the vocabulary, a merge without a space or with a side (or the
// merged text) missing from the vocabulary, special ids out of range, an unknown model or
// pre-tokenizer.
std::unique_ptr<Tokenizer> make_tokenizer(VocabData v);

}  // namespace kvtrim
