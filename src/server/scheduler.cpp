#include "server/scheduler.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "engine/context_question.h"
#include "engine/limit_error.h"
#include "engine/press_runner.h"
#include "engine/refeed.h"
#include "engine/session.h"
#include "model/model.h"
#include "press/press.h"
#include "server/scheduler_slot.h"
#include "server/text_stream.h"

namespace kvtrim::server {

// ---- Job ----

bool Job::next(JobEvent* e, int timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); })) return false;
  *e = std::move(events_.front());
  events_.pop_front();
  return true;
}

void Job::emit(JobEvent e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}


Scheduler::Scheduler(const Model& model, ThreadPool& pool, ServerOptions opt)
    : model_(model), pool_(pool), opt_(std::move(opt)) {
  KVTRIM_CHECK(opt_.n_parallel >= 1 && opt_.n_parallel <= 256, "--parallel must be in [1, 256] (got %d)", opt_.n_parallel);
  KVTRIM_CHECK(opt_.n_ctx >= 16 && opt_.n_ctx <= model.hparams().n_ctx_train,
               "--ctx %lld must be in [16, %d] (the model's context limit)", static_cast<long long>(opt_.n_ctx),
               model.hparams().n_ctx_train);
  KVTRIM_CHECK(opt_.n_batch >= 1 && opt_.n_batch <= 8192, "--batch must be in [1, 8192] (got %d)", opt_.n_batch);
  KVTRIM_CHECK(opt_.max_queue >= 0 && opt_.max_queue <= 1 << 20, "--queue must be in [0, 2^20]");
  if (!opt_.press.empty()) opt_.press = make_press(opt_.press)->spec();
  if (!opt_.pressure_press.empty()) pressure_press_ = make_press(opt_.pressure_press);
  if (opt_.kv_budget > 0) {
    const size_t one = bytes_per_token(opt_.kv_k, opt_.kv_v);
    KVTRIM_CHECK(opt_.kv_budget >= one * 16,
                 "--kv-budget of %zu bytes does not hold 16 tokens of this model's cache (%zu bytes per token)",
                 opt_.kv_budget, one);
  }
  for (int i = 0; i < opt_.n_parallel; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->id = i;
  }
  publish();
  worker_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::deque<std::shared_ptr<Job>> waiting;
  {
    std::lock_guard<std::mutex> lk(mu_);
    waiting.swap(queue_);
    stats_.queue_length = 0;
  }
  for (auto& j : waiting) j->emit(JobEvent{JobEvent::Kind::kError, {}, {}, {}, 503, "the server is shutting down"});
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

// ---- the worker ----

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      const auto busy = [&] {
        for (const auto& s : slots_)
          if (s->job) return true;
        return false;
      };
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || busy(); });
      if (stop_) break;
    }
    while (admit_front()) {
    }
    bool any = false;
    for (const auto& s : slots_) any |= s->job != nullptr;
    if (any) {
      step();
    } else {
      // Nothing runs and the queue's first job was not admitted. relieve_pressure frees every
      // idle cache and submit refuses what cannot fit alone, so this is not expected; a short
      // wait keeps it from spinning if it happens.
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(50));
    }
    // the slots' picture: at most every 100 ms while steps run, at once after a job came or went
    if (views_dirty_ || now_seconds() - last_publish_ >= 0.1) publish();
  }
  // shutdown: running jobs end with an error, their slots keep nothing
  for (auto& s : slots_)
    if (s->job) fail(*s, 503, "the server is shutting down");
}

