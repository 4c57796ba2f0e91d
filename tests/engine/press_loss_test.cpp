// The loss estimate (src/engine/press_loss.h) and the quality guard (--press-max-loss,
// ContextCompressOptions::max_loss) on a tiny qwen2 model: 0 for a compression that changes
// nothing, growing with the ratio, equal to a direct computation in this file for an eviction
// press, on the window's queries or, when a question was observed, on the question's (an
// observed question changes no plan of a press that is not query-aware); measured for a
// channel press too; the guard with limit 0 leaves the context whole
// (every attempt reported), with limit 1 changes nothing, in between keeps half the ratio.
#include "engine/press_loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "engine/context_question.h"
#include "engine/limit_error.h"
#include "engine/observation_stats.h"
#include "press/press_spec.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim {
namespace {

class PressLossTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("press_loss"));
    model_ = Model::load(test::write_tiny_model(test::tiny_spec(Arch::kQwen2, 3), *dir_)).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  static std::vector<int32_t> tokens(int n) { return test::tiny_tokens(n); }
  // A session with `press` holding a prefilled context of n tokens (f32 cache: the direct
  // computation below reads the same numbers the cache attends over).
  static std::unique_ptr<Session> session(const std::string& press, int n = 120, bool loss = true) {
    SessionParams p;
    p.n_ctx = 256;
    p.n_threads = 2;
    p.kv_dtype = KvDtype::kF32;
    p.press_loss = loss;
    auto s = std::make_unique<Session>(*model_, p);
    PressSchedule sched;
    sched.after_prefill = false;
    s->set_press(make_press(press), sched);
    s->prefill(tokens(n));
    return s;
  }
  static int64_t total(const Session& s) { return total_tokens(s.cache()); }
  static Model* model_;
  static std::string* dir_;
};
Model* PressLossTest::model_ = nullptr;
std::string* PressLossTest::dir_ = nullptr;

// Causal softmax attention of one query head over a head's keys, written out: out [hd].
void direct_attention(const float* q, int32_t q_pos, const std::vector<float>& k,
                      const std::vector<float>& v, const std::vector<int32_t>& pos, int hd,
                      float scale, std::vector<double>* out, std::vector<double>* probs) {
  const size_t n = pos.size();
  std::vector<double> s(n, -std::numeric_limits<double>::infinity());
  double m = -std::numeric_limits<double>::infinity();
  for (size_t t = 0; t < n; ++t) {
    if (pos[t] > q_pos) continue;
    double d = 0;
    for (int i = 0; i < hd; ++i) d += static_cast<double>(q[i]) * k[t * hd + i];
    s[t] = d * scale;
    m = std::max(m, s[t]);
  }
  double z = 0;
  for (size_t t = 0; t < n; ++t) z += std::isinf(s[t]) ? 0.0 : std::exp(s[t] - m);
  out->assign(static_cast<size_t>(hd), 0.0);
  probs->assign(n, 0.0);
  for (size_t t = 0; t < n; ++t) {
    if (std::isinf(s[t])) continue;
    const double a = std::exp(s[t] - m) / z;
    (*probs)[t] = a;
    for (int i = 0; i < hd; ++i) (*out)[i] += a * v[t * hd + i];
  }
}

TEST_F(PressLossTest, ZeroForACompressionThatChangesNothing) {
  auto s = session("snapkv:ratio=0");
  const int64_t before = total(*s);
  const CompressStats st = s->compress();
  EXPECT_EQ(total(*s), before);
  ASSERT_TRUE(st.loss.measured);
  EXPECT_EQ(st.loss.n_queries, kLossWindow);
  EXPECT_EQ(st.loss.rel_err, 0.0);
  EXPECT_EQ(st.loss.rel_err_max, 0.0);
  EXPECT_EQ(st.loss.evicted_mass, 0.0);
  EXPECT_EQ(st.loss.tokens_removed, 0);
}

