// Tokenizers built from GGUF metadata (tokenizer.ggml.*):
//  - "gpt2": byte-level BPE with a pre-tokenizer chosen by tokenizer.ggml.pre
//    (tokenizer_pretok.h: GPT-2, SmolLM/StarCoder/Command-R, Qwen2, Qwen3.5, Llama 3, Tekken,
//    GPT-4o, DeepSeek LLM/Coder/V3, Falcon, Seed-Coder and the names llama.cpp aliases to them);
//  - "gemma4": the same BPE over raw UTF-8 with "▁" for spaces and <0xXX> byte fallback;
//  - "llama": SentencePiece-style (Gemma 3): score-driven BPE over unicode pieces,
//    "▁" for spaces, byte fallback <0xXX>.
// Special tokens (control / user-defined) in the text are matched as whole tokens when
// parse_special is true.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvtrim {

class GgufFile;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);

  // Token ids for text. add_bos: prepend BOS when the model's metadata asks for it
  // (tokenizer.ggml.add_bos_token). parse_special: recognise special-token strings.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const = 0;
  // The bytes a token stands for (special tokens render as their text).
  virtual std::string token_to_piece(int32_t id) const = 0;
  std::string decode(const std::vector<int32_t>& ids) const;

  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos() const = 0;  // -1 if none
  virtual int32_t eos() const = 0;  // -1 if none
  virtual bool add_bos() const = 0;
  // End-of-generation: eos, eot, <|im_end|>, <end_of_turn>, ...
  virtual bool is_eog(int32_t id) const = 0;
  virtual int32_t token_id(std::string_view piece) const = 0;  // -1 if absent
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// The tokens of a rendered prompt (special-token text parsed): BOS first when the model adds
// one and the text does not already start with it (templates such as Llama 3's write
// {{ bos_token }} themselves; one BOS, not two).
std::vector<int32_t> encode_prompt(const Tokenizer& tok, std::string_view text);

}  // namespace kvtrim
