// RULER task generators: niah (8 variants), vt, cwe, fwe, and the shared fitting to a token
// budget. See ruler.h for the sources followed and docs/eval.md for each task.
#include "eval/ruler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "eval/ruler_internal.h"
#include "eval/text.h"

namespace kvtrim::eval {

namespace {

constexpr const char* kGeneratorVersion = "kvtrim-ruler-v1";
constexpr const char* kNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

enum class Haystack { kRepeat, kEssay, kNeedle };
enum class NeedleType { kNumbers, kWords, kUuids };

struct NiahSpec {
  Haystack haystack;
  NeedleType key, value;
  int num_k, num_v, num_q;
};

const char* needle_type_name(NeedleType t) {
  switch (t) {
    case NeedleType::kNumbers: return "numbers";
    case NeedleType::kWords: return "words";
    case NeedleType::kUuids: return "uuids";
  }
  return "";
}

const std::vector<RulerTaskInfo> kTasks = {
    {"niah_single_1", "one needle (word key, 7-digit number) in repeated noise sentences", Metric::kAll, 128},
    {"niah_single_2", "one needle (word key, number) in essays", Metric::kAll, 128},
    {"niah_single_3", "one needle (word key, uuid) in essays", Metric::kAll, 128},
    {"niah_multikey_1", "4 needles with different word keys in essays; asks one", Metric::kAll, 128},
    {"niah_multikey_2", "haystack made only of needles with distinct word keys; asks one", Metric::kAll, 128},
    {"niah_multikey_3", "haystack made only of needles with uuid keys and uuid values; asks one", Metric::kAll, 128},
    {"niah_multivalue", "4 numbers under the same key in essays; asks all 4", Metric::kAll, 128},
    {"niah_multiquery", "4 keys in essays; asks all 4 in one question", Metric::kAll, 128},
    {"vt", "variable tracking: a 4-hop chain VAR B = VAR A ... in noise; name every variable", Metric::kAll, 30},
    {"cwe", "common words: a numbered word list; the 10 words that repeat most", Metric::kAll, 120},
    {"fwe", "frequent words: Zipf-distributed coded words; the 3 most frequent", Metric::kAll, 50},
    {"qa_1", "single-hop QA: a fact about a person among essay and distractor documents", Metric::kPart, 32},
    {"qa_2", "two-hop QA: person -> company -> city/year across two documents", Metric::kPart, 32},
};

NiahSpec niah_spec(const std::string& t) {
  using H = Haystack;
  using N = NeedleType;
  if (t == "niah_single_1") return {H::kRepeat, N::kWords, N::kNumbers, 1, 1, 1};
  if (t == "niah_single_2") return {H::kEssay, N::kWords, N::kNumbers, 1, 1, 1};
  if (t == "niah_single_3") return {H::kEssay, N::kWords, N::kUuids, 1, 1, 1};
  if (t == "niah_multikey_1") return {H::kEssay, N::kWords, N::kNumbers, 4, 1, 1};
  if (t == "niah_multikey_2") return {H::kNeedle, N::kWords, N::kNumbers, 1, 1, 1};
  if (t == "niah_multikey_3") return {H::kNeedle, N::kUuids, N::kUuids, 1, 1, 1};
  if (t == "niah_multivalue") return {H::kEssay, N::kWords, N::kNumbers, 1, 4, 1};
  if (t == "niah_multiquery") return {H::kEssay, N::kWords, N::kNumbers, 4, 1, 4};
  KVTRIM_ASSERT(false);
  return {};
}

std::string random_uuid(Rng& rng) {
  // RFC 4122 version 4 layout, as Python's uuid.UUID(int=getrandbits(128), version=4).
  uint64_t hi = rng.next(), lo = rng.next();
  hi = (hi & ~0xf000ULL) | 0x4000ULL;
  lo = (lo & ~(0xc000ULL << 48)) | (0x8000ULL << 48);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08llx-%04llx-%04llx-%04llx-%012llx",
                static_cast<unsigned long long>(hi >> 32), static_cast<unsigned long long>((hi >> 16) & 0xffff),
                static_cast<unsigned long long>(hi & 0xffff), static_cast<unsigned long long>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xffffffffffffULL));
  return buf;
}

