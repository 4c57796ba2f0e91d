// qa_1 / qa_2: RULER's QA tasks rebuilt without SQuAD / HotpotQA (docs/eval.md, "QA").
// The context is RULER's QA layout ("Document i:\n<text>" blocks); the documents are
//  - fact documents about fictional people and companies, written from templates with
//    invented names (so the model cannot know the answer without reading the context);
//  - filler documents: consecutive 5-sentence excerpts of the haystack essays, from a random
//    start, which take the rest of the budget.
// qa_1 (single hop, SQuAD-like): 4 person profiles (1 gold + 3 distractors of the same shape);
//   the question asks one attribute of the gold person (birth city, birth year, field of
//   study, profession, book title). The gold value differs from every distractor's.
// qa_2 (two hops, HotpotQA bridge-like): 4 (person -> company) documents and the 4 matching
//   company documents; the question asks the headquarters city or the founding year of the
//   company the gold person works for, so the answer needs both gold documents.
// Gold documents are placed at the requested depths (fraction of the document list);
// distractor fact documents at random positions.
#include <algorithm>
#include <functional>
#include <set>

#include "core/error.h"
#include "eval/ruler_internal.h"
#include "eval/text.h"

namespace kvtrim::eval {

namespace {

constexpr int kFillerSentences = 5;  // sentences per filler document
constexpr int kFactDocs = 4;         // gold + 3 distractor entities

const std::vector<std::string> kOnsets = {"b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m",
                                          "n", "p", "r", "s", "st", "t", "tr", "v", "w", "z", "th", "sh"};
const std::vector<std::string> kVowels = {"a", "e", "i", "o", "u", "ai", "ea", "ou", "ia"};
const std::vector<std::string> kCodas = {"", "", "n", "r", "l", "s", "th", "nd", "rk", "m", "x"};
const std::vector<std::string> kCitySuffix = {"ford", "haven", "mere", "wick", "stead", "ton", "port", "vale"};
const std::vector<std::string> kCompanyKind = {"Industries", "Labs", "Works", "Systems", "Trading", "Foods", "Instruments",
                                               "Textiles"};
const std::vector<std::string> kFields = {"chemistry", "architecture", "linguistics", "geology", "music theory",
                                          "economics", "astronomy", "botany", "mathematics", "philosophy", "medicine",
                                          "history"};
const std::vector<std::string> kProfessions = {"cartographer", "pharmacist", "civil engineer", "violin maker",
                                               "journalist", "pilot", "archivist", "veterinarian", "glassblower",
                                               "translator", "beekeeper", "librarian"};
const std::vector<std::string> kIndustries = {"shipping", "software", "furniture", "pharmaceutical", "textile",
                                              "food processing", "mining", "optics", "printing", "toy"};
const std::vector<std::string> kHobbies = {"sailing on the lake", "restoring old clocks", "painting landscapes",
                                           "hiking in the hills", "growing tomatoes", "playing chess"};

std::string cap(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

std::string syllables(Rng& rng, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += rng.pick(kOnsets) + rng.pick(kVowels) + (i + 1 == n ? rng.pick(kCodas) : "");
  return cap(s);
}

// Unique invented names within one sample.
struct Namer {
  Rng& rng;
  std::set<std::string> used;
  std::string unique(const std::function<std::string()>& make) {
    while (true) {
      std::string s = make();
      if (used.insert(s).second) return s;
    }
  }
  std::string person() {
    return unique([&] { return syllables(rng, 2) + " " + syllables(rng, 2 + static_cast<int>(rng.below(2))); });
  }
  std::string city() { return unique([&] { return syllables(rng, 2) + rng.pick(kCitySuffix); }); }
};

struct Person {
  std::string name, first, birth_city, field, profession, title, home_city, hobby, company;
  int birth_year = 0, book_year = 0, join_year = 0;
};

struct Company {
  std::string name, industry, hq_city;
  int founded = 0, employees = 0;
};

std::string profile_doc(const Person& p) {
  return p.name + " was born in " + p.birth_city + " in " + std::to_string(p.birth_year) + ". " + p.first + " studied " +
         p.field + " at the university before working as a " + p.profession + " for many years. In " +
         std::to_string(p.book_year) + ", " + p.first + " published a book titled \"" + p.title +
         "\", which is still read today. " + p.first + " now lives in " + p.home_city + " and spends weekends " + p.hobby +
         ".";
}

std::string employee_doc(const Person& p) {
  return p.name + " joined " + p.company + " as a " + p.profession + " in " + std::to_string(p.join_year) +
         ". Colleagues describe " + p.first + " as careful and patient, and " + p.first +
         " has trained many of the newer staff. Outside work, " + p.first + " enjoys " + p.hobby + ".";
}

std::string company_doc(const Company& c) {
  return c.name + " is a " + c.industry + " company founded in " + std::to_string(c.founded) +
         ". Its headquarters are in the city of " + c.hq_city + ", where it employs about " +
         std::to_string(c.employees) + " people. The company has grown steadily and now sells its products in many "
         "countries.";
}

}  // namespace

Built build_qa(const RulerGenerator::Impl& im, const RulerConfig& cfg, bool two_hop, int64_t n, Rng& rng) {
  // Fact documents and the question: drawn before anything that depends on n.
  Namer nm{rng, {}};
  std::vector<std::string> fact_docs;  // [0] (and [1] for qa_2) are gold
  std::string question;
  std::vector<std::string> answers;
  const auto title = [&] { return "The " + cap(rng.pick(im.words.adjs)) + " " + cap(rng.pick(im.words.nouns)); };
  if (!two_hop) {
    std::vector<Person> ps(kFactDocs);
    for (Person& p : ps) {
      p.name = nm.person();
      p.first = p.name.substr(0, p.name.find(' '));
      p.birth_city = nm.city();
      p.home_city = nm.city();
      p.birth_year = static_cast<int>(rng.range(1931, 1999));
      p.book_year = p.birth_year + static_cast<int>(rng.range(25, 45));
      p.field = rng.pick(kFields);
      p.profession = rng.pick(kProfessions);
      p.title = nm.unique(title);
      p.hobby = rng.pick(kHobbies);
    }
    const int attr = static_cast<int>(rng.below(5));
    const auto value = [&](const Person& p) -> std::string {
      switch (attr) {
        case 0: return p.birth_city;
        case 1: return std::to_string(p.birth_year);
        case 2: return p.field;
        case 3: return p.profession;
        default: return p.title;
      }
    };
    // Distractors must not share the asked value (cities and titles are unique already).
    for (size_t i = 1; i < ps.size(); ++i) {
      while (value(ps[i]) == value(ps[0])) {
        ps[i].birth_year = static_cast<int>(rng.range(1931, 1999));
        ps[i].field = rng.pick(kFields);
        ps[i].profession = rng.pick(kProfessions);
      }
    }
    const std::string& who = ps[0].name;
    switch (attr) {
      case 0: question = "In which city was " + who + " born?"; break;
      case 1: question = "In what year was " + who + " born?"; break;
      case 2: question = "What did " + who + " study at the university?"; break;
      case 3: question = "What was the profession of " + who + " for many years?"; break;
      default: question = "What is the title of the book that " + who + " published?"; break;
    }
    answers = {value(ps[0])};
    for (const Person& p : ps) fact_docs.push_back(profile_doc(p));
  } else {
    std::vector<Person> ps(kFactDocs);
    std::vector<Company> cs(kFactDocs);
    std::set<int> years;
    for (int i = 0; i < kFactDocs; ++i) {
      Company& c = cs[static_cast<size_t>(i)];
      c.name = nm.unique([&] { return cap(rng.pick(im.words.adjs)) + " " + cap(rng.pick(im.words.nouns)) + " " +
                                      rng.pick(kCompanyKind); });
      c.industry = rng.pick(kIndustries);
      c.hq_city = nm.city();
      do c.founded = static_cast<int>(rng.range(1850, 2005));
      while (!years.insert(c.founded).second);
      c.employees = static_cast<int>(rng.range(2, 90)) * 50;
      Person& p = ps[static_cast<size_t>(i)];
      p.name = nm.person();
      p.first = p.name.substr(0, p.name.find(' '));
      p.company = c.name;
      p.profession = rng.pick(kProfessions);
      p.join_year = std::max(c.founded + 1, static_cast<int>(rng.range(1990, 2022)));
      p.hobby = rng.pick(kHobbies);
    }
    const bool ask_city = rng.below(2) == 0;
    question = ask_city ? "In which city are the headquarters of the company that " + ps[0].name + " works for?"
                        : "In what year was the company that " + ps[0].name + " works for founded?";
    answers = {ask_city ? cs[0].hq_city : std::to_string(cs[0].founded)};
    fact_docs.push_back(employee_doc(ps[0]));
    fact_docs.push_back(company_doc(cs[0]));
    for (int i = 1; i < kFactDocs; ++i) {
      fact_docs.push_back(employee_doc(ps[static_cast<size_t>(i)]));
      fact_docs.push_back(company_doc(cs[static_cast<size_t>(i)]));
    }
  }
  const int n_gold = two_hop ? 2 : 1;
  std::vector<double> depths = draw_depths(cfg, rng, n_gold);
  const double start_frac = static_cast<double>(rng.below(1u << 30)) / static_cast<double>(1u << 30);

  // Filler documents from n consecutive essay sentences.
  const auto total = static_cast<int64_t>(im.essay_sents.size());
  n = std::min(n, total);
  const auto start = static_cast<int64_t>(start_frac * static_cast<double>(total - n));
  std::vector<std::string> docs;
  for (int64_t s = 0; s < n; s += kFillerSentences) {
    std::vector<std::string> part;
    for (int64_t j = s; j < std::min(n, s + kFillerSentences); ++j) part.push_back(im.essay_sents[static_cast<size_t>(start + j)]);
    docs.push_back(join(part, " "));
  }
  // Distractor fact documents at random positions, then gold documents at their depths.
  for (size_t i = static_cast<size_t>(n_gold); i < fact_docs.size(); ++i) {
    docs.insert(docs.begin() + static_cast<int64_t>(rng.below(docs.size() + 1)), fact_docs[i]);
  }
  std::vector<std::pair<double, int>> gold;
  for (int g = 0; g < n_gold; ++g) gold.emplace_back(depths[static_cast<size_t>(g)], g);
  std::sort(gold.begin(), gold.end());
  for (size_t g = gold.size(); g-- > 0;) {  // deepest first keeps earlier positions valid
    const auto pos = static_cast<int64_t>(static_cast<double>(docs.size()) * gold[g].first / 100.0 + 0.5);
    docs.insert(docs.begin() + std::clamp<int64_t>(pos, 0, static_cast<int64_t>(docs.size())),
                fact_docs[static_cast<size_t>(gold[g].second)]);
  }
  std::string body;
  for (size_t i = 0; i < docs.size(); ++i) body += (i ? "\n\n" : "") + ("Document " + std::to_string(i + 1) + ":\n" + docs[i]);

  const std::string instr =
      "Answer the question based on the given documents. Only give me the answer and do not output any other words.";
  Built b;
  b.context = instr + "\n\nThe following are given documents.\n\n" + body + "\n\n";
  b.q.question = instr + "\n\nQuestion: " + question;
  b.q.answer_prefix = " Answer:";
  b.q.answers = answers;
  b.depths = depths;
  return b;
}

}  // namespace kvtrim::eval
