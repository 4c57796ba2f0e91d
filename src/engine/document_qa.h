// One document, many questions (kvpress's and KVzip's "compress once, query many"), shared by
// `kvtrim run` and the Python module's generate / pipeline: how a context and its questions are
// laid out as tokens (the context compressed, each question protected; docs/presses.md "Context
// and question"), and the loop that prefills the context once, compresses it once (a query-aware
// press: once per question, with that question's queries) and answers every question from that
// compressed context (a copy of the cache per question, not a second prefill).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/context_question.h"
#include "engine/session.h"
#include "model/model.h"

namespace kvtrim {

struct PromptRequest {
  std::vector<std::string> questions;  // at least one (may be empty text with a context)
  std::string context;                 // "" = none
  bool chat = false;                   // wrap in the model's chat template as one user turn
  std::string system;                  // system message (chat only)
  int64_t protect = 0;                 // raw prompt without context: its last N tokens are protected
};

// The prompts of a run: one context (compressed) shared by every question (protected).
struct PromptLayout {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> questions;
  std::string protected_what;  // what the protected tail is, for reports
};

// How the prompt is laid out:
//  chat: one user turn, content = context + "\n\n" + question (the context trimmed of spaces at
//    its ends); cut where the question starts (split_chat_prompt): the context part = the
//    template's beginning (system prompt, the user turn's header) + the context; the protected
//    part = "\n\n" + the question + the end of the user turn + the generation prompt. Without a
//    context the cut is where the user message starts.
//  raw with a context: the context (with BOS), then "\n\n" + the question.
//  raw without a context: the prompt's last `protect` tokens are protected (0: the whole prompt
//    is the context, as kvpress's pipeline does with no question).
// Throws Error: no question, several questions without a context or chat, an empty prompt.
PromptLayout layout_prompts(const Model& model, const PromptRequest& r);

struct QaAnswer {
  GenerateResult result;
  ContextCompression compression;  // the context's (the same for every question unless query-aware)
  size_t first_compress_log = 0;   // compress_log() entries from here on: made while decoding
  size_t end_compress_log = 0;
};

struct QaRun {
  std::vector<QaAnswer> answers;
  double context_s = 0;  // the context's prefill time (once for every question)
};

struct QaOptions {
  GenerateParams gen;
  ContextCompressOptions compress;
  // Called before question qi is prefilled (after the context's prefill and compression).
  std::function<void(size_t qi)> on_question;
  // Each generated piece of question qi; false stops that answer (StopReason::kCallback).
  std::function<bool(size_t qi, int32_t id, const std::string& piece)> on_token;
  // Called when question qi's answer is complete, the session still holding it (its cache, its
  // compress log), before the next question starts.
  std::function<void(size_t qi, const QaAnswer& a, const QaRun& run)> on_answer;
  // Polled between the context's prefill chunks; true abandons the run (Error "interrupted").
  std::function<bool()> interrupted;
};

// Prefills `tokens` chunk by chunk (n_batch), polling `interrupted` (may be empty) before each
// chunk: false when it stopped there (the chunks before stay in the cache). The whole prompt is
// checked against the context limit before anything runs (Error naming the numbers).
bool prefill_chunks(Session& s, const std::vector<int32_t>& tokens, const std::function<bool()>& interrupted);

// Runs the layout on a session holding nothing (reset first when it does). With a press on the
// session it must have been installed with after_prefill = false (the context is compressed
// here). A query-aware press needs a non-empty question.
QaRun answer_questions(Session& s, const PromptLayout& layout, const QaOptions& o);

}  // namespace kvtrim
