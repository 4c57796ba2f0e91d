// Every architecture against two independent references, without real weights: tiny random-weight
// checkpoints built from each architecture's transformers config class, converted to GGUF by
// llama.cpp's own converter and quantized by llama.cpp (scripts/ref/make_arch_refs.py; the files
// and both references' logits are in tests/data/arch, docs/results/models/README.md). kvtrim runs
// the same 300 token ids through each committed file and is held to:
//  - llama.cpp on the same file: the logits at the recorded positions and the argmax at every
//    position (both quantize activations the same way for the integer products);
//  - transformers (f32 checkpoint) on the f16 files.
// Positions past a file's context_length (qwen2-yarn and phi3-longrope: 256) are not run: kvtrim
// refuses them, while both references run on. Each comparison prints its figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace kvtrim {
namespace {

const std::string kDir = std::string(KVTRIM_TEST_DATA_DIR) + "/arch/";

// Tolerances on max |Δlogit| over the recorded positions (logits of these models span ~±15).
// vs transformers on f16 files: the f16 weights themselves move logits by up to ~0.017 (llama.cpp
// f16 vs transformers f32, measured by the script), and kvtrim keeps its KV cache in f16 like
// llama.cpp; 0.05 is 3x the largest reference-to-reference gap.
constexpr double kTolHfF16 = 0.05;
// vs llama.cpp on the same file: f16 weights 0.03; quantized weights: both engines quantize the
// activations to 8 bits per block for the integer products, but not at the same points (kvtrim's
// attention and norms stay f32; llama.cpp rounds some intermediates to f16), so a logit moves by a
// few hundredths; random weights amplify it (the same files move 0.2-3.8 between transformers and
// llama.cpp). Tolerance 0.25 for q8_0 / q4_k_m, a tenth of that reference gap.
constexpr double kTolLlamaF16 = 0.03;
constexpr double kTolLlamaQuant = 0.25;

struct Result {
  std::vector<std::vector<float>> at;  // logits at the recorded positions (those run)
  std::vector<int> argmax;             // at every position run
  std::vector<int> greedy;             // n_greedy tokens after the first n_prompt ids
};

Result run_kvtrim(const std::string& path, const nlohmann::json& ref) {
  auto m = Model::load(path);
  const HParams& hp = m->hparams();
  std::vector<int32_t> toks = ref["tokens"].get<std::vector<int32_t>>();
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(toks.size()), hp.n_ctx_train);
  const int n_vocab = hp.n_vocab;
  EXPECT_EQ(n_vocab, ref["vocab_size"].get<int>());
  ThreadPool pool(2);
  KvCacheConfig cc = m->cache_config(hp.n_ctx_train);
  auto cache = make_dense_cache(cc);
  std::vector<float> logits(static_cast<size_t>(n) * n_vocab);
  m->forward(toks.data(), n, 0, *cache, logits.data(), true, &pool);
  Result r;
  for (int p : ref["positions"].get<std::vector<int>>())
    if (p < n) r.at.emplace_back(logits.begin() + static_cast<int64_t>(p) * n_vocab, logits.begin() + (p + 1) * n_vocab);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data() + i * n_vocab;
    r.argmax.push_back(static_cast<int>(std::max_element(row, row + n_vocab) - row));
  }
  // greedy from the first n_prompt ids: prefill, then one decode step per token
  const int n_prompt = ref["n_prompt"].get<int>(), n_greedy = ref["n_greedy"].get<int>();
  auto c2 = make_dense_cache(cc);
  std::vector<float> last(static_cast<size_t>(n_vocab));
  m->forward(toks.data(), n_prompt, 0, *c2, last.data(), false, &pool);
  for (int i = 0; i < n_greedy; ++i) {
    const int32_t t = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    r.greedy.push_back(t);
    if (i + 1 < n_greedy) m->forward(&t, 1, n_prompt + i, *c2, last.data(), false, &pool);
  }
  return r;
}

struct Cmp {
  double max_dlogit = 0;
  int top1 = 0, n_top1 = 0;
  int greedy_prefix = 0;
  int far_flips = 0;  // recorded positions where kvtrim's top token is > kTolLlamaQuant below the reference's
};

