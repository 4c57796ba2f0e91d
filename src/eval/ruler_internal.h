// Internals shared by the RULER task builders (ruler.cpp: niah, vt, cwe, fwe;
// ruler_qa.cpp: qa_1, qa_2). Not a public header.
#pragma once
#include <string>
#include <vector>

#include "eval/rng.h"
#include "eval/ruler.h"

namespace kvtrim::eval {

// One built instance: the context, its question, and the depths used.
struct Built {
  std::string context;
  EvalQuestion q;
  std::vector<double> depths;
};

struct RulerGenerator::Impl {
  TokenCounter count;
  WordLists words;
  std::vector<std::string> all_words;    // nouns + adjs + verbs, sorted unique (cwe)
  std::vector<std::string> essay_words;  // the corpus, normalised, as words (niah essays)
  std::vector<std::string> essay_sents;  // the corpus as sentences (qa filler documents)
  uint64_t corpus_hash = 0;
};

// Depths for k needles: the configured ones in turn, or k distinct values of RULER's grid
// round(linspace(0, 100, 40)).
std::vector<double> draw_depths(const RulerConfig& cfg, Rng& rng, int k);

// qa_1 / qa_2 builders (ruler_qa.cpp). n = number of essay filler sentences.
Built build_qa(const RulerGenerator::Impl& im, const RulerConfig& cfg, bool two_hop, int64_t n,
               Rng& rng);

}  // namespace kvtrim::eval