TEST_F(PressLossTest, GrowsWithTheRatio) {
  for (const char* press : {"snapkv", "knorm", "streamingllm"}) {
    double last_err = -1, last_mass = -1;
    for (double ratio : {0.25, 0.5, 0.75}) {
      auto s = session(strprintf("%s:ratio=%g", press, ratio));
      const CompressStats st = s->compress();
      ASSERT_TRUE(st.loss.measured) << press;
      EXPECT_GT(st.loss.rel_err, last_err) << press << " at " << ratio;
      EXPECT_GE(st.loss.evicted_mass, last_mass) << press << " at " << ratio;
      EXPECT_GE(st.loss.rel_err_max, st.loss.rel_err);
      EXPECT_EQ(st.loss.tokens_removed, st.tokens_before - st.tokens_after);
      last_err = st.loss.rel_err;
      last_mass = st.loss.evicted_mass;
    }
    EXPECT_GT(last_mass, 0.0) << press;
  }
}

struct DirectLoss {
  double rel_err = 0, rel_err_max = 0, evicted_mass = 0;
};

// The estimate written out from the keys and values `before` and `after` the plan, for the last
// kLossWindow of each layer's queries qs[il].
DirectLoss direct_loss(const Model& model, const KvCache& before, const KvCache& after,
                       const std::vector<ObservedQueries>& qs) {
  const HParams& hp = model.hparams();
  const KvCacheConfig& c = before.config();
  const int group = hp.n_head / c.n_head_kv, hd = c.head_dim_k;
  const float scale = attention_scale(hp);
  DirectLoss r;
  double evicted = 0, mass = 0;
  for (int il = 0; il < c.n_layer; ++il) {
    const ObservedQueries q = last_queries(qs[static_cast<size_t>(il)], kLossWindow);
    double diff = 0, norm = 0;
    for (int ih = 0; ih < c.n_head_kv; ++ih) {
      std::vector<float> kb, vb, ka, va;
      std::vector<int32_t> pb, pa;
      before.read_head(il, ih, &kb, &vb, &pb);
      after.read_head(il, ih, &ka, &va, &pa);
      for (int64_t iq = 0; iq < q.n; ++iq)
        for (int g = 0; g < group; ++g) {
          const float* qh = q.query(iq, ih * group + g, hp.n_head, hd);
          std::vector<double> of, oc, pf, pc;
          direct_attention(qh, q.pos[iq], kb, vb, pb, hd, scale, &of, &pf);
          direct_attention(qh, q.pos[iq], ka, va, pa, hd, scale, &oc, &pc);
          for (int i = 0; i < hd; ++i) {
            diff += (of[i] - oc[i]) * (of[i] - oc[i]);
            norm += of[i] * of[i];
          }
          size_t j = 0;
          for (size_t t = 0; t < pb.size(); ++t) {
            while (j < pa.size() && pa[j] < pb[t]) ++j;
            if (j == pa.size() || pa[j] != pb[t]) evicted += pf[t];
            mass += pf[t];
          }
        }
    }
    const double e = std::sqrt(diff / norm);
    r.rel_err += e / c.n_layer;
    r.rel_err_max = std::max(r.rel_err_max, e);
  }
  r.evicted_mass = evicted / mass;
  return r;
}

// The estimate of an eviction press equals the relative error and the evicted mass computed
// here from the keys and values before and after, with the window queries the session kept.
TEST_F(PressLossTest, EqualsADirectComputationForAnEvictionPress) {
  auto s = session("snapkv:ratio=0.6");
  const Session::State before = s->save_state();  // the uncompressed cache
  const CompressStats st = s->compress();
  ASSERT_TRUE(st.loss.measured);
  EXPECT_EQ(st.loss.queries, LossQueries::kWindow);
  const std::vector<ObservedQueries>& w = s->observations()->window;
  for (const ObservedQueries& q : w) ASSERT_GE(q.n, kLossWindow);
  const DirectLoss d = direct_loss(*model_, *before.cache, s->cache(), w);
  EXPECT_GT(st.loss.rel_err, 0.0);
  EXPECT_NEAR(st.loss.rel_err, d.rel_err, 1e-4);
  EXPECT_NEAR(st.loss.rel_err_max, d.rel_err_max, 1e-4);
  EXPECT_NEAR(st.loss.evicted_mass, d.evicted_mass, 1e-4);
}

