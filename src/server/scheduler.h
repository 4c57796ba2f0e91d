// The server's engine room: a fixed number of slots (one Session each, all on one thread pool),
// a FIFO queue, and one worker thread that runs continuous batching — every step is one
// forward call with the next token of every decoding slot plus one prefill chunk of one
// prefilling slot (Session::step_batch), so the weights are read once per step for all streams.
//
// Memory budget (--kv-budget): every slot reserves what its cache can reach (the bytes it holds
// plus its remaining prompt and max_tokens at the uncompressed bytes per token of its cache
// types); a job is admitted only when the reservations fit. Under pressure, before refusing or
// keeping anyone waiting, the scheduler frees memory in this order: compress idle
// conversations with the pressure press, drop idle conversations (least recently used first),
// compress the active ones. A job that could not fit even alone is refused at once (503); one
// that could waits in the queue (bounded: 503 when full).
//
// Conversations: a slot keeps its cache after a job; a new job goes to the slot whose tokens
// share the longest prefix with its prompt (same press and cache types), which truncates to
// the common prefix and prefills only the rest (llama-server's cache_prompt).
//
// Context and question (DESIGN.md §8): a job's press compresses the prompt's context — the
// conversation before its last user turn — never the turn being answered: the slot prefills the
// context, compresses it (src/engine/context_question.h: once it spans --press-min-tokens
// positions; a follow-up keeps the press's ratio of every position), then prefills the
// protected tail (kv_press_protect: "last_turn" or the last N tokens) uncompressed.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/sampler.h"
#include "kv/kv_types.h"
#include "server/api.h"

namespace kvtrim {
class Model;
class ThreadPool;
class Press;
}  // namespace kvtrim

namespace kvtrim::server {

struct ServerOptions {
  int n_parallel = 4;          // slots
  int64_t n_ctx = 4096;        // tokens per slot (conversation)
  int n_batch = 256;           // prefill chunk per step
  size_t kv_budget = 0;        // bytes for all slots' caches together; 0 = no budget
  int64_t kv_mem_limit = 0;    // without a budget: each slot's SessionParams::kv_mem_limit
  std::string press;           // default kv_press ("" = none)
  int64_t press_min_tokens = 32;  // a context shorter than this is not compressed (ContextCompressOptions)
  bool press_loss = true;         // estimate each compression's loss (SessionParams::press_loss)
  double press_max_loss = 1;      // default kv_press_max_loss (1 = off; ContextCompressOptions::max_loss)
  std::string pressure_press;  // compresses conversations under budget pressure ("" = none)
  KvDtype kv_k = KvDtype::kF16, kv_v = KvDtype::kF16;
  bool kv_rotate = true;
  int max_queue = 64;          // waiting jobs beyond the slots
  int default_max_tokens = 256;
};

// What a job tells the HTTP side, in order: text deltas, then exactly one done or error.
struct JobEvent {
  enum class Kind { kText, kDone, kError };
  Kind kind = Kind::kText;
  std::string text;
  std::string finish_reason;  // kDone: "stop" or "length"
  CompletionStats stats;      // kDone
  int status = 0;             // kError
  std::string message;        // kError
};

class Job {
 public:
  // Waits up to timeout_ms for the next event; false if none came.
  bool next(JobEvent* e, int timeout_ms);
  // The client went away: the scheduler stops the job at its next step (its slot keeps the
  // conversation's tokens so far).
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  friend class Scheduler;
  void emit(JobEvent e);
  std::vector<int32_t> prompt;
  size_t compress_at = 0;  // prompt[0, compress_at) is the context the press compresses; the rest is protected
  int max_tokens = 0;
  SamplerParams sampling;
  std::vector<std::string> stop;
  std::string press;
  double max_loss = 1;  // the quality guard's limit (kv_press_max_loss)
  KvDtype k = KvDtype::kF16, v = KvDtype::kF16;
  // tokens the press's re-feed pass adds beside the prompt while it compresses (0 without one)
  int64_t refeed_peak = 0;
  double t_submit = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
  std::atomic<bool> cancelled_{false};
};

// A consistent picture of a slot for /v1/kvtrim/slots and /metrics (published by the worker).
struct SlotView {
  int id = 0;
  std::string state;  // empty, idle, prefill, decode
  int32_t n_past = 0;
  std::string press, kv_cache_type;
  size_t bytes = 0, bytes_dense = 0, reserved = 0;
  std::vector<size_t> layer_bytes;   // [n_layer]
  std::vector<size_t> head_bytes;    // [n_layer * n_head_kv]
  std::vector<int64_t> head_tokens;  // [n_layer * n_head_kv]
};

struct SchedulerStats {
  std::vector<SlotView> slots;
  size_t queue_length = 0;
  // counters since start
  int64_t jobs_done = 0, jobs_cancelled = 0, jobs_failed = 0, rejected_budget = 0, rejected_queue = 0;
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0, prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // step time split by each step's token share
  int64_t steps = 0, batched_decode_tokens = 0;     // decode tokens that shared a step with another
  int64_t pressure_compressions = 0, evictions = 0;
  size_t bytes_freed_by_pressure = 0;
  // KV bytes of all slots together, each shared basis matrix once (kv/kv_cache.h held_once;
  // a slot's own `bytes` counts the bases it uses), and of those the bases
  size_t kv_bytes_held = 0, kv_bases_held = 0;
  size_t kv_bytes_reserved = 0;  // held + the admitted jobs' room (what admission compares)
  size_t kv_bytes_reserved_active = 0;  // of that, the slots running a job (idle ones can be dropped)
  double recent_prefill_tps = 0, recent_decode_tps = 0;  // over the last ~10 s
};

class Scheduler {
 public:
  Scheduler(const Model& model, ThreadPool& pool, ServerOptions opt);
  ~Scheduler();  // stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Tokenizes and checks a request (ApiError 400: empty or too long prompt, bad token ids;
  // 503: it cannot fit the budget even alone, or the queue is full) and queues it.
  std::shared_ptr<Job> submit(const CompletionRequest& r);
  SchedulerStats stats() const;
  // Whether a new conversation would be taken now (readiness, GET /health): false, with the
  // reason, when the queue is full or when the budget minus what running jobs reserve has no
  // room for a new conversation's default max_tokens (idle conversations do not count: they
  // would be compressed or dropped; with no job running it is ready). Running conversations go
  // on either way.
  bool can_admit_new(std::string* reason) const;
  // Ends every job now: running and waiting ones get a 503 error event ("the server is shutting
  // down"), later submits are refused. Idempotent; the destructor calls it.
  void stop();
  const ServerOptions& options() const { return opt_; }
  const Model& model() const { return model_; }
  // Uncompressed bytes one token takes in a cache of these types (all layers and heads).
  size_t bytes_per_token(KvDtype k, KvDtype v) const;

