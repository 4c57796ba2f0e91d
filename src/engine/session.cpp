// Session (session.h). Dependencies: session -> press_runner, press_loss (never back).
#include "engine/session.h"

#include <algorithm>

#include "core/error.h"
#include "core/memory.h"
#include "core/timer.h"
#include "engine/limit_error.h"
#include "engine/press_loss.h"
#include "engine/press_runner.h"

namespace kvtrim {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kMaxTokens: return "max_tokens";
    case StopReason::kEog: return "end_of_generation";
    case StopReason::kStopString: return "stop_string";
    case StopReason::kContextFull: return "context_full";
    case StopReason::kCallback: return "stopped";
  }
  return "?";
}

double GenerateResult::decode_tps() const {
  // The first generated token comes from the prefill's logits; every further one is a decode step.
  const double n = static_cast<double>(tokens.size());
  return decode_s > 0 && n > 1 ? (n - 1) / decode_s : 0;
}

Session::Session(const Model& model, SessionParams p)
    : model_(model), p_(p), n_ctx_(p.n_ctx > 0 ? p.n_ctx : model.hparams().n_ctx_train),
      own_pool_(p.pool ? nullptr : std::make_unique<ThreadPool>(p.n_threads)),
      pool_(p.pool ? p.pool : own_pool_.get()) {
  const int64_t train = model.hparams().n_ctx_train;
  KVTRIM_CHECK(n_ctx_ > 0, "context size must be positive (got %lld)", static_cast<long long>(n_ctx_));
  KVTRIM_CHECK(n_ctx_ <= train,
               "context size %lld exceeds the model's limit of %lld tokens (%s.context_length)",
               static_cast<long long>(n_ctx_), static_cast<long long>(train), arch_name(model.hparams().arch));
  KVTRIM_CHECK(p_.n_batch > 0, "batch size must be positive (got %d)", p_.n_batch);
  KvCacheConfig cfg = model.cache_config(n_ctx_);
  cfg.dtype = p_.kv_dtype;
  cfg.dtype_k = p_.kv_dtype_k;
  cfg.dtype_v = p_.kv_dtype_v;
  cfg.rotate_quantized = p_.kv_rotate;
  cache_ = make_kv_cache(cfg);
  logits_.resize(static_cast<size_t>(model.hparams().n_vocab));
  if (p_.n_ctx > 0) check_memory(n_ctx_);
}

Session::~Session() = default;

void Session::check_room(int64_t n_new) const {
  // Memory: every multi-token step (prefill chunks, questions), and decode only every 256
  // positions, so that a decode step does not read /proc each time.
  if (n_new > 1 || (n_past() & 255) == 0) check_memory(n_new > 1 ? n_new : 256);
  const int64_t need = static_cast<int64_t>(n_past()) + n_new;
  if (need > n_ctx_)
    throw LimitError(strprintf("context full: %lld tokens in context + %lld new = %lld exceeds the context limit of "
                               "%lld tokens (model limit %d; set --ctx up to it)",
                               static_cast<long long>(n_past()), static_cast<long long>(n_new),
                               static_cast<long long>(need), static_cast<long long>(n_ctx_),
                               model_.hparams().n_ctx_train));
}

// The uncompressed bytes of n_new more tokens against the limit (SessionParams::kv_mem_limit).
// At construction (n_past 0, n_new = n_ctx) this is the whole context.
void Session::check_memory(int64_t n_new) const {
  if (p_.kv_mem_limit < 0 || n_new <= 0) return;
  const KvCacheConfig& cfg = cache_->config();
  const size_t per_token = cfg.dense_bytes_per_token();
  const size_t need = static_cast<size_t>(n_new) * per_token;
  size_t room;
  std::string what;
  if (p_.kv_mem_limit > 0) {
    const size_t held = cache_->bytes().total();
    const size_t lim = static_cast<size_t>(p_.kv_mem_limit);
    room = lim > held ? lim - held : 0;
    what = strprintf("the KV memory limit of %s (%s held)", format_bytes(lim).c_str(), format_bytes(held).c_str());
  } else {
    const char* source = nullptr;
    room = available_memory_bytes(&source);
    if (room == 0) return;  // unknown: nothing to check against
    what = strprintf("the %s available (%s)", format_bytes(room).c_str(), source);
  }
  if (need <= room) return;
  const bool whole = n_past() == 0 && n_new == n_ctx_;
  throw LimitError(strprintf("%s %lld tokens would need %s of uncompressed KV cache (%s keys / %s values: %s per token over %d "
       "layers x %d kv heads), more than %s; use a smaller %s, a quantized cache (-ctk / -ctv q8_0 or q4_0), or "
       "--mem-limit to set the limit (--mem-limit off: no check)",
       whole ? "a context of" : "adding", static_cast<long long>(n_new), format_bytes(need).c_str(),
       kv_dtype_name(cfg.type_k()), kv_dtype_name(cfg.type_v()), format_bytes(per_token).c_str(), cfg.n_layer,
       cfg.n_head_kv, what.c_str(), whole ? "--ctx" : "prompt or --ctx"));
}

