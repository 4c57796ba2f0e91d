// Scheduler::submit: a request checked and turned into a job (its prompt and protected tail,
// press, cache types, token limits) or refused with the 4xx / 503 naming why.
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

size_t Scheduler::bytes_per_token(KvDtype k, KvDtype v) const {
  std::lock_guard<std::mutex> lk(bpt_mu_);
  const auto key = std::make_pair(static_cast<int>(k), static_cast<int>(v));
  auto it = bpt_.find(key);
  if (it != bpt_.end()) return it->second;
  // Measured, not computed: 64 tokens appended to an empty cache of these types.
  KvCacheConfig cfg = model_.cache_config(64);
  cfg.dtype_k = k;
  cfg.dtype_v = v;
  cfg.rotate_quantized = opt_.kv_rotate;
  auto c = make_kv_cache(cfg);
  const auto& hp = model_.hparams();
  std::vector<float> kk(static_cast<size_t>(64) * hp.n_head_kv * hp.head_dim_k, 0.5f);
  std::vector<float> vv(static_cast<size_t>(64) * hp.n_head_kv * hp.head_dim_v, 0.5f);
  std::vector<int32_t> pos(64);
  for (int i = 0; i < 64; ++i) pos[i] = i;
  for (int il = 0; il < hp.n_layer; ++il) c->append(il, 64, kk.data(), vv.data(), pos.data());
  const size_t b = (c->bytes().total() + 63) / 64;
  bpt_[key] = b;
  return b;
}

