// kvtrim run: generate a continuation of a prompt; prints the text to stdout as it is
// produced, then (stderr) prefill and decode tokens/s and the KV bytes held. With --press the
// cache is compressed after the prompt's prefill (and, with --press-every, while decoding).
#include <cstdio>

#include "cli.h"
#include "core/error.h"

namespace kvtrim::cli {

namespace {
struct RunOptions {
  CommonOptions common;
  PressOptions press;
  std::string prompt;
  std::string prompt_file;
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

void run(const RunOptions& o) {
  KVTRIM_CHECK(o.prompt.empty() != o.prompt_file.empty(), "give exactly one of -p PROMPT or -f FILE");
  const std::string text = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
  if (!o.press.spec.empty()) make_press(o.press.spec);  // a bad --press fails before the model loads
  auto model = load_model(o.common);
  const Tokenizer& tok = model->tokenizer();
  std::vector<int32_t> prompt;
  if (o.chat) {
    std::vector<ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", text});
    prompt = tok.encode(apply_chat_template(model->gguf(), msgs, true), tok.add_bos(), true);
  } else {
    prompt = tok.encode(text, tok.add_bos(), false);
  }
  KVTRIM_CHECK(!prompt.empty(), "the prompt is empty");
  Session s(*model, session_params(o.common));
  install_press(s, o.press);
  GenerateParams gp;
  gp.max_new_tokens = o.n_predict;
  gp.sampling = o.sampling;
  if (o.echo) std::fputs(text.c_str(), stdout);
  auto r = s.generate(prompt, gp, [](int32_t, const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "prompt: %lld tokens, prefill %.1f tokens/s | generated %zu tokens, decode %.1f tokens/s | stop: %s\n",
               static_cast<long long>(r.n_prompt), r.prefill_tps(), r.tokens.size(), r.decode_tps(),
               stop_reason_name(r.stop));
  for (const auto& st : s.compress_log()) std::fprintf(stderr, "%s\n", compress_line(*s.press(), st).c_str());
  std::fprintf(stderr, "%s\n", kv_bytes_line(s.cache()).c_str());
}
}  // namespace

void add_sampling_options_to(CLI::App* c, SamplerParams& s) { add_sampling_options(c, s); }

void register_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* c = app.add_subcommand("run", "generate a continuation of a prompt");
  add_common_options(c, o->common);
  add_press_options(c, o->press);
  c->add_option("-p,--prompt", o->prompt, "prompt text");
  c->add_option("-f,--file", o->prompt_file, "read the prompt from a file");
  c->add_option("-n,--n-predict", o->n_predict, "maximum tokens to generate")->capture_default_str()->check(CLI::NonNegativeNumber);
  add_sampling_options(c, o->sampling);
  c->add_flag("--chat", o->chat, "wrap the prompt in the model's chat template as a user turn");
  c->add_option("--system", o->system, "system message (with --chat)");
  c->add_flag("--echo", o->echo, "print the prompt before the continuation");
  c->callback([o] { run(*o); });
}

}  // namespace kvtrim::cli
