// A session: one model, one KV cache, one thread pool; chunked prefill, decode steps and
// generation with sampling and stop tokens. The context limit (n_ctx) is enforced before
// any work is done, with an Error that names the numbers.
// Dependencies (docs/architecture.md "src/engine"): perplexity, refeed, context_question,
// document_qa, eval, server and tools -> session -> press_runner (PressObserver, run_press,
// apply_plan) -> press, kv, model. The session owns the cache, the press and its observer and
// calls press_runner; press_runner never includes this header.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "press/press.h"

namespace kvtrim {
class PressObserver;
struct CompressStats;
}  // namespace kvtrim

namespace kvtrim {

struct SessionParams {
  int64_t n_ctx = 0;     // context limit in tokens; 0 = the model's training context
  int n_threads = 0;     // 0 = all hardware threads
  int n_batch = 256;     // prefill chunk size (tokens per forward call)
  KvDtype kv_dtype = KvDtype::kF16;          // precision of stored keys and values ...
  std::optional<KvDtype> kv_dtype_k, kv_dtype_v;  // ... unless set per side (-ctk / -ctv)
  bool kv_rotate = true;  // quantized dense rows in a Hadamard rotation (KvCacheConfig::rotate_quantized)
  // A pool shared with other sessions (not owned; it must outlive the session), e.g. a server's
  // slots, whose steps run batched (Session::step_batch). nullptr: the session's own pool of
  // n_threads.
  ThreadPool* pool = nullptr;
  // Memory the KV cache may take, checked before it grows (DESIGN.md §3: refused before
  // allocation, with the numbers): a context set explicitly (n_ctx > 0) whose uncompressed cache
  // would not fit is refused at construction; every prefill is refused if its uncompressed
  // tokens would not fit. > 0: a limit in bytes on the cache; 0: the memory the OS reports
  // available (core/memory.h); < 0: no check (a press that compresses during prefill may keep
  // a cache small that would not fit uncompressed).
  int64_t kv_mem_limit = 0;
  // Estimate what each compression loses (src/engine/press_loss.h, CompressStats::loss): the
  // press's observer then also keeps the last kLossWindow (32) queries of each layer and the
  // queries of a question given to observe_question, and every compress measures the attention
  // output of the question's queries (when one was observed for it) or else the window's,
  // before and after the plan.
  bool press_loss = false;
};

class Session;
// One session's part of a batched forward call (Session::step_batch).
struct SessionChunk {
  Session* session = nullptr;
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  bool decode = false;  // a decode step (n == 1: Session::decode's press hooks) or a prefill chunk
};

struct GenerateParams {
  int max_new_tokens = 128;
  SamplerParams sampling;
  bool stop_at_eog = true;                // stop at the model's end-of-generation tokens
  std::vector<std::string> stop_strings;  // stop when the output ends with one of these
};

// When the session's press compresses the cache.
struct PressSchedule {
  bool after_prefill = true;  // generate(): compress once after the prompt's prefill
  int decode_every = 0;       // > 0: while decoding, every N steps, compress down to decode_target
  int64_t decode_target = 0;  //   tokens per (layer, kv head) (a budget override for the press)
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
  ~Session();

  const Model& model() const { return model_; }
  KvCache& cache() { return *cache_; }
  const KvCache& cache() const { return *cache_; }
  ThreadPool& pool() { return *pool_; }
  int64_t n_ctx() const { return n_ctx_; }
  int32_t n_past() const { return cache_->n_past(); }
  const SessionParams& params() const { return p_; }

  // Appends tokens to the context (chunked by n_batch) and returns the logits [n_vocab]
  // of the last one. Throws Error if the context would exceed n_ctx (nothing is run then).
  const std::vector<float>& prefill(const std::vector<int32_t>& tokens);
  // Appends one token; returns its logits [n_vocab].
  const std::vector<float>& decode(int32_t token);
  // The logits of the last token run (prefill, decode, step_batch).
  const std::vector<float>& logits() const { return logits_; }
  // Continuous batching: runs every chunk through the model in one forward call, so the
  // weights are read once for all of them (Model::forward_batch). A decode chunk is exactly
  // decode() of its session (press hooks included); a prefill chunk is one chunk of prefill()
  // (no compression: call compress() after a prompt's last chunk as generate() does). Each
  // session's logits() then hold its last token's logits. The sessions must be distinct and
  // share the model and the thread pool (SessionParams::pool); every check (context room,
  // token ids) runs before any work, so a refused batch changes nothing.
  static void step_batch(const std::vector<SessionChunk>& chunks);
  // Appends tokens and writes the logits of every one: logits[n, n_vocab] (perplexity).
  void eval_all(const int32_t* tokens, int64_t n, float* logits);
  // Drops the context: the cache keeps no tokens and no basis / channel epoch (KvCache::reset;
  // a new context must not inherit a press's basis).
  void reset();

