// The re-feed passes (refeed.h), Session::prepare_compress among them.
// Dependencies: refeed -> session -> press_runner (refeed.cpp is part of the session layer).
#include "engine/refeed.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/timer.h"
#include "engine/limit_error.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace kvtrim {

std::vector<RefeedChunk> context_refeed_chunks(const std::vector<int32_t>& context, int64_t chunk) {
  KVTRIM_CHECK(chunk >= 0, "re-feed chunk %lld must be >= 0", static_cast<long long>(chunk));
  const int64_t n = static_cast<int64_t>(context.size());
  const int64_t c = chunk > 0 ? std::min(chunk, std::max<int64_t>(n, 1)) : std::max<int64_t>(n, 1);
  std::vector<RefeedChunk> out;
  for (int64_t i = 0; i < n; i += c) {
    RefeedChunk ch;
    ch.tokens.assign(context.begin() + i, context.begin() + i + std::min(n - i, c));
    ch.lo = 0;
    ch.hi = static_cast<int32_t>(n);
    out.push_back(std::move(ch));
  }
  return out;
}

KvzipPrompts kvzip_prompts(const Model& model) {
  const Tokenizer& tok = model.tokenizer();
  KvzipPrompts p;
  p.first = tok.encode("\n\nRepeat the previous context exactly.", false, false);
  p.next = tok.encode("\n\nRepeat the part of the previous context exactly, starting with", false, false);
  // The reference: the text after a user turn in the chat template ("\n" without a template).
  if (model.gguf().get_string("tokenizer.chat_template", "").empty()) {
    p.suffix = tok.encode("\n", false, false);
  } else {
    static constexpr const char* kMark = "\x01kvzip-user\x01";
    const std::string r = model.chat_template().render({{"user", kMark}}, true);
    const size_t at = r.find(kMark);
    KVTRIM_CHECK(at != std::string::npos, "kvzip: cannot split the chat template of %s around the user message",
                 model.gguf().path().c_str());
    p.suffix = tok.encode(r.substr(at + std::string(kMark).size()), false, true);
  }
  return p;
}

std::vector<RefeedChunk> kvzip_refeed_chunks(const KvzipPrompts& p, const std::vector<int32_t>& context, int64_t chunk,
                                             int sinks) {
  KVTRIM_CHECK(chunk > 0, "kvzip: chunk %lld must be > 0", static_cast<long long>(chunk));
  KVTRIM_CHECK(sinks >= 0, "kvzip: sinks %d must be >= 0", sinks);
  const int64_t n = static_cast<int64_t>(context.size());
  std::vector<RefeedChunk> out;
  for (int64_t lo = std::min<int64_t>(sinks, n); lo < n; lo += std::min(n - lo, chunk)) {
    const int64_t hi = lo + std::min(n - lo, chunk);
    RefeedChunk ch;
    if (out.empty()) {
      ch.tokens = p.first;
    } else {
      ch.tokens = p.next;
      const int64_t from = std::max<int64_t>(lo - kKvzipOverlap, out.back().lo);
      ch.tokens.insert(ch.tokens.end(), context.begin() + from, context.begin() + lo);
    }
    ch.tokens.insert(ch.tokens.end(), p.suffix.begin(), p.suffix.end());
    ch.tokens.insert(ch.tokens.end(), context.begin() + lo, context.begin() + hi);
    ch.lo = static_cast<int32_t>(lo);
    ch.hi = static_cast<int32_t>(hi);
    out.push_back(std::move(ch));
  }
  return out;
}

RefeedPlan plan_refeed(const Model& model, const RefeedNeeds& rn, const std::vector<int32_t>& context,
                       int64_t n_ctx) {
  RefeedPlan plan;
  if (!rn.any()) return plan;
  const int64_t n_context = static_cast<int64_t>(context.size());
  // The pass appends one chunk at a time after the context: it needs that much room. A chunk
  // larger than the room left is cut down to it (a perplexity window's session holds exactly
  // the window; decode-time compressions re-feed a growing context): smaller chunks change the
  // scores a little (docs/presses-kvcompose.md, presses-kvzip.md).
  const int64_t room = n_ctx - n_context;
  const KvzipPrompts zp = rn.kvzip ? kvzip_prompts(model) : KvzipPrompts{};
  const int64_t zip_extra =
      static_cast<int64_t>(std::max(zp.first.size(), zp.next.size() + kKvzipOverlap) + zp.suffix.size());
  constexpr int64_t kMinChunk = 16;
  plan.ctx_chunk = rn.context_chunk > 0 ? rn.context_chunk : n_context;
  plan.zip_chunk = rn.kvzip_chunk;
  if ((rn.context && plan.ctx_chunk > room) || (rn.kvzip && plan.zip_chunk + zip_extra > room)) {
    if ((rn.context && room < kMinChunk) || (rn.kvzip && room - zip_extra < kMinChunk))
      throw LimitError(strprintf(
          "re-feed: %lld context tokens leave %lld tokens of the context limit of %lld for the re-feed pass, fewer "
          "than a chunk of %lld (+ %lld prompt tokens for kvzip); use a larger --ctx",
          static_cast<long long>(n_context), static_cast<long long>(room), static_cast<long long>(n_ctx),
          static_cast<long long>(kMinChunk), static_cast<long long>(rn.kvzip ? zip_extra : 0)));
    if (rn.context && plan.ctx_chunk > room) plan.ctx_chunk = room;
    if (rn.kvzip && plan.zip_chunk + zip_extra > room) plan.zip_chunk = room - zip_extra;
    plan.cut = true;
  }
  if (rn.context) plan.ctx_chunks = context_refeed_chunks(context, plan.ctx_chunk);
  if (rn.kvzip) plan.zip_chunks = kvzip_refeed_chunks(zp, context, plan.zip_chunk, rn.kvzip_sinks);
  for (const auto* v : {&plan.ctx_chunks, &plan.zip_chunks})
    for (const RefeedChunk& c : *v) plan.longest = std::max(plan.longest, static_cast<int64_t>(c.tokens.size()));
  return plan;
}