std::string random_needle(const RulerGenerator::Impl& im, NeedleType t, Rng& rng) {
  switch (t) {
    case NeedleType::kNumbers: return std::to_string(rng.range(1000000, 9999999));
    case NeedleType::kWords: {
      const std::string& adj = rng.pick(im.words.adjs);
      return adj + "-" + rng.pick(im.words.nouns);
    }
    case NeedleType::kUuids: return random_uuid(rng);
  }
  return "";
}

std::string needle_sentence(NeedleType v, const std::string& key, const std::string& value) {
  return std::string("One of the special magic ") + needle_type_name(v) + " for " + key + " is: " + value + ".";
}

// "a", "a and b"? RULER: "a, b, and c" for several, the key alone for one.
std::string join_queries(const std::vector<std::string>& q) {
  if (q.size() == 1) return q[0];
  std::string out;
  for (size_t i = 0; i + 1 < q.size(); ++i) out += (i ? ", " : "") + q[i];
  return out + ", and " + q.back();
}

Built build_niah(const RulerGenerator::Impl& im, const RulerConfig& cfg, const NiahSpec& sp, int64_t n, Rng& rng) {
  // n-independent draws first, so every probe of the fitting has the same needles.
  const int num_k = std::max(sp.num_k, sp.num_q);
  std::vector<std::string> keys;
  std::set<std::string> used;
  while (static_cast<int>(keys.size()) < num_k) {
    std::string k = random_needle(im, sp.key, rng);
    if (used.insert(k).second) keys.push_back(k);
  }
  std::vector<std::vector<std::string>> values(static_cast<size_t>(num_k));
  std::vector<std::string> needles;
  for (int i = 0; i < num_k; ++i) {
    for (int j = 0; j < sp.num_v; ++j) {
      values[static_cast<size_t>(i)].push_back(random_needle(im, sp.value, rng));
      needles.push_back(needle_sentence(sp.value, keys[static_cast<size_t>(i)], values[static_cast<size_t>(i)].back()));
    }
  }
  rng.shuffle(needles);
  std::vector<double> depths = draw_depths(cfg, rng, static_cast<int>(needles.size()));
  std::sort(depths.begin(), depths.end());
  const std::vector<int64_t> qidx = rng.sample_indices(num_k, sp.num_q);
  std::vector<std::string> queries, answers;
  for (int64_t i : qidx) {
    queries.push_back(keys[static_cast<size_t>(i)]);
    for (const auto& v : values[static_cast<size_t>(i)]) answers.push_back(v);
  }

  std::string haystack;
  if (sp.haystack == Haystack::kEssay) {
    const int64_t nw = std::min<int64_t>(n, static_cast<int64_t>(im.essay_words.size()));
    const std::vector<std::string> words(im.essay_words.begin(), im.essay_words.begin() + nw);
    std::vector<std::string> sents = split_sentences(join(words, " "));
    // Drop the cut-off last sentence, so a needle at depth 100 stands as a sentence of its own.
    const auto ends_sentence = [](const std::string& x) {
      const size_t e = x.find_last_not_of("\"')]");
      return e != std::string::npos && (x[e] == '.' || x[e] == '!' || x[e] == '?');
    };
    if (sents.size() > 1 && !ends_sentence(sents.back())) sents.pop_back();
    const auto n_s = static_cast<int64_t>(sents.size());
    std::vector<std::string> out;
    int64_t prev = 0;
    for (size_t i = 0; i < needles.size(); ++i) {  // depths sorted: needle i at the i-th position
      const int64_t pos = std::clamp<int64_t>(static_cast<int64_t>(static_cast<double>(n_s) * depths[i] / 100.0), 0, n_s);
      for (int64_t s = prev; s < pos; ++s) out.push_back(sents[static_cast<size_t>(s)]);
      out.push_back(needles[i]);
      prev = pos;
    }
    for (int64_t s = prev; s < n_s; ++s) out.push_back(sents[static_cast<size_t>(s)]);
    haystack = join(out, " ");
  } else {
    std::vector<std::string> lines;
    if (sp.haystack == Haystack::kRepeat) {
      lines.assign(static_cast<size_t>(n), kNoise);
    } else {  // distractor needles with keys different from the real ones
      while (static_cast<int64_t>(lines.size()) < n) {
        std::string k = random_needle(im, sp.key, rng);
        if (!used.insert(k).second) continue;
        lines.push_back(needle_sentence(sp.value, k, random_needle(im, sp.value, rng)));
      }
    }
    // Insert from the deepest so that earlier positions stay valid.
    for (size_t i = needles.size(); i-- > 0;) {
      const auto pos = static_cast<int64_t>(std::lround(static_cast<double>(n) * depths[i] / 100.0));
      lines.insert(lines.begin() + std::clamp<int64_t>(pos, 0, n), needles[i]);
    }
    haystack = join(lines, "\n");
  }

  // RULER's niah template; singular wording when exactly one value is asked for.
  std::string type_v = needle_type_name(sp.value);
  std::string header = "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
                       "I will quiz you about the {type_v} afterwards.\n";
  std::string question = "What are all the special magic {type_v} for {query} mentioned in the provided text?";
  std::string prefix = " The special magic {type_v} for {query} mentioned in the provided text are";
  if (sp.num_q * sp.num_v == 1) {
    for (std::string* s : {&header, &question, &prefix}) {
      *s = replace_all(*s, "Some", "A");
      *s = replace_all(*s, "are all", "is");
      *s = replace_all(*s, "are", "is");
    }
    type_v.pop_back();
  }
  const std::string query = join_queries(queries);
  for (std::string* s : {&header, &question, &prefix}) {
    *s = replace_all(*s, "{type_v}", type_v);
    *s = replace_all(*s, "{query}", query);
  }
  Built b;
  b.context = header + haystack + "\n";
  b.q.question = question;
  b.q.answer_prefix = prefix;
  b.q.answers = answers;
  b.depths = depths;
  return b;
}

