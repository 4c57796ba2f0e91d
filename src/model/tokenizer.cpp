// Tokenizers matching llama.cpp token for token (llama-vocab.cpp, written anew):
//  - special tokens (control / user-defined / unknown) are split out of the text first,
//    longest token first, every occurrence left to right, as llama.cpp's
//    tokenizer_st_partition does (control and unknown ones only when parse_special);
//  - "gpt2": byte-level BPE. Each pre-tokenizer word is mapped byte by byte to GPT-2's
//    printable code points, then the adjacent pair with the lowest merge rank is merged
//    until none is left (ties: leftmost first);
//  - "llama": SentencePiece-style. Spaces become U+2581 "▁"; starting from UTF-8 characters,
//    the adjacent pair whose concatenation is a vocabulary token with the highest score is
//    merged until none is left (ties: leftmost first); what is not a token falls back to
//    <0xXX> byte tokens.
// Per-token attributes and end-of-generation tokens follow llama.cpp's vocabulary loader,
// including its detection of EOT / FIM tokens by their text.
#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "model/tokenizer_unicode.h"
#include "model/tokenizer_vocab.h"

namespace kvtrim {

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id);
  return out;
}

namespace {

// Token attributes (llama_token_attr subset).
constexpr uint8_t kAttrUndefined = 0;
constexpr uint8_t kAttrUnknown = 1;
constexpr uint8_t kAttrUnused = 2;
constexpr uint8_t kAttrNormal = 4;
constexpr uint8_t kAttrControl = 8;
constexpr uint8_t kAttrUserDefined = 16;
constexpr uint8_t kAttrByte = 32;

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

constexpr const char* kSpaceEscape = "\xe2\x96\x81";  // U+2581 "▁"

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

// A piece of the input: raw text [begin, end) when token < 0, else a special token.
struct Fragment {
  size_t begin = 0, end = 0;
  int32_t token = -1;
};

class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(VocabData v) : v_(std::move(v)) {
    const size_t n = v_.tokens.size();
    KVTRIM_CHECK(n > 0, "%s: tokenizer has no tokens (tokenizer.ggml.tokens is missing or empty)",
                 v_.source.c_str());
    KVTRIM_CHECK(n < (size_t(1) << 31), "%s: tokenizer has too many tokens (%zu)",
                 v_.source.c_str(), n);
    KVTRIM_CHECK(v_.types.empty() || v_.types.size() >= n,
                 "%s: tokenizer.ggml.token_type has %zu entries for %zu tokens", v_.source.c_str(),
                 v_.types.size(), n);
    KVTRIM_CHECK(v_.scores.empty() || v_.scores.size() >= n,
                 "%s: tokenizer.ggml.scores has %zu entries for %zu tokens", v_.source.c_str(),
                 v_.scores.size(), n);
    const auto check_id = [&](int32_t id, const char* what) {
      KVTRIM_CHECK(
          id >= -1 && id < static_cast<int64_t>(n),
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
  // token_to_id_ holds views into v_.tokens: no copies.
  VocabTokenizer(const VocabTokenizer&) = delete;
  VocabTokenizer& operator=(const VocabTokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special) const override {
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

  std::string token_to_piece(int32_t id) const override {
    KVTRIM_CHECK(id >= 0 && id < n_vocab(),
                 "%s: token id %d is out of range (vocabulary has %d tokens)", v_.source.c_str(),
                 id, n_vocab());
    const uint8_t a = attr_[id];
    const std::string& text = v_.tokens[id];
    if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return text;
    if (a & kAttrNormal) return normal_piece(text);
    if (a & kAttrByte) return std::string(1, static_cast<char>(token_to_byte(id)));
    return {};
  }

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

  uint8_t token_to_byte(int32_t id) const {
    const std::string& t = v_.tokens[id];
    KVTRIM_CHECK(t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>',
                 "%s: byte token %d has text '%s', expected <0xXX>", v_.source.c_str(), id,
                 t.c_str());
    return static_cast<uint8_t>(std::strtol(t.substr(3, 2).c_str(), nullptr, 16));
  }

  VocabData v_;
  std::vector<uint8_t> attr_;                                  // [n_vocab]
  std::unordered_map<std::string_view, int32_t> token_to_id_;  // views into v_.tokens

 private:
  int32_t find_first(const std::vector<const char*>& names) const {
    for (const char* name : names) {
      auto it = token_to_id_.find(name);
      if (it != token_to_id_.end()) return it->second;
    }
    return -1;
  }

  // EOT / EOM / FIM tokens found by their text become control tokens; the EOG set is the
  // EOS, EOT, EOM, FIM pad/repo/sep tokens and every token named in kEogNames.
  void detect_special_tokens() {
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
  void build_special_trie() {
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
  void partition(std::string_view text, bool parse_special, std::vector<Fragment>* frags) const {
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

  std::vector<uint8_t> eog_;                         // [n_vocab] 1 if end-of-generation
  std::vector<int32_t> special_prio_;                // [n_vocab] split priority, -1 if not special
  std::unordered_map<uint64_t, int32_t> trie_next_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> trie_token_;                  // [n_nodes] token ending at the node, or -1
  std::array<bool, 256> special_first_{};            // bytes that start a special token
};

// ---------------------------------------------------------------------------------------
// Byte-level BPE ("gpt2").

class BpeTokenizer final : public VocabTokenizer {
 public:
  explicit BpeTokenizer(VocabData v) : VocabTokenizer(std::move(v)) {
    const std::string& pre = v_.pre;
    if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
        pre == "codeshell" || pre == "exaone" || pre == "minerva") {
      split_ = tok::PreSplit::Smollm;
    } else if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2" ||
               pre == "hunyuan") {
      split_ = tok::PreSplit::Qwen2;
    } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3") {
      split_ = tok::PreSplit::Llama3;
      ignore_merges_ = true;
    } else if (pre == "gpt2" || pre == "gpt-2" || pre == "phi-2" || pre == "mpt" || pre == "olmo" ||
               pre == "jais") {
      split_ = tok::PreSplit::Gpt2;
    } else {
      fail(
          "%s: unsupported BPE pre-tokenizer tokenizer.ggml.pre = '%s' (supported: smollm, qwen2, "
          "llama3, "
          "gpt-2 and their aliases)",
          v_.source.c_str(), pre.c_str());
    }
    for (int b = 0; b < 256; ++b) {
      std::string s;
      tok::utf8_append(tok::byte_to_cpt(static_cast<uint8_t>(b)), &s);
      byte_token_[b] = token_id(s);
    }
    merges_.reserve(v_.merges.size() * 2);
    for (size_t r = 0; r < v_.merges.size(); ++r) {
      const std::string& m = v_.merges[r];
      const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      KVTRIM_CHECK(sp != std::string::npos,
                   "%s: tokenizer.ggml.merges[%zu] = '%s' has no space separator",
                   v_.source.c_str(), r, m.c_str());
      const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
      const int32_t l = token_id(left), rr = token_id(right);
      KVTRIM_CHECK(l >= 0 && rr >= 0,
                   "%s: tokenizer.ggml.merges[%zu] = '%s': '%.*s' is not in the vocabulary",
                   v_.source.c_str(), r, m.c_str(),
                   static_cast<int>(l < 0 ? left.size() : right.size()),
                   l < 0 ? left.data() : right.data());
      const std::string merged = std::string(left) + std::string(right);
      const int32_t res = token_id(merged);
      KVTRIM_CHECK(
          res >= 0,
          "%s: tokenizer.ggml.merges[%zu] = '%s': the merged token '%s' is not in the vocabulary",
          v_.source.c_str(), r, m.c_str(), merged.c_str());
      merges_.try_emplace(pair_key(l, rr), Merge{static_cast<int32_t>(r), res});  // first rank wins
    }
  }

 protected:
  void encode_text(std::string_view text, bool /*after_special*/,
                   std::vector<int32_t>* out) const override {
    std::string norm;
    std::vector<size_t> ends;
    tok::pre_tokenize(text, split_, &norm, &ends);
    Work w;
    size_t begin = 0;
    for (size_t e : ends) {
      encode_word(std::string_view(norm).substr(begin, e - begin), &w, out);
      begin = e;
    }
  }

  std::string normal_piece(const std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      const size_t start = i;
      const uint32_t c = tok::utf8_next(text, &i);
      const int b = tok::byte_from_cpt(c);
      if (b >= 0) {
        out.push_back(static_cast<char>(b));
      } else {
        out.append(text, start, i - start);  // not a byte-level character: keep it as is
      }
    }
    return out;
  }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  struct Symbol {
    int32_t id;  // token id; -1 for a byte without a token; -2 merged away
    int32_t prev, next;
  };
  struct Bigram {
    int32_t rank;
    int32_t left, right;
    int32_t left_id, right_id;
  };
  struct Work {  // per-call scratch, reused across words
    std::vector<Symbol> syms;
    std::vector<Bigram> heap;
    std::string encoded;
  };

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }

  void try_add(Work* w, int32_t left, int32_t right) const {
    if (left < 0 || right < 0) return;
    const int32_t a = w->syms[left].id, b = w->syms[right].id;
    if (a < 0 || b < 0) return;
    auto it = merges_.find(pair_key(a, b));
    if (it == merges_.end()) return;
    w->heap.push_back({it->second.rank, left, right, a, b});
    std::push_heap(w->heap.begin(), w->heap.end(), heap_less);
  }

  // Max-heap order: the lowest rank, then the leftmost pair, comes out first.
  static bool heap_less(const Bigram& x, const Bigram& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.left > y.left;
  }

  void encode_word(std::string_view word, Work* w, std::vector<int32_t>* out) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      w->encoded.clear();
      for (char c : word) tok::utf8_append(tok::byte_to_cpt(static_cast<uint8_t>(c)), &w->encoded);
      const int32_t id = token_id(w->encoded);
      if (id >= 0) {
        out->push_back(id);
        return;
      }
    }
    const int32_t n = static_cast<int32_t>(word.size());
    if (n == 1) {
      const int32_t id = byte_token_[static_cast<uint8_t>(word[0])];
      if (id >= 0) out->push_back(id);
      return;
    }
    w->syms.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      w->syms[i] = {byte_token_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
    }
    w->heap.clear();
    for (int32_t i = 1; i < n; ++i) try_add(w, i - 1, i);
    while (!w->heap.empty()) {
      std::pop_heap(w->heap.begin(), w->heap.end(), heap_less);
      const Bigram bg = w->heap.back();
      w->heap.pop_back();
      Symbol& l = w->syms[bg.left];
      Symbol& r = w->syms[bg.right];
      if (l.id != bg.left_id || r.id != bg.right_id || l.next != bg.right) continue;  // stale
      l.id = merges_.at(pair_key(bg.left_id, bg.right_id)).result;
      l.next = r.next;
      if (r.next >= 0) w->syms[r.next].prev = bg.left;
      r.id = -2;
      try_add(w, l.prev, bg.left);
      try_add(w, bg.left, l.next);
    }
    for (int32_t i = 0; i >= 0; i = w->syms[i].next) {
      if (w->syms[i].id >= 0)
        out->push_back(w->syms[i].id);  // a byte without a token is dropped, as in llama.cpp
    }
  }

