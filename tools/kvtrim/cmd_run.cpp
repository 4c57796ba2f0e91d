// kvtrim run: generate a continuation of a prompt, or answer questions about a document; prints
// the text to stdout as it is produced, then (stderr) prefill and decode tokens/s and the KV
// bytes held. With --press the cache is compressed after the context's prefill — the document
// (--context), the conversation before the last user turn (--chat), or a raw prompt but its last
// --press-protect tokens — never the question: the question is prefilled after the compression,
// uncompressed, at the positions that continue the context's (kvpress's protocol, as `kvtrim
// eval`; src/engine/context_question.h). With several -p, the document is prefilled and
// compressed once and every question starts from that compressed document (the earlier
// questions and answers are not in the cache). --press-every also compresses while decoding.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli.h"
#include "core/error.h"
#include "core/timer.h"

namespace kvtrim::cli {

namespace {
struct RunOptions {
  CommonOptions common;
  PressOptions press;
  std::vector<std::string> questions;  // -p / --prompt / --question (several: one document, many questions)
  std::string prompt_file;
  std::string context;  // --context FILE|TEXT
  int64_t protect = 0;  // --press-protect (raw prompts)
  bool protect_given = false;
  int n_predict = 128;
  SamplerParams sampling;
  bool chat = false;
  std::string system;
  bool echo = false;
};

void add_sampling_options(CLI::App* c, SamplerParams& s) {
  c->add_option("--temp", s.temperature, "sampling temperature (0 = greedy)")->capture_default_str()->check(CLI::NonNegativeNumber);
  c->add_option("--top-k", s.top_k, "top-k cut (0 = off)")->capture_default_str()->check(CLI::NonNegativeNumber);
  c->add_option("--top-p", s.top_p, "nucleus cut (1 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  c->add_option("--seed", s.seed, "random seed")->capture_default_str();
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// The prompts of a run: one context (compressed) shared by every question (protected).
struct RunPrompts {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> questions;
  std::string protected_what;  // what the protected tail is, for the report
};

// How the prompt is laid out (docs/presses.md "Context and question"):
//  --chat: one user turn, content = context + "\n\n" + question (the context trimmed of spaces at
//    its ends); cut where the question starts (split_chat_prompt): the context part = the
//    template's beginning (system prompt, the user turn's header) + the context; the protected
//    part = "\n\n" + the question + the end of the user turn + the generation prompt. Without
//    --context the cut is where the user message starts.
//  raw with --context: the context, then "\n\n" + the question.
//  raw without --context: the prompt's last --press-protect tokens are protected (default 0:
//    the whole prompt is the context, as kvpress's pipeline does with no question).
RunPrompts build_prompts(const RunOptions& o, const Model& model, const std::vector<std::string>& questions,
                         const std::string& context) {
  const Tokenizer& tok = model.tokenizer();
  RunPrompts r;
  const bool has_context = !o.context.empty();
  const std::string ctx = trim(context);
  if (o.chat) {
    for (const std::string& q : questions) {
      std::vector<ChatMessage> msgs;
      if (!o.system.empty()) msgs.push_back({"system", o.system});
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
    for (const std::string& q : questions) r.questions.push_back(tok.encode("\n\n" + q, false, false));
    r.protected_what = "the question";
  } else {
    KVTRIM_CHECK(questions.size() == 1, "several prompts need --context or --chat (one context, many questions)");
    std::vector<int32_t> all = tok.encode(questions[0], tok.add_bos(), false);
    KVTRIM_CHECK(!all.empty(), "the prompt is empty");
    const size_t n_protect = static_cast<size_t>(std::min<int64_t>(o.protect, static_cast<int64_t>(all.size())));
    r.context.assign(all.begin(), all.end() - static_cast<std::ptrdiff_t>(n_protect));
    r.questions.emplace_back(all.end() - static_cast<std::ptrdiff_t>(n_protect), all.end());
    r.protected_what = strprintf("the prompt's last %lld tokens, --press-protect", static_cast<long long>(n_protect));
  }
  return r;
}

void print_piece(const std::string& piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

void run(const RunOptions& o) {
  KVTRIM_CHECK(o.questions.empty() != o.prompt_file.empty(), "give -p QUESTION (one or more) or -f FILE, not both");
  KVTRIM_CHECK(!o.protect_given || (!o.chat && o.context.empty()),
               "--press-protect is for raw prompts: with --context or --chat the question is what is protected");
  std::vector<std::string> questions = o.questions;
  if (!o.prompt_file.empty()) questions = {read_file(o.prompt_file)};
  // --context: a file when one by that name exists, else the text itself
  std::string context;
  if (!o.context.empty()) {
    std::error_code ec;
    context = std::filesystem::is_regular_file(o.context, ec) ? read_file(o.context) : o.context;
    if (context == o.context && o.context.find_first_of(" \n") == std::string::npos)
      std::fprintf(stderr, "note: there is no file '%s': --context is that text\n", o.context.c_str());
    KVTRIM_CHECK(!trim(context).empty(), "the --context is empty");
  }
  if (!o.press.spec.empty()) make_press(o.press.spec);  // a bad --press fails before the model loads
  auto model = load_model(o.common);
  const RunPrompts rp = build_prompts(o, *model, questions, context);
  for (const auto& q : rp.questions) KVTRIM_CHECK(!q.empty() || !rp.context.empty(), "the prompt is empty");

  SessionParams params = session_params(o.common);
  params.press_loss = press_loss_on(o.press);
  Session s(*model, params);
  install_press(s, o.press, /*after_prefill=*/false);  // the context is compressed here, before the question
  const bool query_aware = s.press() && s.press()->needs().question;
  KVTRIM_CHECK(!query_aware || !rp.questions[0].empty(),
               "press %s is query-aware: it needs a question (--context DOC -p QUESTION, --chat, or --press-protect N)",
               o.press.spec.c_str());
  ContextCompressOptions co;
  co.min_tokens = o.press.min_tokens;
  co.max_loss = o.press.max_loss;

  if (o.echo) {
    if (!context.empty()) std::fputs((context + "\n\n").c_str(), stdout);
    if (questions.size() == 1) std::fputs(questions[0].c_str(), stdout);
  }
  const double t0 = now_seconds();
  if (!rp.context.empty()) s.prefill(rp.context);
  const double context_s = now_seconds() - t0;
  ContextCompression cc;
  if (s.press() && !query_aware) cc = compress_context(s, {}, co);  // once, for every question
  // Each question starts from the document as compressed (query-aware: as prefilled, compressed
  // again with that question's queries): a copy of the cache, not a second prefill.
  std::unique_ptr<Session::State> saved;
  if (rp.questions.size() > 1) saved = std::make_unique<Session::State>(s.save_state());

  for (size_t qi = 0; qi < rp.questions.size(); ++qi) {
    const std::vector<int32_t>& q = rp.questions[qi];
    if (qi > 0) s.restore_state(*saved);
    if (s.press() && query_aware) cc = compress_context(s, q, co);
    if (rp.questions.size() > 1) {
      std::printf("%sQ%zu: %s\nA%zu:", qi ? "\n" : "", qi + 1, trim(questions[qi]).c_str(), qi + 1);
      std::fflush(stdout);
    }
    GenerateParams gp;
    gp.max_new_tokens = o.n_predict;
    gp.sampling = o.sampling;
    const size_t n_log = s.compress_log().size();
    auto r = s.generate(q, gp, [](int32_t, const std::string& piece) {
      print_piece(piece);
      return true;
    });
    std::fputc('\n', stdout);
    std::fflush(stdout);
    const int64_t n_prompt = static_cast<int64_t>(rp.context.size() + q.size());
    const double prefill_s = r.prefill_s + (qi == 0 ? context_s : 0);
    std::fprintf(stderr,
                 "%sprompt: %lld tokens (context %zu%s + question %zu), prefill %.1f tokens/s | generated %zu tokens, "
                 "decode %.1f tokens/s | stop: %s\n",
                 rp.questions.size() > 1 ? strprintf("[Q%zu] ", qi + 1).c_str() : "", static_cast<long long>(n_prompt),
                 rp.context.size(), qi > 0 ? ", prefilled once" : "", q.size(),
                 prefill_s > 0 ? static_cast<double>(qi == 0 ? n_prompt : static_cast<int64_t>(q.size())) / prefill_s : 0,
                 r.tokens.size(), r.decode_tps(), stop_reason_name(r.stop));
    if (s.press() && (qi == 0 || query_aware))
      std::fprintf(stderr, "%s\n",
                   context_compress_line(*s.press(), cc, static_cast<int64_t>(q.size()), rp.protected_what).c_str());
    for (size_t i = n_log; i < s.compress_log().size(); ++i)  // --press-every, while decoding
      std::fprintf(stderr, "%s\n", compress_line(*s.press(), s.compress_log()[i], "while decoding: ").c_str());
    std::fprintf(stderr, "%s\n", kv_bytes_line(s.cache()).c_str());
  }
}
}  // namespace

void add_sampling_options_to(CLI::App* c, SamplerParams& s) { add_sampling_options(c, s); }

void register_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* c = app.add_subcommand(
      "run",
      "generate a continuation of a prompt, or answer questions about a document (--context DOC -p Q1 -p Q2): with "
      "--press the context is compressed, the question is not");
  add_common_options(c, o->common);
  add_press_options(c, o->press);
  add_press_min_tokens_option(c, o->press);
  add_press_guard_options(c, o->press);
  c->add_option("-p,--prompt,--question", o->questions,
                "the prompt, or with --context the question (not compressed); give several -p to ask several questions "
                "about one --context (prefilled and compressed once)");
  c->add_option("-f,--file", o->prompt_file, "read the prompt from a file");
  c->add_option("--context", o->context,
                "a document to compress before the question: a file if one by that name exists, else the text itself");
  auto* protect = c->add_option("--press-protect", o->protect,
                                "raw prompt (no --chat / --context): its last N tokens are not compressed (default 0: "
                                "the whole prompt is the context, as kvpress with no question)")
                      ->check(CLI::NonNegativeNumber);
  c->add_option("-n,--n-predict", o->n_predict, "maximum tokens to generate")->capture_default_str()->check(CLI::NonNegativeNumber);
  add_sampling_options(c, o->sampling);
  c->add_flag("--chat", o->chat,
              "wrap the prompt in the model's chat template as a user turn (with --context: the document, then the "
              "question); with --press the user turn's question and the generation prompt are not compressed");
  c->add_option("--system", o->system, "system message (with --chat)");
  c->add_flag("--echo", o->echo, "print the prompt before the continuation");
  c->callback([o, protect] {
    o->protect_given = protect->count() > 0;
    run(*o);
  });
}

}  // namespace kvtrim::cli