// vt: chains "VAR X = 12345", "VAR Y = VAR X " ... inserted at random lines of noise.
struct VtChain {
  std::vector<std::string> vars;
  std::vector<std::string> statements;
  std::string value;
};

VtChain make_chain(Rng& rng, int name_len, int hops, std::set<std::string>& used) {
  VtChain c;
  while (static_cast<int>(c.vars.size()) < hops + 1) {
    std::string v;
    for (int i = 0; i < name_len; ++i) v.push_back(static_cast<char>('A' + rng.below(26)));
    if (used.insert(v).second) c.vars.push_back(v);
  }
  do c.value = std::to_string(rng.range(10000, 99998));
  while (!used.insert(c.value).second);
  c.statements.push_back("VAR " + c.vars[0] + " = " + c.value);
  for (int j = 0; j < hops; ++j) c.statements.push_back("VAR " + c.vars[static_cast<size_t>(j + 1)] + " = VAR " + c.vars[static_cast<size_t>(j)] + " ");
  return c;
}

std::string vt_noise_text(const VtChain& c, int64_t n_noise, Rng& rng, std::vector<double>* depths) {
  std::vector<std::string> lines(static_cast<size_t>(n_noise), std::string(kNoise) + "\n");
  std::vector<int64_t> pos = rng.sample_indices(n_noise, static_cast<int64_t>(c.statements.size()));
  std::sort(pos.begin(), pos.end());
  for (size_t j = 0; j < pos.size(); ++j) {
    if (depths) depths->push_back(100.0 * static_cast<double>(pos[j]) / static_cast<double>(n_noise));
    lines.insert(lines.begin() + pos[j] + static_cast<int64_t>(j), c.statements[j]);
  }
  return replace_all(join(lines, " "), ". \n", ".\n");
}

constexpr const char* kVtHeader = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";

std::string vt_question(const std::string& value) {
  return "Question: Find all variables that are assigned the value " + value + " in the text above.";
}
std::string vt_prefix(int n_vars, const std::string& value) {
  // "assgined": RULER's spelling, kept so prompts match the published task.
  return " Answer: According to the chain(s) of variable assignment in the text above, " + std::to_string(n_vars) +
         " variables are assgined the value " + value + ", they are: ";
}