// With a question observed for the compression (the kvpress protocol: the question after the
// compressed context), the estimate is measured on the question's queries — equal to the direct
// computation with them, not to the window's — for a press that is not query-aware too.
TEST_F(PressLossTest, UsesTheQuestionsQueriesWhenGiven) {
  for (int n_question : {12, 40}) {  // 40: the question's last kLossWindow
    auto s = session("snapkv:ratio=0.6");
    const std::vector<int32_t> question = test::tiny_tokens(n_question, 3);
    const Session::State before = s->save_state();
    const ContextCompression cc = compress_context(*s, question);
    ASSERT_TRUE(cc.ran);
    EXPECT_FALSE(cc.saw_question);  // snapkv is not query-aware: it did not score with it
    const PressLoss& l = cc.stats.loss;
    ASSERT_TRUE(l.measured);
    EXPECT_EQ(l.queries, LossQueries::kQuestion);
    EXPECT_STREQ(loss_queries_name(l.queries), "question");
    EXPECT_EQ(l.n_queries, std::min<int64_t>(n_question, kLossWindow));
    const std::vector<ObservedQueries>& qs = s->observations()->question;
    ASSERT_EQ(qs.size(), static_cast<size_t>(model_->hparams().n_layer));
    EXPECT_EQ(qs[0].n, n_question);
    EXPECT_EQ(qs[0].pos.front(), 120);  // after the context
    const DirectLoss d = direct_loss(*model_, *before.cache, s->cache(), qs);
    EXPECT_GT(l.rel_err, 0.0);
    EXPECT_NEAR(l.rel_err, d.rel_err, 1e-4) << n_question;
    EXPECT_NEAR(l.rel_err_max, d.rel_err_max, 1e-4);
    EXPECT_NEAR(l.evicted_mass, d.evicted_mass, 1e-4);
    const DirectLoss w = direct_loss(*model_, *before.cache, s->cache(), s->observations()->window);
    EXPECT_GT(std::abs(l.rel_err - w.rel_err), 1e-3);  // not the window's
  }
}

// Without a question, or with one since prefilled (stale: a decode-time compression), the
// estimate falls back to the window.
TEST_F(PressLossTest, FallsBackToTheWindowWithoutAQuestion) {
  auto s = session("snapkv:ratio=0.6");
  const ContextCompression cc = compress_context(*s, {});
  ASSERT_TRUE(cc.stats.loss.measured);
  EXPECT_EQ(cc.stats.loss.queries, LossQueries::kWindow);
  EXPECT_EQ(cc.stats.loss.n_queries, kLossWindow);
  EXPECT_STREQ(loss_queries_name(cc.stats.loss.queries), "window");
  auto t = session("snapkv:ratio=0.3");
  const std::vector<int32_t> question = test::tiny_tokens(10, 3);
  EXPECT_EQ(compress_context(*t, question).stats.loss.queries, LossQueries::kQuestion);
  t->prefill(question);  // the question is in the cache now, and more after it
  t->prefill(test::tiny_tokens(40, 5));
  const Session::State before = t->save_state();
  const PressLoss l = t->compress().loss;
  ASSERT_TRUE(l.measured);
  EXPECT_EQ(l.queries, LossQueries::kWindow);
  const DirectLoss d = direct_loss(*model_, *before.cache, t->cache(), t->observations()->window);
  EXPECT_NEAR(l.rel_err, d.rel_err, 1e-4);
  // a question with no room after the context (120 + 140 > n_ctx 256): the window, no error —
  // unless the press is query-aware and needs it
  auto u = session("snapkv:ratio=0.5");
  const ContextCompression cu = compress_context(*u, test::tiny_tokens(140, 3));
  ASSERT_TRUE(cu.ran);
  EXPECT_EQ(cu.stats.loss.queries, LossQueries::kWindow);
  auto aware = session("snapkv:ratio=0.5,query_aware=true");
  EXPECT_THROW(compress_context(*aware, test::tiny_tokens(140, 3)), LimitError);
}

