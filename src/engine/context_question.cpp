#include "engine/context_question.h"

#include "core/error.h"

namespace kvtrim {

SplitPrompt tokenize_chat_split(const Tokenizer& tok, const ChatPromptSplit& sp) {
  SplitPrompt p;
  p.context = encode_prompt(tok, sp.head);
  p.question = tok.encode(sp.tail, false, true);
  return p;
}

ContextCompression compress_context(Session& s, const std::vector<int32_t>& question, const ContextCompressOptions& o) {
  KVTRIM_CHECK(s.press() != nullptr, "compress_context: no press set on this session");
  ContextCompression r;
  r.n_context = s.n_past();
  if (r.n_context == 0) {
    r.note = "not compressed: no context before the question";
    return r;
  }
  if (r.n_context < o.min_tokens) {
    r.note = strprintf("not compressed: the context has %lld tokens, fewer than the %lld a press needs to run "
                       "(--press-min-tokens)",
                       static_cast<long long>(r.n_context), static_cast<long long>(o.min_tokens));
    return r;
  }
  const Press& press = *s.press();
  try {
    // query-aware: the question's queries first (its tokens are dropped again), as eval does
    if (press.needs().question && !question.empty()) {
      s.observe_question(question);
      r.saw_question = true;
    }
    const Budget* tb = press.token_budget();
    if (o.follow_up && tb && tb->n_keep <= 0 && tb->ratio > 0) {
      Budget b;
      b.n_keep = tb->keep_count(s.n_past());
      r.stats = s.compress(b);
    } else {
      r.stats = s.compress();
    }
  } catch (const Error& e) {
    if (!o.skip_on_error) throw;
    r.note = std::string("not compressed: ") + e.what();
    r.saw_question = false;
    r.failed = true;
    return r;
  }
  r.ran = true;
  return r;
}

}  // namespace kvtrim
