// KVCompose against an independent brute force on tiny hand-made shapes: the 4-D attention
// tensor A[l, h_q, c, m] computed naively in double, aggregated, sorted and picked exactly as
// the paper writes it (eqs. 3, 14-24, appendix A.1.3 and A.2), compared with the kept index
// sets of the press (through a real cache, PressContext and Observations) for every option:
// agg_task / agg_group / agg_head, mean_heads, weight none / vnorm / vonorm, structured /
// unstructured, ratio / budget / total, task-agnostic / task-aware, with and without a
// sliding-window layer.
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
#include "test_util.h"
#include "tiny_model.h"
#include "press/press.h"
#include "press/token/kvcompose.h"
#include "press/token/kvcompose_core.h"
#include "kvcompose_brute_force.h"

namespace kvtrim {
namespace {

using kvcompose_test::brute_force;
using kvcompose_test::dump;
using kvcompose_test::ensure_registered;
using kvcompose_test::Fixture;
using kvcompose_test::KeepSets;
using kvcompose_test::Opt;
using kvcompose_test::question_self_lse;
// ---------------------------------------------------------------------------------------
// The press on the same data, through a real cache.

struct Harness {
  Fixture& f;
  HParams hp;
  std::unique_ptr<KvCache> cache;
  Observations obs;
  explicit Harness(Fixture& fx) : f(fx) {
    hp.arch = Arch::kLlama;
    hp.n_layer = f.L;
    hp.n_head = f.Hq();
    hp.n_head_kv = f.H;
    hp.head_dim_k = f.d;
    hp.head_dim_v = f.dv;
    hp.n_embd = f.n_embd;
    hp.attn_scale = f.scale;
    hp.sliding_window = f.window;
    KvCacheConfig cfg;
    cfg.n_layer = f.L;
    cfg.n_head_kv = f.H;
    cfg.head_dim_k = f.d;
    cfg.head_dim_v = f.dv;
    cfg.n_ctx = 64;
    cfg.dtype = KvDtype::kF32;
    cfg.sliding_window = f.window;
    cache = make_dense_cache(cfg);
    std::vector<int32_t> pos(static_cast<size_t>(f.N));
    for (int c = 0; c < f.N; ++c) pos[c] = c;
    for (int l = 0; l < f.L; ++l) {
      std::vector<float> kk(static_cast<size_t>(f.N * f.H * f.d)), vv(static_cast<size_t>(f.N * f.H * f.dv));
      for (int c = 0; c < f.N; ++c)
        for (int h = 0; h < f.H; ++h) {
          for (int i = 0; i < f.d; ++i) kk[(static_cast<size_t>(c) * f.H + h) * f.d + i] = f.K(l, h, c, i);
          for (int i = 0; i < f.dv; ++i) vv[(static_cast<size_t>(c) * f.H + h) * f.dv + i] = f.V(l, h, c, i);
        }
      cache->append(l, f.N, kk.data(), vv.data(), pos.data());
    }
    cache->advance(f.N);
    obs.window.resize(static_cast<size_t>(f.L));
    obs.question.resize(static_cast<size_t>(f.L));
    for (int l = 0; l < f.L; ++l) {
      auto& w = obs.window[static_cast<size_t>(l)];
      w.n = f.N;
      w.q.assign(f.qctx.begin() + static_cast<std::ptrdiff_t>(l) * f.N * f.Hq() * f.d,
                 f.qctx.begin() + static_cast<std::ptrdiff_t>(l + 1) * f.N * f.Hq() * f.d);
      w.pos = pos;
      auto& qq = obs.question[static_cast<size_t>(l)];
      qq.n = f.M_aware;
      qq.q.assign(f.qtask.begin() + static_cast<std::ptrdiff_t>(l) * f.M_aware * f.Hq() * f.d,
                  f.qtask.begin() + static_cast<std::ptrdiff_t>(l + 1) * f.M_aware * f.Hq() * f.d);
      for (int m = 0; m < f.M_aware; ++m) qq.pos.push_back(f.N + m);
      qq.self_lse = question_self_lse(f, l);
    }
  }