// The question is observed for the estimate only: the plan of a press that is not query-aware is
// the same with and without the loss estimate (which observes the question), token for token;
// a query-aware press given a question it must not see (eval's shared compression) does not
// get it.
TEST_F(PressLossTest, AnObservedQuestionChangesNoPlanOfAPressThatIsNotQueryAware) {
  const std::vector<int32_t> question = test::tiny_tokens(12, 3);
  for (const char* press : {"snapkv:ratio=0.5", "tova:ratio=0.5", "expected_attention:ratio=0.5"}) {
    auto on = session(press, 120, /*loss=*/true);
    auto off = session(press, 120, /*loss=*/false);
    const ContextCompression a = compress_context(*on, question);
    const ContextCompression b = compress_context(*off, question);
    ASSERT_TRUE(a.ran && b.ran) << press;
    EXPECT_EQ(a.stats.loss.queries, LossQueries::kQuestion) << press;
    EXPECT_FALSE(b.stats.loss.measured);
    EXPECT_FALSE(on->observations()->question.empty() || on->observations()->question[0].n == 0);
    EXPECT_FALSE(off->observations()->has_question()) << press;  // the question was not observed
    EXPECT_EQ(a.stats.tokens_after, b.stats.tokens_after) << press;
    const KvCacheConfig& c = on->cache().config();
    for (int il = 0; il < c.n_layer; ++il)
      for (int ih = 0; ih < c.n_head_kv; ++ih) {
        std::vector<int32_t> pa, pb;
        on->cache().read_head(il, ih, nullptr, nullptr, &pa);
        off->cache().read_head(il, ih, nullptr, nullptr, &pb);
        EXPECT_EQ(pa, pb) << press << " layer " << il << " kv head " << ih;
      }
  }
  auto aware = session("snapkv:ratio=0.5,query_aware=true");
  ContextCompressOptions co;
  co.press_sees_question = false;
  EXPECT_THROW(compress_context(*aware, question, co), Error);  // no question for it to score with
  EXPECT_TRUE(compress_context(*aware, question).saw_question);
}

// A press that keeps every token and stores fewer coordinates of each is measured too (the
// compressed cache's own attention reads the pruned keys).
TEST_F(PressLossTest, MeasuresAChannelPress) {
  auto s = session("think:ratio=0.5");
  const CompressStats st = s->compress();
  ASSERT_TRUE(st.loss.measured);
  EXPECT_EQ(st.loss.tokens_removed, 0);
  EXPECT_EQ(st.loss.evicted_mass, 0.0);
  EXPECT_GT(st.loss.rel_err, 0.0);
}

TEST_F(PressLossTest, OffWithoutPressLoss) {
  auto s = session("snapkv:ratio=0.5", 120, /*loss=*/false);
  EXPECT_FALSE(s->compress().loss.measured);
  auto g = session("snapkv:ratio=0.5", 120, /*loss=*/false);
  ContextCompressOptions co;
  co.max_loss = 0.1;
  EXPECT_THROW(compress_context(*g, {}, co), Error);  // a limit without the estimate
}

TEST_F(PressLossTest, GuardAtZeroLeavesTheContextUncompressed) {
  auto s = session("snapkv:ratio=0.5");
  const int64_t before = total(*s);
  const size_t bytes = s->cache().bytes().total();
  ContextCompressOptions co;
  co.max_loss = 0;
  const ContextCompression cc = compress_context(*s, {}, co);
  EXPECT_FALSE(cc.ran);
  EXPECT_TRUE(cc.refused);
  EXPECT_EQ(total(*s), before);
  EXPECT_EQ(s->cache().bytes().total(), bytes);
  ASSERT_EQ(cc.attempts.size(), 1u + kMaxLossRetries);  // the press, then half, then a quarter
  EXPECT_EQ(cc.attempts[0].press, "snapkv:ratio=0.5");
  EXPECT_DOUBLE_EQ(cc.attempts[1].ratio, 0.25);
  EXPECT_DOUBLE_EQ(cc.attempts[2].ratio, 0.125);
  for (const CompressAttempt& a : cc.attempts) {
    EXPECT_FALSE(a.accepted);
    EXPECT_GT(a.loss.rel_err, 0.0);
  }
  EXPECT_NE(cc.note.find("exceeded the limit 0"), std::string::npos) << cc.note;
  // the uncompressed context still answers: the question's prefill continues it
  s->prefill(tokens(8));
  EXPECT_EQ(total(*s), before + 8 * s->cache().config().n_layer * s->cache().config().n_head_kv);
}

