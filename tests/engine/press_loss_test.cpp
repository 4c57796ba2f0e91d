// The loss estimate (src/engine/press_loss.h) and the quality guard (--press-max-loss,
// ContextCompressOptions::max_loss) on a tiny qwen2 model: 0 for a compression that changes
// nothing, growing with the ratio, equal to a direct computation in this file for an eviction
// press; measured for a channel press too; the guard with limit 0 leaves the context whole
// (every attempt reported), with limit 1 changes nothing, in between keeps half the ratio.
#include "engine/press_loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "engine/context_question.h"
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

// The estimate of an eviction press equals the relative error and the evicted mass computed
// here from the keys and values before and after, with the window queries the session kept.
TEST_F(PressLossTest, EqualsADirectComputationForAnEvictionPress) {
  auto s = session("snapkv:ratio=0.6");
  const Session::State before = s->save_state();  // the uncompressed cache
  const CompressStats st = s->compress();
  ASSERT_TRUE(st.loss.measured);
  const HParams& hp = model_->hparams();
  const KvCacheConfig& c = s->cache().config();
  const int group = hp.n_head / c.n_head_kv, hd = c.head_dim_k;
  const float scale = attention_scale(hp);
  double err_sum = 0, err_max = 0, evicted = 0, mass = 0;
  for (int il = 0; il < c.n_layer; ++il) {
    const ObservedQueries q =
        last_queries(s->observations()->window[static_cast<size_t>(il)], kLossWindow);
    ASSERT_EQ(q.n, kLossWindow);
    double diff = 0, norm = 0;
    for (int ih = 0; ih < c.n_head_kv; ++ih) {
      std::vector<float> kb, vb, ka, va;
      std::vector<int32_t> pb, pa;
      before.cache->read_head(il, ih, &kb, &vb, &pb);
      s->cache().read_head(il, ih, &ka, &va, &pa);
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
    err_sum += e;
    err_max = std::max(err_max, e);
  }
  EXPECT_GT(st.loss.rel_err, 0.0);
  EXPECT_NEAR(st.loss.rel_err, err_sum / c.n_layer, 1e-4);
  EXPECT_NEAR(st.loss.rel_err_max, err_max, 1e-4);
  EXPECT_NEAR(st.loss.evicted_mass, evicted / mass, 1e-4);
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
