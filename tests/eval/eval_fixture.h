// Shared setup of the eval tests: a tiny random model (its byte-level tokenizer counts the
// tokens) and a RULER generator over the shared haystack and the installed word lists.
#pragma once
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/session.h"
#include "eval/ruler.h"
#include "eval/runner.h"
#include "eval/sweep.h"
#include "model/model.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim::eval::test_support {

inline const Model& tiny_model() {
  static std::unique_ptr<Model> m = [] {
    auto spec = kvtrim::test::tiny_spec(Arch::kLlama, 7);
    spec.n_ctx_train = 4096;
    return Model::load(kvtrim::test::write_tiny_model(spec, kvtrim::test::temp_dir("eval_tiny")));
  }();
  return *m;
}

// A session on the tiny model: a context of n_ctx tokens, two threads.
inline SessionParams tiny_session_params(int64_t n_ctx = 4096) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_threads = 2;
  return p;
}

inline const PromptBuilder& tiny_prompts() {
  static PromptBuilder pb(tiny_model(), PromptFormat::kBase);
  return pb;
}

inline std::string haystack_dir() { return kvtrim::test::shared_data_dir() + "/haystack/paul_graham"; }

inline RulerConfig ruler_config(int64_t ctx_len = 4096, uint64_t seed = 42) {
  RulerConfig c;
  c.ctx_len = ctx_len;
  c.seed = seed;
  c.haystack_dir = haystack_dir();
  return c;
}

inline TokenCounter tiny_counter() {
  return [](const std::string& t, bool is_ctx) { return tiny_prompts().count(t, is_ctx); };
}

// About 4 bytes per token, like a real BPE on English: fast, and lets the structure tests use
// realistic budgets (the tiny tokenizer spends one token per byte).
inline TokenCounter approx_counter() {
  return [](const std::string& t, bool is_ctx) { return static_cast<int64_t>(t.size() + 3) / 4 + (is_ctx ? 1 : 0); };
}

// The configs of a sweep's cells (what a results file is opened with).
inline std::set<std::string> configs_of(const std::vector<SweepCell>& c) {
  std::set<std::string> out;
  for (const auto& x : c) out.insert(x.config);
  return out;
}

// <temp dir of tag>/name, removed if it exists.
inline std::string fresh_path(const std::string& tag, const std::string& name) {
  const std::string p = kvtrim::test::temp_dir(tag) + "/" + name;
  std::filesystem::remove(p);
  return p;
}

}  // namespace kvtrim::eval::test_support