Built build_vt(const RulerConfig& cfg, int64_t n, Rng& rng) {
  const int hops = 4;
  std::set<std::string> used;
  const VtChain main = make_chain(rng, 5, hops, used);
  // RULER prepends one solved example (3-letter names) fitted to 500 tokens (~20 noise lines);
  // short budgets get a shorter example so the real task keeps most of the room.
  const VtChain icl = make_chain(rng, 3, hops, used);
  const int64_t icl_noise = std::clamp<int64_t>(cfg.ctx_len / 200, 3, 20);
  const std::string icl_text = vt_noise_text(icl, icl_noise, rng, nullptr);
  std::string example = std::string(kVtHeader) + icl_text + "\n" + vt_question(icl.value) +
                        vt_prefix(hops + 1, icl.value) + join(icl.vars, " ") + "\n\n";
  Built b;
  b.context = example + kVtHeader + vt_noise_text(main, n, rng, &b.depths) + "\n";
  b.q.question = vt_question(main.value);
  b.q.answer_prefix = vt_prefix(hops + 1, main.value);
  b.q.answers = main.vars;
  return b;
}

// cwe: RULER's common_words_extraction with one solved example.
constexpr int kNumCw = 10;
constexpr const char* kCweHeader =
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n";
constexpr const char* kCweQuestion = "Question: What are the 10 most common words in the above list?";
constexpr const char* kCwePrefix = " Answer: The top 10 words that appear most often in the list are:";

std::string numbered(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) out += (i ? " " : "") + std::to_string(i + 1) + ". " + words[i];
  return out;
}

std::vector<std::string> cwe_list(const std::vector<std::string>& common, const std::vector<std::string>& uncommon,
                                  int freq_cw, int freq_ucw, Rng& rng) {
  std::vector<std::string> list;
  for (int r = 0; r < freq_cw; ++r) list.insert(list.end(), common.begin(), common.end());
  for (int r = 0; r < freq_ucw; ++r) list.insert(list.end(), uncommon.begin(), uncommon.end());
  rng.shuffle(list);
  return list;
}

Built build_cwe(const RulerGenerator::Impl& im, const RulerConfig& cfg, int64_t n, Rng& rng) {
  // RULER: below 4096 tokens the example has 20 words (3 / 1 repeats) and the task repeats
  // common words 6 times, others once; from 4096 on: 40 words (10 / 3) and 30 / 3.
  const bool small = cfg.ctx_len < 4096;
  const int n_ex = small ? 20 : 40, ex_cw = small ? 3 : 10, ex_ucw = small ? 1 : 3;
  const int freq_cw = small ? 6 : 30, freq_ucw = small ? 1 : 3;
  // Partial Fisher-Yates: the first n_ex + 10 draws do not depend on n. The example's words
  // and the task's words are disjoint so that the task's answer is unambiguous.
  const std::vector<int64_t> idx = rng.sample_indices(static_cast<int64_t>(im.all_words.size()), n_ex + n);
  auto words_at = [&](int64_t b, int64_t e) {
    std::vector<std::string> w;
    for (int64_t i = b; i < e; ++i) w.push_back(im.all_words[static_cast<size_t>(idx[static_cast<size_t>(i)])]);
    return w;
  };
  const auto ex_common = words_at(0, kNumCw), ex_uncommon = words_at(kNumCw, n_ex);
  const auto common = words_at(n_ex, n_ex + kNumCw), uncommon = words_at(n_ex + kNumCw, n_ex + n);
  const auto ex_list = cwe_list(ex_common, ex_uncommon, ex_cw, ex_ucw, rng);
  const auto list = cwe_list(common, uncommon, freq_cw, freq_ucw, rng);
  Built b;
  b.context = std::string(kCweHeader) + numbered(ex_list) + "\n" + kCweQuestion + kCwePrefix + " " + numbered(ex_common) +
              "\n" + kCweHeader + numbered(list) + "\n";
  b.q.question = kCweQuestion;
  b.q.answer_prefix = kCwePrefix;
  b.q.answers = common;
  return b;
}

