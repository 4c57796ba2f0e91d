// Issue 39's case on a real model: SmolLM2's GGUF with a `rope_freqs.weight` (Llama 3's
// per-frequency RoPE divisors; here 1 on the first half of the frequencies and 8 on the second)
// used to load and run with the divisors silently ignored. The file is written here with kvtrim's
// own GGUF writer (every key and tensor of the installed file, byte for byte, plus the divisors);
// llama.cpp's logits and greedy tokens on the same file (scripts/ref/make_rope_freqs_refs.py,
// tests/data/rope_freqs_refs.json) are the reference, with the tolerances of
// tests/engine/generation_model_test.cpp (the same engine against the same llama.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/session.h"
#include "model/gguf_writer.h"
#include "test_util.h"

namespace kvtrim {
namespace {

std::string write_with_rope_freqs(const std::string& src, const std::vector<float>& factors) {
  auto f = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [k, v] : f->metadata())
    if (k != "general.alignment") w.set_value(k, v);
  for (const GgufTensor& t : f->tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  w.add_tensor("rope_freqs.weight", GgmlType::F32, {static_cast<int64_t>(factors.size())}, factors.data(),
               factors.size() * sizeof(float));
  const std::string out = test::temp_dir("rope_freqs_model") + "/smollm2_rope_freqs.gguf";
  w.write(out, static_cast<uint32_t>(f->alignment()));
  return out;
}

int argmax(const std::vector<float>& x) {
  return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
}

TEST(RopeFreqsModel, SmolLM2WithLlama3FactorsMatchesLlamaCpp) {
  std::ifstream in(test::data_dir() + "/rope_freqs_refs.json");
  ASSERT_TRUE(in) << "missing tests/data/rope_freqs_refs.json";
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::vector<float> factors = ref["rope_freqs"].get<std::vector<float>>();
  // the reference itself shows the divisors matter: llama.cpp continues some prompt differently
  bool ref_differs = false;
  for (size_t i = 0; i < ref["plain"].size(); ++i)
    ref_differs |= ref["plain"][i]["continuation"] != ref["rope_freqs_run"][i]["continuation"];
  ASSERT_TRUE(ref_differs) << "the reference's rope_freqs run equals the plain run: the check would prove nothing";

  auto model = Model::load(write_with_rope_freqs(test::require_model("smollm2"), factors));
  ASSERT_TRUE(model->hparams().rope_freq_factors);
  EXPECT_EQ(*model->hparams().rope_freq_factors, factors);
  SessionParams sp;
  sp.n_ctx = 512;
  sp.n_threads = 2;
  Session s(*model, sp);
  const int32_t n_vocab = model->hparams().n_vocab;
  int steps = 0, exact = 0, past_tie = 0;
  for (const auto& g : ref["rope_freqs_run"]) {
    const std::vector<int32_t> prompt = g["prompt_tokens"];
    s.reset();
    std::vector<float> cur = s.prefill(prompt);
    ASSERT_EQ(static_cast<int32_t>(cur.size()), n_vocab);
    const std::vector<int32_t> top5 = g["top5_ids"];
    const std::vector<float> top5_logits = g["top5_logits"];
    for (size_t i = 0; i < top5.size(); ++i)
      EXPECT_NEAR(cur[static_cast<size_t>(top5[i])], top5_logits[i], 0.05f * std::abs(top5_logits[0]) + 0.3f)
          << "logit of token " << top5[i] << " after " << g["prompt"];
    // teacher-forced greedy: our argmax is llama.cpp's token, or within a near tie of it
    constexpr float kTie = 0.3f;
    const std::vector<int32_t> want = g["continuation"];
    for (size_t i = 0; i < want.size(); ++i) {
      const int32_t ours = argmax(cur);
      ++steps;
      if (ours == want[i]) {
        ++exact;
      } else if (cur[static_cast<size_t>(ours)] - cur[static_cast<size_t>(want[i])] >= kTie) {
        ++past_tie;
      }
      if (i + 1 < want.size()) cur = s.decode(want[i]);
    }
  }
  std::printf("smollm2 + rope_freqs: %d of %d teacher-forced greedy steps equal llama.cpp's choice, %d past a tie\n", exact,
              steps, past_tie);
  EXPECT_LE(past_tie, steps / 50);
  EXPECT_GE(exact, steps * 9 / 10);
}

}  // namespace
}  // namespace kvtrim
