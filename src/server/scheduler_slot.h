// Internal to the scheduler's files (scheduler.cpp: the loop, prefill / decode steps, finishing;
// scheduler_submit.cpp: a request into a job; scheduler_admission.cpp: the KV budget, pressure
// and admission): a slot's state and the helpers they share.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/refeed.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "server/scheduler.h"
#include "server/text_stream.h"

namespace kvtrim::server {

// ---- Slot ----

struct Scheduler::Slot {
  enum class State { kEmpty, kIdle, kPrefill, kDecode };
  int id = 0;
  State state = State::kEmpty;
  std::unique_ptr<Session> session;
  std::string press;  // the session's press spec ("" = none)
  KvDtype k = KvDtype::kF16, v = KvDtype::kF16;
  std::vector<int32_t> tokens;  // the token at every position the cache has seen (0 .. n_past-1)
  int64_t last_used = 0;
  bool pressured = false;  // compressed by the pressure press since its last job
  RefeedNeeds refeed;      // the re-feed passes the session's compressions run (its observer's)
  // the running job
  std::shared_ptr<Job> job;
  size_t prompt_done = 0;  // prompt tokens in the cache
  size_t prompt_len = 0;   // the prompt of the slot's last job (a continuation starts with it)
  int64_t cached = 0;      // of which reused from the previous conversation
  bool compressed = false;       // the conversation's press ran on an earlier turn (a follow-up keeps its ratio)
  // The context (prompt tokens) the last compression left in the cache, and its report: a job
  // whose context is that one, reused whole from the cache, does not compress it again (0 = none,
  // or changed since: a new conversation, a pressure compression).
  size_t compressed_context = 0;
  CompressionReport last_compression;
  bool context_done = false;     // the job's context was compressed (or did not need it)
  CompressionReport compression;  // what that did, for the response
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> text;
  int32_t next_token = -1;  // sampled, not yet in the cache
  int n_gen = 0;
  double t_start = 0, t_prefill_end = 0;
};

inline const char* state_name(int s) {
  static const char* names[] = {"empty", "idle", "prefill", "decode"};
  return names[s];
}
inline size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

}  // namespace kvtrim::server
