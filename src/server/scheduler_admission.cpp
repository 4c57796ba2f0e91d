// The KV budget: what running jobs reserve, compressing conversations under pressure, and
// admitting the queue's first job into a slot.
#include "server/scheduler.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/context_question.h"
#include "engine/limit_error.h"
#include "engine/press_runner.h"
#include "engine/refeed.h"
#include "model/model.h"
#include "press/press.h"
#include "server/scheduler_slot.h"

namespace kvtrim::server {

size_t Scheduler::reserved(const Slot& s, size_t held) const {
  if (!s.session) return 0;
  if (!s.job) return held;
  const size_t bpt = bytes_per_token(s.k, s.v);
  size_t left = (s.job->prompt.size() - s.prompt_done) + static_cast<size_t>(s.job->max_tokens - s.n_gen);
  // until the prompt's compression ran: its re-feed chunk, where larger than the decode's room
  if (s.state == Slot::State::kPrefill && s.job->refeed_peak > s.job->max_tokens)
    left += static_cast<size_t>(s.job->refeed_peak - s.job->max_tokens);
  return held + left * bpt;
}

int64_t Scheduler::peak_beside_prompt(const Job& j) { return std::max<int64_t>(j.max_tokens, j.refeed_peak); }

size_t Scheduler::reserved_total(const Slot* except) const {
  // every slot's reservation, the basis matrices that several slots share (interned: one copy in
  // memory) counted once
  std::vector<KvBytes> held;
  held.reserve(slots_.size());
  size_t room = 0;
  for (const auto& s : slots_) {
    if (s.get() == except || !s->session) continue;
    held.push_back(s->session->cache().bytes());
    room += reserved(*s, held.back().total()) - held.back().total();
  }
  return held_once(held) + room;
}

bool Scheduler::relieve_pressure(size_t need, const Slot* chosen) {
  const auto fits = [&] { return reserved_total(chosen) + need <= opt_.kv_budget; };
  std::vector<Slot*> idle;
  for (auto& s : slots_)
    if (s.get() != chosen && !s->job && s->state == Slot::State::kIdle) idle.push_back(s.get());
  std::sort(idle.begin(), idle.end(), [](const Slot* a, const Slot* b) { return a->last_used < b->last_used; });
  const auto compress = [&](Slot& s) {
    const size_t before = s.session->cache().bytes().total();
    // a re-feed pass holds one chunk beside the conversation while it runs: only where the
    // budget has room for it (else the conversation is dropped below instead)
    int64_t chunk = 0;
    try {
      chunk = refeed_peak_tokens(model_, s.refeed, s.session->n_past(), opt_.n_ctx);
    } catch (const LimitError&) {
      return;  // no room in the context for the pass: the press would fail
    }
    if (chunk > 0 && reserved_total(nullptr) + static_cast<size_t>(chunk) * bytes_per_token(s.k, s.v) > opt_.kv_budget)
      return;
    try {
      s.session->compress_with(*pressure_press_);
    } catch (const Error& e) {
      KVTRIM_LOG_WARN("slot %d: pressure press %s failed: %s", s.id, pressure_press_->spec().c_str(), e.what());
      return;
    }
    s.pressured = true;
    s.compressed_context = 0;  // its context is no longer what the last compression left
    views_dirty_ = true;
    const size_t after = s.session->cache().bytes().total();
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.pressure_compressions;
    stats_.bytes_freed_by_pressure += before > after ? before - after : 0;
  };
  // 1. compress idle conversations (once each between their jobs)
  if (pressure_press_) {
    for (Slot* s : idle) {
      if (fits()) return true;
      if (!s->pressured) compress(*s);
    }
  }
  // 2. drop idle conversations, least recently used first
  for (Slot* s : idle) {
    if (fits()) return true;
    s->session->reset();
    s->tokens.clear();
    s->state = Slot::State::kEmpty;
    s->pressured = false;
    views_dirty_ = true;
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.evictions;
  }
  // 3. compress running conversations (once per job)
  if (pressure_press_) {
    for (auto& s : slots_) {
      if (fits()) return true;
      if (s.get() != chosen && s->job && !s->pressured && s->state == Slot::State::kDecode) compress(*s);
    }
  }
  return fits();
}

bool Scheduler::admit_front() {
  std::shared_ptr<Job> j;
  {
    std::lock_guard<std::mutex> lk(mu_);
    while (!queue_.empty() && queue_.front()->cancelled()) {
      queue_.front()->emit(JobEvent{JobEvent::Kind::kError, {}, {}, {}, 499, "cancelled by the client"});
      queue_.pop_front();
      ++stats_.jobs_cancelled;
    }
    stats_.queue_length = queue_.size();
    if (queue_.empty()) return false;
    j = queue_.front();
  }
  // The slot: the conversation this prompt continues (the slot's last prompt is a prefix of
  // it: nothing held is lost), else an empty slot, else the least recently used idle one
  // (whose common prefix with the prompt, if any, is still reused). A prompt that merely
  // shares a beginning with another conversation (a system prompt, a document) does not take
  // that conversation's slot while another is free.
  Slot* best = nullptr;
  size_t best_prefix = 0;
  for (auto& s : slots_) {
    if (s->job || s->state != Slot::State::kIdle || s->press != j->press || s->k != j->k || s->v != j->v) continue;
    const size_t p = common_prefix(s->tokens, j->prompt);
    if (s->prompt_len > 0 && p >= s->prompt_len && p > best_prefix) best = s.get(), best_prefix = p;
  }
  if (!best)
    for (auto& s : slots_)
      if (!s->job && s->state == Slot::State::kEmpty) {
        best = s.get();
        break;
      }
  if (!best)
    for (auto& s : slots_)
      if (!s->job && (!best || s->last_used < best->last_used)) best = s.get();
  if (!best) return false;  // every slot busy

  if (opt_.kv_budget > 0) {
    const size_t bpt = bytes_per_token(j->k, j->v);
    const size_t reuse = best_prefix > 0 && best->session ? best->session->cache().bytes().total() : 0;
    const size_t beside = static_cast<size_t>(peak_beside_prompt(*j));
    const size_t fresh = (j->prompt.size() + beside) * bpt;
    const size_t need = reuse > 0 ? reuse + (j->prompt.size() - best_prefix + beside) * bpt : fresh;
    // the chosen slot's current cache is replaced by this job's (counted in `need` when reused)
    if (!relieve_pressure(need, best)) {
      if (reuse == 0 || !relieve_pressure(fresh, best)) return false;  // wait for running jobs
      best_prefix = 0;  // too big to keep: start the conversation over
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (queue_.empty() || queue_.front() != j) return true;  // cannot happen (one consumer); retry
    queue_.pop_front();
    stats_.queue_length = queue_.size();
  }
  if (j->cancelled()) {
    j->emit(JobEvent{JobEvent::Kind::kError, {}, {}, {}, 499, "cancelled by the client"});
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.jobs_cancelled;
    return true;
  }
  best->job = j;
  ++n_busy_;
  views_dirty_ = true;
  try {
    prepare_slot(*best, *j);
  } catch (const LimitError& e) {  // the slot's context cannot fit the memory limit
    fail(*best, 503, e.what());
  } catch (const std::exception& e) {
    fail(*best, 500, e.what());
  }
  return true;
}

bool Scheduler::can_admit_new(std::string* reason) const {
  const SchedulerStats st = stats();
  if (st.queue_length >= static_cast<size_t>(std::max(opt_.max_queue, 1))) {
    if (reason) *reason = strprintf("the queue is full (%zu requests waiting, --queue %d)", st.queue_length, opt_.max_queue);
    return false;
  }
  // nothing running: ready (a request too big for the budget alone gets its own 503 at submit)
  if (opt_.kv_budget == 0 || st.kv_bytes_reserved_active == 0) return true;
  const size_t need =
      std::min(static_cast<size_t>(opt_.default_max_tokens) * bytes_per_token(opt_.kv_k, opt_.kv_v), opt_.kv_budget);
  if (st.kv_bytes_reserved_active + need > opt_.kv_budget) {
    if (reason)
      *reason = strprintf("the KV budget is taken: running requests reserve %zu of %zu bytes, a new conversation "
                          "needs %zu (its default max_tokens %d)",
                          st.kv_bytes_reserved_active, opt_.kv_budget, need, opt_.default_max_tokens);
    return false;
  }
  return true;
}

// Sets the slot up for job j: a session with the job's cache types and press, the cache
// truncated to the prefix it shares with the prompt (at least one prompt token is run).
}  // namespace kvtrim::server
