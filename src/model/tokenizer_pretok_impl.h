// Internals shared by the pre-tokenizer files (tokenizer_pretok*.cpp); see tokenizer_pretok.h.
// A regex is written as a Matcher: the end of its leftmost-first match that starts at pos, as a
// backtracking regex engine would find it, or pos when none starts there. split_by<M> scans
// a piece left to right as a regex search does: matches and the text between them become
// pieces.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/tokenizer_pretok.h"
#include "model/tokenizer_unicode.h"

namespace kvtrim::tok {

inline constexpr uint32_t kOut = 0xFFFFFFFFu;  // position outside the current piece

// The code points of one text with their classes; positions outside [ini, end) of the piece
// being split read as kOut / 0 (llama.cpp's _get_cpt / _get_flags), so lookaheads stop there.
struct Piece {
  const std::vector<uint32_t>& cpts;  // [n] code points of the whole text
  const std::vector<uint16_t>& cls;   // [n] cpt_class of each
  size_t ini, end;                    // the piece: [ini, end)
  uint32_t cpt(size_t p) const { return p >= ini && p < end ? cpts[p] : kOut; }
  uint16_t flags(size_t p) const { return p >= ini && p < end ? cls[p] : 0; }
};

inline bool is_newline(uint32_t c) {
  return c == '\r' || c == '\n';
}

// 's|'t|'re|'ve|'m|'ll|'d (optionally ASCII case-insensitive): length of the match at pos, or 0.
size_t match_contraction(const Piece& p, size_t pos, bool icase);

// End of the run of positions from pos whose flags satisfy in(flags).
template <class In>
size_t run_end(const Piece& p, size_t pos, In in) {
  while (in(p.flags(pos))) ++pos;
  return pos;
}

// The whitespace tail of the Qwen2 / Llama3 / GPT-4o regexes at a whitespace position:
// \s*[\r\n]+|\s+(?!\S)|\s+ (returns pos if p.cpt(pos) is not whitespace).
size_t match_space_tail(const Piece& p, size_t pos);

using Matcher = size_t (*)(const Piece& p, size_t pos);
// One regex of a family over one piece: appends the end of every piece it cuts p into.
using Stage = void (*)(const Piece& p, std::vector<size_t>* ends);

// The Stage of one regex: its matches and the text between them become pieces. (A template,
// so that the matcher is inlined where it is defined.)
template <Matcher M>
void split_by(const Piece& p, std::vector<size_t>* ends) {
  size_t gap = p.ini;  // start of the unmatched text before pos
  for (size_t pos = p.ini; pos < p.end;) {
    const size_t e = M(p, pos);
    if (e > pos) {
      if (pos > gap) ends->push_back(pos);
      ends->push_back(e);
      pos = gap = e;
    } else {
      ++pos;
    }
  }
  if (p.end > gap) ends->push_back(p.end);
}

// tokenizer_pretok_gpt2.cpp: the GPT-2-like single regexes (and SmolLM's digits first);
// mode is one of Gpt2, Smollm, Qwen2, Llama3, Qwen35, SeedCoder, Tekken, Gpt4o.
const std::vector<Stage>& gpt2_like_stages(PreSplit mode);
size_t match_gpt2(const Piece& p, size_t pos);
size_t match_qwen2(const Piece& p, size_t pos);
size_t match_llama3(const Piece& p, size_t pos);
size_t match_qwen35(const Piece& p, size_t pos);
size_t match_seed_coder(const Piece& p, size_t pos);
size_t match_tekken(const Piece& p, size_t pos);
size_t match_gpt4o(const Piece& p, size_t pos);

// tokenizer_pretok_stages.cpp: the families made of several regexes.
const std::vector<Stage>& deepseek_llm_stages();
const std::vector<Stage>& deepseek_coder_stages();
const std::vector<Stage>& deepseek3_stages();
const std::vector<Stage>& falcon_stages();

}  // namespace kvtrim::tok