  tok::PreSplit split_ = tok::PreSplit::Gpt2;
  bool ignore_merges_ = false;                  // llama3: a word that is a token is taken whole
  std::array<int32_t, 256> byte_token_{};       // byte -> token of its byte-level character, or -1
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
};

// ---------------------------------------------------------------------------------------
// SentencePiece-style ("llama").

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(VocabData v) : VocabTokenizer(std::move(v)) {
    scores_.assign(v_.tokens.size(), 0.0f);
    if (!v_.scores.empty()) std::copy_n(v_.scores.begin(), v_.tokens.size(), scores_.begin());
    static const char* kHex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const char hex[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
      int32_t id = token_id(hex);
      if (id < 0) id = token_id(std::string(1, static_cast<char>(b)));
      byte_token_[b] = id;
    }
    joins_space_.fill(false);
    for (const std::string& t : v_.tokens) {
      for (size_t k = t.find(kSpaceEscape, 1); k != std::string::npos;
           k = t.find(kSpaceEscape, k + 1)) {
        joins_space_[static_cast<uint8_t>(t[k - 1])] = true;
      }
    }
  }

 protected:
  void encode_text(std::string_view raw, bool after_special,
                   std::vector<int32_t>* out) const override {
    std::string text;
    text.reserve(raw.size() + 16);
    if (v_.add_space_prefix && after_special) text += kSpaceEscape;
    for (char c : raw) {
      if (c == ' ') {
        text += kSpaceEscape;
      } else {
        text.push_back(c);
      }
    }
    // Cut before a "▁" that no vocabulary token can join to the previous character: no
    // merge can cross such a cut, so the chunks tokenize independently with the same result
    // as the whole text (and a much smaller merge queue).
    std::vector<Symbol> syms;
    std::vector<Bigram> heap;
    // Cuts are only made at character starts (a malformed lead byte may swallow a "▁").
    size_t begin = 0;
    for (size_t p = 0; p < text.size(); p += tok::utf8_len(static_cast<uint8_t>(text[p]))) {
      if (p > begin && text.compare(p, 3, kSpaceEscape) == 0 &&
          !joins_space_[static_cast<uint8_t>(text[p - 1])]) {
        encode_chunk(std::string_view(text).substr(begin, p - begin), &syms, &heap, out);
        begin = p;
      }
    }
    encode_chunk(std::string_view(text).substr(begin), &syms, &heap, out);
  }

  std::string normal_piece(const std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 3, kSpaceEscape) == 0) {
        out.push_back(' ');
        i += 3;
      } else {
        out.push_back(text[i++]);
      }
    }
    return out;
  }

 private:
  struct Symbol {
    uint32_t start, n;  // bytes of the chunk; n = 0 once merged away
    int32_t prev, next;
  };
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t size;
  };

  // SentencePiece merges over one chunk; syms and heap are scratch space.
  void encode_chunk(std::string_view text, std::vector<Symbol>* syms_buf,
                    std::vector<Bigram>* heap_buf, std::vector<int32_t>* out) const {
    // One symbol per UTF-8 character.
    std::vector<Symbol>& syms = *syms_buf;
    std::vector<Bigram>& heap = *heap_buf;
    syms.clear();
    heap.clear();
    for (size_t off = 0; off < text.size();) {
      const size_t len =
          std::min(tok::utf8_len(static_cast<uint8_t>(text[off])), text.size() - off);
      const int32_t idx = static_cast<int32_t>(syms.size());
      syms.push_back({static_cast<uint32_t>(off), static_cast<uint32_t>(len), idx - 1,
                      off + len == text.size() ? -1 : idx + 1});
      off += len;
    }
    auto try_add = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const uint32_t size = syms[left].n + syms[right].n;
      auto it = token_to_id_.find(text.substr(syms[left].start, size));
      if (it == token_to_id_.end()) return;
      heap.push_back({scores_[it->second], left, right, size});
      std::push_heap(heap.begin(), heap.end(), heap_less);
    };
    for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), heap_less);
      const Bigram bg = heap.back();
      heap.pop_back();
      Symbol& l = syms[bg.left];
      Symbol& r = syms[bg.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;  // stale
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = bg.left;
      try_add(l.prev, bg.left);
      try_add(bg.left, l.next);
    }
    for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
      const std::string_view piece = text.substr(syms[i].start, syms[i].n);
      auto it = token_to_id_.find(piece);
      if (it != token_to_id_.end()) {
        out->push_back(it->second);
        continue;
      }
      for (char c : piece) {  // byte fallback
        int32_t id = byte_token_[static_cast<uint8_t>(c)];
        if (id < 0) id = v_.unk;
        KVTRIM_CHECK(id >= 0,
                     "%s: no token for byte 0x%02X (no <0x%02X> byte token and no unknown token)",
                     v_.source.c_str(), static_cast<uint8_t>(c), static_cast<uint8_t>(c));
        out->push_back(id);
      }
    }
  }

  // Max-heap order: the highest score, then the leftmost pair, comes out first.
  static bool heap_less(const Bigram& x, const Bigram& y) {
    return x.score != y.score ? x.score < y.score : x.left > y.left;
  }

  std::vector<float> scores_;              // [n_vocab]
  std::array<int32_t, 256> byte_token_{};  // byte -> <0xXX> token (or the 1-byte token), or -1
  std::array<bool, 256> joins_space_{};    // some token has this byte right before a "▁"
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(VocabData v) {
  if (v.model == "gpt2") return std::make_unique<BpeTokenizer>(std::move(v));
  if (v.model == "llama") return std::make_unique<SpmTokenizer>(std::move(v));
  fail("%s: unsupported tokenizer model tokenizer.ggml.model = '%s' (supported: gpt2, llama)",
       v.source.c_str(), v.model.c_str());
}

}  // namespace kvtrim
