// A session: one model, one KV cache, one thread pool; chunked prefill, decode steps and
// generation with sampling and stop tokens. The context limit (n_ctx) is enforced before
// any work is done, with an Error that names the numbers.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace kvtrim {

struct SessionParams {
  int64_t n_ctx = 0;     // context limit in tokens; 0 = the model's training context
  int n_threads = 0;     // 0 = all hardware threads
  int n_batch = 256;     // prefill chunk size (tokens per forward call)
  KvDtype kv_dtype = KvDtype::kF16;
};

struct GenerateParams {
  int max_new_tokens = 128;
  SamplerParams sampling;
  bool stop_at_eog = true;                // stop at the model's end-of-generation tokens
  std::vector<std::string> stop_strings;  // stop when the output ends with one of these
};

enum class StopReason { kMaxTokens, kEog, kStopString, kContextFull, kCallback };
const char* stop_reason_name(StopReason r);

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (without a final stop token)
  std::string text;
  StopReason stop = StopReason::kMaxTokens;
  int64_t n_prompt = 0;
  double prefill_s = 0, decode_s = 0;
  double prefill_tps() const { return prefill_s > 0 ? static_cast<double>(n_prompt) / prefill_s : 0; }
  double decode_tps() const;
};

class Session {
 public:
  Session(const Model& model, SessionParams p);

  const Model& model() const { return model_; }
  KvCache& cache() { return *cache_; }
  const KvCache& cache() const { return *cache_; }
  ThreadPool& pool() { return pool_; }
  int64_t n_ctx() const { return n_ctx_; }
  int32_t n_past() const { return cache_->n_past(); }
  const SessionParams& params() const { return p_; }

  // Appends tokens to the context (chunked by n_batch) and returns the logits [n_vocab]
  // of the last one. Throws Error if the context would exceed n_ctx (nothing is run then).
  const std::vector<float>& prefill(const std::vector<int32_t>& tokens);
  // Appends one token; returns its logits [n_vocab].
  const std::vector<float>& decode(int32_t token);
  // Appends tokens and writes the logits of every one: logits[n, n_vocab] (perplexity).
  void eval_all(const int32_t* tokens, int64_t n, float* logits);
  // Drops the context (the cache keeps no tokens).
  void reset();

  // Prefills `prompt` (may be empty when continuing the current context, in which case
  // the last logits are used) and samples up to max_new_tokens. on_token(id, piece)
  // returning false stops generation.
  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateParams& gp,
                          const std::function<bool(int32_t, const std::string&)>& on_token = {});

 private:
  void check_room(int64_t n_new) const;
  const Model& model_;
  SessionParams p_;
  int64_t n_ctx_;
  ThreadPool pool_;
  std::unique_ptr<KvCache> cache_;
  std::vector<float> logits_;
};

// Resolves -m: an existing file path, or an installed model name / alias (smollm2,
// qwen2.5-coder-1.5b (qwen), gemma3-270m (gemma3)) looked up in $KVTRIM_MODELS_DIR,
// <executable>/../../models, ./models and ~/.local/share/kvtrim/models.
// Throws Error listing the places searched and the install command.
std::string resolve_model_path(const std::string& name_or_path);
// Installed model names (for help texts).
std::vector<std::string> known_model_names();

}  // namespace kvtrim
