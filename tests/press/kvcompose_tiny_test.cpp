// KVCompose on a tiny random model (split from kvcompose_test.cpp, which checks hand-made
// shapes): prefill (chunked) with the session's press observer, plan, and compare with the brute
// force (kvcompose_brute_force.h) computed from the captured queries and the cached keys; then the
// cache applies the plan, bytes drop and generation continues.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "kvcompose_brute_force.h"
#include "press/press.h"
#include "press/token/kvcompose.h"
#include "press/token/kvcompose_core.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim {
namespace {

using kvcompose_test::brute_force;
using kvcompose_test::dump;
using kvcompose_test::ensure_registered;
using kvcompose_test::Fixture;
using kvcompose_test::KeepSets;
using kvcompose_test::Opt;
using kvcompose_test::question_self_lse;

// Forwards every on_qkv to several observers (the press's, and one that captures all the
// queries for the brute force).
struct TeeObserver : ForwardObserver {
  std::vector<ForwardObserver*> to;
  void on_qkv(int il, int64_t n, const float* q, const float* k, const float* v,
              const int32_t* pos) override {
    for (ForwardObserver* o : to) o->on_qkv(il, n, q, k, v, pos);
  }
};

// Captures the keys of every forward call per layer ([n, n_head_kv, head_dim] appended).
struct KeyTap : ForwardObserver {
  std::vector<std::vector<float>> k;
  int row = 0;
  void on_qkv(int il, int64_t n, const float*, const float* kk, const float*,
              const int32_t*) override {
    if (k.size() <= static_cast<size_t>(il)) k.resize(static_cast<size_t>(il) + 1);
    k[static_cast<size_t>(il)].insert(k[static_cast<size_t>(il)].end(), kk,
                                      kk + static_cast<size_t>(n) * row);
  }
};

// Task-agnostic observations hold the accumulators (2 floats per (layer, query head, token),
// aligned with the cache) and no query.
void expect_task_accumulators_only(const Observations& ob, const KvCache& cache, const HParams& hp,
                                   int64_t n_queries) {
  const int G = hp.n_head / hp.n_head_kv;
  EXPECT_TRUE(ob.window.empty()) << "no query store in task-agnostic mode";
  EXPECT_FALSE(ob.has_question());
  ASSERT_TRUE(ob.has_task_attn());
  size_t floats = 0, want = 0;
  for (int l = 0; l < hp.n_layer; ++l) {
    EXPECT_EQ(static_cast<int64_t>(ob.task_pos[static_cast<size_t>(l)].size()), n_queries);
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const size_t i = static_cast<size_t>(l * hp.n_head_kv + h);
      const size_t n = static_cast<size_t>(cache.n_tokens(l, h) * G);
      EXPECT_EQ(ob.stat(TokenStat::kTaskMax)[i].size(), n);
      EXPECT_EQ(ob.stat(TokenStat::kTaskSum)[i].size(), n);
      floats += ob.stat(TokenStat::kTaskMax)[i].size() + ob.stat(TokenStat::kTaskSum)[i].size();
      want += 2 * n;
    }
  }
  EXPECT_EQ(floats, want);  // O(L · N · H_q) · 2, not O(L · N · H_q · d_k)
}

struct ModelCase {
  Arch arch;
  std::string spec;
  Opt opt;
};