// fwe: coded words with Zipf counts n * k^-alpha / zeta(alpha); rank 1 is the noise "...".
Built build_fwe(const RulerConfig& cfg, int64_t n, Rng& rng) {
  const double alpha = 2.0, zeta2 = M_PI * M_PI / 6.0;
  const int64_t vocab_size = std::max<int64_t>(cfg.ctx_len / 50, 8);
  std::set<std::string> seen;
  std::vector<std::string> vocab;
  while (static_cast<int64_t>(vocab.size()) < vocab_size) {
    std::string w;
    for (int i = 0; i < 6; ++i) w.push_back(static_cast<char>('a' + rng.below(26)));
    if (seen.insert(w).second) vocab.push_back(w);
  }
  std::sort(vocab.begin(), vocab.end());
  rng.shuffle(vocab);
  vocab[0] = "...";
  std::vector<std::string> words;
  for (int64_t k = 1; k <= vocab_size; ++k) {
    const auto cnt = static_cast<int64_t>(static_cast<double>(n) * std::pow(static_cast<double>(k), -alpha) / zeta2);
    for (int64_t c = 0; c < cnt; ++c) words.push_back(vocab[static_cast<size_t>(k - 1)]);
  }
  rng.shuffle(words);
  Built b;
  b.context = "Read the following coded text and track the frequency of each coded word. Find the three most "
              "frequently appeared coded words. " + join(words, " ") + "\n";
  b.q.question = "Question: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
                 "frequently appeared words in the above coded text?";
  b.q.answer_prefix = " Answer: According to the coded text above, the three most frequently appeared words are:";
  b.q.answers = {vocab[1], vocab[2], vocab[3]};
  return b;
}

}  // namespace

const std::vector<RulerTaskInfo>& ruler_tasks() { return kTasks; }

const RulerTaskInfo& ruler_task(const std::string& name) {
  for (const auto& t : kTasks) {
    if (name == t.name) return t;
  }
  std::string names;
  for (const auto& t : kTasks) names += std::string(names.empty() ? "" : ", ") + t.name;
  fail("unknown RULER task '%s' (tasks: %s)", name.c_str(), names.c_str());
}

std::vector<std::string> parse_task_list(const std::string& spec) {
  std::vector<std::string> out;
  if (spec == "all" || spec.empty()) {
    for (const auto& t : kTasks) out.emplace_back(t.name);
    return out;
  }
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    std::string name = normalize_space(spec.substr(start, comma - start));
    if (!name.empty()) {
      ruler_task(name);  // validates
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    }
    start = comma + 1;
  }
  KVTRIM_CHECK(!out.empty(), "no task named in '%s'", spec.c_str());
  return out;
}

uint64_t sample_seed(uint64_t seed, const std::string& task, int64_t index) {
  uint64_t x = fnv1a64(task, seed * 0x9e3779b97f4a7c15ULL + 1);
  x ^= static_cast<uint64_t>(index) * 0xd1b54a32d192ed03ULL;
  return splitmix64(x);
}

std::vector<double> draw_depths(const RulerConfig& cfg, Rng& rng, int k) {
  std::vector<double> out;
  if (!cfg.depths.empty()) {
    for (int i = 0; i < k; ++i) out.push_back(cfg.depths[static_cast<size_t>(i) % cfg.depths.size()]);
    return out;
  }
  KVTRIM_ASSERT(k <= 40);
  for (int64_t i : rng.sample_indices(40, k)) out.push_back(std::round(100.0 * static_cast<double>(i) / 39.0));
  return out;
}

RulerGenerator::RulerGenerator(RulerConfig cfg, TokenCounter count) : cfg_(std::move(cfg)), impl_(std::make_unique<Impl>()) {
  KVTRIM_CHECK(cfg_.ctx_len >= 256, "context length %lld is too small for RULER tasks (at least 256 tokens)",
               static_cast<long long>(cfg_.ctx_len));
  for (double d : cfg_.depths) KVTRIM_CHECK(d >= 0 && d <= 100, "depth %g is outside [0, 100]", d);
  KVTRIM_CHECK(static_cast<bool>(count), "RulerGenerator needs a token counter");
  impl_->count = std::move(count);
  impl_->words = load_word_lists(cfg_.wordnet_dir, cfg_.scowl_dir);
  std::set<std::string> all(impl_->words.nouns.begin(), impl_->words.nouns.end());
  all.insert(impl_->words.adjs.begin(), impl_->words.adjs.end());
  all.insert(impl_->words.verbs.begin(), impl_->words.verbs.end());
  impl_->all_words.assign(all.begin(), all.end());
  KVTRIM_CHECK(!cfg_.haystack_dir.empty(), "no haystack directory given");
  std::string corpus;
  for (const auto& t : load_text_dir(cfg_.haystack_dir)) corpus += t + "\n";
  corpus = normalize_space(corpus);
  impl_->corpus_hash = fnv1a64(corpus);
  impl_->essay_words = split_words(corpus);
  impl_->essay_sents = split_sentences(corpus);
  KVTRIM_CHECK(impl_->essay_sents.size() >= 50, "haystack '%s' is too small (%zu sentences)", cfg_.haystack_dir.c_str(),
               impl_->essay_sents.size());
}

