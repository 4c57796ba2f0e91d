#include "engine/context_question.h"

#include <cmath>
#include <memory>
#include <optional>

#include "core/error.h"
#include "engine/limit_error.h"
#include "press/press_spec.h"

namespace kvtrim {

SplitPrompt tokenize_chat_split(const Tokenizer& tok, const ChatPromptSplit& sp) {
  SplitPrompt p;
  p.context = encode_prompt(tok, sp.head);
  p.question = tok.encode(sp.tail, false, true);
  return p;
}

std::string max_loss_problem(double x, const std::string& what) {
  if (std::isnan(x) || x < 0 || x > 1)
    return strprintf("'%s' must be a loss estimate in [0, 1] (got %g): 0 refuses any loss, 1 turns the guard off",
                     what.c_str(), x);
  return {};
}

namespace {

// One compression with `press`; a follow-up turn keeps the press's ratio of every position the
// context spans (ContextCompressOptions::follow_up).
CompressStats compress_once(Session& s, const Press& press, bool follow_up) {
  const Budget* tb = press.token_budget();
  if (follow_up && tb && tb->n_keep <= 0 && tb->ratio > 0) {
    Budget b;
    b.n_keep = tb->keep_count(s.n_past());
    return s.compress_with(press, b);
  }
  return s.compress_with(press);
}

// The press's string parsed, when it is one the registry makes (a press written in Python, or a
// composition holding one, is not: the guard then has no ratio to halve).
std::optional<PressSpec> parsed_spec(const Press& p) {
  if (p.spec().empty()) return std::nullopt;
  try {
    return parse_press_spec(p.spec());
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::string attempts_text(const std::vector<CompressAttempt>& as) {
  std::string t;
  for (const CompressAttempt& a : as)
    t += strprintf("%s%s: %.4f", t.empty() ? "" : ", ", a.press.c_str(), a.loss.rel_err);
  return t;
}

}  // namespace

ContextCompression compress_context(Session& s, const std::vector<int32_t>& question, const ContextCompressOptions& o) {
  KVTRIM_CHECK(s.press() != nullptr, "compress_context: no press set on this session");
  const std::string bad = max_loss_problem(o.max_loss, "max_loss");
  KVTRIM_CHECK(bad.empty(), "compress_context: %s", bad.c_str());
  const bool guard = o.max_loss < 1;
  KVTRIM_CHECK(!guard || s.params().press_loss,
               "compress_context: a loss limit needs the session's loss estimate (SessionParams::press_loss)");
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
  std::unique_ptr<Session::State> before;  // the guard's copy of the uncompressed context
  try {
    // the question's queries first (its tokens are dropped again), as eval does: for a
    // query-aware press, and for the loss estimate (which a press that is not query-aware ignores)
    const bool aware = press.needs().question;
    const bool observe = aware ? o.press_sees_question : s.params().press_loss;
    if (observe && !question.empty()) {
      try {
        s.observe_question(question);
        r.saw_question = aware;
      } catch (const LimitError&) {
        if (aware) throw;  // for the estimate alone: without room for it, the window's queries serve
      }
    }
    std::optional<PressSpec> spec;  // the press the guard weakens
    if (guard) {
      spec = parsed_spec(press);
      s.prepare_compress();  // a re-feed pass once, in the copy: every retry shares it
      before = std::make_unique<Session::State>(s.save_state());
    }
    std::unique_ptr<Press> weaker;  // the retry's press
    const Press* cur = &press;
    for (int attempt = 0;; ++attempt) {
      if (attempt > 0) s.restore_state(*before);
      const CompressStats st = compress_once(s, *cur, o.follow_up);
      CompressAttempt a;
      a.press = cur->spec();
      const std::optional<PressSpec> parsed = parsed_spec(*cur);
      a.ratio = parsed ? press_spec_ratio(*parsed)
                       : cur->token_budget() && cur->token_budget()->n_keep <= 0 ? cur->token_budget()->ratio : -1.0;
      a.loss = st.loss;
      a.accepted = !guard || !st.loss.measured || st.loss.rel_err <= o.max_loss;
      r.attempts.push_back(a);
      if (a.accepted) {
        r.stats = st;
        break;
      }
      if (attempt == kMaxLossRetries || !spec || !halve_press_ratios(&*spec)) {
        s.restore_state(*before);
        r.refused = true;
        r.saw_question = false;
        r.note = strprintf("not compressed: the loss estimate exceeded the limit %g at every attempt (%s)%s", o.max_loss,
                           attempts_text(r.attempts).c_str(),
                           attempt < kMaxLossRetries ? "; the press has no ratio to halve" : "");
        return r;
      }
      weaker = make_press(*spec);
      cur = weaker.get();
    }
  } catch (const Error& e) {
    if (before) s.restore_state(*before);
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
