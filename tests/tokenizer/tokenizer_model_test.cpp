// Tokenizers of the real models against llama.cpp: tests/data/tokenizer_refs.json holds, for
// ~40 texts per model, the ids llama.cpp (llama-cpp-python, vocab_only) produces with
// special=false and special=true, and the chat templates rendered by the GGUF's Jinja
// template (or llama.cpp's built-in "gemma" one). Regenerate with
// scripts/ref/make_tokenizer_refs.py.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../common/test_util.h"
#include "model/gguf.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace kvtrim {
namespace {

using nlohmann::json;

const json& refs() {
  static const json j = [] {
    std::ifstream f(test::data_dir() + "/tokenizer_refs.json");
    EXPECT_TRUE(f.good()) << "cannot open tokenizer_refs.json";
    return json::parse(f);
  }();
  return j;
}

struct Loaded {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

const Loaded& load(const std::string& name) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    Loaded l;
    l.file = GgufFile::open(test::require_model(name));
    l.tok = Tokenizer::from_gguf(*l.file);
    it = cache.emplace(name, std::move(l)).first;
  }
  return it->second;
}

std::string show(const std::vector<int32_t>& ids) {
  std::ostringstream o;
  for (size_t i = 0; i < ids.size(); ++i) o << (i ? "," : "") << ids[i];
  return o.str();
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

class TokenizerModel : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerModel, MatchesLlamaCppOnEveryText) {
  const std::string name = GetParam();
  const Loaded& m = load(name);
  const json& model = refs().at("models").at(name);
  EXPECT_EQ(m.tok->n_vocab(), model.at("n_vocab").get<int32_t>());
  EXPECT_EQ(m.tok->bos(), model.at("bos").get<int32_t>());
  EXPECT_EQ(m.tok->eos(), model.at("eos").get<int32_t>());
  int n_cases = 0, n_match = 0;
  for (const json& c : model.at("cases")) {
    const std::string case_name = c.at("name");
    // Cases with text_hex hold bytes that are not valid UTF-8.
    const bool hex = c.contains("text_hex");
    const std::string text = hex ? from_hex(c.at("text_hex")) : c.at("text").get<std::string>();
    for (bool special : {false, true}) {
      const std::string key = special ? "special" : "plain";
      const auto want = c.at(key).get<std::vector<int32_t>>();
      const auto got = m.tok->encode(text, /*add_bos=*/false, special);
      ++n_cases;
      n_match += got == want;
      EXPECT_EQ(show(got), show(want)) << name << " case '" << case_name << "' special=" << special;
      // Our pieces equal llama.cpp's, and decode(encode(x)) == x for valid UTF-8.
      const std::string detok =
          hex ? from_hex(c.at(key + "_detok_hex")) : c.at(key + "_detok").get<std::string>();
      EXPECT_EQ(m.tok->decode(got), detok) << name << " case '" << case_name << "'";
      if (!hex) {
        EXPECT_EQ(m.tok->decode(got), text) << name << " case '" << case_name << "'";
      }
    }
  }
  std::printf("[ %s ] %d/%d tokenizations identical to llama.cpp\n", name.c_str(), n_match,
              n_cases);
}

TEST_P(TokenizerModel, ChatTemplateMatchesReference) {
  const std::string name = GetParam();
  const Loaded& m = load(name);
  for (const json& c : refs().at("models").at(name).at("chats")) {
    std::vector<ChatMessage> msgs;
    for (const json& x : c.at("messages")) msgs.push_back({x.at("role"), x.at("content")});
    const bool agp = c.at("add_generation_prompt");
    EXPECT_EQ(apply_chat_template(*m.file, msgs, agp), c.at("rendered").get<std::string>())
        << name << " chat '" << c.at("name").get<std::string>()
        << "' add_generation_prompt=" << agp;
  }
}

TEST_P(TokenizerModel, BosAndEndOfGeneration) {
  const std::string name = GetParam();
  const Tokenizer& t = *load(name).tok;
  EXPECT_TRUE(t.is_eog(t.eos()));
  for (const char* s : {"<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>"}) {
    const int32_t id = t.token_id(s);
    if (id >= 0) {
      EXPECT_TRUE(t.is_eog(id)) << name << " " << s;
    }
  }
  EXPECT_FALSE(t.is_eog(t.token_id("<|im_start|>") >= 0 ? t.token_id("<|im_start|>")
                                                        : t.token_id("<start_of_turn>")));
  const auto with_bos = t.encode("Hi", /*add_bos=*/true, false);
  const auto without = t.encode("Hi", /*add_bos=*/false, false);
  if (t.add_bos()) {
    ASSERT_EQ(with_bos.size(), without.size() + 1);
    EXPECT_EQ(with_bos[0], t.bos());
  } else {
    EXPECT_EQ(with_bos, without);
  }
  EXPECT_EQ(t.token_to_piece(t.eos()), name == "gemma3-270m" ? "<eos>" : "<|im_end|>");
}

// Encoding 100k words of WikiText must take well under a second.
TEST_P(TokenizerModel, EncodesHundredThousandWordsFast) {
  const std::string name = GetParam();
  const Tokenizer& t = *load(name).tok;
  std::ifstream f(test::shared_data_dir() + "/wikitext-2/test.txt");
  ASSERT_TRUE(f.good());
  std::string text, word;
  size_t n_words = 0;
  std::ostringstream all;
  all << f.rdbuf();
  const std::string src = all.str();
  while (n_words < 100000) {  // repeat the file if needed
    std::istringstream in(src);
    while (n_words < 100000 && in >> word) {
      text += word;
      text += ' ';
      ++n_words;
    }
  }
  // CPU time (std::clock), not wall time: other jobs on a busy machine do not count against it
  const std::clock_t c0 = std::clock();
  const auto ids = t.encode(text, false, false);
  const double s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  std::printf("[ %s ] %zu words, %zu bytes -> %zu tokens in %.3f s of CPU time\n", name.c_str(), n_words,
              text.size(), ids.size(), s);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_LT(s, 2.0);  // typically ~0.1-0.3 s in Release
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerModel,
                         ::testing::Values("smollm2", "qwen2.5-coder-1.5b", "gemma3-270m"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace kvtrim