void Scheduler::prepare_slot(Slot& s, Job& j) {
  const bool same = s.session && s.press == j.press && s.k == j.k && s.v == j.v && s.state == Slot::State::kIdle;
  size_t keep = same ? common_prefix(s.tokens, j.prompt) : 0;
  keep = std::min(keep, j.prompt.size() - 1);
  // the protected tail is prefilled after the context's compression, never reused compressed
  if (!j.press.empty()) keep = std::min(keep, j.compress_at);
  if (!s.session || s.k != j.k || s.v != j.v) {
    SessionParams p;
    p.n_ctx = opt_.n_ctx;
    p.n_batch = opt_.n_batch;
    p.kv_dtype_k = j.k;
    p.kv_dtype_v = j.v;
    p.kv_rotate = opt_.kv_rotate;
    p.kv_mem_limit = opt_.kv_budget > 0 ? -1 : opt_.kv_mem_limit;  // a budget is checked by admission
    p.press_loss = opt_.press_loss;
    p.pool = &pool_;
    s.session = std::make_unique<Session>(model_, p);
    s.press.clear();
    s.k = j.k;
    s.v = j.v;
    keep = 0;
  }
  if (keep == 0 || s.press != j.press) {
    s.session->reset();
    const PressNeeds extra = pressure_press_ ? pressure_press_->needs() : PressNeeds{};
    PressNeeds all = extra;
    if (!j.press.empty()) {
      std::unique_ptr<Press> press = make_press(j.press);
      all.merge(press->needs());
      s.session->set_press(std::move(press), PressSchedule{}, extra);
    } else if (pressure_press_) {
      s.session->set_observer(extra);
    } else {
      s.session->set_press(nullptr);
    }
    s.refeed = all.refeed;  // the passes every compression of this session runs
    s.press = j.press;
    keep = 0;
  } else {
    s.session->truncate(static_cast<int32_t>(keep));
  }
  s.tokens.assign(j.prompt.begin(), j.prompt.begin() + static_cast<std::ptrdiff_t>(keep));
  s.prompt_done = keep;
  s.prompt_len = j.prompt.size();
  s.cached = static_cast<int64_t>(keep);
  if (keep == 0) {  // a new conversation
    s.compressed = false;
    s.compressed_context = 0;
  }
  s.context_done = j.press.empty();
  s.compression = CompressionReport{};
  s.compression.requested = !j.press.empty();
  s.compression.press = j.press;
  s.sampler = std::make_unique<Sampler>(j.sampling);
  s.text = std::make_unique<TextStream>(j.stop);
  s.n_gen = 0;
  s.next_token = -1;
  s.pressured = false;
  s.t_start = now_seconds();
  s.t_prefill_end = 0;
  s.state = Slot::State::kPrefill;
  s.last_used = ++use_clock_;
  std::lock_guard<std::mutex> lk(mu_);
  stats_.prompt_tokens += static_cast<int64_t>(j.prompt.size());
  stats_.cached_prompt_tokens += static_cast<int64_t>(keep);
}

