// Unicode helpers and the hand-written BPE pre-tokenizers (see tokenizer_unicode.h).
// The splitters follow the semantics of llama.cpp's unicode_regex_split for the regexes
// listed in the header, including its quirks (e.g. `\s+(?!\S)` leaves the last space of a
// run for the next word, but takes a run that ends the piece whole).
#include "model/tokenizer_unicode.h"

#include <algorithm>
#include <array>

#include "model/tokenizer_unicode_data.h"

namespace kvtrim::tok {

namespace {

constexpr uint32_t kOut = 0xFFFFFFFFu;  // position outside the current piece

bool is_space_cpt(uint32_t c) {
  // llama.cpp's whitespace set (the \s of the tokenizer regexes).
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

uint8_t table_class(uint32_t c) {
  const auto* begin = std::begin(unicode_data::kLetterNumberRanges);
  const auto* end = std::end(unicode_data::kLetterNumberRanges);
  const auto* it = std::upper_bound(
      begin, end, c, [](uint32_t v, const unicode_data::CptRange& r) { return v < r.first; });
  if (it == begin) return 0;
  --it;
  return c <= it->last ? it->cls : 0;
}

struct AsciiTable {
  std::array<uint8_t, 128> cls{};
  AsciiTable() {
    for (uint32_t c = 0; c < 128; ++c) {
      cls[c] = static_cast<uint8_t>(table_class(c) | (is_space_cpt(c) ? kClsSpace : 0) | kClsValid);
    }
  }
};

struct ByteMap {
  std::array<uint32_t, 256> to_cpt{};
  std::array<int16_t, 512> from_cpt{};
  ByteMap() {
    from_cpt.fill(-1);
    std::array<bool, 256> direct{};
    for (int b = 0x21; b <= 0x7E; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) to_cpt[b] = direct[b] ? static_cast<uint32_t>(b) : 256 + n++;
    for (int b = 0; b < 256; ++b) from_cpt[to_cpt[b]] = static_cast<int16_t>(b);
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The code points of one text with their classes; positions outside [ini, end) of the piece
// being split read as kOut / 0, like llama.cpp's _get_cpt / _get_flags.
struct Piece {
  const std::vector<uint32_t>& cpts;
  const std::vector<uint8_t>& cls;
  size_t ini, end;
  uint32_t cpt(size_t p) const { return p >= ini && p < end ? cpts[p] : kOut; }
  uint8_t flags(size_t p) const { return p >= ini && p < end ? cls[p] : 0; }
};

uint32_t ascii_lower(uint32_t c) {
  return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

// 's|'t|'re|'ve|'m|'ll|'d (optionally case-insensitive): length of the match at pos, or 0.
size_t match_contraction(const Piece& p, size_t pos, bool icase) {
  if (p.cpt(pos) != '\'' || pos + 1 >= p.end) return 0;
  auto low = [&](size_t q) { return icase ? ascii_lower(p.cpt(q)) : p.cpt(q); };
  const uint32_t c1 = low(pos + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 < p.end) {
    const uint32_t c2 = low(pos + 2);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  }
  return 0;
}

constexpr uint8_t kLN = kClsLetter | kClsNumber;
constexpr uint8_t kSLN = kClsSpace | kClsLetter | kClsNumber;

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(const Piece& p, std::vector<size_t>* ends) {
  size_t pos = p.ini;
  auto emit = [&](size_t e) {
    if (ends->empty() || ends->back() != e) ends->push_back(e);
    pos = e;
  };
  while (pos < p.end) {
    const uint32_t c = p.cpt(pos);
    if (size_t n = match_contraction(p, pos, false)) {
      emit(pos + n);
      continue;
    }
    const size_t sp = c == ' ' ? 1 : 0;
    uint8_t f2 = p.flags(pos + sp);
    if (f2 & kClsLetter) {
      size_t q = pos + sp;
      while (p.flags(q) & kClsLetter) ++q;
      emit(q);
      continue;
    }
    if (f2 & kClsNumber) {
      size_t q = pos + sp;
      while (p.flags(q) & kClsNumber) ++q;
      emit(q);
      continue;
    }
    if (!(f2 & kSLN) && (f2 & kClsValid)) {
      size_t q = pos + sp;
      while (!(p.flags(q) & kSLN) && (p.flags(q) & kClsValid)) ++q;
      emit(q);
      continue;
    }
    size_t n_ws = 0;
    while (p.flags(pos + n_ws) & kClsSpace) ++n_ws;
    if (n_ws > 1 && p.cpt(pos + n_ws) != kOut) {
      emit(pos + n_ws - 1);
      continue;
    }
    emit(pos + (n_ws > 0 ? n_ws : 1));
  }
}

// Qwen2 (max_digits 1) / Llama3 (max_digits 3):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,k}| ?[^\s\p{L}\p{N}]+[\r\n]*
// |\s*[\r\n]+|\s+(?!\S)|\s+
void split_qwen2(const Piece& p, size_t max_digits, std::vector<size_t>* ends) {
  size_t pos = p.ini;
  auto emit = [&](size_t e) {
    if (ends->empty() || ends->back() != e) ends->push_back(e);
    pos = e;
  };
  while (pos < p.end) {
    const uint32_t c = p.cpt(pos);
    const uint8_t f = p.flags(pos);
    if (size_t n = match_contraction(p, pos, true)) {
      emit(pos + n);
      continue;
    }
    if (!(c == '\r' || c == '\n' || (f & kClsNumber))) {
      if ((f & kClsLetter) || (p.flags(pos + 1) & kClsLetter)) {
        size_t q = pos + 1;
        while (p.flags(q) & kClsLetter) ++q;
        emit(q);
        continue;
      }
    }
    if (f & kClsNumber) {
      size_t q = pos;
      while ((p.flags(q) & kClsNumber) && q - pos < max_digits) ++q;
      emit(q);
      continue;
    }
    const size_t sp = c == ' ' ? 1 : 0;
    const uint8_t f2 = p.flags(pos + sp);
    if (!(f2 & kSLN) && (f & kClsValid)) {
      size_t q = pos + sp;
      while (!(p.flags(q) & kSLN) && (p.flags(q) & kClsValid)) ++q;
      while (p.cpt(q) == '\r' || p.cpt(q) == '\n') ++q;
      emit(q);
      continue;
    }
    size_t n_ws = 0, last_nl_end = 0;
    while (p.flags(pos + n_ws) & kClsSpace) {
      const uint32_t c2 = p.cpt(pos + n_ws);
      if (c2 == '\r' || c2 == '\n') last_nl_end = pos + n_ws + 1;
      ++n_ws;
    }
    if (last_nl_end > 0) {
      emit(last_nl_end);
      continue;
    }
    if (n_ws > 1 && p.cpt(pos + n_ws) != kOut) {
      emit(pos + n_ws - 1);
      continue;
    }
    emit(pos + (n_ws > 0 ? n_ws : 1));
  }
}

}  // namespace

uint8_t cpt_class(uint32_t c) {
  static const AsciiTable ascii;
  if (c < 128) return ascii.cls[c];
  return static_cast<uint8_t>(table_class(c) | (is_space_cpt(c) ? kClsSpace : 0) | kClsValid);
}

uint32_t utf8_next(std::string_view s, size_t* pos) {
  const size_t i = *pos;
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const uint8_t b0 = b(0);
  if (b0 < 0x80) {
    *pos = i + 1;
    return b0;
  }
  if ((b0 & 0xE0) == 0xC0 && cont(1)) {
    *pos = i + 2;
    return (uint32_t(b0 & 0x1F) << 6) | (b(1) & 0x3F);
  }
  if ((b0 & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    *pos = i + 3;
    return (uint32_t(b0 & 0x0F) << 12) | (uint32_t(b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  }
  if ((b0 & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    *pos = i + 4;
    return (uint32_t(b0 & 0x07) << 18) | (uint32_t(b(1) & 0x3F) << 12) |
           (uint32_t(b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
  *pos = i + 1;
  return 0xFFFD;
}

void utf8_append(uint32_t c, std::string* out) {
  if (c > 0x10FFFF) c = 0xFFFD;
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

uint32_t byte_to_cpt(uint8_t b) {
  return byte_map().to_cpt[b];
}

int byte_from_cpt(uint32_t cpt) {
  return cpt < 512 ? byte_map().from_cpt[cpt] : -1;
}

void pre_tokenize(std::string_view text, PreSplit mode, std::string* norm,
                  std::vector<size_t>* word_ends) {
  norm->clear();
  word_ends->clear();
  std::vector<uint32_t> cpts;
  std::vector<uint8_t> cls;
  cpts.reserve(text.size());
  cls.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t c = utf8_next(text, &i);
    if (c > 0x10FFFF) c = 0xFFFD;
    cpts.push_back(c);
    cls.push_back(cpt_class(c));
  }
  const size_t n = cpts.size();
  std::vector<size_t> ends;  // in code points
  ends.reserve(n / 3 + 4);
  switch (mode) {
    case PreSplit::Gpt2:
      split_gpt2(Piece{cpts, cls, 0, n}, &ends);
      break;
    case PreSplit::Smollm: {
      // \p{N} first: every number code point is a piece of its own; then GPT-2 inside each piece.
      size_t start = 0;
      for (size_t i = 0; i <= n; ++i) {
        if (i == n || (cls[i] & kClsNumber)) {
          if (i > start) split_gpt2(Piece{cpts, cls, start, i}, &ends);
          if (i < n) {
            ends.push_back(i + 1);
            start = i + 1;
          }
        }
      }
      break;
    }
    case PreSplit::Qwen2:
      split_qwen2(Piece{cpts, cls, 0, n}, 1, &ends);
      break;
    case PreSplit::Llama3:
      split_qwen2(Piece{cpts, cls, 0, n}, 3, &ends);
      break;
  }
  norm->reserve(text.size() + 8);
  word_ends->reserve(ends.size());
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    utf8_append(cpts[i], norm);
    while (k < ends.size() && ends[k] == i + 1) {
      word_ends->push_back(norm->size());
      ++k;
    }
  }
}

}  // namespace kvtrim::tok