  // Prefills `prompt` (may be empty when continuing the current context, in which case
  // the last logits are used) and samples up to max_new_tokens. on_token(id, piece)
  // returning false stops generation.
  // Compression (DESIGN.md §3). set_press installs a press and the observer that captures
  // what it needs from then on (set it before prefill); nullptr removes it.
  // `extra`: what the observer captures besides the press's own needs (a server's pressure
  // press, applied later with compress_with).
  void set_press(std::unique_ptr<Press> press, PressSchedule sched = {}, const PressNeeds& extra = {});
  const Press* press() const { return press_.get(); }
  const PressSchedule& press_schedule() const { return sched_; }
  // Compresses the cache now with the session's press (plan, then the cache applies it).
  // n_past() keeps the uncompressed length. Throws Error if no press is set. Runs
  // prepare_compress() first.
  CompressStats compress();
  // The same with a budget replacing the press's own (every scorer press of a composition
  // keeps budget.keep_count(n) tokens per (layer, kv head)): decode-time compression.
  CompressStats compress(const Budget& budget_override);
  // Query-aware presses and the loss estimate (press_loss): runs `question` through the model
  // to capture its queries (Observations::question), then drops its tokens from the cache again
  // (n_past() unchanged). Needs a press or an observer (set_observer).
  void observe_question(const std::vector<int32_t>& question);
  // Drops every token at position >= pos (chat keeps the common prefix of a conversation).
  void truncate(int32_t pos);
  // The passes a press needs after the context and before planning (src/engine/refeed.h: the
  // re-feed of KVCompose, KVzip's reconstruction): run once per context (a no-op while the
  // observer's results are current or when nothing needs them). compress(), compress_with()
  // and generate's decode-time compressions call it; a sweep calls it before saving a state
  // so every cell shares one pass. Throws LimitError when a chunk does not fit the context.
  void prepare_compress();
  // Re-feed passes run since the session was made (tests: a restored state does not re-run).
  int64_t refeed_passes() const { return n_refeeds_; }
  // The token ids at positions [0, n_past()) (what a re-feed runs again).
  const std::vector<int32_t>& history() const { return history_; }
  // Stats of every compress() since the last reset (generate's included).
  const std::vector<CompressStats>& compress_log() const { return compress_log_; }
  // The press's own hooks: its after-append plans during prefill / eval_all
  // (Press::plans_after_append) and its decode-time updates (Press::plan_decode, every
  // decode_interval() decode steps, applied by decode() independently of PressSchedule). On by
  // default; off runs the model over the uncompressed cache with the press installed (the
  // full-cache reference pass of `kvtrim eval ppl`).
  void set_press_hooks(bool on);
  bool press_hooks() const { return hooks_; }
  // Decode-time updates applied since the last reset.
  int64_t press_updates() const { return n_updates_; }
  // What the press's observer captured so far (nullptr without a press): for tests and tools
  // that plan without applying (PressContext).
  const Observations* observations() const;

  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateParams& gp,
                          const std::function<bool(int32_t, const std::string&)>& on_token = {});

 private:
  void check_room(int64_t n_new) const;
  void check_memory(int64_t n_new) const;
  void check_tokens(const int32_t* tokens, int64_t n) const;
  void before_step(bool decode);
  void after_step(bool decode);
  void restore_observer();
  std::unique_ptr<PressObserver> make_observer(const KvCache& cache, const PressNeeds& needs) const;
  const Model& model_;
  SessionParams p_;
  int64_t n_ctx_;
  std::unique_ptr<ThreadPool> own_pool_;  // when no shared pool is given
  ThreadPool* pool_;
  std::unique_ptr<KvCache> cache_;
  std::vector<float> logits_;
  std::vector<int32_t> history_;  // the context's token ids, position by position
  int64_t n_refeeds_ = 0;
  double refeed_s_ = 0;         // the last prepare_compress's time and peak RSS, taken by the
  size_t refeed_rss_peak_ = 0;  // next compress into its CompressStats
  CompressStats run_compress(const Press& press, const Budget* budget_override);
  std::unique_ptr<Press> press_;
  PressSchedule sched_;
  std::unique_ptr<PressObserver> observer_;
  std::vector<CompressStats> compress_log_;
  // Press hooks (set_press_hooks): decode steps since the prefill, the first position not yet
  // seen by the press's last plan (OjaKV's buffer starts there), updates applied.
  void decode_update();
  bool hooks_ = true;
  int64_t decode_steps_ = 0;
  int32_t update_from_ = 0;
  int64_t n_updates_ = 0;

 public:
  // ---- Sweeps: one prefill compressed several ways (kvtrim eval sweep, src/eval/sweep.h) ----
  // A saved context: a deep copy of the cache, what the observer had captured, the last logits.
  struct State {
    std::unique_ptr<KvCache> cache;
    bool has_observer = false;
    Observations observations;
    std::vector<float> logits;
    std::vector<int32_t> history;
    int64_t decode_steps = 0;  // the press hooks' decode counter and first unplanned position
    int32_t update_from = 0;
  };
  // Installs an observer capturing `needs` (e.g. the PressNeeds::merge of every press of a
  // sweep) without a press: presses are then given to compress_with. Removes any press. Set
  // it before prefill, like set_press.
  void set_observer(const PressNeeds& needs);
  // Compresses the cache now with `press` (not the session's) against what the observer
  // captured; logged like compress(). A press needing more than the observer captures throws.
  CompressStats compress_with(const Press& press);
  // The same with a budget replacing the press's own (as compress(budget_override)).
  CompressStats compress_with(const Press& press, const Budget& budget_override);
  State save_state() const;
  // Back to `st`: the cache becomes a copy of the saved one (st stays usable for the next
  // restore) and the observer (which refers to the cache) is rebuilt over it with the saved
  // observations; the compress log is cleared. The observer's needs are the session's current
  // ones: restore into the session (or one set up the same way) that saved.
  void restore_state(const State& st);
};

// Resolves -m: an existing file path, or an installed model name / alias (smollm2,
// qwen2.5-coder-1.5b (qwen), gemma3-270m (gemma3)) looked up in $KVTRIM_MODELS_DIR,
// <executable>/../../models, ./models and ~/.local/share/kvtrim/models.
// Throws Error listing the places searched and the install command.
std::string resolve_model_path(const std::string& name_or_path);
// Installed model names (for help texts).
std::vector<std::string> known_model_names();

}  // namespace kvtrim