RulerGenerator::~RulerGenerator() = default;

std::string RulerGenerator::fingerprint() const {
  std::string depths;
  for (double d : cfg_.depths) depths += std::to_string(d) + ",";
  const uint64_t h = fnv1a64(strprintf("%s|ctx=%lld|seed=%llu|reserve=%lld|depths=%s|words=%llx|corpus=%llx", kGeneratorVersion,
                                       static_cast<long long>(cfg_.ctx_len), static_cast<unsigned long long>(cfg_.seed),
                                       static_cast<long long>(cfg_.reserve_tokens), depths.c_str(),
                                       static_cast<unsigned long long>(impl_->words.fingerprint),
                                       static_cast<unsigned long long>(impl_->corpus_hash)));
  return strprintf("%s:%016llx", kGeneratorVersion, static_cast<unsigned long long>(h));
}

EvalSample RulerGenerator::generate(const std::string& task, int64_t index) const {
  const RulerTaskInfo& info = ruler_task(task);
  const uint64_t seed = sample_seed(cfg_.seed, task, index);
  const Impl& im = *impl_;
  std::function<Built(int64_t, Rng&)> build;
  int64_t n_min = 1, n_max = 1 << 22;
  if (task.rfind("niah", 0) == 0) {
    const NiahSpec sp = niah_spec(task);
    build = [&, sp](int64_t n, Rng& r) { return build_niah(im, cfg_, sp, n, r); };
    if (sp.haystack == Haystack::kEssay) {
      n_min = 50;
      n_max = static_cast<int64_t>(im.essay_words.size());
    }
  } else if (task == "vt") {
    build = [&](int64_t n, Rng& r) { return build_vt(cfg_, n, r); };
    n_min = 5;
  } else if (task == "cwe") {
    build = [&](int64_t n, Rng& r) { return build_cwe(im, cfg_, n, r); };
    n_min = kNumCw + 1;
    n_max = static_cast<int64_t>(im.all_words.size()) - 40;
  } else if (task == "fwe") {
    build = [&](int64_t n, Rng& r) { return build_fwe(cfg_, n, r); };
    n_min = 100;
  } else {  // qa_1, qa_2
    const bool two_hop = task == "qa_2";
    build = [&, two_hop](int64_t n, Rng& r) { return build_qa(im, cfg_, two_hop, n, r); };
    n_min = 1;
    n_max = static_cast<int64_t>(im.essay_sents.size()) - 1;
  }

  // Largest n whose instance fits the budget (exponential, then binary search).
  Built best;
  auto fits = [&](int64_t n) {
    Rng rng(seed);
    Built b = build(n, rng);
    b.q.max_new_tokens = info.max_new_tokens;
    const int64_t t = im.count(b.context, true) + im.count(b.q.question + b.q.answer_prefix, false) +
                      cfg_.reserve_tokens + b.q.max_new_tokens;
    if (t > cfg_.ctx_len) return false;
    best = std::move(b);
    return true;
  };
  KVTRIM_CHECK(fits(n_min), "context length %lld is too small for task %s (its smallest instance needs more)",
               static_cast<long long>(cfg_.ctx_len), task.c_str());
  int64_t lo = n_min, hi = n_min;
  while (true) {
    hi = std::min(lo * 2, n_max);
    if (hi == lo) break;
    if (!fits(hi)) break;
    lo = hi;
  }
  if (hi > lo) {
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (fits(mid)) lo = mid;
      else hi = mid;
    }
  }
  // `best` is the last probe that fitted, which is n = lo.

  EvalSample s;
  s.task = task;
  s.index = index;
  s.metric = info.metric;
  s.context = std::move(best.context);
  s.questions.push_back(std::move(best.q));
  s.depths = std::move(best.depths);
  return s;
}

}  // namespace kvtrim::eval