void run_model_case(const ModelCase& mc) {
  ensure_registered();
  SCOPED_TRACE(mc.spec);
  const std::string path =
      test::write_tiny_model(test::tiny_spec(mc.arch, 3), test::temp_dir("kvcompose"));
  auto model = Model::load(path);
  const HParams& hp = model->hparams();
  const int N = 40, M = 5;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> tok(0, test::tiny_vocab_size() - 1);
  std::vector<int32_t> ctx_tokens(N), question(M);
  for (auto& t : ctx_tokens) t = tok(rng);
  for (auto& t : question) t = tok(rng);

  SessionParams sp;
  sp.n_ctx = 128;
  sp.n_threads = 2;
  sp.n_batch = 7;  // several chunks: the captured queries must cover all of them
  sp.kv_dtype = KvDtype::kF32;

  // 1. manual run: our own observer, so the observations can be checked against the plan
  Session s(*model, sp);
  auto press = make_press(mc.spec);
  auto* kc = dynamic_cast<KVComposePress*>(press.get());
  ASSERT_NE(kc, nullptr);
  kc->bind_model(*model);
  PressObserver obs(*model, s.cache(), press->needs());
  obs.set_pool(&s.pool());
  // task-agnostic: the press's observer accumulates; a second one captures every query, only
  // so that the brute force can be computed from them
  PressNeeds all_queries;
  all_queries.window = PressNeeds::kAllQueries;
  PressObserver capture(*model, s.cache(), all_queries);
  TeeObserver tee;
  tee.to = {&obs, &capture};
  std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
  for (int i = 0; i < N; i += sp.n_batch) {
    const int n = std::min(sp.n_batch, N - i);
    model->forward(ctx_tokens.data() + i, n, s.n_past(), s.cache(), logits.data(), false, &s.pool(),
                   &tee);
  }
  ASSERT_EQ(s.n_past(), N);
  if (!mc.opt.aware) expect_task_accumulators_only(obs.observations(), s.cache(), hp, N);
  KeyTap question_keys;  // the question's keys leave the cache: the brute force needs them
  question_keys.row = hp.n_head_kv * hp.head_dim_k;
  if (mc.opt.aware) {
    obs.begin_question();
    TeeObserver qtee;
    qtee.to = {&obs, &question_keys};
    for (int i = 0; i < M; i += 3)  // in chunks: later queries see earlier chunks' keys
      model->forward(question.data() + i, std::min(3, M - i), s.n_past(), s.cache(), logits.data(),
                     false, &s.pool(), &qtee);
    obs.end_question();
    s.cache().truncate(N);
  }
  const Observations& ob = obs.observations();

  // the brute force's inputs, from what was captured and cached
  Fixture f;
  f.L = hp.n_layer;
  f.H = hp.n_head_kv;
  f.G = hp.n_head / hp.n_head_kv;
  f.d = hp.head_dim_k;
  f.dv = hp.head_dim_v;
  f.n_embd = hp.n_embd;
  f.N = N;
  f.M_aware = M;
  f.window = hp.sliding_window;
  f.scale = hp.attn_scale > 0 ? hp.attn_scale : 1.f / std::sqrt(static_cast<float>(f.d));
  f.k.resize(static_cast<size_t>(f.L * f.H * N * f.d));
  f.v.resize(static_cast<size_t>(f.L * f.H * N * f.dv));
  for (int l = 0; l < f.L; ++l) {
    for (int h = 0; h < f.H; ++h) {
      std::vector<float> kk, vv;
      std::vector<int32_t> pp;
      s.cache().read_head(l, h, &kk, &vv, &pp);
      ASSERT_EQ(pp.size(), static_cast<size_t>(N));
      for (int c = 0; c < N; ++c) {
        ASSERT_EQ(pp[c], c);
        for (int i = 0; i < f.d; ++i) f.K(l, h, c, i) = kk[static_cast<size_t>(c) * f.d + i];
        for (int i = 0; i < f.dv; ++i) f.V(l, h, c, i) = vv[static_cast<size_t>(c) * f.dv + i];
      }
    }
    const auto& w = capture.observations().window[static_cast<size_t>(l)];
    if (!mc.opt.aware) {
      ASSERT_EQ(w.n, N) << "every context query captured";
      for (int m = 0; m < N; ++m) ASSERT_EQ(w.pos[m], m);
      f.qctx.insert(f.qctx.end(), w.q.begin(), w.q.end());
    } else {
      const auto& q = ob.question[static_cast<size_t>(l)];
      ASSERT_EQ(q.n, M);
      for (int m = 0; m < M; ++m) ASSERT_EQ(q.pos[m], N + m);
      f.qtask.insert(f.qtask.end(), q.q.begin(), q.q.end());
      f.ktask.insert(f.ktask.end(), question_keys.k[static_cast<size_t>(l)].begin(),
                     question_keys.k[static_cast<size_t>(l)].end());
    }
    const WeightView& wo = model->layers()[static_cast<size_t>(l)].wo;
    f.wo.emplace_back(static_cast<size_t>(wo.n_rows * wo.n_cols));
    for (int64_t r = 0; r < wo.n_rows; ++r) get_row(wo, r, f.wo.back().data() + r * wo.n_cols);
  }
  if (mc.opt.aware) {
    // the observer's self_lse against the definition, from the captured keys
    for (int l = 0; l < f.L; ++l) {
      const std::vector<float> want_lse = question_self_lse(f, l);
      const std::vector<float>& got_lse = ob.question[static_cast<size_t>(l)].self_lse;
      ASSERT_EQ(got_lse.size(), want_lse.size());
      for (size_t i = 0; i < want_lse.size(); ++i)
        EXPECT_NEAR(got_lse[i], want_lse[i], 1e-4 * (1 + std::fabs(want_lse[i])))
            << "layer " << l << " row " << i;
    }
  }
  const KeepSets want = brute_force(f, mc.opt);
  PressContext pctx(s.cache(), hp, &ob, &s.pool());
  const CompressionPlan plan = press->plan(pctx);
  KeepSets got(static_cast<size_t>(f.L), std::vector<std::set<int>>(static_cast<size_t>(f.H)));
  for (int l = 0; l < f.L; ++l)
    for (int h = 0; h < f.H; ++h) {
      const HeadPlan& p = plan.at(l, h);
      if (p.keep_all) {
        for (int c = 0; c < N; ++c) got[l][h].insert(c);
      } else {
        got[l][h].insert(p.keep.begin(), p.keep.end());
      }
    }
  ASSERT_EQ(dump(got), dump(want));

  // 2. the cache applies the plan: bytes drop, counts match, decoding continues
  const size_t before = s.cache().bytes().total();
  s.cache().apply(plan);
  EXPECT_LT(s.cache().bytes().total(), before);
  EXPECT_EQ(s.n_past(), N);
  for (int l = 0; l < f.L; ++l)
    for (int h = 0; h < f.H; ++h)
      EXPECT_EQ(s.cache().n_tokens(l, h), static_cast<int64_t>(want[l][h].size()));
  for (int i = 0; i < 4; ++i) {
    const auto& lg = s.decode(tok(rng));
    for (float x : lg) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_EQ(s.n_past(), N + 4);

  // 3. the same through the session (set_press, prefill, question, compress, generate)
  // (vo-norm included: the session passes the model, so the press finds W_O itself)
  Session s2(*model, sp);
  s2.set_press(make_press(mc.spec));
  s2.prefill(ctx_tokens);
  if (mc.opt.aware) s2.observe_question(question);
  if (!mc.opt.aware) expect_task_accumulators_only(*s2.observations(), s2.cache(), hp, N);
  const CompressStats st = s2.compress();
  EXPECT_LT(st.bytes_after, st.bytes_before);
  for (int l = 0; l < f.L; ++l)
    for (int h = 0; h < f.H; ++h) {
      EXPECT_EQ(s2.cache().n_tokens(l, h), static_cast<int64_t>(want[l][h].size()));
      std::vector<int32_t> pp;  // the session's plan (threaded accumulation) keeps the same tokens
      s2.cache().read_head(l, h, nullptr, nullptr, &pp);
      EXPECT_EQ(std::set<int>(pp.begin(), pp.end()), want[l][h]) << "layer " << l << " head " << h;
    }
  // the accumulators follow the cache: rows of dropped tokens removed
  if (!mc.opt.aware) expect_task_accumulators_only(*s2.observations(), s2.cache(), hp, N);
  GenerateParams gp;
  gp.max_new_tokens = 5;
  gp.stop_at_eog = false;
  const GenerateResult r = s2.generate({}, gp);
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_GE(s2.n_past(), N + 4);  // the last sampled token is not fed back yet
  if (!mc.opt.aware) {
    // without decode-time compression, decode tokens get rows (aligned with the cache) but
    // their queries are not accumulated: M stays the N prefill queries
    expect_task_accumulators_only(*s2.observations(), s2.cache(), hp, N);
    s2.truncate(N + 2);
    expect_task_accumulators_only(*s2.observations(), s2.cache(), hp, N);
    // with decode-time compression scheduled, decode queries accumulate too and truncating
    // drops their rows and their count
    Session s3(*model, sp);
    PressSchedule every;
    every.decode_every = 1000;  // scheduled, never reached here
    every.decode_target = 4;
    s3.set_press(make_press(mc.spec), every);
    s3.prefill(ctx_tokens);
    s3.compress();
    s3.generate({}, gp);
    expect_task_accumulators_only(*s3.observations(), s3.cache(), hp, s3.n_past());
    s3.truncate(N + 2);
    expect_task_accumulators_only(*s3.observations(), s3.cache(), hp, N + 2);
  }
}

Opt opt_of(const std::string& kind, double ratio, int64_t amount) {
  Opt o;
  o.budget_kind = kind;
  o.ratio = ratio;
  o.amount = amount;
  return o;
}

TEST(KVComposeTinyModel, LlamaTaskAgnosticStructured) {
  run_model_case({Arch::kLlama, "kvcompose:ratio=0.5,task=causal", opt_of("ratio", 0.5, 0)});
}

TEST(KVComposeTinyModel, LlamaUnstructuredMeanTask) {
  Opt o = opt_of("ratio", 0.7, 0);
  o.structured = false;
  o.agg_task = "mean";
  run_model_case(
      {Arch::kLlama, "kvcompose:ratio=0.7,mode=unstructured,agg_task=mean,task=causal", o});
}

TEST(KVComposeTinyModel, LlamaVoNormTotalBudget) {
  Opt o = opt_of("total", 0, 30);
  o.weight = "vonorm";
  run_model_case({Arch::kLlama, "kvcompose:total=30,weight=vonorm,task=causal", o});
}

TEST(KVComposeTinyModel, LlamaTaskAware) {
  Opt o = opt_of("ratio", 0.6, 0);
  o.aware = true;
  o.agg_group = "max";
  o.agg_head = "max";
  run_model_case({Arch::kLlama, "kvcompose:ratio=0.6,task=aware,agg_group=max,agg_head=max", o});
}

TEST(KVComposeTinyModel, LlamaTaskAwareContextOnlySoftmax) {
  Opt o = opt_of("ratio", 0.6, 0);
  o.aware = true;
  o.question_keys = false;
  run_model_case({Arch::kLlama, "kvcompose:ratio=0.6,task=aware,question_keys=0", o});
}

TEST(KVComposeTinyModel, Gemma3TaskAwareSlidingWindowLayers) {
  Opt o = opt_of("ratio", 0.5, 0);
  o.aware = true;
  o.agg_task = "mean";
  run_model_case({Arch::kGemma3, "kvcompose:ratio=0.5,task=aware,agg_task=mean", o});
}

TEST(KVComposeTinyModel, Gemma3SlidingWindowLayers) {
  Opt o = opt_of("ratio", 0.5, 0);
  o.weight = "vnorm";
  run_model_case({Arch::kGemma3, "kvcompose:ratio=0.5,weight=vnorm,task=causal", o});
}

TEST(KVComposeTinyModel, Qwen2PerLayerBudget) {
  run_model_case({Arch::kQwen2, "kvcompose:budget=12,task=causal", opt_of("budget", 0, 12)});
}

}  // namespace
}  // namespace kvtrim
