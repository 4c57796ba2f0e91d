#include "engine/document_qa.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "core/strings.h"
#include "core/timer.h"

namespace kvtrim {

PromptLayout layout_prompts(const Model& model, const PromptRequest& req) {
  const Tokenizer& tok = model.tokenizer();
  KVTRIM_CHECK(!req.questions.empty(), "no prompt or question given");
  PromptLayout r;
  const bool has_context = !req.context.empty();
  const std::string ctx = trim_space(req.context);
  KVTRIM_CHECK(!has_context || !ctx.empty(), "the context is empty");
  if (req.chat) {
    for (const std::string& q : req.questions) {
      std::vector<ChatMessage> msgs;
      if (!req.system.empty()) msgs.push_back({"system", req.system});
      msgs.push_back({"user", has_context ? ctx + "\n\n" + q : q});
      const SplitPrompt sp =
          tokenize_chat_split(tok, split_chat_prompt(model.chat_template(), msgs, true, has_context ? ctx.size() : 0));
      if (r.questions.empty()) r.context = sp.context;
      KVTRIM_CHECK(sp.context == r.context, "the chat template renders the document differently for each question");
      r.questions.push_back(sp.question);
    }
    r.protected_what = "the question, the end of the user turn and the generation prompt";
  } else if (has_context) {
    r.context = tok.encode(ctx, tok.add_bos(), false);
    for (const std::string& q : req.questions) r.questions.push_back(tok.encode("\n\n" + q, false, false));
    r.protected_what = "the question";
  } else {
    KVTRIM_CHECK(req.questions.size() == 1, "several questions need a context or the chat template (one context, many questions)");
    KVTRIM_CHECK(req.protect >= 0, "the protected tail must be >= 0 tokens (got %lld)", static_cast<long long>(req.protect));
    std::vector<int32_t> all = tok.encode(req.questions[0], tok.add_bos(), false);
    KVTRIM_CHECK(!all.empty(), "the prompt is empty");
    const size_t n_protect = static_cast<size_t>(std::min<int64_t>(req.protect, static_cast<int64_t>(all.size())));
    r.context.assign(all.begin(), all.end() - static_cast<std::ptrdiff_t>(n_protect));
    r.questions.emplace_back(all.end() - static_cast<std::ptrdiff_t>(n_protect), all.end());
    r.protected_what = strprintf("the prompt's last %lld tokens", static_cast<long long>(n_protect));
  }
  for (const auto& q : r.questions) KVTRIM_CHECK(!q.empty() || !r.context.empty(), "the prompt is empty");
  return r;
}

bool prefill_chunks(Session& s, const std::vector<int32_t>& tokens, const std::function<bool()>& interrupted) {
  const int64_t need = s.n_past() + static_cast<int64_t>(tokens.size());
  KVTRIM_CHECK(need <= s.n_ctx(), "the prompt of %zu tokens after %d held exceeds the context limit of %lld tokens",
               tokens.size(), s.n_past(), static_cast<long long>(s.n_ctx()));
  const size_t chunk = static_cast<size_t>(std::max(1, s.params().n_batch));
  for (size_t at = 0; at < tokens.size(); at += chunk) {
    if (interrupted && interrupted()) return false;
    const size_t end = std::min(tokens.size(), at + chunk);
    s.prefill(std::vector<int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(at),
                                   tokens.begin() + static_cast<std::ptrdiff_t>(end)));
  }
  return true;
}

QaRun answer_questions(Session& s, const PromptLayout& layout, const QaOptions& o) {
  KVTRIM_CHECK(!layout.questions.empty(), "no question to answer");
  const bool query_aware = s.press() && s.press()->needs().question;
  KVTRIM_CHECK(!query_aware || !layout.questions[0].empty(),
               "press %s is query-aware: it needs a question (a context and a question, the chat template, or a "
               "protected tail)",
               s.press()->spec().c_str());
  // The whole prompt must fit before anything runs (prefill_chunks checks the context alone).
  size_t longest = 0;
  for (const auto& q : layout.questions) longest = std::max(longest, q.size());
  const int64_t need = static_cast<int64_t>(layout.context.size() + longest);
  KVTRIM_CHECK(need <= s.n_ctx(), "the prompt (%lld tokens: context %zu + question %zu) exceeds the context limit of %lld tokens",
               static_cast<long long>(need), layout.context.size(), longest, static_cast<long long>(s.n_ctx()));
  if (s.n_past() > 0) s.reset();
  QaRun run;
  const double t0 = now_seconds();
  if (!prefill_chunks(s, layout.context, o.interrupted)) throw Error("interrupted");
  run.context_s = now_seconds() - t0;
  ContextCompression cc;
  if (s.press() && !query_aware) {  // once, for every question; the first one for the loss estimate only
    ContextCompressOptions co = o.compress;
    co.press_sees_question = false;
    cc = compress_context(s, layout.questions[0], co);
  }
  std::unique_ptr<Session::State> saved;
  if (layout.questions.size() > 1) saved = std::make_unique<Session::State>(s.save_state());
  for (size_t qi = 0; qi < layout.questions.size(); ++qi) {
    const std::vector<int32_t>& q = layout.questions[qi];
    if (qi > 0) s.restore_state(*saved);
    if (s.press() && query_aware) cc = compress_context(s, q, o.compress);
    if (o.on_question) o.on_question(qi);
    QaAnswer a;
    a.compression = cc;
    a.first_compress_log = s.compress_log().size();
    a.result = s.generate(q, o.gen, [&](int32_t id, const std::string& piece) {
      return o.on_token ? o.on_token(qi, id, piece) : true;
    });
    a.end_compress_log = s.compress_log().size();
    run.answers.push_back(std::move(a));
    if (o.on_answer) o.on_answer(qi, run.answers.back(), run);
  }
  return run;
}

}  // namespace kvtrim
