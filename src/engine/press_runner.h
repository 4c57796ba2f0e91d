// Runs a press inside a session (DESIGN.md §3): the observer that captures, during the
// forward pass, exactly what the configured press needs (PressNeeds: the last W post-RoPE
// queries of each layer, the cumulative attention each stored token received, the question's
// queries, the task attention accumulators of task-agnostic KVCompose), and the compress step
// (plan with the press, apply with the cache, keep the observations aligned with the cache's
// tokens), and apply_plan, the one path from a plan to the cache.
// Dependencies (docs/architecture.md "src/engine"): session -> press_runner ->
// observation_stats, press_loss, press, kv, model. This layer knows nothing of Session (it never
// includes session.h): it works on the cache, the model and the observer it is given; the
// session owns them and calls in here.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/observation_stats.h"
#include "engine/press_loss.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "press/press.h"

namespace kvtrim {

class ThreadPool;

class PressObserver : public ForwardObserver {
 public:
  PressObserver(const Model& model, const KvCache& cache, PressNeeds needs);
  const PressNeeds& needs() const { return needs_; }
  const Observations& observations() const { return obs_; }

  // q: [n, n_head, head_dim_k] etc. (ForwardObserver). In question mode the queries are
  // stored as the question's (replacing any earlier question) and nothing else is recorded.
  void on_qkv(int il, int64_t n, const float* q, const float* k, const float* v, const int32_t* pos) override;
  // The pool the task attention accumulation runs on (nullptr = the calling thread only).
  // on_qkv is called on the forward's calling thread between its own parallel steps.
  void set_pool(ThreadPool* pool) { pool_ = pool; }

  // false: new tokens get zero rows in the attention statistics (H2O, KVCompose) instead of
  // the O(n_stored) accumulation — the session's choice for decode steps when no decode-time
  // compression is scheduled (a later compression then sees prefill-time statistics only).
  void set_accumulate(bool on) { accumulate_ = on; }

  // The next forward calls are the question: capture its queries and, for each, the log-sum-exp
  // of its attention logits over the question's own keys (ObservedQueries::self_lse).
  void begin_question();
  void end_question();
  void clear_question();
  // Prefill-time compression (Press::plans_after_append): while a press is set here and hooks
  // are on, after each layer's append the press plans that layer (ctx.new_from() = the chunk's
  // first position, the observations captured so far, this chunk's queries included) and the
  // plan is applied before attention reads the cache. Off in question mode.
  void after_append(int il, KvCache& cache) override;
  void set_after_append_press(const Press* press) { hook_press_ = press; }
  void set_hooks(bool on) { hooks_ = on; }
  bool hooks() const { return hooks_; }
  // The re-feed passes (src/engine/refeed.h). start_refeed sizes the results for the stored
  // tokens (zeros; KVzip's sinks, the stored tokens at positions < sinks, score 1) and marks
  // them current; any later context append clears them. Between begin_refeed and end_refeed
  // every forward call is a re-feed chunk appended at positions >= n_context (the context's
  // end) and truncated away afterwards: nothing is recorded as context (no window queries, no
  // statistics rows, no after-append plans); on_qkv scores the stored context instead:
  //   kContext: the chunk's queries attend over every stored token (the context and the
  //     chunk's earlier sub-chunks) plus their own keys, causally; the probabilities on the
  //     context's tokens fold into kRefeedMax / kRefeedSum, and M grows by the chunk's size;
  //   kKvzip: softmax over the stored tokens at positions < sinks, those in [lo, hi) (the
  //     context span the chunk reconstructs) and the chunk's own (>= n_context), causal; the
  //     max over queries and the group's heads of the probabilities on [lo, hi) is the score.
  using RefeedMode = RefeedScores::Mode;
  void start_refeed(bool context, bool kvzip, int kvzip_sinks);
  void finish_refeed();  // every chunk ran: the results are current (until the context changes)
  bool refeed_current() const { return obs_.refeed_current; }
  void begin_refeed(RefeedMode mode, int32_t lo = 0, int32_t hi = 0);
  void end_refeed() { refeed_.end(); }
  void reset_refeed();  // drops the re-feed's results (not current any more)
  // Keeps the observations aligned with the cache after it applied `plan`.
  void on_apply(const CompressionPlan& plan);
  // After cache.truncate(pos): drops what belonged to positions >= pos.
  void on_truncate(int32_t pos);
  void reset();
  // Replaces what was captured (Session::restore_state: observations saved with the cache
  // they are aligned with).
  void restore(Observations obs) {
    obs_ = std::move(obs);
    question_mode_ = false;
    refeed_.on_restore(cache_);  // current re-feed results were saved with this cache
  }

 private:
  StatContext stat_context() { return StatContext{model_, cache_, obs_, pool_}; }
  const Model& model_;
  const KvCache& cache_;
  PressNeeds needs_;
  Observations obs_;
  ThreadPool* pool_ = nullptr;
  bool question_mode_ = false;
  bool accumulate_ = true;
  const Press* hook_press_ = nullptr;
  bool hooks_ = true;
  // the statistics the press needs, fed by every context chunk (observation_stats.h)
  std::vector<std::unique_ptr<ObservationStat>> stats_;
  QuestionQueries question_;
  RefeedScores refeed_;
};

// What one compress step did.
struct CompressStats {
  int64_t tokens_before = 0, tokens_after = 0;  // summed over (layer, kv head)
  size_t bytes_before = 0, bytes_after = 0;     // KvCache::bytes().total()
  size_t rss_before = 0, rss_after = 0;         // process resident set size before planning / after apply()
  double seconds = 0;
  // The re-feed pass this compress ran first (Session::prepare_compress; 0 when none ran):
  // its time and the process RSS at its fullest (the context plus one chunk in the cache).
  double refeed_seconds = 0;
  size_t refeed_rss_peak = 0;
  // What the compression lost, estimated on the observation window (SessionParams::press_loss;
  // measured == false otherwise). Its time is not in `seconds`.
  PressLoss loss;
};

// The one path from a press's plan to the cache (DESIGN.md §3: the press plans, only the cache
// mutates storage). Every caller applies through here: run_press (compress), the after-append
// hook (PressObserver::after_append) and the decode-time update (Session's plan_decode). A plan
// that plans nothing (plan_is_planned false) is skipped; otherwise the cache applies it and the
// observer (nullptr: none) keeps its observations aligned with the cache's tokens. Returns
// whether the plan was applied.
bool apply_plan(const CompressionPlan& plan, KvCache& cache, PressObserver* obs);

// Plans with `press` over the cache and applies the plan (apply_plan); obs may be nullptr.
// model's weights are visible to the press through PressContext::model().
CompressStats run_press(const Press& press, KvCache& cache, const Model& model, PressObserver* obs, ThreadPool* pool,
                        const Budget* budget_override = nullptr);

int64_t total_tokens(const KvCache& cache);

}  // namespace kvtrim
