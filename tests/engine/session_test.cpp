// Session behaviour on tiny random models: context limit, chunking, truncation,
// determinism of generation, perplexity against a hand computation.
#include "engine/session.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "engine/perplexity.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim {
namespace {

class SessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("session"));
    // f32 weights: every kernel path (8-bit activations for small batches, f32 GEMM for
    // large ones) is then exact to rounding, so these tests see the session logic alone.
    test::TinyModelSpec spec = test::tiny_spec(Arch::kLlama, 3);
    spec.t_embd = spec.t_attn = spec.t_v = spec.t_ffn = spec.t_down = spec.t_output = GgmlType::F32;
    model_ = Model::load(test::write_tiny_model(spec, *dir_)).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  static std::vector<int32_t> tokens(int n, int salt = 0) { return test::tiny_tokens(n, salt); }
  static SessionParams params(int64_t n_ctx, int n_batch = 256) {
    SessionParams p;
    p.n_ctx = n_ctx;
    p.n_threads = 2;
    p.n_batch = n_batch;
    p.kv_dtype = KvDtype::kF32;  // exact storage, as the f32 weights above
    return p;
  }
  static Model* model_;
  static std::string* dir_;
};
Model* SessionTest::model_ = nullptr;
std::string* SessionTest::dir_ = nullptr;

