// The pre-tokenizer of each tokenizer.ggml.pre name, and the machinery the splitters share
// (see tokenizer_pretok.h). Names and flags follow llama.cpp's vocabulary loader
// (llama-vocab.cpp): only names whose regexes kvtrim implements are listed; any other name
// is an error for the caller to report.
#include "model/tokenizer_pretok.h"

#include "model/tokenizer_pretok_impl.h"

namespace kvtrim::tok {

namespace {

struct NamedPre {
  const char* name;
  PreTokenizer pre;
};

constexpr PreTokenizer kGpt2{PreSplit::Gpt2, false, false};
constexpr PreTokenizer kSmollm{PreSplit::Smollm, false, false};
constexpr PreTokenizer kQwen2{PreSplit::Qwen2, false, false};
constexpr PreTokenizer kLlama3{PreSplit::Llama3, true, true};
constexpr PreTokenizer kLlama3Merges{PreSplit::Llama3, false, false};  // dbrx, smaug
constexpr PreTokenizer kQwen35{PreSplit::Qwen35, false, false};
constexpr PreTokenizer kSeedCoder{PreSplit::SeedCoder, false, false};
constexpr PreTokenizer kTekken{PreSplit::Tekken, true, true};
constexpr PreTokenizer kGpt4o{PreSplit::Gpt4o, false, false};
constexpr PreTokenizer kDeepseekLlm{PreSplit::DeepseekLlm, false, false};
constexpr PreTokenizer kDeepseekCoder{PreSplit::DeepseekCoder, false, false};
constexpr PreTokenizer kDeepseek3{PreSplit::Deepseek3, false, false};
constexpr PreTokenizer kFalcon{PreSplit::Falcon, false, false};
constexpr PreTokenizer kGemma4{PreSplit::Gemma4, false, false, true};

// "gpt2" is not a llama.cpp name but older kvtrim tests and tools write it.
constexpr NamedPre kNames[] = {
    {"gpt2", kGpt2},
    {"gpt-2", kGpt2},
    {"phi-2", kGpt2},
    {"mpt", kGpt2},
    {"olmo", kGpt2},
    {"jais", kGpt2},
    {"trillion", kGpt2},
    {"granite-docling", kGpt2},
    {"exaone4", kGpt2},
    {"gigachat", kGpt2},
    {"a.x-4.0", kGpt2},
    {"mellum", kGpt2},
    {"smollm", kSmollm},
    {"starcoder", kSmollm},
    {"refact", kSmollm},
    {"command-r", kSmollm},
    {"codeshell", kSmollm},
    {"exaone", kSmollm},
    {"minerva-7b", kSmollm},
    {"qwen2", kQwen2},
    {"deepseek-r1-qwen", kQwen2},
    {"stablelm2", kQwen2},
    {"hunyuan", kQwen2},
    {"megrez", kQwen2},
    {"kormo", kQwen2},
    {"f2llmv2", kQwen2},
    {"solar-open", kQwen2},
    {"grok-2", kQwen2},
    {"llama3", kLlama3},
    {"llama-v3", kLlama3},
    {"llama-bpe", kLlama3},
    {"falcon3", kLlama3},
    {"falcon-h1", kLlama3},
    {"pixtral", kLlama3},
    {"midm-2.0", kLlama3},
    {"lfm2", kLlama3},
    {"dbrx", kLlama3Merges},
    {"smaug-bpe", kLlama3Merges},
    {"qwen35", kQwen35},
    {"seed-coder", kSeedCoder},
    {"tekken", kTekken},
    {"gpt-4o", kGpt4o},
    {"llama4", kGpt4o},
    {"minimax-m2", kGpt4o},
    {"kanana2", kGpt4o},
    {"deepseek-llm", kDeepseekLlm},
    {"deepseek-coder", kDeepseekCoder},
    {"deepseek-v3", kDeepseek3},
    {"hunyuan-dense", kDeepseek3},
    {"joyai-llm", kDeepseek3},
    {"falcon", kFalcon},
    {"gemma4", kGemma4},  // also what tokenizer.ggml.model = "gemma4" implies
    {"granite-embed-multi-311m", kGemma4},
};

uint32_t ascii_lower(uint32_t c) {
  return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

// [^\n]+|[\n]+
size_t line_or_newlines(const Piece& p, size_t pos) {
  const bool nl = p.cpt(pos) == '\n';
  size_t q = pos;
  while (p.cpt(q) != kOut && (p.cpt(q) == '\n') == nl) ++q;
  return q;
}

const std::vector<Stage>& stages_of(PreSplit mode) {
  static const std::vector<Stage> gemma4{split_by<line_or_newlines>};
  switch (mode) {
    case PreSplit::Gpt2:
    case PreSplit::Smollm:
    case PreSplit::Qwen2:
    case PreSplit::Llama3:
    case PreSplit::Qwen35:
    case PreSplit::SeedCoder:
    case PreSplit::Tekken:
    case PreSplit::Gpt4o:
      return gpt2_like_stages(mode);
    case PreSplit::DeepseekLlm:
      return deepseek_llm_stages();
    case PreSplit::DeepseekCoder:
      return deepseek_coder_stages();
    case PreSplit::Deepseek3:
      return deepseek3_stages();
    case PreSplit::Falcon:
      return falcon_stages();
    case PreSplit::Gemma4:
      return gemma4;
  }
  return gemma4;  // unreachable: every enumerator is handled above
}

}  // namespace

bool pre_tokenizer_by_name(std::string_view name, PreTokenizer* out) {
  for (const NamedPre& n : kNames) {
    if (name == n.name) {
      *out = n.pre;
      return true;
    }
  }
  return false;
}

std::string pre_tokenizer_names() {
  std::string s;
  for (const NamedPre& n : kNames) {
    if (!s.empty()) s += ", ";
    s += n.name;
  }
  return s;
}

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

size_t match_space_tail(const Piece& p, size_t pos) {
  size_t q = pos, last_nl_end = 0;
  while (p.flags(q) & kClsSpace) {
    if (is_newline(p.cpt(q))) last_nl_end = q + 1;
    ++q;
  }
  if (q == pos) return pos;
  if (last_nl_end > 0) return last_nl_end;  // \s*[\r\n]+: up to the run's last newline
  if (q - pos > 1 && p.cpt(q) != kOut)
    return q - 1;  // \s+(?!\S): the last space starts the next word
  return q;        // \s+
}

void pre_tokenize(std::string_view text, PreSplit mode, std::string* norm,
                  std::vector<size_t>* word_ends) {
  norm->clear();
  word_ends->clear();
  std::vector<uint32_t> cpts;
  std::vector<uint16_t> cls;
  cpts.reserve(text.size());
  cls.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t c = utf8_next(text, &i);
    if (c > 0x10FFFF) c = 0xFFFD;
    cpts.push_back(c);
    cls.push_back(cpt_class(c));
  }
  const size_t n = cpts.size();
  std::vector<size_t> ends, next;  // piece ends, in code points
  if (n > 0) ends.push_back(n);
  for (Stage stage : stages_of(mode)) {
    next.clear();
    next.reserve(ends.size() + n / 3 + 4);
    size_t begin = 0;
    for (size_t e : ends) {
      stage(Piece{cpts, cls, begin, e}, &next);
      begin = e;
    }
    ends.swap(next);
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
