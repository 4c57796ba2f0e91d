// Context and question apart (DESIGN.md §8; kvpress's protocol, DESIGN.md §5): what a press
// compresses is the context — a document, the earlier turns of a conversation — never the
// question being answered. The session holds the context (and nothing after it) when
// compress_context runs; the question — the protected tail: the last user turn and the chat
// template's generation prompt, or a document's question — is prefilled after the compression,
// uncompressed, at the positions that continue the context's uncompressed length. A query-aware
// press (query_aware=true: PressNeeds::question) sees the question's queries first
// (Session::observe_question), exactly as `kvtrim eval` runs it: run, chat, serve and the
// evaluation harness share this one function. With the session's loss estimate on
// (SessionParams::press_loss) the question is observed for any press, and the estimate is
// measured on its queries (src/engine/press_loss.h); a press that is not query-aware does not
// read them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/press_runner.h"
#include "engine/session.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace kvtrim {

// A prompt cut into the part a press may compress and the protected tail.
struct SplitPrompt {
  std::vector<int32_t> context;   // compressed (empty: nothing before the question)
  std::vector<int32_t> question;  // protected: prefilled after the compression
};

// Tokenizes a chat prompt cut by split_chat_prompt: the head with BOS, the tail without, both
// parsing special tokens as a whole-prompt encode does, so the cut is a token boundary. (For
// ChatML and Gemma the cut follows "\n" or a special token, where the byte-level pre-tokenizers
// cut anyway: the tokens equal the whole prompt's.)
SplitPrompt tokenize_chat_split(const Tokenizer& tok, const ChatPromptSplit& sp);

struct ContextCompressOptions {
  // A context of fewer positions is not compressed (ContextCompression::note says so). Default
  // 32: the observation window of SnapKV, PyramidKV, ThinK, SPARK and OjaKV (the last 32
  // queries); a shorter context is all window — on a chat turn only the template and the system
  // prompt — so there is nothing worth ranking (the CLI's --press-min-tokens, serve's default).
  int64_t min_tokens = 32;
  // The context holds an earlier compression (a conversation's follow-up turn): a press with a
  // ratio budget (Press::token_budget) keeps its ratio of every position the context spans
  // (Budget::n_keep = keep_count(n_past) per (layer, kv head)), not of what earlier turns left,
  // so early turns are not compressed again and again.
  bool follow_up = false;
  // An Error from the press (a pass that does not fit, a press that cannot run on this context)
  // becomes the note, the cache unchanged (chat, serve: a conversation goes on); false: it
  // propagates (run, eval).
  bool skip_on_error = false;
  // The quality guard (run/chat/serve --press-max-loss, a request's kv_press_max_loss), in
  // [0, 1] (check_max_loss). Below 1: the session's copy of the context is saved first; when a
  // compression's loss estimate (CompressStats::loss.rel_err, src/engine/press_loss.h) exceeds
  // it, the cache is restored from that copy and the press retried with half its ratio
  // (halve_press_ratios: every press of a composition that has a ratio), at most
  // kMaxLossRetries times; when every attempt exceeds it, or the press has no ratio to halve,
  // the context is left uncompressed (the note says so). 1 = off: no copy, no retry (an
  // estimate of 1 means the probe queries' attention output is as far off as it is large). Needs
  // SessionParams::press_loss.
  double max_loss = 1;
  // false: the question is not the press's to see (one compression shared by several questions:
  // eval's and run's query-agnostic protocol gives the first question) — it is observed only
  // for the loss estimate, and only when the press is not query-aware (a query-aware press must
  // not score with it; it then fails for want of a question, as without one).
  bool press_sees_question = true;
};

constexpr int kMaxLossRetries = 2;

// "" when x is a valid loss limit (a number in [0, 1]), else what is wrong with it, naming
// `what` (the option or field).
std::string max_loss_problem(double x, const std::string& what);

// One compression tried on the context.
struct CompressAttempt {
  std::string press;      // its canonical spec
  double ratio = -1;      // press_spec_ratio (-1: the press has none)
  PressLoss loss;         // its estimate
  bool accepted = false;  // kept (the last attempt, unless the guard refused them all)
};

struct ContextCompression {
  bool ran = false;
  std::string note;          // why nothing ran ("" when it ran)
  std::vector<CompressAttempt> attempts;  // every compression tried, in order (empty: none ran)
  bool refused = false;      // the guard refused every attempt: the context is uncompressed
  int64_t n_context = 0;     // positions of the context (the compressed part)
  bool saw_question = false;  // the press scored with the question's queries (a query-aware press)
  bool failed = false;       // the press threw and skip_on_error made it the note
  CompressStats stats;       // when it ran: tokens and bytes of the context, all (layer, kv head)
};

// Compresses what the session holds — the context, before `question` is prefilled — with the
// session's press (Session::compress). `question` (may be empty) is what a query-aware press
// sees (ContextCompressOptions::press_sees_question) and what the loss estimate is measured on
// (SessionParams::press_loss); it is not left in the cache. Throws Error without a press.
ContextCompression compress_context(Session& s, const std::vector<int32_t>& question,
                                    const ContextCompressOptions& o = {});

}  // namespace kvtrim