TEST_F(PressLossTest, GuardAtOneChangesNothing) {
  auto a = session("snapkv:ratio=0.5");
  auto b = session("snapkv:ratio=0.5");
  ContextCompressOptions off;
  off.max_loss = 1;
  const ContextCompression ca = compress_context(*a, {}, off);
  const ContextCompression cb = compress_context(*b, {}, ContextCompressOptions{});
  ASSERT_TRUE(ca.ran);
  ASSERT_EQ(ca.attempts.size(), 1u);
  EXPECT_TRUE(ca.attempts[0].accepted);
  EXPECT_EQ(ca.stats.tokens_after, cb.stats.tokens_after);
  EXPECT_EQ(ca.stats.loss.rel_err, cb.stats.loss.rel_err);
  EXPECT_EQ(a->cache().bytes().total(), b->cache().bytes().total());
}

// A limit between the estimates at 0.5 and 0.25 keeps the press at half its ratio.
TEST_F(PressLossTest, GuardKeepsTheFirstWeakerPressUnderTheLimit) {
  const double at_half = session("snapkv:ratio=0.5")->compress().loss.rel_err;
  auto q = session("snapkv:ratio=0.25");
  const CompressStats quarter = q->compress();
  ASSERT_LT(quarter.loss.rel_err, at_half);
  auto s = session("snapkv:ratio=0.5");
  ContextCompressOptions co;
  co.max_loss = (at_half + quarter.loss.rel_err) / 2;
  const ContextCompression cc = compress_context(*s, {}, co);
  ASSERT_TRUE(cc.ran);
  ASSERT_EQ(cc.attempts.size(), 2u);
  EXPECT_FALSE(cc.attempts[0].accepted);
  EXPECT_TRUE(cc.attempts[1].accepted);
  EXPECT_EQ(cc.attempts[1].press, "snapkv:ratio=0.25");
  EXPECT_EQ(cc.stats.tokens_after, quarter.tokens_after);
  EXPECT_EQ(total(*s), total(*q));
}

TEST_F(PressLossTest, BadLimitsAreRefusedNamingThem) {
  EXPECT_EQ(max_loss_problem(0, "x"), "");
  EXPECT_EQ(max_loss_problem(1, "x"), "");
  for (double bad : {-0.1, 1.5, std::nan("")})
    EXPECT_NE(max_loss_problem(bad, "--press-max-loss").find("--press-max-loss"), std::string::npos)
        << bad;
  auto s = session("snapkv:ratio=0.5");
  ContextCompressOptions co;
  co.max_loss = -1;
  EXPECT_THROW(compress_context(*s, {}, co), Error);
}

TEST(PressSpecRatio, HalvesEveryRatioOfAComposition) {
  PressSpec sp = parse_press_spec("snapkv:0.5+think:ratio=0.4");
  EXPECT_DOUBLE_EQ(press_spec_ratio(sp), 0.4);
  ASSERT_TRUE(halve_press_ratios(&sp));
  EXPECT_EQ(canonical_press_spec(sp), "snapkv:ratio=0.25+think:ratio=0.2");
  PressSpec def = parse_press_spec("knorm");  // the default ratio, halved
  const double r = press_spec_ratio(def);
  ASSERT_TRUE(halve_press_ratios(&def));
  EXPECT_DOUBLE_EQ(press_spec_ratio(def), r / 2);
  PressSpec wrapped = parse_press_spec("adakv(snapkv:ratio=0.6)");
  ASSERT_TRUE(halve_press_ratios(&wrapped));
  EXPECT_DOUBLE_EQ(press_spec_ratio(wrapped), 0.3);
  PressSpec counted = parse_press_spec("snapkv:budget=64");  // a count, no ratio to halve
  EXPECT_EQ(press_spec_ratio(counted), -1);
  EXPECT_FALSE(halve_press_ratios(&counted));
}

}  // namespace
}  // namespace kvtrim
