// Continuous batching: Model::forward_batch and Session::step_batch against the same sequences
// run one at a time (tiny random models with their quantized weights: under 16 rows in all the
// batch uses the decode kernel row by row, so logits must be equal bit for bit).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "ops/matmul.h"
#include "press/press.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim {
namespace {

// Pairs of sessions (solo[s], batched[s]) with the same history decode `steps` more tokens: the
// solo ones one by one, the batched ones in one step_batch per token; every batched session
// must get its solo logits bit for bit.
void decode_together_equals_solo(const std::vector<std::unique_ptr<Session>>& solo,
                                 const std::vector<std::unique_ptr<Session>>& batched, int steps, int salt) {
  const size_t n_seq = solo.size();
  for (int step = 0; step < steps; ++step) {
    std::vector<int32_t> next(n_seq);
    std::vector<SessionChunk> chunks;
    for (size_t s = 0; s < n_seq; ++s) {
      next[s] = static_cast<int32_t>((step * 13 + static_cast<int>(s) * 29 + salt) % 250);
      solo[s]->decode(next[s]);
      chunks.push_back(SessionChunk{batched[s].get(), &next[s], 1, true});
    }
    Session::step_batch(chunks);
    for (size_t s = 0; s < n_seq; ++s) {
      ASSERT_EQ(batched[s]->n_past(), solo[s]->n_past());
      ASSERT_EQ(batched[s]->logits(), solo[s]->logits()) << "sequence " << s << " step " << step;
    }
  }
}

class BatchTest : public ::testing::TestWithParam<Arch> {
 protected:
  void SetUp() override {
    dir_ = test::temp_dir("batch");
    model_ = Model::load(test::write_tiny_model(test::tiny_spec(GetParam(), 7), dir_));
  }
  // Two decode rows (as many as threads) and a 20-token prefill chunk in one step_batch: every
  // session gets its solo logits bit for bit.
  void two_decodes_beside_a_chunk() const {
    ThreadPool pool(2);
    SessionParams p = params(&pool);
    p.n_batch = 32;
    Session a_solo(*model_, p), b_solo(*model_, p), c_solo(*model_, p), a(*model_, p), b(*model_, p), c(*model_, p);
    for (Session* s : {&a_solo, &a}) s->prefill(test::tiny_tokens(9, 1));
    for (Session* s : {&c_solo, &c}) s->prefill(test::tiny_tokens(14, 4));
    const std::vector<int32_t> prompt = test::tiny_tokens(20, 2);
    b_solo.prefill(prompt);
    const int32_t ta = 42, tc = 7;
    a_solo.decode(ta);
    c_solo.decode(tc);
    Session::step_batch({SessionChunk{&a, &ta, 1, true}, SessionChunk{&b, prompt.data(), 20, false},
                         SessionChunk{&c, &tc, 1, true}});
    EXPECT_EQ(a.logits(), a_solo.logits());
    EXPECT_EQ(b.logits(), b_solo.logits());
    EXPECT_EQ(c.logits(), c_solo.logits());
  }
  SessionParams params(ThreadPool* pool) const {
    SessionParams p;
    p.n_ctx = 128;
    p.n_batch = 8;
    p.pool = pool;
    return p;
  }
  std::string dir_;
  std::unique_ptr<Model> model_;
};

// Three conversations at different lengths decode together; each equals its solo run.
TEST_P(BatchTest, BatchedDecodeEqualsSoloDecode) {
  ThreadPool pool(2);
  const int n_seq = 3;
  std::vector<std::unique_ptr<Session>> solo, batched;
  for (int s = 0; s < n_seq; ++s) {
    solo.push_back(std::make_unique<Session>(*model_, params(&pool)));
    batched.push_back(std::make_unique<Session>(*model_, params(&pool)));
    solo[s]->prefill(test::tiny_tokens(5 + 7 * s, s));
    batched[s]->prefill(test::tiny_tokens(5 + 7 * s, s));
  }
  decode_together_equals_solo(solo, batched, 6, 1);
}

// Decode steps of as many sequences as threads attend in one pool job, a sequence per thread;
// at contexts long enough for the decode splits (2 x kMinSplit tokens and more) each piece and
// merge must still be what the sequence gets on the whole pool alone.
TEST_P(BatchTest, OneAttentionJobKeepsTheSoloSplits) {
  test::TinyModelSpec spec = test::tiny_spec(GetParam(), 7);
  spec.n_ctx_train = 2048;
  const std::string dir = test::temp_dir("batch_long");
  auto model = Model::load(test::write_tiny_model(spec, dir));
  ThreadPool pool(2);
  SessionParams p;
  p.n_ctx = 2048;
  p.n_batch = 256;
  p.pool = &pool;
  const int n_seq = 2;
  std::vector<std::unique_ptr<Session>> solo, batched;
  for (int s = 0; s < n_seq; ++s) {
    solo.push_back(std::make_unique<Session>(*model, p));
    batched.push_back(std::make_unique<Session>(*model, p));
    solo[s]->prefill(test::tiny_tokens(1100 + 300 * s, s));
    batched[s]->prefill(test::tiny_tokens(1100 + 300 * s, s));
  }
  decode_together_equals_solo(solo, batched, 3, 2);
}

// A prefill chunk next to decode steps (the server's continuous batching): the prefill's own
// logits and the decoding sequence's logits equal their solo runs bit for bit (the 20-token
// chunk takes the GEMM path as it does alone; the decode row stays on the decode kernel).
TEST_P(BatchTest, PrefillChunkBesideDecodeSteps) {
  ThreadPool pool(2);
  SessionParams p = params(&pool);
  p.n_batch = 32;
  Session a_solo(*model_, p), b_solo(*model_, p), a(*model_, p), b(*model_, p);
  a_solo.prefill(test::tiny_tokens(9, 1));
  a.prefill(test::tiny_tokens(9, 1));
  const std::vector<int32_t> prompt = test::tiny_tokens(20, 2);
  b_solo.prefill(prompt);
  const int32_t t = 42;
  a_solo.decode(t);
  Session::step_batch({SessionChunk{&a, &t, 1, true}, SessionChunk{&b, prompt.data(), 20, false}});
  ASSERT_EQ(a.n_past(), 10);
  ASSERT_EQ(b.n_past(), 20);
  EXPECT_EQ(a.logits(), a_solo.logits());
  EXPECT_EQ(b.logits(), b_solo.logits());
}

// Two decode rows (as many as threads: they attend in one pool job) beside a prefill chunk
// (it attends alone on the pool): every session still gets its solo logits.
TEST_P(BatchTest, DecodeJobBesidePrefillChunk) {
  two_decodes_beside_a_chunk();
}

// With 8-bit prefill on a CPU whose integer kernels cover every weight type of the model, the
// whole batch (two decode rows and a 20-token prefill chunk) is one product per weight
// (Model::token_exact_products): every session still gets its solo logits bit for bit.
TEST_P(BatchTest, OneProductForDecodeRowsAndPrefillChunkWithInt8Prefill) {
  struct Int8Prefill {
    bool was = int8_prefill();
    Int8Prefill() { set_int8_prefill(true); }
    ~Int8Prefill() { set_int8_prefill(was); }
  } on;
  if (!model_->token_exact_products()) GTEST_SKIP() << "no integer kernel for every weight type on this CPU";
  two_decodes_beside_a_chunk();
}

// Press hooks run per session in a batch: a press that plans during prefill (streaming_llm
// keeps sink + window) and one decoding uncompressed, batched, equal their solo runs.
TEST_P(BatchTest, PressesActPerSession) {
  ThreadPool pool(2);
  Session p_solo(*model_, params(&pool)), q_solo(*model_, params(&pool));
  Session p(*model_, params(&pool)), q(*model_, params(&pool));
  for (Session* s : {&p_solo, &p}) s->set_press(make_press("streamingllm:0.5"));
  for (Session* s : {&p_solo, &p, &q_solo, &q}) s->prefill(test::tiny_tokens(12, 3));
  p_solo.compress();
  p.compress();
  EXPECT_LT(p.cache().bytes().total(), q.cache().bytes().total());
  for (int step = 0; step < 4; ++step) {
    const int32_t t1 = 7 + step, t2 = 99 - step;
    p_solo.decode(t1);
    q_solo.decode(t2);
    Session::step_batch({SessionChunk{&p, &t1, 1, true}, SessionChunk{&q, &t2, 1, true}});
    ASSERT_EQ(p.logits(), p_solo.logits()) << step;
    ASSERT_EQ(q.logits(), q_solo.logits()) << step;
  }
  EXPECT_EQ(p.cache().bytes().total(), p_solo.cache().bytes().total());
}

// Every check runs before any work: a refused batch (one session out of room, a bad token, a
// session twice, a foreign pool) changes no cache.
TEST_P(BatchTest, RefusedBatchChangesNothing) {
  ThreadPool pool(2), other(1);
  SessionParams small = params(&pool);
  small.n_ctx = 10;
  Session a(*model_, params(&pool)), full(*model_, small), foreign(*model_, params(&other));
  a.prefill(test::tiny_tokens(4, 0));
  full.prefill(test::tiny_tokens(10, 0));
  const int32_t ok = 3, bad = 1 << 20;
  EXPECT_THROW(Session::step_batch({SessionChunk{&a, &ok, 1, true}, SessionChunk{&full, &ok, 1, true}}), Error);
  EXPECT_THROW(Session::step_batch({SessionChunk{&a, &ok, 1, true}, SessionChunk{&a, &ok, 1, true}}), Error);
  EXPECT_THROW(Session::step_batch({SessionChunk{&a, &bad, 1, true}}), Error);
  EXPECT_THROW(Session::step_batch({SessionChunk{&a, &ok, 1, true}, SessionChunk{&foreign, &ok, 1, true}}), Error);
  EXPECT_EQ(a.n_past(), 4);
  EXPECT_EQ(full.n_past(), 10);
  EXPECT_EQ(a.cache().n_past(), 4);
}

// More decode steps than one kernel run takes (20 > 15 rows): still each equals its solo run.
TEST_P(BatchTest, ManyDecodeStepsSplitIntoKernelRuns) {
  ThreadPool pool(2);
  const int n_seq = 20;
  std::vector<std::unique_ptr<Session>> solo, batched;
  std::vector<int32_t> next(n_seq);
  std::vector<SessionChunk> chunks;
  for (int s = 0; s < n_seq; ++s) {
    solo.push_back(std::make_unique<Session>(*model_, params(&pool)));
    batched.push_back(std::make_unique<Session>(*model_, params(&pool)));
    solo[s]->prefill(test::tiny_tokens(3 + s, s));
    batched[s]->prefill(test::tiny_tokens(3 + s, s));
    next[s] = (s * 7 + 2) % 250;
    solo[s]->decode(next[s]);
    chunks.push_back(SessionChunk{batched[s].get(), &next[s], 1, true});
  }
  Session::step_batch(chunks);
  for (int s = 0; s < n_seq; ++s) ASSERT_EQ(batched[s]->logits(), solo[s]->logits()) << s;
}

INSTANTIATE_TEST_SUITE_P(Archs, BatchTest, ::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kQwen3, Arch::kQwen3Moe, Arch::kPhi3, Arch::kGemma2, Arch::kGemma3),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace kvtrim
