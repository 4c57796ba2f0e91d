// kvtrim chat: an interactive conversation using the model's chat template. Each turn
// re-renders the conversation, keeps the cached prefix that is unchanged and prefills only
// the new tokens. Lines starting with '/' are commands: /reset, /quit.
// With --press, a new user turn is never compressed before it is answered: each turn prefills
// the conversation before it (earlier turns, the system prompt), compresses that — once it spans
// --press-min-tokens positions; a follow-up keeps the press's ratio of every position, not of
// what earlier turns left (src/engine/context_question.h) — then prefills the user turn and the
// generation prompt uncompressed and answers. The kept tokens keep their positions, so the
// unchanged-prefix reuse still works by position.
#include <algorithm>
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
  SessionParams params = session_params(o.common);
  params.press_loss = press_loss_on(o.press);
  Session s(*model, params);
  install_press(s, o.press, /*after_prefill=*/false);  // the history is compressed before each turn
  bool compressed = false;  // the cache holds an earlier turn's compression
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
      compressed = false;
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({"user", line});
    // the conversation before this user turn (compressed), and the turn (protected)
    const SplitPrompt sp = tokenize_chat_split(tok, split_chat_prompt(model->chat_template(), msgs, true));
    std::vector<int32_t> all = sp.context;
    all.insert(all.end(), sp.question.begin(), sp.question.end());
    size_t common = 0;
    while (common < cached.size() && common < all.size() && cached[common] == all[common]) ++common;
    if (common == all.size()) --common;  // always run at least one token to get logits
    if (s.press()) common = std::min(common, sp.context.size());  // the history ends before the new turn
    if (static_cast<int64_t>(all.size()) + o.n_predict > s.n_ctx()) {
      std::fprintf(stderr, "(the conversation is longer than the context of %lld tokens; /reset to start over)\n",
                   static_cast<long long>(s.n_ctx()));
      msgs.pop_back();
      continue;
    }
    s.truncate(static_cast<int32_t>(common));
    size_t from = common;
    std::string compress_note;
    if (s.press()) {
      if (sp.context.size() > common)
        s.prefill(std::vector<int32_t>(sp.context.begin() + static_cast<std::ptrdiff_t>(common), sp.context.end()));
      from = sp.context.size();
      ContextCompressOptions co;
      co.min_tokens = o.press.min_tokens;
      co.max_loss = o.press.max_loss;
      co.follow_up = compressed;
      co.skip_on_error = true;  // a press that cannot run on this history leaves it whole; the chat goes on
      const ContextCompression cc = compress_context(s, sp.question, co);
      compressed = compressed || cc.ran;
      compress_note = context_compress_line(*s.press(), cc, static_cast<int64_t>(sp.question.size()),
                                            "this user turn and the generation prompt");
    }
    const size_t n_log = s.compress_log().size();  // what follows: --press-every while decoding
    std::vector<int32_t> fresh(all.begin() + static_cast<std::ptrdiff_t>(from), all.end());
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
    if (!compress_note.empty()) std::fprintf(stderr, "[%s]\n", compress_note.c_str());
    for (size_t i = n_log; i < s.compress_log().size(); ++i)
      std::fprintf(stderr, "[%s]\n", compress_line(*s.press(), s.compress_log()[i], "while decoding: ").c_str());
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
  add_press_min_tokens_option(c, o->press);
  add_press_guard_options(c, o->press);
  c->add_option("--system", o->system, "system message");
  c->add_option("-n,--n-predict", o->n_predict, "maximum tokens per reply")->capture_default_str();
  add_sampling_options_to(c, o->sampling);
  c->callback([o] { chat(*o); });
}

}  // namespace kvtrim::cli