  KeepSets run(const Opt& o, ThreadPool* pool = nullptr) {
    auto press = make_press(o.spec());
    auto* kc = dynamic_cast<KVComposePress*>(press.get());
    EXPECT_NE(kc, nullptr);
    std::vector<WeightView> wo;
    for (auto& w : f.wo) {
      wo.push_back(WeightView{GgmlType::F32, w.data(), f.n_embd, f.Hq() * f.dv,
                              static_cast<size_t>(f.Hq() * f.dv) * sizeof(float)});
    }
    kc->bind_wo(wo);
    PressContext ctx(*cache, hp, &obs, pool);
    const CompressionPlan plan = press->plan(ctx);
    KeepSets keep(static_cast<size_t>(f.L), std::vector<std::set<int>>(static_cast<size_t>(f.H)));
    for (int l = 0; l < f.L; ++l)
      for (int h = 0; h < f.H; ++h) {
        const HeadPlan& hp_ = plan.at(l, h);
        if (hp_.keep_all) {
          for (int c = 0; c < f.N; ++c) keep[l][h].insert(c);
        } else {
          EXPECT_TRUE(std::is_sorted(hp_.keep.begin(), hp_.keep.end()));
          keep[l][h].insert(hp_.keep.begin(), hp_.keep.end());
        }
      }
    return keep;
  }
};

// Every option combination against the brute force.
void sweep(bool sliding, uint32_t seed, ThreadPool* pool, int* n_checked) {
  ensure_registered();
  Fixture f(seed, sliding);
  Harness hz(f);
  struct B { std::string kind; double ratio; int64_t amount; };
  const std::vector<B> budgets = {{"ratio", 0.3, 0}, {"ratio", 0.6, 0}, {"ratio", 0.9, 0},
                                  {"budget", 0, 4},  {"total", 0, 7},   {"total", 0, 2}};
  for (const std::string at : {"max", "mean"})
    for (const std::string ag : {"mean", "max"})
      for (const std::string ah : {"mean", "max"})
        for (const std::string w : {"none", "vnorm", "vonorm"})
          for (bool mh : {true, false})
            for (bool st : {true, false})
              for (int aware_qk : {0, 1, 2})  // causal, aware without / with the question's keys
                for (const B& b : budgets) {
                  const bool aware = aware_qk > 0;
                  Opt o;
                  o.agg_task = at;
                  o.agg_group = ag;
                  o.agg_head = ah;
                  o.weight = w;
                  o.mean_heads = mh;
                  o.structured = st;
                  o.aware = aware;
                  o.question_keys = aware_qk == 2;
                  o.budget_kind = b.kind;
                  o.ratio = b.ratio;
                  o.amount = b.amount;
                  if (!st && ah == "max") continue;  // agg_head is unused when unstructured
                  SCOPED_TRACE(o.spec());
                  const KeepSets want = brute_force(f, o);
                  const KeepSets got = hz.run(o, pool);
                  ASSERT_EQ(dump(got), dump(want));
                  ++*n_checked;
                }
}

TEST(KVCompose, MatchesBruteForceAllOptions) {
  int n = 0;
  sweep(false, 7, nullptr, &n);
  EXPECT_EQ(n, 1296);
}

TEST(KVCompose, MatchesBruteForceWithSlidingWindowLayer) {
  int n = 0;
  sweep(true, 11, nullptr, &n);
  EXPECT_EQ(n, 1296);
}

TEST(KVCompose, MatchesBruteForceOnThreadPool) {
  ThreadPool pool(3);
  int n = 0;
  sweep(true, 23, &pool, &n);
  EXPECT_EQ(n, 1296);
}

// Structured plans keep the same number of tokens in every head of a layer, layers differ,
// and the total is exactly B_total; different heads keep different tokens (composite tokens).
TEST(KVCompose, StructuredCountsAndBudget) {
  ensure_registered();
  Fixture f(5, false);
  Harness hz(f);
  Opt o;
  o.budget_kind = "total";
  o.amount = 17;
  o.mean_heads = false;  // eq. 16 pulls the heads together; without it they pick apart
  const KeepSets k = hz.run(o);
  int64_t total = 0;
  bool heads_differ = false;
  for (int l = 0; l < f.L; ++l) {
    EXPECT_EQ(k[l][0].size(), k[l][1].size()) << "layer " << l;
    total += static_cast<int64_t>(k[l][0].size());
    if (k[l][0] != k[l][1]) heads_differ = true;
  }
  EXPECT_EQ(total, 17);
  EXPECT_TRUE(heads_differ);
}

// The sliding-window layer drops the tokens no future query can see, whatever the budget.
TEST(KVCompose, SlidingWindowDropsDeadTokens) {
  ensure_registered();
  Fixture f(3, true);
  Harness hz(f);
  Opt o;
  o.ratio = 0.01;
  const KeepSets k = hz.run(o);
  for (int h = 0; h < f.H; ++h) {
    ASSERT_FALSE(k[1][h].empty());
    EXPECT_GT(*k[1][h].begin(), f.N - f.window[1]);  // positions > n_past - window only
    EXPECT_EQ(k[0][h].size(), static_cast<size_t>(f.N));  // global layers keep all at r≈0
  }
}

// Agg_task = max accumulated online over chunks of queries equals one pass over all.
TEST(KVComposeCore, OnlineAccumulationOverChunks) {
  Fixture f(9, false);
  const int l = 0, ih = 1;
  std::vector<float> k(static_cast<size_t>(f.N * f.d));
  std::vector<int32_t> kpos(static_cast<size_t>(f.N)), qpos(static_cast<size_t>(f.N));
  for (int c = 0; c < f.N; ++c) {
    kpos[c] = qpos[c] = c;
    for (int i = 0; i < f.d; ++i) k[static_cast<size_t>(c) * f.d + i] = f.K(l, ih, c, i);
  }
  for (auto agg : {kvcompose::Agg::kMax, kvcompose::Agg::kMean}) {
    std::vector<float> once(static_cast<size_t>(f.N * f.G), 0.f), chunked = once;
    kvcompose::accumulate_task_attention(f.qctx.data(), qpos.data(), f.N, f.Hq(), ih, f.G, f.d, k.data(),
                                         kpos.data(), f.N, f.scale, 0, agg, once.data(), nullptr);
    for (int m0 = 0; m0 < f.N; m0 += 5) {
      const int nm = std::min(5, f.N - m0);
      kvcompose::accumulate_task_attention(f.qctx.data() + static_cast<size_t>(m0) * f.Hq() * f.d, qpos.data() + m0,
                                           nm, f.Hq(), ih, f.G, f.d, k.data(), kpos.data(), f.N, f.scale, 0, agg,
                                           chunked.data(), nullptr);
    }
    for (size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(once[i], chunked[i], 1e-6f);
  }
}

// The paper's Figure 1 idea on explicit scores: each head ranks its own tokens, composite
// rank k aggregates the heads' k-th best, the global pool decides N_l per layer.
TEST(KVComposeCore, HandComputedSelection) {
  // layer 0: head 0 scores, head 1 scores; layer 1 likewise (already final S).
  std::vector<std::vector<std::vector<float>>> s = {
      {{0.9f, 0.1f, 0.5f, 0.2f}, {0.1f, 0.8f, 0.3f, 0.6f}},
      {{0.4f, 0.3f, 0.2f, 0.1f}, {0.2f, 0.1f, 0.3f, 0.05f}},
  };
  // layer 0: head orders {0,2,3,1} / {1,3,2,0}; I = mean: .85, .55, .25, .1
  // layer 1: head orders {0,1,2,3} / {2,0,1,3}; I = mean: .35, .25, .15, .075
  // B_total = 4: ranks 0 of both layers forced (.85, .35), then .55 (l0 k1), then .25 (l0 k2
  // ties l1 k1 at .25: the lower layer wins) -> N_0 = 3, N_1 = 1.
  const auto sel = kvcompose::select_structured(s, kvcompose::Agg::kMean, 4);
  EXPECT_EQ(sel.n_keep_layer, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(sel.keep[0], (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(sel.keep[1], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(sel.keep[2], (std::vector<int32_t>{0}));
  EXPECT_EQ(sel.keep[3], (std::vector<int32_t>{2}));
  // max over heads: I0 = .9,.6,.3,.1 ; I1 = .4,.3,.2,.1 -> B=4: .9,.4 forced, .6, then .3 (tie,
  // the lower layer wins) -> N = 3, 1
  const auto sm = kvcompose::select_structured(s, kvcompose::Agg::kMax, 4);
  EXPECT_EQ(sm.n_keep_layer, (std::vector<int64_t>{3, 1}));
  // unstructured, 5 entries: each head's best forced (.9, .8, .4, .3), then .6 (l0 h1 c3)
  const auto su = kvcompose::select_unstructured(s, 5);
  EXPECT_EQ(su.keep[0], (std::vector<int32_t>{0}));
  EXPECT_EQ(su.keep[1], (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(su.keep[2], (std::vector<int32_t>{0}));
  EXPECT_EQ(su.keep[3], (std::vector<int32_t>{2}));
}

// Eq. 16 with heads holding different positions (after a per-head press): a head that does
// not hold a position adds 0 to its mean.
// The reference code's choices: keep_min forces each layer's best keep_min composite tokens
// (they count toward B_total); layer0_max lifts layer 0's composite scores to the max over
// layers, so layer 0 keeps at least as many as any layer.
TEST(KVComposeCore, ReferenceLowerBoundAndLayerZeroBoost) {
  // 3 layers x 1 head x 4 tokens; layer 2 holds the high scores
  const std::vector<std::vector<std::vector<float>>> s = {{{0.1f, 0.2f, 0.05f, 0.01f}},
                                                          {{0.3f, 0.25f, 0.2f, 0.15f}},
                                                          {{0.9f, 0.8f, 0.7f, 0.6f}}};
  const auto plain = kvcompose::select_structured(s, kvcompose::Agg::kMean, 6);
  EXPECT_EQ(plain.n_keep_layer, (std::vector<int64_t>{1, 1, 4}));
  kvcompose::StructuredOptions lb;
  lb.keep_min = 2;
  const auto low = kvcompose::select_structured(s, kvcompose::Agg::kMean, 6, lb);
  EXPECT_EQ(low.n_keep_layer, (std::vector<int64_t>{2, 2, 2}));
  kvcompose::StructuredOptions l0;
  l0.layer0_max = true;
  const auto boost = kvcompose::select_structured(s, kvcompose::Agg::kMean, 6, l0);
  EXPECT_GE(boost.n_keep_layer[0], boost.n_keep_layer[2]);
  EXPECT_EQ(boost.n_keep_layer[0] + boost.n_keep_layer[1] + boost.n_keep_layer[2], 6);
  // layer 0 keeps its own best tokens, in its own order
  EXPECT_EQ(boost.keep[0], (std::vector<int32_t>{0, 1, 2}));
}

TEST(KVComposeCore, HeadMeanAlignsByPosition) {
  std::vector<std::vector<float>> s = {{1.f, 2.f, 3.f}, {10.f, 20.f}};
  const std::vector<std::vector<int32_t>> pos = {{0, 5, 9}, {5, 7}};
  kvcompose::add_head_mean(&s, pos);
  EXPECT_FLOAT_EQ(s[0][0], 1.f + 0.5f * 1.f);
  EXPECT_FLOAT_EQ(s[0][1], 2.f + 0.5f * (2.f + 10.f));
  EXPECT_FLOAT_EQ(s[0][2], 3.f + 0.5f * 3.f);
  EXPECT_FLOAT_EQ(s[1][0], 10.f + 0.5f * (2.f + 10.f));
  EXPECT_FLOAT_EQ(s[1][1], 20.f + 0.5f * 20.f);
}

TEST(KVCompose, RatioZeroIsNoop) {
  ensure_registered();
  Fixture f(2, false);
  Harness hz(f);
  auto press = make_press("kvcompose:0");
  PressContext ctx(*hz.cache, hz.hp, &hz.obs);
  const CompressionPlan p = press->plan(ctx);
  for (const auto& h : p.heads) EXPECT_TRUE(h.keep_all);
}

// Task-agnostic: the re-feed (chunked, refeed_test.cpp); causal: the running max / sum
// accumulators, never the queries (DESIGN §4.4: scoring must not double the cache);
// task-aware: the question's queries.
TEST(KVCompose, NeedsTaskAttentionOrTheQuestion) {
  ensure_registered();
  EXPECT_EQ(make_press("kvcompose")->needs().window, 0);
  EXPECT_TRUE(make_press("kvcompose")->needs().refeed.context);
  EXPECT_EQ(make_press("kvcompose")->needs().refeed.context_chunk, 512);
  EXPECT_FALSE(make_press("kvcompose")->needs().task_attn);
  EXPECT_TRUE(make_press("kvcompose:task=causal")->needs().task_attn);
  EXPECT_FALSE(make_press("kvcompose:task=causal")->needs().refeed.any());
  EXPECT_FALSE(make_press("kvcompose")->needs().question);
  EXPECT_FALSE(make_press("kvcompose:task=aware")->needs().task_attn);
  EXPECT_TRUE(make_press("kvcompose:task=aware")->needs().question);
  EXPECT_TRUE(make_press("kvcompose:query_aware=true")->needs().question);
  EXPECT_EQ(make_press("kvcompose:task=aware")->needs().window, 0);
}

TEST(KVCompose, BadOptionsAreClearErrors) {
  ensure_registered();
  for (const char* bad : {"kvcompose:mode=dense", "kvcompose:task=maybe", "kvcompose:agg_task=median",
                          "kvcompose:weight=knorm", "kvcompose:total=-1", "kvcompose:ratio=1"}) {
    EXPECT_THROW(make_press(bad), Error) << bad;
  }
  // vonorm without W_O bound
  Fixture f(2, false);
  Harness hz(f);
  auto press = make_press("kvcompose:weight=vonorm");
  PressContext ctx(*hz.cache, hz.hp, &hz.obs);
  try {
    press->plan(ctx);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("W_O"), std::string::npos) << e.what();
  }
  // no observations
  PressContext bare(*hz.cache, hz.hp, nullptr);
  EXPECT_THROW(make_press("kvcompose")->plan(bare), Error);
}


// ---------------------------------------------------------------------------------------

}  // namespace
}  // namespace kvtrim
