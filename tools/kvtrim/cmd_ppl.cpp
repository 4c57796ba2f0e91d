// kvtrim ppl: perplexity of a text file, with windows like llama.cpp's perplexity tool.
// The text is tokenized whole (BOS first if the model adds one), then cut into windows of
// --ctx tokens starting every --stride tokens; each window is evaluated from an empty
// cache with its first token replaced by BOS (when the model uses one).
//  - stride == ctx (default): non-overlapping windows scoring their second half, exactly as
//    llama.cpp's perplexity does, so the numbers are comparable;
//  - stride < ctx: each window scores its last `stride` tokens, each seeing at least
//    ctx - stride tokens of context.
#include <cmath>
#include <cstdio>
#include <vector>

#include "cli.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"

namespace kvtrim::cli {

namespace {
struct PplOptions {
  CommonOptions common;
  std::string file;
  int64_t window = 1024;
  int64_t stride = 0;
  int64_t max_tokens = 0;
};

void ppl(const PplOptions& o) {
  const std::string text = read_file(o.file);
  auto model = load_model(o.common);
  const Tokenizer& tok = model->tokenizer();
  const int64_t C = o.window;
  const int64_t S = o.stride > 0 ? o.stride : C;
  KVTRIM_CHECK(C >= 16, "--ctx for ppl must be at least 16 (got %lld)", static_cast<long long>(C));
  KVTRIM_CHECK(S <= C, "--stride (%lld) must not exceed --ctx (%lld)", static_cast<long long>(S), static_cast<long long>(C));
  KVTRIM_CHECK(C <= model->hparams().n_ctx_train, "--ctx %lld exceeds the model's context limit of %d tokens",
               static_cast<long long>(C), model->hparams().n_ctx_train);
  const double t_tok = now_seconds();
  std::vector<int32_t> tokens = tok.encode(text, tok.add_bos(), false);
  std::fprintf(stderr, "tokenized %s: %zu tokens in %.2f s\n", o.file.c_str(), tokens.size(), now_seconds() - t_tok);
  if (o.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > o.max_tokens) tokens.resize(static_cast<size_t>(o.max_tokens));
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  KVTRIM_CHECK(n_tok >= C, "the text has %lld tokens, fewer than one window of %lld (lower --ctx)",
               static_cast<long long>(n_tok), static_cast<long long>(C));
  const int64_t n_windows = (n_tok - C) / S + 1;
  const int64_t first = S >= C ? C / 2 : C - S - 1;  // first logit row that is scored

  SessionParams sp = session_params(o.common);
  sp.n_ctx = C;
  Session s(*model, sp);
  const size_t n_vocab = static_cast<size_t>(model->hparams().n_vocab);
  std::vector<float> logits(static_cast<size_t>(C) * n_vocab);
  double sum_nll = 0, sum_nll2 = 0;
  int64_t n_scored = 0;
  ProgressBar bar("ppl", n_windows, "win");
  const double t0 = now_seconds();
  for (int64_t w = 0; w < n_windows; ++w) {
    std::vector<int32_t> win(tokens.begin() + w * S, tokens.begin() + w * S + C);
    if (tok.add_bos() && tok.bos() >= 0) win[0] = tok.bos();
    s.reset();
    s.eval_all(win.data(), C, logits.data());
    for (int64_t j = first; j < C - 1; ++j) {
      const float* lg = logits.data() + static_cast<size_t>(j) * n_vocab;
      float mx = lg[0];
      for (size_t v = 1; v < n_vocab; ++v) mx = std::max(mx, lg[v]);
      double z = 0;
      for (size_t v = 0; v < n_vocab; ++v) z += std::exp(static_cast<double>(lg[v] - mx));
      const double nll = std::log(z) + mx - lg[win[static_cast<size_t>(j + 1)]];
      sum_nll += nll;
      sum_nll2 += nll * nll;
      ++n_scored;
    }
    const double cur = std::exp(sum_nll / static_cast<double>(n_scored));
    bar.update(w + 1, strprintf("ppl %.4f", cur));
    if (w + 1 == n_windows) bar.finish(strprintf("ppl %.4f", cur));
  }
  const double mean = sum_nll / static_cast<double>(n_scored);
  const double var = std::max(0.0, sum_nll2 / static_cast<double>(n_scored) - mean * mean);
  const double p = std::exp(mean);
  const double se = p * std::sqrt(var / static_cast<double>(std::max<int64_t>(1, n_scored - 1)));
  const double dt = now_seconds() - t0;
  std::printf("ppl = %.4f +/- %.4f  (%lld tokens scored in %lld windows of %lld, stride %lld; %.1f tokens/s evaluated)\n",
              p, se, static_cast<long long>(n_scored), static_cast<long long>(n_windows), static_cast<long long>(C),
              static_cast<long long>(S), static_cast<double>(n_windows * C) / dt);
  std::fprintf(stderr, "%s\n", kv_bytes_line(s.cache()).c_str());
}
}  // namespace

void register_ppl(CLI::App& app) {
  auto o = std::make_shared<PplOptions>();
  CLI::App* c = app.add_subcommand("ppl", "perplexity of a text file (llama.cpp-compatible windows)");
  add_common_options(c, o->common);
  c->remove_option(c->get_option("--ctx"));
  c->add_option("-f,--file", o->file, "text file")->required();
  c->add_option("-c,--ctx", o->window, "window length in tokens")->capture_default_str();
  c->add_option("--stride", o->stride, "tokens between window starts (0 = ctx: non-overlapping, second half scored)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  c->add_option("--max-tokens", o->max_tokens, "use only the first N tokens of the text (0 = all)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  c->callback([o] { ppl(*o); });
}

}  // namespace kvtrim::cli
