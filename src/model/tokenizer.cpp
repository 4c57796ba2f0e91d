// Tokenizers matching llama.cpp token for token (llama-vocab.cpp, written anew). This file
// holds what both models share (tokenizer_impl.h):
//  - special tokens (control / user-defined / unknown) are split out of the text first,
//    longest token first, every occurrence left to right, as llama.cpp's
//    tokenizer_st_partition does (control and unknown ones only when parse_special);
//  - per-token attributes and end-of-generation tokens follow llama.cpp's vocabulary loader,
//    including its detection of EOT / FIM tokens by their text.
// The models: byte-level BPE "gpt2" (tokenizer_bpe.cpp, with the pre-tokenizers of
// tokenizer_pretok.h) and SentencePiece-style "llama" (tokenizer_spm.cpp).
#include "model/tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "model/tokenizer_impl.h"
#include "model/tokenizer_vocab.h"

namespace kvtrim {

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id);
  return out;
}

namespace {

uint8_t attr_from_type(int32_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::Normal:
      return kAttrNormal;
    case TokenType::Unknown:
      return kAttrUnknown;
    case TokenType::Control:
      return kAttrControl;
    case TokenType::UserDefined:
      return kAttrUserDefined;
    case TokenType::Unused:
      return kAttrUnused;
    case TokenType::Byte:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

// Token texts llama.cpp recognises (llama-vocab.cpp, load()).
const std::vector<const char*> kEotNames = {"<|eot_id|>",
                                            "<|im_end|>",
                                            "<|end|>",
                                            "<end_of_turn>",
                                            "<|endoftext|>",
                                            "<|end_of_text|>",
                                            "<EOT>",
                                            "_<EOT>",
                                            "[EOT]",
                                            "<\xef\xbd\x9c"
                                            "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                            "<end_of_utterance>"};
const std::vector<const char*> kFimPreNames = {
    "<|fim_prefix|>",    "<fim-prefix>",    "<fim_prefix>", "<PRE>",
    "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"};
const std::vector<const char*> kFimSufNames = {
    "<|fim_suffix|>",    "<fim-suffix>",    "<fim_suffix>", "<SUF>",
    "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"};
const std::vector<const char*> kFimMidNames = {
    "<|fim_middle|>",    "<fim-middle>",    "<fim_middle>", "<MID>",
    "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"};
const std::vector<const char*> kFimPadNames = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                               "[PAD]"};
const std::vector<const char*> kFimRepNames = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                               "<REPO>", "<reponame>"};
const std::vector<const char*> kFimSepNames = {"<|file_sep|>"};
const std::vector<const char*> kEogNames = {"<|eot_id|>",
                                            "<|im_end|>",
                                            "<|end|>",
                                            "<|return|>",
                                            "<|call|>",
                                            "<|flush|>",
                                            "<|calls|>",
                                            "<end_of_turn>",
                                            "<|endoftext|>",
                                            "</s>",
                                            "<|eom_id|>",
                                            "<EOT>",
                                            "_<EOT>",
                                            "[EOT]",
                                            "[EOS]",
                                            "<|end_of_text|>",
                                            "<end_of_utterance>",
                                            "<eos>",
                                            "<turn|>",
                                            "<|tool_response>",
                                            "<\xef\xbd\x9c"
                                            "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                            "[e~["};

}  // namespace

VocabTokenizer::VocabTokenizer(VocabData v) : v_(std::move(v)) {
  const size_t n = v_.tokens.size();
  KVTRIM_CHECK(n > 0, "%s: tokenizer has no tokens (tokenizer.ggml.tokens is missing or empty)",
               v_.source.c_str());
  KVTRIM_CHECK(n < (size_t(1) << 31), "%s: tokenizer has too many tokens (%zu)", v_.source.c_str(),
               n);
  KVTRIM_CHECK(v_.types.empty() || v_.types.size() >= n,
               "%s: tokenizer.ggml.token_type has %zu entries for %zu tokens", v_.source.c_str(),
               v_.types.size(), n);
  KVTRIM_CHECK(v_.scores.empty() || v_.scores.size() >= n,
               "%s: tokenizer.ggml.scores has %zu entries for %zu tokens", v_.source.c_str(),
               v_.scores.size(), n);
  const auto check_id = [&](int32_t id, const char* what) {
    KVTRIM_CHECK(id >= -1 && id < static_cast<int64_t>(n),
                 "%s: tokenizer.ggml.%s_token_id = %d is out of range (vocabulary has %zu tokens)",
                 v_.source.c_str(), what, id, n);
  };
  check_id(v_.bos, "bos");
  check_id(v_.eos, "eos");
  check_id(v_.eot, "eot");
  check_id(v_.eom, "eom");
  check_id(v_.unk, "unknown");
  KVTRIM_CHECK(!v_.add_bos || v_.bos >= 0,
               "%s: tokenizer.ggml.add_bos_token is set but there is no BOS token",
               v_.source.c_str());

  attr_.resize(n);
  token_to_id_.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    if (v_.tokens[i].empty()) v_.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
    attr_[i] = v_.types.empty() ? kAttrNormal : attr_from_type(v_.types[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    const bool inserted = token_to_id_.emplace(v_.tokens[i], static_cast<int32_t>(i)).second;
    KVTRIM_CHECK(inserted, "%s: token %zu '%s' duplicates token %d", v_.source.c_str(), i,
                 v_.tokens[i].c_str(), token_to_id_.at(v_.tokens[i]));
  }
  detect_special_tokens();
  build_special_trie();
}

std::vector<int32_t> VocabTokenizer::encode(std::string_view text, bool add_bos,
                                            bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_bos && v_.add_bos && v_.bos >= 0) out.push_back(v_.bos);
  if (text.empty()) return out;
  std::vector<Fragment> frags;
  partition(text, parse_special, &frags);
  bool prev_special = true;
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
    } else {
      encode_text(text.substr(f.begin, f.end - f.begin), prev_special, &out);
      prev_special = false;
    }
  }
  return out;
}

std::string VocabTokenizer::token_to_piece(int32_t id) const {
  KVTRIM_CHECK(id >= 0 && id < n_vocab(),
               "%s: token id %d is out of range (vocabulary has %d tokens)", v_.source.c_str(), id,
               n_vocab());
  const uint8_t a = attr_[id];
  const std::string& text = v_.tokens[id];
  if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return text;
  if (a & kAttrNormal) return normal_piece(text);
  if (a & kAttrByte) return std::string(1, static_cast<char>(token_to_byte(id)));
  return {};
}

int32_t VocabTokenizer::find_first(const std::vector<const char*>& names) const {
  for (const char* name : names) {
    auto it = token_to_id_.find(name);
    if (it != token_to_id_.end()) return it->second;
  }
  return -1;
}

// EOT / EOM / FIM tokens found by their text become control tokens; the EOG set is the
// EOS, EOT, EOM, FIM pad/repo/sep tokens and every token named in kEogNames.
void VocabTokenizer::detect_special_tokens() {
  const auto make_control = [&](int32_t id) {
    if (id >= 0) attr_[id] |= kAttrControl;
  };
  if (v_.eot < 0) v_.eot = find_first(kEotNames);
  make_control(v_.eot);
  if (v_.eom < 0) v_.eom = find_first({"<|eom_id|>"});
  make_control(v_.eom);
  for (const auto* names : {&kFimPreNames, &kFimSufNames, &kFimMidNames})
    make_control(find_first(*names));
  eog_.assign(v_.tokens.size(), 0);
  for (const auto* names : {&kFimPadNames, &kFimRepNames, &kFimSepNames}) {
    const int32_t id = find_first(*names);
    make_control(id);
    if (id >= 0) eog_[id] = 1;
  }
  for (const char* name : kEogNames) {
    auto it = token_to_id_.find(name);
    if (it == token_to_id_.end()) continue;
    eog_[it->second] = 1;
    make_control(it->second);
  }
  for (int32_t id : {v_.eos, v_.eot, v_.eom}) {
    if (id >= 0) eog_[id] = 1;
  }
}

// A byte trie over the texts of control / user-defined / unknown tokens; the priority of a
// token is its rank by text length (longest first, then lowest id), the order in which
// llama.cpp splits them out.
void VocabTokenizer::build_special_trie() {
  std::vector<int32_t> specials;
  for (size_t i = 0; i < attr_.size(); ++i) {
    if (attr_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown))
      specials.push_back(static_cast<int32_t>(i));
  }
  std::sort(specials.begin(), specials.end(), [&](int32_t a, int32_t b) {
    const size_t la = v_.tokens[a].size(), lb = v_.tokens[b].size();
    return la != lb ? la > lb : a < b;
  });
  special_prio_.assign(attr_.size(), -1);
  trie_token_.assign(1, -1);
  special_first_.fill(false);
  for (size_t r = 0; r < specials.size(); ++r) {
    const int32_t id = specials[r];
    special_prio_[id] = static_cast<int32_t>(r);
    const std::string& t = v_.tokens[id];
    special_first_[static_cast<uint8_t>(t[0])] = true;
    int32_t node = 0;
    for (char ch : t) {
      const uint64_t key = (uint64_t(node) << 8) | static_cast<uint8_t>(ch);
      auto it = trie_next_.find(key);
      if (it == trie_next_.end()) {
        trie_token_.push_back(-1);
        it = trie_next_.emplace(key, static_cast<int32_t>(trie_token_.size() - 1)).first;
      }
      node = it->second;
    }
    trie_token_[node] = id;
  }
}