void Session::check_tokens(const int32_t* tokens, int64_t n) const {
  const int32_t n_vocab = model_.hparams().n_vocab;
  for (int64_t i = 0; i < n; ++i)
    KVTRIM_CHECK(tokens[i] >= 0 && tokens[i] < n_vocab, "token id %d out of range [0, %d)", tokens[i], n_vocab);
}

const std::vector<float>& Session::prefill(const std::vector<int32_t>& tokens) {
  KVTRIM_CHECK(!tokens.empty(), "prefill needs at least one token");
  check_room(static_cast<int64_t>(tokens.size()));
  check_tokens(tokens.data(), static_cast<int64_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(p_.n_batch)) {
    const int64_t n = std::min<int64_t>(p_.n_batch, static_cast<int64_t>(tokens.size() - i));
    step_batch({SessionChunk{this, tokens.data() + i, n, false}});
  }
  return logits_;
}

const std::vector<float>& Session::decode(int32_t token) {
  step_batch({SessionChunk{this, &token, 1, true}});
  return logits_;
}

void Session::before_step(bool decode) {
  if (!decode || !observer_) return;
  // Attention statistics of decode tokens matter only if decoding itself compresses.
  observer_->set_accumulate(sched_.decode_every > 0);
  // Decode steps are planned by plan_decode (after_step), never by the after-append hook.
  observer_->set_hooks(false);
}

// The observer's settings outside a decode step (before_step changes them for one).
void Session::restore_observer() {
  if (!observer_) return;
  observer_->set_accumulate(true);
  observer_->set_hooks(hooks_);
}

void Session::after_step(bool decode) {
  if (!decode) {
    update_from_ = n_past();  // the press has seen the prompt (after-append plans, or compress())
    decode_steps_ = 0;
    return;
  }
  restore_observer();
  if (press_ && hooks_) {
    const int every = press_->decode_interval();
    if (every > 0 && ++decode_steps_ % every == 0) decode_update();
  }
}

void Session::step_batch(const std::vector<SessionChunk>& chunks) {
  KVTRIM_CHECK(!chunks.empty(), "step_batch: no chunks");
  const Session& s0 = *chunks[0].session;
  std::vector<ForwardSeq> seqs;
  seqs.reserve(chunks.size());
  for (const SessionChunk& c : chunks) {
    Session& s = *c.session;
    KVTRIM_CHECK(&s.model_ == &s0.model_ && s.pool_ == s0.pool_,
                 "step_batch: the sessions must share the model and the thread pool");
    KVTRIM_CHECK(c.n > 0 && (!c.decode || c.n == 1), "step_batch: a %s chunk of %lld tokens",
                 c.decode ? "decode" : "prefill", static_cast<long long>(c.n));
    for (const SessionChunk& d : chunks)
      KVTRIM_CHECK(&d == &c || d.session != c.session, "step_batch: a session appears twice in one batch");
    s.check_room(c.n);
    s.check_tokens(c.tokens, c.n);
    seqs.push_back(ForwardSeq{c.tokens, c.n, s.n_past(), s.cache_.get(), s.logits_.data(), false, s.observer_.get()});
  }
  for (const SessionChunk& c : chunks) c.session->before_step(c.decode);
  try {
    s0.model_.forward_batch(seqs, s0.pool_);
  } catch (...) {
    for (const SessionChunk& c : chunks) c.session->restore_observer();  // nothing else
    throw;
  }
  for (const SessionChunk& c : chunks) {
    c.session->history_.insert(c.session->history_.end(), c.tokens, c.tokens + c.n);
    c.session->after_step(c.decode);
  }
}

// The press's periodic decode-time plan (OjaKV: Oja step on the buffer, new basis epoch).
void Session::decode_update() {
  PressContext ctx(*cache_, model_.hparams(), observer_ ? &observer_->observations() : nullptr, pool_);
  ctx.set_model(&model_);
  ctx.set_new_from(update_from_);
  ctx.set_decode_step(decode_steps_);
  apply_plan(press_->plan_decode(ctx), *cache_, observer_.get());
  update_from_ = n_past();
  ++n_updates_;
}

void Session::set_press_hooks(bool on) {
  hooks_ = on;
  if (observer_) observer_->set_hooks(on);
}

