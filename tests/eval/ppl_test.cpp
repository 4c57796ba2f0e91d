// kvtrim eval ppl: both modes against hand-written references on a tiny f32 model (f32 KV),
// ratio 0 against the full-cache perplexity, and the resumable results file.
#include "eval/ppl.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/perplexity.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "press/press.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim::eval {
namespace {

namespace fs = std::filesystem;

const Model& f32_model() {
  static std::unique_ptr<Model> m = [] {
    auto spec = kvtrim::test::tiny_spec(Arch::kLlama, 11);
    spec.t_embd = spec.t_attn = spec.t_v = spec.t_ffn = spec.t_down = spec.t_output = GgmlType::F32;
    spec.n_ctx_train = 512;
    return Model::load(kvtrim::test::write_tiny_model(spec, kvtrim::test::temp_dir("ppl_tiny")));
  }();
  return *m;
}

SessionParams f32_params() {
  SessionParams p;
  p.n_ctx = 256;
  p.n_threads = 1;
  p.n_batch = 32;
  p.kv_dtype = KvDtype::kF32;
  return p;
}

double nll(const float* logits, size_t n_vocab, int32_t target) {
  NllAccumulator a;
  a.add(logits, n_vocab, target);
  PplResult r;
  a.finish(&r);
  return r.mean_nll;
}

std::vector<PplWindow> run_all(Session& s, const std::vector<int32_t>& toks, const PplConfig& c) {
  std::vector<PplWindow> rows;
  for (int64_t w = 0; w < ppl_window_count(static_cast<int64_t>(toks.size()), c.ctx); ++w)
    rows.push_back(score_ppl_window(s, ppl_window_tokens(toks, c.ctx, w, c.bos), w, c));
  return rows;
}

TEST(EvalPpl, RatioZeroEqualsFullCacheInBothModes) {
  const std::vector<int32_t> toks = kvtrim::test::random_tokens(200, 256, 12345);
  Session full(f32_model(), f32_params());
  PplOptions po;
  po.n_ctx = 64;
  po.stride = 64;
  po.bos = 1;
  const PplResult ref = perplexity(full, toks, po);
  for (PplMode mode : {PplMode::kPcc, PplMode::kThroughout}) {
    for (const char* spec : {"knorm:ratio=0", "streamingllm:ratio=0"}) {
      Session s(f32_model(), f32_params());
      s.set_press(make_press(spec));
      PplConfig c;
      c.ctx = 64;
      c.mode = mode;
      c.bos = 1;
      c.chunk = mode == PplMode::kThroughout ? 3 : 1;
      const PplSummary sm = summarize_ppl(run_all(s, toks, c));
      EXPECT_EQ(sm.n_scored, ref.n_scored);
      // In log space, relative to the mean NLL (~44 nats for this random model): chunked passes
      // (3 tokens) and whole-window passes take different attention paths (tiled prefill from 4
      // queries on), equal up to f32 rounding, which differs with the SIMD width of the machine.
      const double tol = 1e-7 * (1.0 + std::log(ref.ppl));
      EXPECT_NEAR(std::log(sm.ppl_full / ref.ppl), 0.0, tol) << spec << " " << ppl_mode_name(mode);
      EXPECT_NEAR(std::log(sm.ppl_press / ref.ppl), 0.0, tol) << spec << " " << ppl_mode_name(mode);
      EXPECT_NEAR(sm.delta, 0.0, tol * ref.ppl);
      EXPECT_NEAR(sm.kv_ratio, 2.0, 0.05);  // f32 holds twice the f16 bytes (plus positions), nothing dropped
    }
  }
}

// One perplexity path: `kvtrim ppl --press` (perplexity() with kPcc) and `kvtrim eval ppl`
// (score_ppl_window) score the same rows with the same pass, so their PPLs agree up to the
// order of the NLL sums (one running sum against per-window sums).
TEST(EvalPpl, EnginePerplexityPccEqualsEvalPplPcc) {
  const std::vector<int32_t> toks = kvtrim::test::random_tokens(200, 256, 4321);
  for (const char* spec : {"snapkv:ratio=0.5", "streamingllm:ratio=0.5"}) {
    Session a(f32_model(), f32_params());
    a.set_press(make_press(spec));
    PplOptions po;
    po.n_ctx = 64;
    po.bos = 1;
    po.pass = PplPass::kPcc;
    const PplResult r = perplexity(a, toks, po);
    Session b(f32_model(), f32_params());
    PressSchedule sched;
    sched.after_prefill = false;
    b.set_press(make_press(spec), sched);
    PplConfig c;
    c.ctx = 64;
    c.bos = 1;
    const PplSummary sm = summarize_ppl(run_all(b, toks, c));
    EXPECT_EQ(sm.n_scored, r.n_scored) << spec;
    EXPECT_NEAR(std::log(sm.ppl_press / r.ppl), 0.0, 1e-12) << spec;
  }
}

TEST(EvalPpl, PccMatchesBruteForceStreamingLlm) {
  const std::vector<int32_t> toks = kvtrim::test::random_tokens(128, 256, 12345);
  const char* spec = "streamingllm:ratio=0.5";
  PplConfig c;
  c.ctx = 64;
  c.prefix = 40;
  c.bos = 1;
  Session s(f32_model(), f32_params());
  s.set_press(make_press(spec));
  const std::vector<PplWindow> rows = run_all(s, toks, c);
  ASSERT_EQ(rows.size(), 2u);
  // By hand: prefill P, apply the press to the cache, continue with the rest.
  Session h(f32_model(), f32_params());
  const auto press = make_press(spec);
  const size_t n_vocab = static_cast<size_t>(f32_model().hparams().n_vocab);
  for (int64_t w = 0; w < 2; ++w) {
    std::vector<int32_t> win(toks.begin() + w * 64, toks.begin() + (w + 1) * 64);
    win[0] = 1;
    h.reset();
    h.prefill(std::vector<int32_t>(win.begin(), win.begin() + 40));
    const CompressStats st = run_press(*press, h.cache(), f32_model(), nullptr, &h.pool());
    EXPECT_LT(st.tokens_after, st.tokens_before);
    double sum = 0, sum_full = 0;
    for (int64_t j = 40; j < 63; ++j) {
      const std::vector<float>& lg = h.decode(win[static_cast<size_t>(j)]);
      sum += nll(lg.data(), n_vocab, win[static_cast<size_t>(j + 1)]);
    }
    h.reset();
    std::vector<float> all(64 * n_vocab);
    h.eval_all(win.data(), 64, all.data());
    for (int64_t j = 40; j < 63; ++j) sum_full += nll(all.data() + static_cast<size_t>(j) * n_vocab, n_vocab, win[static_cast<size_t>(j + 1)]);
    EXPECT_EQ(rows[static_cast<size_t>(w)].n_scored, 23);
    EXPECT_NEAR(rows[static_cast<size_t>(w)].nll_press, sum, 1e-6 * std::abs(sum));
    EXPECT_NEAR(rows[static_cast<size_t>(w)].nll_full, sum_full, 1e-6 * std::abs(sum_full));
    EXPECT_GT(std::abs(sum - sum_full), 1e-4);  // the press changed something
    EXPECT_LT(rows[static_cast<size_t>(w)].kv_bytes, rows[static_cast<size_t>(w)].kv_dense * 2.0);
  }
}

TEST(EvalPpl, ThroughoutChunk1MatchesTokenByTokenKnorm) {
  const std::vector<int32_t> toks = kvtrim::test::random_tokens(64, 256, 12345);
  const char* spec = "knorm:ratio=0.5";
  PplConfig c;
  c.ctx = 64;
  c.mode = PplMode::kThroughout;
  c.chunk = 1;
  c.bos = 1;
  Session s(f32_model(), f32_params());
  s.set_press(make_press(spec));
  const std::vector<PplWindow> rows = run_all(s, toks, c);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].n_compress, 63);
  // By hand: decode every token, compress after each one to half the tokens seen so far.
  Session h(f32_model(), f32_params());
  const auto press = make_press(spec);
  const size_t n_vocab = static_cast<size_t>(f32_model().hparams().n_vocab);
  std::vector<int32_t> win = toks;
  win[0] = 1;
  double sum = 0;
  for (int64_t t = 0; t < 63; ++t) {
    const std::vector<float>& lg = h.decode(win[static_cast<size_t>(t)]);
    if (t >= 32) sum += nll(lg.data(), n_vocab, win[static_cast<size_t>(t + 1)]);
    Budget b;
    b.n_keep = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(t + 1) * 0.5));
    run_press(*press, h.cache(), f32_model(), nullptr, &h.pool(), &b);
    EXPECT_LE(h.cache().n_tokens(0, 0), b.n_keep);
  }
  EXPECT_NEAR(rows[0].nll_press, sum, 1e-6 * std::abs(sum));
  EXPECT_GT(std::abs(rows[0].nll_press - rows[0].nll_full), 1e-4);
  EXPECT_LT(rows[0].kv_bytes, 0.8 * rows[0].kv_dense * 2.0);  // about half of the f32 bytes
}