// Splits text into raw fragments and special tokens. Equivalent to llama.cpp's
// tokenizer_st_partition: for each special token in priority order, every occurrence
// (left to right, not overlapping) that lies inside a still-raw part of the text is taken.
void VocabTokenizer::partition(std::string_view text, bool parse_special,
                               std::vector<Fragment>* frags) const {
  struct Occurrence {
    int32_t prio;
    uint32_t pos;
    int32_t id;
  };
  std::vector<Occurrence> occ;
  const uint8_t skip = parse_special ? 0 : (kAttrControl | kAttrUnknown);
  for (size_t pos = 0; pos < text.size(); ++pos) {
    if (!special_first_[static_cast<uint8_t>(text[pos])]) continue;
    int32_t node = 0;
    for (size_t k = pos; k < text.size(); ++k) {
      auto it = trie_next_.find((uint64_t(node) << 8) | static_cast<uint8_t>(text[k]));
      if (it == trie_next_.end()) break;
      node = it->second;
      const int32_t id = trie_token_[node];
      if (id >= 0 && !(attr_[id] & skip))
        occ.push_back({special_prio_[id], static_cast<uint32_t>(pos), id});
    }
  }
  frags->clear();
  if (occ.empty()) {
    frags->push_back({0, text.size(), -1});
    return;
  }
  std::sort(occ.begin(), occ.end(), [](const Occurrence& a, const Occurrence& b) {
    return a.prio != b.prio ? a.prio < b.prio : a.pos < b.pos;
  });
  std::vector<uint8_t> taken(text.size(), 0);
  std::vector<Fragment> accepted;
  for (const Occurrence& o : occ) {
    const size_t len = v_.tokens[o.id].size();
    if (std::find(taken.begin() + o.pos, taken.begin() + o.pos + len, 1) !=
        taken.begin() + o.pos + len)
      continue;
    std::fill(taken.begin() + o.pos, taken.begin() + o.pos + len, 1);
    accepted.push_back({o.pos, o.pos + len, o.id});
  }
  std::sort(accepted.begin(), accepted.end(),
            [](const Fragment& a, const Fragment& b) { return a.begin < b.begin; });
  size_t at = 0;
  for (const Fragment& a : accepted) {
    if (a.begin > at) frags->push_back({at, a.begin, -1});
    frags->push_back(a);
    at = a.end;
  }
  if (at < text.size()) frags->push_back({at, text.size(), -1});
}

uint8_t VocabTokenizer::token_to_byte(int32_t id) const {
  const std::string& t = v_.tokens[id];
  KVTRIM_CHECK(t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>',
               "%s: byte token %d has text '%s', expected <0xXX>", v_.source.c_str(), id,
               t.c_str());
  return static_cast<uint8_t>(std::strtol(t.substr(3, 2).c_str(), nullptr, 16));
}

std::unique_ptr<Tokenizer> make_tokenizer(VocabData v) {
  if (v.model == "gpt2" || v.model == "gemma4") return make_bpe_tokenizer(std::move(v));
  if (v.model == "llama") return make_spm_tokenizer(std::move(v));
  fail(
      "%s: unsupported tokenizer model tokenizer.ggml.model = '%s' (supported: gpt2, gemma4, "
      "llama)",
      v.source.c_str(), v.model.c_str());
}

}  // namespace kvtrim