void Scheduler::step() {
  // cancelled jobs end before the step
  for (auto& s : slots_) {
    if (s->job && s->job->cancelled()) {
      s->job->emit(JobEvent{JobEvent::Kind::kError, {}, {}, {}, 499, "cancelled by the client"});
      {
        std::lock_guard<std::mutex> lk(mu_);
        ++stats_.jobs_cancelled;
      }
      release_slot(*s);
    }
  }
  std::vector<SessionChunk> chunks;
  std::vector<Slot*> in_step;
  for (auto& s : slots_) {
    if (s->job && s->state == Slot::State::kDecode) {
      chunks.push_back(SessionChunk{s->session.get(), &s->next_token, 1, true});
      in_step.push_back(s.get());
    }
  }
  int64_t n_decode = static_cast<int64_t>(chunks.size());
  Slot* pre = nullptr;
  int64_t n_pre = 0;
  for (int i = 0; i < opt_.n_parallel && !pre; ++i) {
    Slot& s = *slots_[static_cast<size_t>((rr_ + i) % opt_.n_parallel)];
    if (s.job && s.state == Slot::State::kPrefill) pre = &s;
  }
  if (pre) {
    rr_ = (pre->id + 1) % opt_.n_parallel;
    // the context reused from the conversation's cache ends where the protected tail starts
    if (!pre->context_done && pre->prompt_done == pre->job->compress_at) compress_context_of(*pre);
    const size_t upto = pre->context_done ? pre->job->prompt.size() : pre->job->compress_at;
    n_pre = std::min<int64_t>(opt_.n_batch, static_cast<int64_t>(upto - pre->prompt_done));
    chunks.push_back(SessionChunk{pre->session.get(), pre->job->prompt.data() + pre->prompt_done, n_pre, false});
    in_step.push_back(pre);
  }
  if (chunks.empty()) return;
  const double t0 = now_seconds();
  try {
    Session::step_batch(chunks);
  } catch (const LimitError& e) {
    // Refused before any work (a slot's context or memory limit): find the slot(s) at fault by
    // stepping each alone, so that the others are not failed with them.
    if (chunks.size() == 1) {
      fail(*in_step[0], 503, e.what());
      return;
    }
    std::vector<SessionChunk> ok_chunks;
    std::vector<Slot*> ok_slots;
    for (size_t i = 0; i < chunks.size(); ++i) {
      try {
        Session::step_batch({chunks[i]});
        ok_chunks.push_back(chunks[i]);
        ok_slots.push_back(in_step[i]);
      } catch (const LimitError& e1) {
        fail(*in_step[i], 503, e1.what());
      } catch (const std::exception& e1) {
        fail(*in_step[i], 500, e1.what());
      }
    }
    chunks.swap(ok_chunks);
    in_step.swap(ok_slots);
    if (pre && std::find(in_step.begin(), in_step.end(), pre) == in_step.end()) n_pre = 0;
    n_decode = std::count_if(chunks.begin(), chunks.end(), [](const SessionChunk& c) { return c.decode; });
    if (chunks.empty()) return;
  } catch (const std::exception& e) {
    for (Slot* s : in_step) fail(*s, 500, e.what());
    return;
  }
  const double dt = now_seconds() - t0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const double tot = static_cast<double>(n_decode + n_pre);
    stats_.steps += 1;
    stats_.decode_tokens += n_decode;
    stats_.prefill_tokens += n_pre;
    if (n_decode > 1 || (n_decode == 1 && n_pre > 0)) stats_.batched_decode_tokens += n_decode;
    stats_.decode_seconds += dt * static_cast<double>(n_decode) / tot;
    stats_.prefill_seconds += dt * static_cast<double>(n_pre) / tot;
    recent_.push_back(Recent{now_seconds(), n_pre, n_decode});
  }
  // The decoding slots' next tokens, drawn on the pool (each slot has its own sampler and
  // logits; a 49k-token draw is tens of microseconds that the other thread would spend waiting),
  // then handed out in slot order.
  std::vector<int32_t> drawn(in_step.size(), -1);
  {
    Slot* const* sl = in_step.data();
    int32_t* const out = drawn.data();
    const int32_t n_vocab = model_.hparams().n_vocab;
    for_range(&pool_, static_cast<int64_t>(in_step.size()), 1, [sl, out, n_vocab](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        Slot& s = *sl[i];
        if (s.state != Slot::State::kDecode) continue;
        try {
          out[i] = s.sampler->sample(s.session->logits().data(), n_vocab);
        } catch (...) {
          out[i] = -1;  // (NaN logits: sample_next draws again on this thread and reports it)
        }
      }
    });
  }
  for (size_t i = 0; i < in_step.size(); ++i) {
    Slot* s = in_step[i];
    if (s->state == Slot::State::kDecode) {
      s->tokens.push_back(s->next_token);
      sample_next(*s, drawn[i]);
    } else {
      s->tokens.insert(s->tokens.end(), s->job->prompt.begin() + static_cast<std::ptrdiff_t>(s->prompt_done),
                       s->job->prompt.begin() + static_cast<std::ptrdiff_t>(s->prompt_done + static_cast<size_t>(n_pre)));
      s->prompt_done += static_cast<size_t>(n_pre);
      // the context is in: compress it, then the protected tail follows in the next steps
      if (!s->context_done && s->prompt_done == s->job->compress_at) compress_context_of(*s);
      if (s->prompt_done < s->job->prompt.size()) continue;
      s->t_prefill_end = now_seconds();
      s->state = Slot::State::kDecode;
      sample_next(*s);
    }
  }
}

