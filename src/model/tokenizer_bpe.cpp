// Byte-level BPE ("gpt2"), as llama.cpp's llm_tokenizer_bpe: the text is cut into words by the
// pre-tokenizer tokenizer.ggml.pre names (tokenizer_pretok.h); each word is mapped byte by byte
// to GPT-2's printable code points, then the adjacent pair with the lowest merge rank is merged
// until none is left (ties: leftmost first). With ignore_merges (llama3, tekken) a word that
// is a token is taken whole. Gemma 4 ("gemma4", llama.cpp's byte_encode = false) is the same
// merge loop over raw UTF-8 characters, with spaces escaped to U+2581 and <0xXX> byte fallback.
#include <algorithm>
#include <array>
#include <unordered_map>

#include "core/error.h"
#include "model/tokenizer_impl.h"
#include "model/tokenizer_pretok.h"
#include "model/tokenizer_unicode.h"

namespace kvtrim {

namespace {

constexpr const char* kSpaceEscape = "\xe2\x96\x81";  // U+2581 "\u2581"

class BpeTokenizer final : public VocabTokenizer {
 public:
  explicit BpeTokenizer(VocabData v) : VocabTokenizer(std::move(v)) {
    // tokenizer.ggml.model = "gemma4" implies its pre-tokenizer, as in llama.cpp.
    const std::string& pre_name = v_.model == "gemma4" ? std::string("gemma4") : v_.pre;
    tok::PreTokenizer pre;
    if (!tok::pre_tokenizer_by_name(pre_name, &pre)) {
      fail("%s: unsupported BPE pre-tokenizer tokenizer.ggml.pre = '%s' (supported: %s)",
           v_.source.c_str(), pre_name.c_str(), tok::pre_tokenizer_names().c_str());
    }
    split_ = pre.split;
    ignore_merges_ = pre.ignore_merges;
    raw_utf8_ = pre.raw_utf8;
    static const char* kHex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      std::string s;
      if (raw_utf8_) {
        s = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      } else {
        tok::utf8_append(tok::byte_to_cpt(static_cast<uint8_t>(b)), &s);
      }
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
    std::string norm, escaped;
    std::vector<size_t> ends;
    if (raw_utf8_) {  // spaces become U+2581 before the split (llama_escape_whitespace)
      escaped.reserve(text.size() + 16);
      for (char c : text) {
        if (c == ' ') {
          escaped += kSpaceEscape;
        } else {
          escaped.push_back(c);
        }
      }
      text = escaped;
    }
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
    if (raw_utf8_) {  // "\u2581" stands for a space; everything else is the text itself
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
    int32_t id;  // token id; -1 for a unit (byte, or character in raw_utf8_) without a token; -2
                 // merged away
    int32_t prev, next;
    uint32_t off, len;  // the unit's bytes in the word (meaningful while id == -1)
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
    // llama3 / tekken: a word that is a token is taken whole; Gemma 4: a word of newlines.
    if (ignore_merges_ || (raw_utf8_ && word.find_first_not_of('\n') == std::string_view::npos)) {
      w->encoded.clear();
      if (raw_utf8_) {
        w->encoded = word;
      } else {
        for (char c : word)
          tok::utf8_append(tok::byte_to_cpt(static_cast<uint8_t>(c)), &w->encoded);
      }
      const int32_t id = token_id(w->encoded);
      if (id >= 0) {
        out->push_back(id);
        return;
      }
    }
    if (!raw_utf8_ && word.size() == 1) {
      const int32_t id = byte_token_[static_cast<uint8_t>(word[0])];
      if (id >= 0) out->push_back(id);
      return;
    }
    // The units merges start from: bytes (as their byte-level characters), or UTF-8
    // characters in raw_utf8_ mode.
    w->syms.clear();
    for (size_t off = 0; off < word.size();) {
      const size_t len =
          raw_utf8_ ? std::min(tok::utf8_len(static_cast<uint8_t>(word[off])), word.size() - off)
                    : 1;
      const int32_t id = raw_utf8_ ? token_id(word.substr(off, len))
                                   : byte_token_[static_cast<uint8_t>(word[off])];
      const int32_t i = static_cast<int32_t>(w->syms.size());
      w->syms.push_back({id, i - 1, off + len < word.size() ? i + 1 : -1,
                         static_cast<uint32_t>(off), static_cast<uint32_t>(len)});
      off += len;
    }
    const int32_t n = static_cast<int32_t>(w->syms.size());
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
      const Symbol& sym = w->syms[i];
      if (sym.id >= 0) {
        out->push_back(sym.id);
      } else if (raw_utf8_) {  // a character without a token: its bytes as <0xXX> tokens
        for (uint32_t k = 0; k < sym.len; ++k) {
          const int32_t id = byte_token_[static_cast<uint8_t>(word[sym.off + k])];
          if (id >= 0) out->push_back(id);
        }
      }  // (byte-level: a byte without a token is dropped, as in llama.cpp)
    }
  }

  tok::PreSplit split_ = tok::PreSplit::Gpt2;
  bool ignore_merges_ = false;             // llama3, tekken: a word that is a token is taken whole
  bool raw_utf8_ = false;                  // Gemma 4: raw UTF-8 tokens, "\u2581" for spaces
  std::array<int32_t, 256> byte_token_{};  // byte -> its byte-level character's token (raw_utf8_:
                                           // its <0xXX> token), or -1
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(VocabData v) {
  return std::make_unique<BpeTokenizer>(std::move(v));
}

}  // namespace kvtrim
