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
#include "core/strings.h"
#include "core/timer.h"
#include "engine/document_qa.h"

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
    KVTRIM_CHECK(!trim_space(context).empty(), "the --context is empty");
  }
  if (!o.press.spec.empty()) make_press(o.press.spec);  // a bad --press fails before the model loads
  auto model = load_model(o.common);
  KVTRIM_CHECK(questions.size() == 1 || o.chat || !context.empty(),
               "several prompts need --context or --chat (one context, many questions)");
  PromptRequest req;
  req.questions = questions;
  req.context = context;
  req.chat = o.chat;
  req.system = o.system;
  req.protect = o.protect;
  PromptLayout rp = layout_prompts(*model, req);
  if (!o.chat && context.empty()) rp.protected_what += ", --press-protect";

  SessionParams params = session_params(o.common);
  params.press_loss = press_loss_on(o.press);
  Session s(*model, params);
  install_press(s, o.press, /*after_prefill=*/false);  // the context is compressed before the question
  const bool query_aware = s.press() && s.press()->needs().question;
  KVTRIM_CHECK(!query_aware || !rp.questions[0].empty(),
               "press %s is query-aware: it needs a question (--context DOC -p QUESTION, --chat, or --press-protect N)",
               o.press.spec.c_str());
  QaOptions qo;
  qo.compress.min_tokens = o.press.min_tokens;
  qo.compress.max_loss = o.press.max_loss;
  qo.gen.max_new_tokens = o.n_predict;
  qo.gen.sampling = o.sampling;
  qo.on_question = [&](size_t qi) {
    if (rp.questions.size() > 1) {
      std::printf("%sQ%zu: %s\nA%zu:", qi ? "\n" : "", qi + 1, trim_space(questions[qi]).c_str(), qi + 1);
      std::fflush(stdout);
    }
  };
  // The report of question qi, as soon as its answer is complete.
  const auto report = [&](size_t qi, const QaAnswer& a, double context_s) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
    const GenerateResult& r = a.result;
    const size_t nq = rp.questions[qi].size();
    const int64_t n_prompt = static_cast<int64_t>(rp.context.size() + nq);
    const double prefill_s = r.prefill_s + (qi == 0 ? context_s : 0);
    std::fprintf(stderr,
                 "%sprompt: %lld tokens (context %zu%s + question %zu), prefill %.1f tokens/s | generated %zu tokens, "
                 "decode %.1f tokens/s | stop: %s\n",
                 rp.questions.size() > 1 ? strprintf("[Q%zu] ", qi + 1).c_str() : "", static_cast<long long>(n_prompt),
                 rp.context.size(), qi > 0 ? ", prefilled once" : "", nq,
                 prefill_s > 0 ? static_cast<double>(qi == 0 ? n_prompt : static_cast<int64_t>(nq)) / prefill_s : 0,
                 r.tokens.size(), r.decode_tps(), stop_reason_name(r.stop));
    if (s.press() && (qi == 0 || query_aware))
      std::fprintf(stderr, "%s\n",
                   context_compress_line(*s.press(), a.compression, static_cast<int64_t>(nq), rp.protected_what).c_str());
    for (size_t i = a.first_compress_log; i < a.end_compress_log; ++i)  // --press-every, while decoding
      std::fprintf(stderr, "%s\n", compress_line(*s.press(), s.compress_log()[i], "while decoding: ").c_str());
    std::fprintf(stderr, "%s\n", kv_bytes_line(s.cache()).c_str());
  };
  if (o.echo) {
    if (!context.empty()) std::fputs((context + "\n\n").c_str(), stdout);
    if (questions.size() == 1) std::fputs(questions[0].c_str(), stdout);
  }
  qo.on_token = [](size_t, int32_t, const std::string& piece) {
    print_piece(piece);
    return true;
  };
  qo.on_answer = [&](size_t qi, const QaAnswer& a, const QaRun& r) { report(qi, a, r.context_s); };
  answer_questions(s, rp, qo);
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