void Scheduler::compress_context_of(Slot& s) {
  Job& j = *s.job;
  s.context_done = true;
  if (!s.session->press()) return;
  ContextCompressOptions co;
  co.min_tokens = opt_.press_min_tokens;
  co.follow_up = s.compressed;  // keep the press's ratio of the whole conversation, not of what earlier turns left
  co.skip_on_error = true;      // a press that cannot run on this context leaves it whole: the conversation goes on
  co.max_loss = j.max_loss;
  const std::vector<int32_t> tail(j.prompt.begin() + static_cast<std::ptrdiff_t>(j.compress_at),
                                  j.prompt.end());
  CompressionReport& r = s.compression;
  // The context is the one this press compressed for an earlier job of the slot, reused whole
  // from its cache (another question over the same document): it is not pressed again. A token
  // press would find its budget met and change nothing, after a whole second forward over the
  // context for a re-feed press (KVCompose, KVzip); a composition (no single budget) would
  // compress the document further with every question. The report is that compression's,
  // marked reused.
  if (s.compressed_context > 0 && s.compressed_context == j.compress_at &&
      static_cast<size_t>(s.cached) == j.compress_at && s.last_compression.max_loss == j.max_loss) {
    r = s.last_compression;
    r.reused = true;
    r.protected_tokens = static_cast<int64_t>(tail.size());
    return;
  }
  const ContextCompression cc = compress_context(*s.session, tail, co);
  r.applied = cc.ran;
  r.note = cc.note;
  r.context_tokens = cc.n_context;
  r.protected_tokens = static_cast<int64_t>(tail.size());
  r.query_aware = cc.saw_question;
  r.max_loss = j.max_loss;
  r.attempts = cc.attempts;
  r.loss = cc.ran ? cc.stats.loss : PressLoss{};
  const KvCacheConfig& cfg = s.session->cache().config();
  const double heads = static_cast<double>(cfg.n_layer) * cfg.n_head_kv;
  if (cc.ran) {
    s.compressed = true;
    r.tokens_before = static_cast<double>(cc.stats.tokens_before) / heads;
    r.tokens_after = static_cast<double>(cc.stats.tokens_after) / heads;
    r.kv_bytes_before = cc.stats.bytes_before;
    r.kv_bytes_after = cc.stats.bytes_after;
    s.compressed_context = j.compress_at;
    s.last_compression = r;
  } else {
    s.compressed_context = 0;
    r.tokens_before = r.tokens_after = static_cast<double>(total_tokens(s.session->cache())) / heads;
    r.kv_bytes_before = r.kv_bytes_after = s.session->cache().bytes().total();
    if (cc.failed) KVTRIM_LOG_WARN("slot %d: press %s skipped: %s", s.id, j.press.c_str(), cc.note.c_str());
  }
  views_dirty_ = true;
}

void Scheduler::sample_next(Slot& s, int32_t drawn) {
  Job& j = *s.job;
  const Tokenizer& tok = model_.tokenizer();
  const int32_t id = drawn >= 0 ? drawn : s.sampler->sample(s.session->logits().data(), model_.hparams().n_vocab);
  if (tok.is_eog(id)) return finish(s, "stop");
  ++s.n_gen;
  const std::string out = s.text->push(tok.token_to_piece(id));
  if (!out.empty()) j.emit(JobEvent{JobEvent::Kind::kText, out, {}, {}, 0, {}});
  if (s.text->stopped()) return finish(s, "stop");
  if (s.n_gen >= j.max_tokens || s.session->n_past() + 1 > opt_.n_ctx) return finish(s, "length");
  s.next_token = id;
}

