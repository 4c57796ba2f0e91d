// SentencePiece-style tokenizer ("llama": Llama 2, Mistral v0.1-v0.3, Phi-3, Gemma 3), as
// llama.cpp's llm_tokenizer_spm: spaces become U+2581 "▁" (and one is prefixed when
// add_space_prefix); starting from UTF-8 characters, the adjacent pair whose concatenation is a
// vocabulary token with the highest score is merged until none is left (ties: leftmost first);
// what is not a token falls back to <0xXX> byte tokens.
#include <algorithm>
#include <array>

#include "core/error.h"
#include "model/tokenizer_impl.h"
#include "model/tokenizer_unicode.h"

namespace kvtrim {

namespace {

constexpr const char* kSpaceEscape = "\xe2\x96\x81";  // U+2581 "▁"

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

std::unique_ptr<Tokenizer> make_spm_tokenizer(VocabData v) {
  return std::make_unique<SpmTokenizer>(std::move(v));
}

}  // namespace kvtrim