void Session::eval_all(const int32_t* tokens, int64_t n, float* logits) {
  check_room(n);
  const size_t n_vocab = static_cast<size_t>(model_.hparams().n_vocab);
  for (int64_t i = 0; i < n; i += p_.n_batch) {
    const int64_t m = std::min<int64_t>(p_.n_batch, n - i);
    model_.forward(tokens + i, m, n_past(), *cache_, logits + static_cast<size_t>(i) * n_vocab, true, pool_,
                   observer_.get());
    history_.insert(history_.end(), tokens + i, tokens + i + m);
  }
  update_from_ = n_past();
  decode_steps_ = 0;
}

void Session::reset() {
  // reset(), not clear(): the next context must not inherit a head's basis (OjaKV's adapted
  // to the last context; a static one would encode the full-cache pass of eval ppl).
  cache_->reset();
  history_.clear();
  refeed_s_ = 0;  // a pass of the old context is not the next compress's
  refeed_rss_peak_ = 0;
  if (observer_) observer_->reset();
  compress_log_.clear();
  decode_steps_ = 0;
  update_from_ = 0;
  n_updates_ = 0;
}

void Session::set_press(std::unique_ptr<Press> press, PressSchedule sched, const PressNeeds& extra) {
  KVTRIM_CHECK(sched.decode_every >= 0 && (sched.decode_every == 0 || sched.decode_target > 0),
               "press schedule: decode compression every %d steps needs a positive target (got %lld)",
               sched.decode_every, static_cast<long long>(sched.decode_target));
  press_ = std::move(press);
  sched_ = sched;
  observer_.reset();
  if (press_) {
    PressNeeds needs = press_->needs();
    needs.merge(extra);
    observer_ = make_observer(*cache_, needs);
  }
  decode_steps_ = 0;
  update_from_ = n_past();
}

// The one place a session's observer is made (set_press, set_observer, restore_state): over
// `cache`, capturing `needs`, on the session's pool, with the press's after-append hook.
std::unique_ptr<PressObserver> Session::make_observer(const KvCache& cache, const PressNeeds& press_needs) const {
  PressNeeds needs = press_needs;
  if (p_.press_loss) {  // the loss estimate's queries: the window, and a question when one is observed
    needs.window = std::max(needs.window, kLossWindow);
    needs.question = true;  // only captured; a press reads it only when it is query-aware itself
  }
  auto obs = std::make_unique<PressObserver>(model_, cache, needs);
  obs->set_pool(pool_);
  if (press_ && press_->plans_after_append()) obs->set_after_append_press(press_.get());
  obs->set_hooks(hooks_);
  return obs;
}

// Every compression of the session: the passes its press needs, the plan and its application,
// the pass's time and peak RSS (once, the compress after it), the loss estimate (press_loss),
// the log.
CompressStats Session::run_compress(const Press& press, const Budget* budget_override) {
  prepare_compress();
  std::unique_ptr<PressLossProbe> probe;
  if (p_.press_loss && observer_)
    probe = std::make_unique<PressLossProbe>(model_, *cache_, &observer_->observations(), pool_);
  CompressStats st = run_press(press, *cache_, model_, observer_.get(), pool_, budget_override);
  if (probe) st.loss = probe->finish(*cache_);
  st.refeed_seconds = refeed_s_;
  st.refeed_rss_peak = refeed_rss_peak_;
  refeed_s_ = 0;
  refeed_rss_peak_ = 0;
  compress_log_.push_back(st);
  return st;
}

CompressStats Session::compress() {
  KVTRIM_CHECK(press_ != nullptr, "compress: no press set on this session");
  return run_compress(*press_, nullptr);
}

CompressStats Session::compress(const Budget& budget_override) {
  KVTRIM_CHECK(press_ != nullptr, "compress: no press set on this session");
  return run_compress(*press_, &budget_override);
}

void Session::observe_question(const std::vector<int32_t>& question) {
  KVTRIM_CHECK(observer_ != nullptr, "observe_question: no press (or observer) set on this session");
  KVTRIM_CHECK(!question.empty(), "observe_question: empty question");
  check_room(static_cast<int64_t>(question.size()));
  const int32_t p0 = n_past();
  std::vector<float> saved = logits_;
  observer_->begin_question();
  try {
    for (size_t i = 0; i < question.size(); i += static_cast<size_t>(p_.n_batch)) {
      const int64_t n = std::min<int64_t>(p_.n_batch, static_cast<int64_t>(question.size() - i));
      model_.forward(question.data() + i, n, n_past(), *cache_, logits_.data(), false, pool_, observer_.get());
    }
  } catch (...) {
    observer_->end_question();
    cache_->truncate(p0);
    throw;
  }
  observer_->end_question();
  cache_->truncate(p0);
  logits_ = std::move(saved);
}

