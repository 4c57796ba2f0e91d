// kvtrim ppl: perplexity of a text file, with windows like llama.cpp's perplexity tool.
// The text is tokenized whole (BOS first if the model adds one), then cut into windows of
// --ctx tokens starting every --stride tokens; each window is evaluated from an empty
// cache with its first token replaced by BOS (when the model uses one).
//  - stride == ctx (default): non-overlapping windows scoring their second half, exactly as
//    llama.cpp's perplexity does, so the numbers are comparable;
//  - stride < ctx: each window scores its last `stride` tokens, each seeing at least
//    ctx - stride tokens of context.
// With --press (prefill–compress–continue, DESIGN.md §5 mode b; only stride == ctx): each
// window's first half [0, ctx/2) is prefilled and compressed once with the press, then the
// second half is run through the compressed cache and scored: the same tokens (ctx/2+1 ..
// ctx-1 of each window) as without --press, so the two perplexities compare directly.
// (The full protocol, compressed-throughout mode included, is `kvtrim eval ppl`.)
#include <cstdio>
#include <vector>

#include "cli.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"
#include "engine/perplexity.h"

namespace kvtrim::cli {

namespace {
struct PplOptions {
  CommonOptions common;
  PressOptions press;
  std::string file;
  int64_t window = 1024;
  int64_t stride = 0;
  int64_t max_tokens = 0;
};

void ppl(const PplOptions& o) {
  const std::string text = read_file(o.file);
  if (!o.press.spec.empty()) make_press(o.press.spec);  // a bad --press fails before the model loads
  auto model = load_model(o.common);
  const Tokenizer& tok = model->tokenizer();
  const double t_tok = now_seconds();
  std::vector<int32_t> tokens = tok.encode(text, tok.add_bos(), false);
  std::fprintf(stderr, "tokenized %s: %zu tokens in %.2f s\n", o.file.c_str(), tokens.size(), now_seconds() - t_tok);
  if (o.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > o.max_tokens) tokens.resize(static_cast<size_t>(o.max_tokens));
  KVTRIM_CHECK(o.window <= model->hparams().n_ctx_train, "--ctx %lld exceeds the model's context limit of %d tokens",
               static_cast<long long>(o.window), model->hparams().n_ctx_train);
  SessionParams sp = session_params(o.common);
  sp.n_ctx = o.window;
  Session s(*model, sp);
  KVTRIM_CHECK(o.press.decode_every == 0, "ppl: --press-every is not supported (compression happens once per window)");
  install_press(s, o.press);
  KVTRIM_CHECK(!s.press() || o.stride == 0 || o.stride == o.window,
               "ppl --press needs non-overlapping windows (--stride 0 or equal to --ctx)");
  std::unique_ptr<ProgressBar> bar;
  auto on_progress = [&](int64_t done, int64_t total, double cur) {
    if (!bar) bar = std::make_unique<ProgressBar>("ppl", total, "win");
    bar->update(done, strprintf("ppl %.4f", cur));
    if (done == total) bar->finish();
  };
  CompressStats last;
  kvtrim::PplOptions po;
  po.n_ctx = o.window;
  po.stride = o.stride;
  po.bos = tok.add_bos() ? tok.bos() : -1;
  po.pass = s.press() ? PplPass::kPcc : PplPass::kFull;
  po.progress = on_progress;
  po.last = &last;
  const PplResult r = perplexity(s, tokens, po);
  if (s.press()) std::fprintf(stderr, "last window: %s\n", compress_line(*s.press(), last).c_str());
  std::printf("ppl = %.4f +/- %.4f  (%lld tokens scored in %lld windows of %lld, stride %lld; %.1f tokens/s evaluated)\n",
              r.ppl, r.ppl_stderr, static_cast<long long>(r.n_scored), static_cast<long long>(r.n_windows),
              static_cast<long long>(o.window), static_cast<long long>(o.stride > 0 ? o.stride : o.window),
              static_cast<double>(r.n_windows * o.window) / r.seconds);
  std::fprintf(stderr, "%s\n", kv_bytes_line(s.cache()).c_str());
}
}  // namespace

void register_ppl(CLI::App& app) {
  auto o = std::make_shared<PplOptions>();
  CLI::App* c = app.add_subcommand("ppl", "perplexity of a text file (llama.cpp-compatible windows)");
  add_common_options(c, o->common);
  add_press_options(c, o->press);
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
