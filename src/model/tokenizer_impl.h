// The vocabulary-based tokenizer shared by the BPE ("gpt2", tokenizer_bpe.cpp) and
// SentencePiece-style ("llama", tokenizer_spm.cpp) tokenizers (private to src/model/tokenizer*):
// token attributes, end-of-generation tokens, and the split of special tokens out of the text
// (tokenizer.cpp). A subclass tokenizes the raw fragments between special tokens.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"
#include "model/tokenizer_vocab.h"

namespace kvtrim {

// Token attributes (llama_token_attr subset).
inline constexpr uint8_t kAttrUndefined = 0;
inline constexpr uint8_t kAttrUnknown = 1;
inline constexpr uint8_t kAttrUnused = 2;
inline constexpr uint8_t kAttrNormal = 4;
inline constexpr uint8_t kAttrControl = 8;
inline constexpr uint8_t kAttrUserDefined = 16;
inline constexpr uint8_t kAttrByte = 32;

class VocabTokenizer : public Tokenizer {
 public:
  // Validates v (sizes, special ids) and builds the token index and special-token trie.
  explicit VocabTokenizer(VocabData v);
  // token_to_id_ holds views into v_.tokens: no copies.
  VocabTokenizer(const VocabTokenizer&) = delete;
  VocabTokenizer& operator=(const VocabTokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special) const override;
  std::string token_to_piece(int32_t id) const override;

  int32_t n_vocab() const override { return static_cast<int32_t>(v_.tokens.size()); }
  int32_t bos() const override { return v_.bos; }
  int32_t eos() const override { return v_.eos; }
  bool add_bos() const override { return v_.add_bos; }
  bool is_eog(int32_t id) const override { return id >= 0 && id < n_vocab() && eog_[id]; }
  int32_t token_id(std::string_view piece) const override {
    auto it = token_to_id_.find(piece);
    return it == token_to_id_.end() ? -1 : it->second;
  }

 protected:
  // Tokenizes a raw fragment (no special tokens in it) and appends the ids.
  // after_special: the fragment starts the text or follows a special token.
  virtual void encode_text(std::string_view text, bool after_special,
                           std::vector<int32_t>* out) const = 0;
  // The bytes of a normal token.
  virtual std::string normal_piece(const std::string& text) const = 0;
  // The byte of a <0xXX> byte token.
  uint8_t token_to_byte(int32_t id) const;

  VocabData v_;
  std::vector<uint8_t> attr_;                                  // [n_vocab] kAttr* bits
  std::unordered_map<std::string_view, int32_t> token_to_id_;  // views into v_.tokens

 private:
  // A piece of the input: raw text [begin, end) when token < 0, else a special token.
  struct Fragment {
    size_t begin = 0, end = 0;
    int32_t token = -1;
  };

  int32_t find_first(const std::vector<const char*>& names) const;
  void detect_special_tokens();
  void build_special_trie();
  void partition(std::string_view text, bool parse_special, std::vector<Fragment>* frags) const;

  std::vector<uint8_t> eog_;                         // [n_vocab] 1 if end-of-generation
  std::vector<int32_t> special_prio_;                // [n_vocab] split priority, -1 if not special
  std::unordered_map<uint64_t, int32_t> trie_next_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> trie_token_;                  // [n_nodes] token ending at the node, or -1
  std::array<bool, 256> special_first_{};            // bytes that start a special token
};

// The two tokenizer models (make_tokenizer picks by VocabData::model).
std::unique_ptr<Tokenizer> make_bpe_tokenizer(VocabData v);  // "gpt2"
std::unique_ptr<Tokenizer> make_spm_tokenizer(VocabData v);  // "llama"

}  // namespace kvtrim