TEST(EvalPpl, ThroughoutRejectsNonScorerPresses) {
  Session s(f32_model(), f32_params());
  s.set_press(make_press("knorm:ratio=0.5+streamingllm:ratio=0.2"));
  PplConfig c;
  c.ctx = 64;
  c.mode = PplMode::kThroughout;
  EXPECT_THROW(check_ppl_config(s, c), Error);
  c.mode = PplMode::kPcc;
  EXPECT_NO_THROW(check_ppl_config(s, c));
}

PplWindow fake_window(int64_t i) {
  PplWindow r;
  r.index = i;
  r.tokens_hash = std::string(1, 'h');
  r.tokens_hash += std::to_string(i);
  r.n_scored = 10;
  r.nll_press = 20 + static_cast<double>(i);
  r.nll2_press = 50;
  r.nll_full = 19;
  r.nll2_full = 45;
  r.nll_cross = 47;
  r.kv_bytes = 100;
  r.kv_dense = 200;
  return r;
}

TEST(EvalPpl, ResumeAfterATornLine) {
  const std::string path = (fs::path(kvtrim::test::temp_dir("ppl_resume")) / "r.jsonl").string();
  fs::remove(path);
  {
    PplResultsFile f(path, "cfgA");
    f.append(fake_window(0));
    f.append(fake_window(1));
  }
  {
    std::ofstream o(path, std::ios::app | std::ios::binary);
    o << "{\"config\":\"cfgA\",\"window\":2,\"tok";  // interrupted write
  }
  PplResultsFile f(path, "cfgA");
  EXPECT_EQ(f.rows().size(), 2u);
  EXPECT_TRUE(f.done(0, "h0"));
  EXPECT_TRUE(f.done(1, "h1"));
  EXPECT_FALSE(f.done(2, "h2"));
  EXPECT_DOUBLE_EQ(f.row(1).nll_press, 21);
  f.append(fake_window(2));
  PplResultsFile g(path, "cfgA");
  EXPECT_EQ(g.rows().size(), 3u);
  EXPECT_EQ(g.n_other_config(), 0);
}

