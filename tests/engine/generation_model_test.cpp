// kvtrim against llama.cpp on the real models (reference data: scripts/ref/make_model_refs.py,
// which runs llama.cpp through llama-cpp-python on the same GGUF files).
//  - prompt tokenization equals llama.cpp's;
//  - the next-token logits after each prompt agree (top-1 equal, top-5 logits close);
//  - greedy continuations agree for their first tokens (quantized activations in both
//    engines make long continuations free to diverge where two tokens are nearly tied);
//  - perplexity with llama.cpp's windows agrees within 1%.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/perplexity.h"
#include "engine/session.h"
#include "test_util.h"

namespace kvtrim {
namespace {

nlohmann::json load_refs() {
  std::ifstream f(test::data_dir() + "/model_refs.json");
  if (!f) return {};
  return nlohmann::json::parse(f);
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class AgainstLlamaCpp : public ::testing::TestWithParam<std::string> {};

TEST_P(AgainstLlamaCpp, TokensLogitsGreedyAndPerplexity) {
  const std::string name = GetParam();
  const auto refs = load_refs();
  ASSERT_TRUE(refs.contains(name)) << "no reference data for " << name << " in tests/data/model_refs.json";
  const auto& ref = refs[name];
  auto model = Model::load(test::require_model(name));
  const Tokenizer& tok = model->tokenizer();
  SessionParams sp;
  sp.n_ctx = 1024;
  sp.n_threads = 2;
  Session s(*model, sp);
  const int32_t n_vocab = model->hparams().n_vocab;

  for (const auto& g : ref["greedy"]) {
    const std::string prompt = g["prompt"];
    const std::vector<int32_t> want_prompt = g["prompt_tokens"];
    EXPECT_EQ(tok.encode(prompt, tok.add_bos(), false), want_prompt) << name << ": tokens of " << prompt;
    s.reset();
    const std::vector<float> logits = s.prefill(want_prompt);
    const std::vector<int32_t> top5 = g["top5_ids"];
    const std::vector<float> top5_logits = g["top5_logits"];
    EXPECT_EQ(argmax(logits.data(), n_vocab), top5[0]) << name << ": next token after " << prompt;
    for (size_t i = 0; i < top5.size(); ++i)
      EXPECT_NEAR(logits[static_cast<size_t>(top5[i])], top5_logits[i], 0.05f * std::abs(top5_logits[0]) + 0.3f)
          << name << ": logit of token " << top5[i] << " after " << prompt;
    // greedy continuation
    const std::vector<int32_t> want = g["continuation"];
    std::vector<int32_t> got;
    int32_t next = argmax(logits.data(), n_vocab);
    for (size_t i = 0; i < want.size(); ++i) {
      got.push_back(next);
      next = argmax(s.decode(next).data(), n_vocab);
    }
    size_t same = 0;
    while (same < want.size() && got[same] == want[same]) ++same;
    EXPECT_GE(same, std::min<size_t>(8, want.size()))
        << name << ": greedy continuation of '" << prompt << "' diverges from llama.cpp at token " << same
        << "\n  kvtrim:    " << tok.decode(got) << "\n  llama.cpp: " << tok.decode(want);
    RecordProperty(name + "_same_prefix", static_cast<int>(same));
  }

  // perplexity, llama.cpp windows
  const auto& p = ref["ppl"];
  std::vector<int32_t> toks = tok.encode(read_all(test::shared_data_dir() + "/" + p["file"].get<std::string>()),
                                         tok.add_bos(), false);
  toks.resize(p["max_tokens"].get<size_t>());
  const PplResult r = perplexity(s, toks, p["n_ctx"].get<int64_t>(), 0, tok.add_bos() ? tok.bos() : -1);
  EXPECT_EQ(r.n_scored, p["n_scored"].get<int64_t>());
  EXPECT_NEAR(r.ppl, p["ppl"].get<double>(), 0.01 * p["ppl"].get<double>()) << name << ": perplexity vs llama.cpp";
}

INSTANTIATE_TEST_SUITE_P(RealModels, AgainstLlamaCpp,
                         ::testing::Values("smollm2", "gemma3-270m", "qwen2.5-coder-1.5b"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace kvtrim
