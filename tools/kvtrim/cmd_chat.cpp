// kvtrim chat: an interactive conversation using the model's chat template. Each turn
// re-renders the conversation, keeps the cached prefix that is unchanged and prefills only
// the new tokens. Lines starting with '/' are commands: /reset, /quit.
// With --press, the whole cache (earlier turns included, already compressed or not) is
// compressed after each turn's prefill, before the reply is generated; the kept tokens keep
// their positions, so the unchanged-prefix reuse still works by position.
#include <cstdio>
#include <iostream>

#include "cli.h"
#include "core/error.h"

namespace kvtrim::cli {

void add_sampling_options_to(CLI::App* c, SamplerParams& s);

namespace {
struct ChatOptions {
  CommonOptions common;
  PressOptions press;
  std::string system;
  int n_predict = 512;
  SamplerParams sampling{0.7f, 40, 0.95f, 42};
};

void chat(const ChatOptions& o) {
  if (!o.press.spec.empty()) make_press(o.press.spec);  // a bad --press fails before the model loads
  auto model = load_model(o.common);
  const Tokenizer& tok = model->tokenizer();
  Session s(*model, session_params(o.common));
  install_press(s, o.press);
  std::vector<ChatMessage> msgs;
  if (!o.system.empty()) msgs.push_back({"system", o.system});
  std::vector<int32_t> cached;  // tokens currently in the KV cache
  std::fprintf(stderr, "chat with %s; /reset clears the conversation, /quit or EOF ends\n", model->hparams().name.c_str());
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    std::fflush(stderr);
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      msgs.resize(o.system.empty() ? 0 : 1);
      s.reset();
      cached.clear();
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({"user", line});
    std::vector<int32_t> all = tok.encode(apply_chat_template(model->gguf(), msgs, true), tok.add_bos(), true);
    size_t common = 0;
    while (common < cached.size() && common < all.size() && cached[common] == all[common]) ++common;
    if (common == all.size()) --common;  // always run at least one token to get logits
    s.truncate(static_cast<int32_t>(common));
    const size_t n_log = s.compress_log().size();
    std::vector<int32_t> fresh(all.begin() + static_cast<std::ptrdiff_t>(common), all.end());
    if (static_cast<int64_t>(all.size()) + o.n_predict > s.n_ctx()) {
      std::fprintf(stderr, "(the conversation is longer than the context of %lld tokens; /reset to start over)\n",
                   static_cast<long long>(s.n_ctx()));
      msgs.pop_back();
      continue;
    }
    GenerateParams gp;
    gp.max_new_tokens = o.n_predict;
    gp.sampling = o.sampling;
    auto r = s.generate(fresh, gp, [](int32_t, const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputc('\n', stdout);
    std::fflush(stdout);
    cached = all;
    cached.insert(cached.end(), r.tokens.begin(), r.tokens.end());
    // The last sampled token was not run through the model; drop it from what is cached.
    if (!r.tokens.empty() && static_cast<int32_t>(cached.size()) > s.n_past()) cached.resize(static_cast<size_t>(s.n_past()));
    msgs.push_back({"assistant", r.text});
    for (size_t i = n_log; i < s.compress_log().size(); ++i)
      std::fprintf(stderr, "[%s]\n", compress_line(*s.press(), s.compress_log()[i]).c_str());
    std::fprintf(stderr, "[%zu tokens, %.1f tokens/s; %s]\n", r.tokens.size(), r.decode_tps(),
                 kv_bytes_line(s.cache()).c_str());
  }
}
}  // namespace

void register_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  CLI::App* c = app.add_subcommand("chat", "interactive chat with the model's chat template");
  add_common_options(c, o->common);
  add_press_options(c, o->press);
  c->add_option("--system", o->system, "system message");
  c->add_option("-n,--n-predict", o->n_predict, "maximum tokens per reply")->capture_default_str();
  add_sampling_options_to(c, o->sampling);
  c->callback([o] { chat(*o); });
}

}  // namespace kvtrim::cli