TEST(EvalPpl, ConfigHashMismatch) {
  const std::string path = (fs::path(kvtrim::test::temp_dir("ppl_cfg")) / "r.jsonl").string();
  fs::remove(path);
  {
    PplResultsFile f(path, "cfgA");
    f.append(fake_window(0));
  }
  PplResultsFile b(path, "cfgB");  // another config: its rows are kept but ignored
  EXPECT_EQ(b.rows().size(), 0u);
  EXPECT_EQ(b.n_other_config(), 1);
  EXPECT_FALSE(b.done(0, "h0"));
  b.append(fake_window(0));
  PplResultsFile a(path, "cfgA");
  EXPECT_EQ(a.rows().size(), 1u);
  EXPECT_EQ(a.n_other_config(), 1);
  EXPECT_THROW(a.done(0, "other-tokens"), Error);  // same config, different tokens
}

TEST(EvalPpl, SummaryIsPairedAndModeNamesParse) {
  const PplSummary s = summarize_ppl({fake_window(0), fake_window(1)});
  EXPECT_EQ(s.n_scored, 20);
  EXPECT_NEAR(s.ppl_press, std::exp(41.0 / 20), 1e-12);
  EXPECT_NEAR(s.ppl_full, std::exp(38.0 / 20), 1e-12);
  EXPECT_NEAR(s.kv_ratio, 0.5, 1e-12);
  EXPECT_EQ(parse_ppl_mode("pcc"), PplMode::kPcc);
  EXPECT_EQ(parse_ppl_mode("throughout"), PplMode::kThroughout);
  EXPECT_THROW(parse_ppl_mode("x"), Error);
}

}  // namespace
}  // namespace kvtrim::eval