TEST_F(SessionTest, ContextLimitIsCheckedBeforeAnyWork) {
  Session s(*model_, params(32));
  s.prefill(tokens(20));
  try {
    s.prefill(tokens(13));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the context limit of 32"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.n_past(), 20);  // nothing was appended
  s.prefill(tokens(12));       // exactly fills it
  EXPECT_EQ(s.n_past(), 32);
  EXPECT_THROW(s.decode(1), Error);
}

TEST_F(SessionTest, ContextLargerThanTheModelsIsRejected) {
  EXPECT_THROW(Session(*model_, params(model_->hparams().n_ctx_train + 1)), Error);
  Session s(*model_, params(0));
  EXPECT_EQ(s.n_ctx(), model_->hparams().n_ctx_train);
}

// SessionParams::kv_mem_limit: an explicit context whose uncompressed cache exceeds the limit is
// refused at construction; a prefill is refused before it runs, leaving the session as it was.
TEST_F(SessionTest, MemoryLimitIsCheckedBeforeTheCacheGrows) {
  SessionParams p = params(200);
  KvCacheConfig cc = model_->cache_config(200);
  cc.dtype = KvDtype::kF32;
  const size_t per_token = cc.dense_bytes_per_token();
  p.kv_mem_limit = static_cast<int64_t>(per_token * 199);
  try {
    Session s(*model_, p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a context of 200 tokens would need"), std::string::npos) << e.what();
  }
  p.kv_mem_limit = static_cast<int64_t>(per_token * 200);
  EXPECT_NO_THROW(Session(*model_, p));

  p.n_ctx = 0;  // the model's context: checked per prefill
  p.kv_mem_limit = static_cast<int64_t>(per_token * 30);
  Session s(*model_, p);
  s.prefill(tokens(20));
  try {
    s.prefill(tokens(11));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adding 11 tokens would need"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.n_past(), 20);
  s.prefill(tokens(10));  // exactly the limit
  EXPECT_EQ(s.n_past(), 30);
  p.kv_mem_limit = -1;  // off
  Session off(*model_, p);
  off.prefill(tokens(100));
  EXPECT_EQ(off.n_past(), 100);
}

TEST_F(SessionTest, BadTokenIdsAreErrors) {
  Session s(*model_, params(64));
  EXPECT_THROW(s.prefill({1, -1}), Error);
  EXPECT_THROW(s.prefill({model_->hparams().n_vocab}), Error);
  EXPECT_THROW(s.prefill({}), Error);
  EXPECT_EQ(s.n_past(), 0);
}

TEST_F(SessionTest, ChunkSizeDoesNotChangeLogits) {
  const auto t = tokens(40);
  Session whole(*model_, params(64, 256));
  const std::vector<float> ref = whole.prefill(t);
  for (int b : {1, 3, 16}) {
    Session s(*model_, params(64, b));
    const std::vector<float> got = s.prefill(t);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-3f) << "batch " << b << " logit " << i;
  }
}

TEST_F(SessionTest, TruncateThenRefillMatches) {
  const auto t = tokens(24);
  Session a(*model_, params(64));
  const std::vector<float> ref = a.prefill(t);
  a.cache().truncate(10);
  EXPECT_EQ(a.n_past(), 10);
  const std::vector<float> got = a.prefill(std::vector<int32_t>(t.begin() + 10, t.end()));
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-3f);
}

TEST_F(SessionTest, EvalAllLastRowEqualsPrefill) {
  const auto t = tokens(30);
  Session a(*model_, params(64)), b(*model_, params(64));
  const size_t nv = static_cast<size_t>(model_->hparams().n_vocab);
  std::vector<float> all(t.size() * nv);
  a.eval_all(t.data(), static_cast<int64_t>(t.size()), all.data());
  const std::vector<float> last = b.prefill(t);
  for (size_t i = 0; i < nv; ++i) ASSERT_NEAR(all[(t.size() - 1) * nv + i], last[i], 1e-3f);
}

TEST_F(SessionTest, GenerationIsDeterministicAndStops) {
  GenerateParams gp;
  gp.max_new_tokens = 12;
  gp.stop_at_eog = false;
  gp.sampling = {0.9f, 20, 0.9f, 77};
  Session a(*model_, params(128)), b(*model_, params(128));
  const auto ra = a.generate(tokens(8), gp), rb = b.generate(tokens(8), gp);
  EXPECT_EQ(ra.tokens, rb.tokens);
  EXPECT_EQ(ra.tokens.size(), 12u);
  EXPECT_EQ(ra.stop, StopReason::kMaxTokens);
  // greedy generation = argmax of each decode step
  gp.sampling = {};
  Session c(*model_, params(128)), d(*model_, params(128));
  const auto rc = c.generate(tokens(8), gp);
  std::vector<int32_t> manual;
  int32_t next = argmax(d.prefill(tokens(8)).data(), model_->hparams().n_vocab);
  for (int i = 0; i < gp.max_new_tokens; ++i) {
    manual.push_back(next);
    if (i + 1 < gp.max_new_tokens) next = argmax(d.decode(next).data(), model_->hparams().n_vocab);
  }
  EXPECT_EQ(rc.tokens, manual);
}

TEST_F(SessionTest, GenerationStopsWhenTheContextIsFull) {
  GenerateParams gp;
  gp.max_new_tokens = 100;
  gp.stop_at_eog = false;
  Session s(*model_, params(20));
  const auto r = s.generate(tokens(10), gp);
  EXPECT_EQ(r.stop, StopReason::kContextFull);
  EXPECT_EQ(s.n_past(), 20);
  EXPECT_EQ(r.tokens.size(), 11u);  // 10 decoded + the last sampled one
}

// perplexity() over windows of n_ctx every `stride` tokens, full cache, no BOS replacement.
PplResult ppl_of(Session& s, const std::vector<int32_t>& t, int64_t n_ctx, int64_t stride) {
  PplOptions o;
  o.n_ctx = n_ctx;
  o.stride = stride;
  return perplexity(s, t, o);
}

TEST_F(SessionTest, PerplexityMatchesHandComputation) {
  const auto t = tokens(64, 1);
  Session s(*model_, params(32));
  const PplResult r = ppl_of(s, t, 32, 0);
  EXPECT_EQ(r.n_windows, 2);
  EXPECT_EQ(r.n_scored, 2 * 15);
  // by hand: windows [0,32) and [32,64), rows 16..30 predict tokens 17..31
  const size_t nv = static_cast<size_t>(model_->hparams().n_vocab);
  double nll = 0;
  int n = 0;
  for (int w = 0; w < 2; ++w) {
    Session h(*model_, params(32));
    std::vector<float> lg(32 * nv);
    h.eval_all(t.data() + w * 32, 32, lg.data());
    for (int j = 16; j < 31; ++j) {
      const float* row = lg.data() + static_cast<size_t>(j) * nv;
      double z = 0;
      for (size_t v = 0; v < nv; ++v) z += std::exp(static_cast<double>(row[v]));
      nll += std::log(z) - row[t[static_cast<size_t>(w * 32 + j + 1)]];
      ++n;
    }
  }
  EXPECT_NEAR(r.ppl, std::exp(nll / n), 1e-3 * r.ppl);
  // overlapping windows score their last `stride` tokens
  const PplResult o = ppl_of(s, t, 32, 8);
  EXPECT_EQ(o.n_windows, (64 - 32) / 8 + 1);
  EXPECT_EQ(o.n_scored, o.n_windows * 8);
  EXPECT_THROW(ppl_of(s, t, 32, 33), Error);
  EXPECT_THROW(ppl_of(s, tokens(20), 32, 0), Error);
}

}  // namespace
}  // namespace kvtrim
