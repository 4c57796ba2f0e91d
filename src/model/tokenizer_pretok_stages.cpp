// The pre-tokenizers made of several regexes, each applied to every piece the previous ones
// made (see tokenizer_pretok.h): DeepSeek LLM, DeepSeek Coder, DeepSeek V3, Falcon.
#include <algorithm>
#include <iterator>

#include "model/tokenizer_pretok_impl.h"

namespace kvtrim::tok {

namespace {

struct Range {
  uint32_t first, last;  // inclusive
};

template <size_t N>
bool in_ranges(const Range (&r)[N], uint32_t c) {
  const Range* it = std::upper_bound(std::begin(r), std::end(r), c,
                                     [](uint32_t v, const Range& x) { return v < x.first; });
  return it != std::begin(r) && c <= (it - 1)->last;
}

// DeepSeek LLM's letter class (its tokenizer.json, second Split), sorted:
// [A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-Ֆ...𞤀-𞥃].
constexpr Range kDeepseekLetters[] = {
    {0x0041, 0x005A},   {0x0061, 0x007A},   {0x00B5, 0x00B5},   {0x00C0, 0x00D6},
    {0x00D8, 0x00F6},   {0x00F8, 0x01BA},   {0x01BC, 0x01BF},   {0x01C4, 0x0293},
    {0x0295, 0x02AF},   {0x0370, 0x0373},   {0x0376, 0x0377},   {0x037B, 0x037D},
    {0x037F, 0x037F},   {0x0386, 0x0386},   {0x0388, 0x038A},   {0x038C, 0x038C},
    {0x038E, 0x03A1},   {0x03A3, 0x03F5},   {0x03F7, 0x0481},   {0x048A, 0x052F},
    {0x0531, 0x0556},   {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
// DeepSeek LLM's punctuation class: [!-/:-~！-／：-～‘-‟　-。] (note that :-~ holds A-Z, a-z).
constexpr Range kDeepseekPunct[] = {
    {0x0021, 0x002F}, {0x003A, 0x007E}, {0x2018, 0x201F},
    {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};
// [一-龥ࠀ-一가-퟿] (DeepSeek LLM and Coder): U+0800..U+9FA5 and the Hangul syllables block.
constexpr Range kDeepseekCjk[] = {{0x0800, 0x9FA5}, {0xAC00, 0xD7FF}};
// [一-龥぀-ゟ゠-ヿ] (DeepSeek V3): kana and CJK ideographs.
constexpr Range kDeepseek3Cjk[] = {{0x3040, 0x30FF}, {0x4E00, 0x9FA5}};

template <const auto& kRanges>
bool in_class(const Piece& p, size_t pos) {
  const uint32_t c = p.cpt(pos);
  return c != kOut && in_ranges(kRanges, c);
}

template <const auto& kRanges>
size_t class_run(const Piece& p, size_t pos) {
  while (in_class<kRanges>(p, pos)) ++pos;
  return pos;
}

// \s?[class]+
template <const auto& kRanges>
size_t space_opt_class_run(const Piece& p, size_t pos) {
  size_t t = pos;
  if ((p.flags(t) & kClsSpace) && in_class<kRanges>(p, t + 1)) ++t;
  return in_class<kRanges>(p, t) ? class_run<kRanges>(p, t) : pos;
}

// \s?<cls>+ over a class bit of cpt_class.
template <uint16_t kBits>
size_t space_opt_flags_run(const Piece& p, size_t pos) {
  size_t t = pos;
  if ((p.flags(t) & kClsSpace) && (p.flags(t + 1) & kBits)) ++t;
  if (!(p.flags(t) & kBits)) return pos;
  return run_end(p, t, [](uint16_t g) { return (g & kBits) != 0; });
}

size_t one_newline(const Piece& p, size_t pos) {  // [\r\n]
  return is_newline(p.cpt(pos)) ? pos + 1 : pos;
}

template <size_t kMax>
size_t digits(const Piece& p, size_t pos) {  // \p{N}{1,kMax}
  size_t q = pos;
  while (q - pos < kMax && (p.flags(q) & kClsNumber)) ++q;
  return q;
}

size_t digit_run(const Piece& p, size_t pos) {  // \p{N}+
  return run_end(p, pos, [](uint16_t g) { return (g & kClsNumber) != 0; });
}

// \s+$: the piece's trailing whitespace (a search finds it at the run's start).
void trailing_space(const Piece& p, std::vector<size_t>* ends) {
  size_t ts = p.end;
  while (ts > p.ini && (p.flags(ts - 1) & kClsSpace)) --ts;
  if (ts > p.ini) ends->push_back(ts);
  if (p.end > ts) ends->push_back(p.end);
}

// DeepSeek V3's main regex:
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
// | ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_deepseek3(const Piece& p, size_t pos) {
  const uint32_t c = p.cpt(pos);
  const auto ascii_letter = [](uint32_t x) {
    return (x >= 'A' && x <= 'Z') || (x >= 'a' && x <= 'z');
  };
  const bool ascii_punct = c >= 0x21 && c <= 0x7E && !ascii_letter(c) && !(c >= '0' && c <= '9');
  if (ascii_punct && ascii_letter(p.cpt(pos + 1))) {
    size_t q = pos + 1;
    while (ascii_letter(p.cpt(q))) ++q;
    return q;
  }
  const auto word = [](uint16_t g) { return (g & (kClsLetter | kClsMark)) != 0; };
  const uint16_t f = p.flags(pos);
  const bool prefix =
      (f & kClsValid) && !(f & (kClsLetter | kClsPunct | kClsSymbol)) && !is_newline(c);
  if (word(f) || (prefix && word(p.flags(pos + 1)))) return run_end(p, pos + 1, word);
  const auto ps = [](uint16_t g) { return (g & (kClsPunct | kClsSymbol)) != 0; };
  const size_t t = pos + (c == ' ' ? 1 : 0);
  if (ps(p.flags(t))) {
    size_t q = run_end(p, t, ps);
    while (is_newline(p.cpt(q))) ++q;
    return q;
  }
  return match_space_tail(p, pos);
}

// Falcon's Punctuation pre-tokenizer: runs of [\p{P}\$\+<=>\^~\|`] (Rust's
// is_ascii_punctuation or a Unicode punctuation character).
size_t falcon_punct(const Piece& p, size_t pos) {
  const auto in = [&](size_t q) {
    const uint32_t c = p.cpt(q);
    return (p.flags(q) & kClsPunct) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' ||
           c == '^' || c == '~' || c == '|' || c == '`';
  };
  size_t q = pos;
  while (in(q)) ++q;
  return q;
}

size_t three_ascii_digits(const Piece& p, size_t pos) {  // [0-9][0-9][0-9]
  for (size_t k = 0; k < 3; ++k) {
    const uint32_t c = p.cpt(pos + k);
    if (c < '0' || c > '9') return pos;
  }
  return pos + 3;
}

}  // namespace

const std::vector<Stage>& deepseek_llm_stages() {
  static const std::vector<Stage> s{
      split_by<one_newline>,
      split_by<space_opt_class_run<kDeepseekLetters>>,
      split_by<space_opt_class_run<kDeepseekPunct>>,
      trailing_space,
      split_by<class_run<kDeepseekCjk>>,
      split_by<digit_run>,
  };
  return s;
}

const std::vector<Stage>& deepseek_coder_stages() {
  static const std::vector<Stage> s{
      split_by<one_newline>,
      split_by<space_opt_flags_run<kClsLetter>>,
      split_by<space_opt_flags_run<kClsPunct>>,
      split_by<class_run<kDeepseekCjk>>,
      split_by<digits<1>>,
  };
  return s;
}

const std::vector<Stage>& deepseek3_stages() {
  static const std::vector<Stage> s{
      split_by<digits<3>>,
      split_by<class_run<kDeepseek3Cjk>>,
      split_by<match_deepseek3>,
  };
  return s;
}

const std::vector<Stage>& falcon_stages() {
  static const std::vector<Stage> s{
      split_by<falcon_punct>,
      split_by<match_gpt2>,
      split_by<three_ascii_digits>,
  };
  return s;
}

}  // namespace kvtrim::tok