const Observations* Session::observations() const { return observer_ ? &observer_->observations() : nullptr; }

void Session::truncate(int32_t pos) {
  cache_->truncate(pos);
  if (pos >= 0 && static_cast<size_t>(pos) < history_.size()) history_.resize(static_cast<size_t>(pos));
  if (observer_) observer_->on_truncate(pos);
  update_from_ = std::min(update_from_, pos);
}

GenerateResult Session::generate(const std::vector<int32_t>& prompt, const GenerateParams& gp,
                                 const std::function<bool(int32_t, const std::string&)>& on_token) {
  GenerateResult r;
  r.n_prompt = static_cast<int64_t>(prompt.size());
  const Tokenizer& tok = model_.tokenizer();
  const int32_t n_vocab = model_.hparams().n_vocab;
  double t0 = now_seconds();
  if (!prompt.empty()) {
    prefill(prompt);
    if (press_ && sched_.after_prefill) compress();
  } else {
    KVTRIM_CHECK(n_past() > 0, "generate: empty prompt and empty context");
  }
  r.prefill_s = now_seconds() - t0;
  Sampler sampler(gp.sampling);
  t0 = now_seconds();
  for (int i = 0; i < gp.max_new_tokens; ++i) {
    const int32_t id = sampler.sample(logits_.data(), n_vocab);
    if (gp.stop_at_eog && tok.is_eog(id)) {
      r.stop = StopReason::kEog;
      break;
    }
    r.tokens.push_back(id);
    const std::string piece = tok.token_to_piece(id);
    r.text += piece;
    if (on_token && !on_token(id, piece)) {
      r.stop = StopReason::kCallback;
      break;
    }
    bool hit = false;
    for (const auto& s : gp.stop_strings)
      if (!s.empty() && r.text.size() >= s.size() && r.text.compare(r.text.size() - s.size(), s.size(), s) == 0) hit = true;
    if (hit) {
      r.stop = StopReason::kStopString;
      break;
    }
    if (i + 1 == gp.max_new_tokens) break;  // no need to run the last token
    if (n_past() >= n_ctx_) {
      r.stop = StopReason::kContextFull;
      break;
    }
    decode(id);
    if (press_ && sched_.decode_every > 0 && (i + 1) % sched_.decode_every == 0) {
      int64_t most = 0;
      for (int il = 0; il < cache_->config().n_layer; ++il)
        for (int ih = 0; ih < cache_->config().n_head_kv; ++ih) most = std::max(most, cache_->n_tokens(il, ih));
      if (most > sched_.decode_target) {
        Budget b;
        b.n_keep = sched_.decode_target;
        run_compress(*press_, &b);
      }
    }
  }
  r.decode_s = now_seconds() - t0;
  return r;
}

}  // namespace kvtrim

// ---- Sweeps (Session::State) ----
namespace kvtrim {

void Session::set_observer(const PressNeeds& needs) {
  press_.reset();
  sched_ = PressSchedule{};
  observer_ = make_observer(*cache_, needs);
}

CompressStats Session::compress_with(const Press& press) {
  return run_compress(press, nullptr);
}

CompressStats Session::compress_with(const Press& press, const Budget& budget_override) {
  return run_compress(press, &budget_override);
}

Session::State Session::save_state() const {
  State st;
  st.cache = cache_->clone();
  st.has_observer = observer_ != nullptr;
  if (observer_) st.observations = observer_->observations();
  st.logits = logits_;
  st.history = history_;
  st.decode_steps = decode_steps_;
  st.update_from = update_from_;
  return st;
}

void Session::restore_state(const State& st) {
  KVTRIM_CHECK(st.cache != nullptr, "restore_state: the state holds no cache");
  KVTRIM_CHECK(st.has_observer == (observer_ != nullptr),
               "restore_state: the state was saved %s an observer, the session has %s", st.has_observer ? "with" : "without",
               observer_ ? "one" : "none");
  std::unique_ptr<KvCache> c = st.cache->clone();
  if (observer_) {
    // The observer keeps a reference to the cache it observes: rebuild it over the new one.
    auto obs = make_observer(*c, observer_->needs());
    obs->restore(st.observations);
    observer_ = std::move(obs);
  }
  cache_ = std::move(c);
  logits_ = st.logits;
  history_ = st.history;
  refeed_s_ = 0;
  refeed_rss_peak_ = 0;
  compress_log_.clear();
  decode_steps_ = st.decode_steps;
  update_from_ = st.update_from;
}

}  // namespace kvtrim