Cmp compare(const Result& got, const nlohmann::json& logits, const nlohmann::json& argmax, const nlohmann::json& greedy) {
  Cmp c;
  for (size_t i = 0; i < got.at.size(); ++i) {
    const auto& want = logits[i];
    for (size_t v = 0; v < got.at[i].size(); ++v)
      c.max_dlogit = std::max(c.max_dlogit, std::fabs(static_cast<double>(got.at[i][v]) - want[v].get<double>()));
  }
  for (size_t i = 0; i < got.at.size(); ++i) {  // a flip where the reference's margin exceeds 0.25
    const auto& want = logits[i];
    const int mine = static_cast<int>(std::max_element(got.at[i].begin(), got.at[i].end()) - got.at[i].begin());
    double best = -1e30;
    for (const auto& v : want) best = std::max(best, v.get<double>());
    c.far_flips += best - want[static_cast<size_t>(mine)].get<double>() > kTolLlamaQuant;
  }
  for (size_t i = 0; i < got.argmax.size(); ++i) {
    c.top1 += got.argmax[i] == argmax[i].get<int>();
    ++c.n_top1;
  }
  while (c.greedy_prefix < static_cast<int>(got.greedy.size()) && got.greedy[static_cast<size_t>(c.greedy_prefix)] == greedy[static_cast<size_t>(c.greedy_prefix)].get<int>())
    ++c.greedy_prefix;
  return c;
}

class ArchRefs : public ::testing::TestWithParam<const char*> {};

TEST_P(ArchRefs, MatchesLlamaCppAndTransformers) {
  const std::string name = GetParam();
  std::ifstream in(kDir + name + ".json");
  ASSERT_TRUE(in) << "missing " << kDir << name << ".json";
  const nlohmann::json ref = nlohmann::json::parse(in);
  int files = 0;
  for (const auto& [type, f] : ref["files"].items()) {
    if (!f["committed"].get<bool>()) continue;
    ++files;
    const std::string file = f["file"].get<std::string>();
    const Result got = run_kvtrim(kDir + file, ref);
    const Cmp ll = compare(got, f["llamacpp"]["logits"], f["llamacpp"]["argmax"], f["llamacpp"]["greedy"]);
    const bool f16 = type == "f16" || type == "f32";
    std::printf("%-26s vs llama.cpp: max|dlogit| %.4f, top-1 %d/%d, greedy prefix %d/%zu\n", file.c_str(), ll.max_dlogit,
                ll.top1, ll.n_top1, ll.greedy_prefix, got.greedy.size());
    EXPECT_LT(ll.max_dlogit, f16 ? kTolLlamaF16 : kTolLlamaQuant) << file;
    // top-1 may flip where the two best logits are closer than the tolerance: at the recorded
    // positions every flip must be such a near-tie; over all positions, f16 files agree on 98 %,
    // quantized ones on 90 % (transformers and llama.cpp agree on 83-92 % of the same positions
    // of the q8_0 files, 41-61 % of the q4_k_m ones: these random models have many near-ties).
    EXPECT_EQ(ll.far_flips, 0) << file;
    EXPECT_GE(ll.top1, ll.n_top1 * (f16 ? 98 : 90) / 100) << file;
    if (f16) {
      const Cmp hf = compare(got, ref["transformers"]["logits"], ref["transformers"]["argmax"], ref["transformers"]["greedy"]);
      std::printf("%-26s vs transformers: max|dlogit| %.4f, top-1 %d/%d, greedy prefix %d/%zu\n", file.c_str(),
                  hf.max_dlogit, hf.top1, hf.n_top1, hf.greedy_prefix, got.greedy.size());
      EXPECT_LT(hf.max_dlogit, kTolHfF16) << file;
      EXPECT_GE(hf.top1, hf.n_top1 * 98 / 100) << file;
      EXPECT_EQ(hf.far_flips, 0) << file;
    }
  }
  EXPECT_GT(files, 0);
}

INSTANTIATE_TEST_SUITE_P(Tiny, ArchRefs,
                         ::testing::Values("llama3", "mistral", "qwen2-yarn", "qwen3", "qwen3moe", "gemma2", "phi3",
                                           "phi3-longrope"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace kvtrim