 private:
  struct Slot;
  void loop();
  bool admit_front();  // admits the queue's first job if it fits (freeing memory under pressure)
  void step();
  // Hands the slot its next token: `drawn` (already sampled from its logits), or a draw here if < 0.
  void sample_next(Slot& s, int32_t drawn = -1);
  void finish(Slot& s, const std::string& finish_reason);
  void fail(Slot& s, int status, const std::string& message);
  void release_slot(Slot& s);
  void prepare_slot(Slot& s, Job& j);
  // The job's press on the slot's context (prompt[0, compress_at) in the cache), before the
  // protected tail is prefilled; a press that cannot run is a note in the response.
  void compress_context_of(Slot& s);
  // held: the slot's KvBytes::total() (its bases included, as for the slot alone)
  size_t reserved(const Slot& s, size_t held) const;
  // Tokens beside the prompt a job may hold at its fullest: its max_tokens, or its press's re-feed
  // chunk while the prompt is compressed, whichever is more.
  static int64_t peak_beside_prompt(const Job& j);
  size_t reserved_total(const Slot* except) const;
  bool relieve_pressure(size_t need, const Slot* chosen);
  void publish();

  const Model& model_;
  ThreadPool& pool_;
  ServerOptions opt_;
  std::unique_ptr<Press> pressure_press_;
  std::vector<std::unique_ptr<Slot>> slots_;
  int rr_ = 0;  // next prefill slot (round robin)
  std::atomic<int> n_busy_{0};  // slots running a job (read by submit on HTTP threads)
  int64_t use_clock_ = 0;

  mutable std::mutex mu_;  // queue_, stats_, stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  SchedulerStats stats_;
  bool stop_ = false;
  mutable std::mutex bpt_mu_;
  mutable std::map<std::pair<int, int>, size_t> bpt_;
  struct Recent {
    double t;
    int64_t prefill, decode;
  };
  std::deque<Recent> recent_;
  double last_publish_ = 0;  // worker only: when publish() last ran
  bool views_dirty_ = false;  // worker only: a slot changed state since
  std::thread worker_;
};

}  // namespace kvtrim::server
