// The GPT-2-like pre-tokenizer regexes (one regex per family; see tokenizer_pretok.h), as
// Matchers: each returns the end of the regex's leftmost-first match at pos. The alternatives
// are tried in the regex's order and each one's greedy quantifiers backtrack as a regex engine's
// would; comments give the alternative a branch implements.
#include "model/tokenizer_pretok_impl.h"

namespace kvtrim::tok {

namespace {

constexpr uint16_t kLN = kClsLetter | kClsNumber;
constexpr uint16_t kSLN = kClsSpace | kClsLetter | kClsNumber;

bool is_letter(uint16_t f) {
  return f & kClsLetter;
}
bool is_number(uint16_t f) {
  return f & kClsNumber;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?W+|\p{N}{1,k}| ?[^\s\p{L}\p{N}W]+[\r\n]*
// |\s*[\r\n]+|\s+(?!\S)|\s+
// kMaxDigits: k; kWord: the word class W, \p{L} (Qwen2) or [\p{L}\p{M}] (Qwen35);
// kPunctNewlines: the [\r\n]* after punctuation (all but Seed-Coder).
template <size_t kMaxDigits, uint16_t kWord, bool kPunctNewlines>
size_t match_qwen2_like(const Piece& p, size_t pos) {
  const uint32_t c = p.cpt(pos);
  const uint16_t f = p.flags(pos);
  if (size_t n = match_contraction(p, pos, true)) return pos + n;
  const auto in_word = [](uint16_t g) { return (g & kWord) != 0; };
  if ((f & kWord) ||
      (!is_newline(c) && !(f & kLN) && (f & kClsValid) && in_word(p.flags(pos + 1)))) {
    return run_end(p, pos + 1, in_word);  // [^\r\n\p{L}\p{N}]?W+
  }
  if (is_number(f)) {  // \p{N}{1,k}
    size_t q = pos + 1;
    while (q - pos < kMaxDigits && is_number(p.flags(q))) ++q;
    return q;
  }
  const auto punct = [](uint16_t g) { return (g & kClsValid) && !(g & (kSLN | kWord)); };
  const size_t sp = c == ' ' ? 1 : 0;
  if (punct(p.flags(pos + sp))) {  //  ?[^\s\p{L}\p{N}]+[\r\n]*
    size_t q = run_end(p, pos + sp, punct);
    if (kPunctNewlines) {
      while (is_newline(p.cpt(q))) ++q;
    }
    return q;
  }
  return match_space_tail(p, pos);
}

// Tekken / GPT-4o words: [^\r\n\p{L}\p{N}]?U*L+ and [^\r\n\p{L}\p{N}]?U+L*, with
// U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and L = [\p{Ll}\p{Lm}\p{Lo}\p{M}] (Lm, Lo, M are in both).
bool in_upper(uint16_t f) {
  return (f & kClsMark) || ((f & kClsLetter) && !(f & kClsLower));
}
bool in_lower(uint16_t f) {
  return (f & kClsMark) || ((f & kClsLetter) && !(f & kClsUpper));
}
bool is_prefix(const Piece& p, size_t pos) {  // [^\r\n\p{L}\p{N}]
  const uint16_t f = p.flags(pos);
  return (f & kClsValid) && !(f & kLN) && !is_newline(p.cpt(pos));
}

// U*L+ from t: U* takes the longest run, then gives back until L+ can start; the first
// (rightmost) start that works is the match. Returns t if none.
size_t upper_star_lower_plus(const Piece& p, size_t t) {
  const size_t u = run_end(p, t, in_upper);
  for (size_t k = u + 1; k-- > t;) {
    if (in_lower(p.flags(k))) return run_end(p, k, in_lower);
  }
  return t;
}

// U+L* from t, or t if p.cpt(t) is not in U.
size_t upper_plus_lower_star(const Piece& p, size_t t) {
  if (!in_upper(p.flags(t))) return t;
  return run_end(p, run_end(p, t, in_upper), in_lower);
}

// Tekken (max_digits 1, no contractions) / GPT-4o (3, contractions after words).
template <size_t kMaxDigits, bool kContractions>
size_t match_cased(const Piece& p, size_t pos) {
  const bool prefix = is_prefix(p, pos);
  size_t e = pos;
  if (prefix) e = upper_star_lower_plus(p, pos + 1);
  if (e == pos || e == pos + 1) e = upper_star_lower_plus(p, pos);
  if (e == pos && prefix) {
    e = upper_plus_lower_star(p, pos + 1);
    if (e == pos + 1) e = pos;
  }
  if (e == pos) e = upper_plus_lower_star(p, pos);
  if (e > pos) {
    if (kContractions) e += match_contraction(p, e, true);
    return e;
  }
  if (is_number(p.flags(pos))) {  // \p{N}{1,k}
    size_t q = pos + 1;
    while (q - pos < kMaxDigits && is_number(p.flags(q))) ++q;
    return q;
  }
  const auto punct = [](uint16_t g) { return (g & kClsValid) && !(g & kSLN); };
  const size_t sp = p.cpt(pos) == ' ' ? 1 : 0;
  if (punct(p.flags(pos + sp))) {  //  ?[^\s\p{L}\p{N}]+[\r\n/]*
    size_t q = run_end(p, pos + sp, punct);
    while (is_newline(p.cpt(q)) || p.cpt(q) == '/') ++q;
    return q;
  }
  return match_space_tail(p, pos);
}

}  // namespace

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Piece& p, size_t pos) {
  if (size_t n = match_contraction(p, pos, false)) return pos + n;
  const size_t t = pos + (p.cpt(pos) == ' ' ? 1 : 0);
  const uint16_t f = p.flags(t);
  if (is_letter(f)) return run_end(p, t, is_letter);
  if (is_number(f)) return run_end(p, t, is_number);
  const auto punct = [](uint16_t g) { return (g & kClsValid) && !(g & kSLN); };
  if (punct(f)) return run_end(p, t, punct);
  size_t q = run_end(p, pos, [](uint16_t g) { return (g & kClsSpace) != 0; });
  if (q - pos > 1 && p.cpt(q) != kOut) return q - 1;  // \s+(?!\S)
  return q;                                           // \s+
}

size_t match_qwen2(const Piece& p, size_t pos) {
  return match_qwen2_like<1, kClsLetter, true>(p, pos);
}
size_t match_llama3(const Piece& p, size_t pos) {
  return match_qwen2_like<3, kClsLetter, true>(p, pos);
}
size_t match_qwen35(const Piece& p, size_t pos) {
  return match_qwen2_like<1, kClsLetter | kClsMark, true>(p, pos);
}
size_t match_seed_coder(const Piece& p, size_t pos) {
  return match_qwen2_like<1, kClsLetter, false>(p, pos);
}
size_t match_tekken(const Piece& p, size_t pos) {
  return match_cased<1, false>(p, pos);
}
size_t match_gpt4o(const Piece& p, size_t pos) {
  return match_cased<3, true>(p, pos);
}

namespace {

size_t one_digit(const Piece& p, size_t pos) {  // \p{N}
  return is_number(p.flags(pos)) ? pos + 1 : pos;
}

}  // namespace

const std::vector<Stage>& gpt2_like_stages(PreSplit mode) {
  static const std::vector<Stage> gpt2{split_by<match_gpt2>};
  static const std::vector<Stage> smollm{split_by<one_digit>, split_by<match_gpt2>};
  static const std::vector<Stage> qwen2{split_by<match_qwen2>};
  static const std::vector<Stage> llama3{split_by<match_llama3>};
  static const std::vector<Stage> qwen35{split_by<match_qwen35>};
  static const std::vector<Stage> seed_coder{split_by<match_seed_coder>};
  static const std::vector<Stage> tekken{split_by<match_tekken>};
  static const std::vector<Stage> gpt4o{split_by<match_gpt4o>};
  switch (mode) {
    case PreSplit::Smollm:
      return smollm;
    case PreSplit::Qwen2:
      return qwen2;
    case PreSplit::Llama3:
      return llama3;
    case PreSplit::Qwen35:
      return qwen35;
    case PreSplit::SeedCoder:
      return seed_coder;
    case PreSplit::Tekken:
      return tekken;
    case PreSplit::Gpt4o:
      return gpt4o;
    default:
      return gpt2;
  }
}

}  // namespace kvtrim::tok