std::shared_ptr<Job> Scheduler::submit(const CompletionRequest& r) {
  const Tokenizer& tok = model_.tokenizer();
  auto j = std::make_shared<Job>();
  if (r.endpoint == Endpoint::kChat) {
    // "last_turn" (no kv_press_protect): the last user turn and the generation prompt are the
    // protected tail, the prompt tokenized in those two parts; else the prompt whole
    bool has_user = false;
    for (const ChatMessage& m : r.messages) has_user = has_user || m.role == "user";
    try {
      if (!r.cache.protect && has_user) {
        const SplitPrompt sp = tokenize_chat_split(tok, split_chat_prompt(model_.chat_template(), r.messages, true, 0, r.chat));
        j->prompt = sp.context;
        j->prompt.insert(j->prompt.end(), sp.question.begin(), sp.question.end());
        j->compress_at = sp.context.size();
      } else {
        j->prompt = encode_prompt(tok, model_.chat_template().render(r.messages, true, r.chat));
        j->compress_at = j->prompt.size();
      }
    } catch (const Error& e) {
      throw ApiError(400, std::string("messages: ") + e.what(), "messages");
    }
  } else if (r.has_prompt_tokens) {
    j->prompt = r.prompt_tokens;
    for (int32_t t : j->prompt)
      if (t >= model_.hparams().n_vocab)
        throw ApiError(400, strprintf("prompt token id %d is out of the vocabulary [0, %d)", t, model_.hparams().n_vocab),
                       "prompt");
  } else {
    j->prompt = tok.encode(r.prompt, tok.add_bos(), false);
  }
  if (j->prompt.empty()) throw ApiError(400, "the prompt is empty", r.endpoint == Endpoint::kChat ? "messages" : "prompt");
  const int64_t n_prompt = static_cast<int64_t>(j->prompt.size());
  if (r.endpoint != Endpoint::kChat) j->compress_at = j->prompt.size();  // "last_turn": no turns, nothing protected
  if (r.cache.protect) {
    if (*r.cache.protect > n_prompt)
      throw ApiError(400,
                     strprintf("'kv_press_protect' %lld is more than the prompt's %lld tokens",
                               static_cast<long long>(*r.cache.protect), static_cast<long long>(n_prompt)),
                     "kv_press_protect");
    j->compress_at = static_cast<size_t>(n_prompt - *r.cache.protect);
  }
  if (n_prompt >= opt_.n_ctx)
    throw ApiError(400,
                   strprintf("the prompt has %lld tokens; the server's context is %lld tokens per conversation "
                             "(prompt + max_tokens must fit)",
                             static_cast<long long>(n_prompt), static_cast<long long>(opt_.n_ctx)),
                   r.endpoint == Endpoint::kChat ? "messages" : "prompt", "context_length_exceeded");
  if (r.max_tokens) {
    if (n_prompt + *r.max_tokens > opt_.n_ctx)
      throw ApiError(400,
                     strprintf("the prompt's %lld tokens + max_tokens %d = %lld exceed the server's context of %lld "
                               "tokens per conversation",
                               static_cast<long long>(n_prompt), *r.max_tokens,
                               static_cast<long long>(n_prompt + *r.max_tokens), static_cast<long long>(opt_.n_ctx)),
                     "max_tokens", "context_length_exceeded");
    j->max_tokens = *r.max_tokens;
  } else {
    j->max_tokens = static_cast<int>(std::min<int64_t>(opt_.default_max_tokens, opt_.n_ctx - n_prompt));
  }
  j->sampling = r.sampling;
  if (!r.has_seed) j->sampling.seed = static_cast<uint64_t>(now_seconds() * 1e6);
  j->stop = r.stop;
  j->press = r.cache.press ? *r.cache.press : opt_.press;
  j->max_loss = r.cache.max_loss ? *r.cache.max_loss : opt_.press_max_loss;
  if (r.cache.max_loss && *r.cache.max_loss < 1 && !opt_.press_loss)
    throw ApiError(400, "'kv_press_max_loss' needs the loss estimate, which this server was started without "
                        "(--no-loss-estimate)", "kv_press_max_loss");
  if (!j->press.empty()) {
    PressNeeds n = make_press(j->press)->needs();
    if (pressure_press_) {
      // the slot's observer serves both presses: they must agree on the passes they share
      // (a re-feed's chunk size), or the request is refused here rather than failing in its slot
      try {
        n.merge(pressure_press_->needs());
      } catch (const Error& e) {
        throw ApiError(400, std::string("kv_press '") + j->press + "' cannot run beside the server's pressure press '" +
                                pressure_press_->spec() + "': " + e.what(),
                       "kv_press");
      }
    }
    // the compression after the prompt runs the observer's re-feed passes: their chunk sits
    // in the cache beside the prompt for a moment
    try {
      j->refeed_peak = refeed_peak_tokens(model_, n.refeed, n_prompt, opt_.n_ctx);
    } catch (const LimitError& e) {
      throw ApiError(400, std::string("kv_press '") + j->press + "': " + e.what(), "kv_press",
                     "context_length_exceeded");
    }
  }
  j->k = r.cache.k.value_or(opt_.kv_k);
  j->v = r.cache.v.value_or(opt_.kv_v);
  j->t_submit = now_seconds();
  if (opt_.kv_budget > 0) {
    const size_t alone = static_cast<size_t>(n_prompt + peak_beside_prompt(*j)) * bytes_per_token(j->k, j->v);
    if (alone > opt_.kv_budget) {
      std::lock_guard<std::mutex> lk(mu_);
      ++stats_.rejected_budget;
      throw ApiError(503,
                     strprintf("this request needs up to %zu bytes of KV cache (%lld prompt + %lld %s tokens at "
                               "%zu bytes each, %s) and the server's --kv-budget is %zu bytes; lower max_tokens, "
                               "shorten the prompt%s or use a smaller kv_cache_type",
                               alone, static_cast<long long>(n_prompt), static_cast<long long>(peak_beside_prompt(*j)),
                               j->refeed_peak > j->max_tokens ? "re-feed chunk (kv_press's second pass)" : "max_tokens",
                               bytes_per_token(j->k, j->v), kv_pair_name(j->k, j->v).c_str(), opt_.kv_budget,
                               j->refeed_peak > j->max_tokens ? ", use a smaller refeed_chunk / chunk" : ""),
                     {}, "kv_budget_exceeded");
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) throw ApiError(503, "the server is shutting down", {}, "shutting_down");
    const int free_slots = opt_.n_parallel - n_busy_.load();
    if (static_cast<int>(queue_.size()) >= opt_.max_queue + std::max(free_slots, 0)) {
      ++stats_.rejected_queue;
      throw ApiError(503, strprintf("the server is busy: %zu requests are waiting (--queue %d)", queue_.size(), opt_.max_queue),
                     {}, "queue_full");
    }
    queue_.push_back(j);
    stats_.queue_length = queue_.size();
  }
  cv_.notify_all();
  return j;
}

}  // namespace kvtrim::server