int64_t refeed_peak_tokens(const Model& model, const RefeedNeeds& rn, int64_t n_context, int64_t n_ctx) {
  if (!rn.any() || n_context <= 0) return 0;
  // the chunks' sizes depend on the context's length only
  return plan_refeed(model, rn, std::vector<int32_t>(static_cast<size_t>(n_context), 0), n_ctx).longest;
}

void Session::prepare_compress() {
  if (!observer_) return;
  const RefeedNeeds& rn = observer_->needs().refeed;
  if (!rn.any() || observer_->refeed_current()) return;
  const int32_t n_context = n_past();
  KVTRIM_CHECK(n_context > 0, "re-feed: the context is empty");
  KVTRIM_CHECK(static_cast<int32_t>(history_.size()) == n_context,
               "re-feed: the session knows %zu of its %d context tokens (a state restored without its tokens?)",
               history_.size(), n_context);
  const RefeedPlan plan = plan_refeed(model_, rn, history_, n_ctx_);
  if (plan.cut)
    KVTRIM_LOG_WARN("re-feed: %d context tokens leave %lld of the context limit of %lld: re-feed chunks cut to %lld "
                    "(context) / %lld (kvzip) tokens, smaller than asked (refeed_chunk / chunk); a larger --ctx avoids it",
                    n_context, static_cast<long long>(n_ctx_ - n_context), static_cast<long long>(n_ctx_),
                    static_cast<long long>(rn.context ? plan.ctx_chunk : 0),
                    static_cast<long long>(rn.kvzip ? plan.zip_chunk : 0));
  const std::vector<RefeedChunk>& ctx_chunks = plan.ctx_chunks;
  const std::vector<RefeedChunk>& zip_chunks = plan.zip_chunks;
  const int64_t longest = plan.longest;
  KVTRIM_ASSERT(static_cast<int64_t>(n_context) + longest <= n_ctx_);
  check_memory(longest);
  for (const RefeedChunk& c : zip_chunks) check_tokens(c.tokens.data(), static_cast<int64_t>(c.tokens.size()));

  const double t0 = now_seconds();
  size_t rss_peak = 0;
  std::vector<float> scratch(static_cast<size_t>(model_.hparams().n_vocab));
  observer_->start_refeed(rn.context, rn.kvzip, rn.kvzip_sinks);  // results current only at the end
  auto run = [&](PressObserver::RefeedMode mode, const RefeedChunk& c) {
    observer_->begin_refeed(mode, c.lo, c.hi);
    try {
      const int64_t n = static_cast<int64_t>(c.tokens.size());
      for (int64_t i = 0; i < n; i += p_.n_batch) {
        const int64_t m = std::min<int64_t>(p_.n_batch, n - i);
        model_.forward(c.tokens.data() + i, m, n_past(), *cache_, scratch.data(), false, pool_, observer_.get());
      }
    } catch (...) {
      observer_->end_refeed();
      cache_->truncate(n_context);
      observer_->reset_refeed();
      throw;
    }
    observer_->end_refeed();
    rss_peak = std::max(rss_peak, process_rss_bytes());
    cache_->truncate(n_context);  // the chunk's tokens go; the context is as it was
  };
  for (const RefeedChunk& c : ctx_chunks) run(PressObserver::RefeedMode::kContext, c);
  for (const RefeedChunk& c : zip_chunks) run(PressObserver::RefeedMode::kKvzip, c);
  observer_->finish_refeed();
  ++n_refeeds_;
  refeed_s_ = now_seconds() - t0;
  refeed_rss_peak_ = rss_peak;
}

}  // namespace kvtrim