void Scheduler::finish(Slot& s, const std::string& finish_reason) {
  const std::shared_ptr<Job> job = s.job;  // release_slot drops the slot's reference
  Job& j = *job;
  const std::string rest = s.text->flush();
  if (!rest.empty()) j.emit(JobEvent{JobEvent::Kind::kText, rest, {}, {}, 0, {}});
  JobEvent e;
  e.kind = JobEvent::Kind::kDone;
  e.finish_reason = finish_reason;
  CompletionStats& st = e.stats;
  st.prompt_tokens = static_cast<int64_t>(j.prompt.size());
  st.completion_tokens = s.n_gen;
  st.cached_tokens = s.cached;
  st.slot = s.id;
  st.n_past = s.session->n_past();
  st.kv_bytes = s.session->cache().bytes().total();
  st.kv_bytes_dense = static_cast<size_t>(st.n_past) * bytes_per_token(s.k, s.v);
  st.press = s.press;
  st.kv_cache_type = kv_pair_name(s.k, s.v);
  st.compression = s.compression;
  const double t_end = now_seconds();
  const double pre_s = s.t_prefill_end - s.t_start;
  if (pre_s > 0) st.prefill_tps = static_cast<double>(j.prompt.size() - static_cast<size_t>(s.cached)) / pre_s;
  if (s.n_gen > 1 && t_end > s.t_prefill_end) st.decode_tps = (s.n_gen - 1) / (t_end - s.t_prefill_end);
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.jobs_done;
  }
  release_slot(s);
  publish();  // a client reading /v1/kvtrim/slots after its reply sees its slot as it is now
  j.emit(std::move(e));
}

void Scheduler::fail(Slot& s, int status, const std::string& message) {
  if (s.job) s.job->emit(JobEvent{JobEvent::Kind::kError, {}, {}, {}, status, message});
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.jobs_failed;
  }
  KVTRIM_LOG_WARN("slot %d: job failed: %s", s.id, message.c_str());
  // the cache may be half-way through a chunk: start the slot over
  if (s.session) s.session->reset();
  s.tokens.clear();
  if (s.job) --n_busy_;
  s.job.reset();
  s.state = Slot::State::kEmpty;
  views_dirty_ = true;
}

void Scheduler::release_slot(Slot& s) {
  views_dirty_ = true;
  if (s.job) --n_busy_;
  s.job.reset();
  s.sampler.reset();
  s.text.reset();
  s.state = s.session && s.session->n_past() > 0 ? Slot::State::kIdle : Slot::State::kEmpty;
  s.last_used = ++use_clock_;
}

void Scheduler::publish() {
  const double now = now_seconds();
  std::vector<SlotView> views;
  std::vector<KvBytes> held;  // the slots' bytes, for the total with shared bases once
  held.reserve(slots_.size());
  size_t room = 0;  // the admitted jobs' room beyond what they hold
  size_t active = 0;  // the reservations of the slots running a job
  const auto& hp = model_.hparams();
  for (const auto& s : slots_) {
    SlotView v;
    v.id = s->id;
    v.state = state_name(static_cast<int>(s->state));
    v.press = s->press;
    v.kv_cache_type = kv_pair_name(s->k, s->v);
    if (s->session) {
      const KvCache& c = s->session->cache();
      const KvBytes b = c.bytes();
      v.n_past = c.n_past();
      v.bytes = b.total();
      v.bytes_dense = static_cast<size_t>(v.n_past) * bytes_per_token(s->k, s->v);
      v.reserved = reserved(*s, v.bytes);
      room += v.reserved - v.bytes;
      if (s->job) active += v.reserved;
      v.layer_bytes = b.per_layer;
      v.head_bytes = b.per_head;
      held.push_back(b);
      for (int il = 0; il < hp.n_layer; ++il)
        for (int ih = 0; ih < hp.n_head_kv; ++ih) v.head_tokens.push_back(c.n_tokens(il, ih));
    }
    views.push_back(std::move(v));
  }
  size_t bases = 0;
  const size_t total = held_once(held, &bases);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.slots = std::move(views);
  stats_.kv_bytes_held = total;
  stats_.kv_bases_held = bases;
  stats_.kv_bytes_reserved = total + room;
  stats_.kv_bytes_reserved_active = active;
  while (!recent_.empty() && recent_.front().t < now - 10) recent_.pop_front();
  int64_t p = 0, d = 0;
  for (const Recent& r : recent_) p += r.prefill, d += r.decode;
  const double span = recent_.empty() ? 1 : std::max(1.0, now - recent_.front().t);
  stats_.recent_prefill_tps = static_cast<double>(p) / span;
  stats_.recent_decode_tps = static_cast<double>(d) / span;
  last_publish_ = now;
  views_dirty_ = false;
}

}  // namespace kvtrim::server
