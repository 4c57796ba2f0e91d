// The BPE pre-tokenizers against Python's `regex` module: tests/data/pretok_refs.json holds,
// for every family kvtrim implements, the Hugging Face pre_tokenizer patterns and the pieces
// they cut a multilingual text set into (English, German, French, Chinese, Japanese, Korean,
// Arabic, Hindi, Russian, code, numbers, contractions, emoji with ZWJ sequences, whitespace
// runs, newlines). Regenerate with scripts/ref/make_pretok_refs.py.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "model/tokenizer_pretok.h"

namespace kvtrim {
namespace {

using nlohmann::json;

const json& refs() {
  static const json j = [] {
    std::ifstream f(test::data_dir() + "/pretok_refs.json");
    EXPECT_TRUE(f.good()) << "cannot open pretok_refs.json";
    return json::parse(f);
  }();
  return j;
}

std::vector<std::string> pieces(const std::string& text, tok::PreSplit mode) {
  std::string norm;
  std::vector<size_t> ends;
  tok::pre_tokenize(text, mode, &norm, &ends);
  EXPECT_EQ(norm, text);
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e : ends) {
    EXPECT_GT(e, b) << "empty piece";
    out.push_back(norm.substr(b, e - b));
    b = e;
  }
  EXPECT_EQ(b, norm.size()) << "pieces do not cover the text";
  return out;
}

std::string show(const std::vector<std::string>& v, size_t from, size_t n) {
  std::string s;
  for (size_t i = from; i < v.size() && i < from + n; ++i) s += "[" + v[i] + "]";
  return s;
}

TEST(PreTokenizerRefs, EveryFamilyMatchesPythonRegexOnEveryText) {
  const json& texts = refs().at("texts");
  ASSERT_GE(texts.size(), 20u);
  size_t n_families = 0;
  for (const json& fam : refs().at("families")) {
    const std::string name = fam.at("name");
    tok::PreTokenizer pre;
    ASSERT_TRUE(tok::pre_tokenizer_by_name(name, &pre)) << name;
    const json& splits = fam.at("splits");
    ASSERT_EQ(splits.size(), texts.size()) << name;
    int n_match = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].at("text");
      const auto want = splits[i].get<std::vector<std::string>>();
      const auto got = pieces(text, pre.split);
      if (got == want) {
        ++n_match;
        continue;
      }
      size_t k = 0;
      while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
      const size_t from = k >= 2 ? k - 2 : 0;
      ADD_FAILURE() << name << " / " << texts[i].at("name").get<std::string>() << ": piece " << k
                    << " differs\n  kvtrim: " << show(got, from, 6)
                    << "\n  regex:  " << show(want, from, 6);
    }
    EXPECT_EQ(n_match, static_cast<int>(texts.size())) << name;
    ++n_families;
  }
  EXPECT_GE(n_families, 13u);
}

TEST(PreTokenizerRefs, NamesAndFlagsFollowLlamaCpp) {
  tok::PreTokenizer pre;
  EXPECT_FALSE(tok::pre_tokenizer_by_name("klingon", &pre));
  EXPECT_FALSE(tok::pre_tokenizer_by_name("", &pre));  // no silent default
  ASSERT_TRUE(tok::pre_tokenizer_by_name("tekken", &pre));
  EXPECT_TRUE(pre.ignore_merges && pre.add_bos);
  ASSERT_TRUE(tok::pre_tokenizer_by_name("llama-bpe", &pre));
  EXPECT_TRUE(pre.ignore_merges && pre.add_bos);
  ASSERT_TRUE(tok::pre_tokenizer_by_name("dbrx", &pre));  // the llama3 regex with merges
  EXPECT_EQ(pre.split, tok::PreSplit::Llama3);
  EXPECT_FALSE(pre.ignore_merges);
  ASSERT_TRUE(tok::pre_tokenizer_by_name("command-r", &pre));
  EXPECT_EQ(pre.split, tok::PreSplit::Smollm);
  ASSERT_TRUE(tok::pre_tokenizer_by_name("llama4", &pre));
  EXPECT_EQ(pre.split, tok::PreSplit::Gpt4o);
  // Every name is listed once in the error message's list.
  std::set<std::string> seen;
  const std::string names = tok::pre_tokenizer_names();
  for (size_t b = 0; b <= names.size();) {
    size_t e = names.find(", ", b);
    if (e == std::string::npos) e = names.size();
    const std::string n = names.substr(b, e - b);
    EXPECT_TRUE(seen.insert(n).second) << "duplicate " << n;
    EXPECT_TRUE(tok::pre_tokenizer_by_name(n, &pre)) << n;
    b = e + 2;
  }
  EXPECT_GE(seen.size(), 40u);
}

// Long runs must stay linear (a regex engine backtracking per position would not).
TEST(PreTokenizerRefs, LongRunsAreNotQuadratic) {
  const std::string spaces(200000, ' ');
  const std::string upper(200000, 'A');
  for (auto mode : {tok::PreSplit::Tekken, tok::PreSplit::Gpt4o, tok::PreSplit::DeepseekLlm,
                    tok::PreSplit::Deepseek3, tok::PreSplit::Falcon, tok::PreSplit::Qwen35}) {
    const auto a = pieces(spaces + "\xe4\xbd\xa0x", mode);  // spaces then a CJK character
    EXPECT_LE(a.size(), 4u);
    const auto b = pieces(upper + "b", mode);
    EXPECT_LE(b.size(), 4u);
  }
}

}  // namespace
}  // namespace kvtrim
