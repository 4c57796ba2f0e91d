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

namespace kvtrim {
namespace {

// ---------------------------------------------------------------------------------------
// A tiny random "model": keys, values, queries, W_O.

struct Fixture {
  int L = 3, H = 2, G = 2, d = 8, dv = 8, n_embd = 12;
  int N = 14;  // context tokens, positions 0..N-1
  int M_aware = 4;  // question tokens, positions N..N+M-1
  std::vector<int> window;  // per layer
  float scale = 0;
  // k[l][h][c][d], v[l][h][c][dv], qctx[l][m][hq][d] (positions m), qtask[l][m][hq][d],
  // ktask[l][m][h][d]: the question's own keys (positions N + m)
  std::vector<float> k, v, qctx, qtask, ktask;
  std::vector<std::vector<float>> wo;  // [l] [n_embd, H*G*dv] row-major
  int Hq() const { return H * G; }
  float& K(int l, int h, int c, int i) { return k[((static_cast<size_t>(l) * H + h) * N + c) * d + i]; }
  float& V(int l, int h, int c, int i) { return v[((static_cast<size_t>(l) * H + h) * N + c) * dv + i]; }

  Fixture() = default;
  explicit Fixture(uint32_t seed, bool sliding) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    window.assign(static_cast<size_t>(L), 0);
    if (sliding) window[1] = 6;
    scale = 0.9f / std::sqrt(static_cast<float>(d));
    auto fill = [&](std::vector<float>* x, size_t n, float sd) {
      x->resize(n);
      for (auto& e : *x) e = sd * nd(rng);
    };
    fill(&k, static_cast<size_t>(L * H * N * d), 1.5f);
    fill(&v, static_cast<size_t>(L * H * N * dv), 1.f);
    // value norms spread over ~1-10x so the weights matter
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < N; ++c) {
          const float s = 0.3f + 2.5f * std::fabs(nd(rng));
          for (int i = 0; i < dv; ++i) V(l, h, c, i) *= s;
        }
    fill(&qctx, static_cast<size_t>(L * N * Hq() * d), 1.5f);
    fill(&qtask, static_cast<size_t>(L * M_aware * Hq() * d), 1.5f);
    fill(&ktask, static_cast<size_t>(L * M_aware * H * d), 1.5f);
    wo.resize(static_cast<size_t>(L));
    for (auto& w : wo) fill(&w, static_cast<size_t>(n_embd * Hq() * dv), 1.f);
  }
};

// ---------------------------------------------------------------------------------------
// The brute force (double precision, straight from the paper).

struct Opt {
  std::string agg_task = "max", agg_group = "mean", agg_head = "mean", weight = "none";
  bool mean_heads = true, structured = true, aware = false;
  bool question_keys = true;  // aware: the question's own keys in the softmax denominator
  std::string budget_kind = "ratio";  // ratio | budget | total
  double ratio = 0.5;
  int64_t amount = 0;
  std::string spec() const {
    std::ostringstream s;
    s << "kvcompose:";
    if (budget_kind == "ratio") s << "ratio=" << ratio;
    else s << budget_kind << "=" << amount;
    s << ",agg_task=" << agg_task << ",agg_group=" << agg_group << ",agg_head=" << agg_head << ",weight=" << weight
      << ",mean_heads=" << (mean_heads ? 1 : 0) << ",mode=" << (structured ? "structured" : "unstructured")
      << ",task=" << (aware ? "aware" : "causal") << ",question_keys=" << (question_keys ? 1 : 0);
    return s.str();
  }
};

// log Σ exp(scale · q·k) of each question query head over the question's keys it sees (what
// the observer records as ObservedQueries::self_lse), straight from the definition.
std::vector<float> question_self_lse(const Fixture& f, int l) {
  const int M = f.M_aware, Hq = f.Hq();
  std::vector<float> out;
  for (int m = 0; m < M; ++m)
    for (int hq = 0; hq < Hq; ++hq) {
      std::vector<double> x;
      for (int j = 0; j <= m; ++j) {
        if (f.window[l] != 0 && m - j >= f.window[l]) continue;
        double dot = 0;
        const float* q = &f.qtask[((static_cast<size_t>(l) * M + m) * Hq + hq) * f.d];
        const float* k = &f.ktask[((static_cast<size_t>(l) * M + j) * f.H + hq / f.G) * f.d];
        for (int i = 0; i < f.d; ++i) dot += static_cast<double>(q[i]) * k[i];
        x.push_back(dot * f.scale);
      }
      const double mx = *std::max_element(x.begin(), x.end());
      double z = 0;
      for (double v : x) z += std::exp(v - mx);
      out.push_back(static_cast<float>(mx + std::log(z)));
    }
  return out;
}

// keep[l][h] = set of kept token indices
using KeepSets = std::vector<std::vector<std::set<int>>>;

KeepSets brute_force(Fixture& f, const Opt& o) {
  const int L = f.L, H = f.H, G = f.G, Hq = f.Hq(), N = f.N;
  const int M = o.aware ? f.M_aware : N;
  auto qv = [&](int l, int m, int hq) -> const float* {
    return o.aware ? &f.qtask[((static_cast<size_t>(l) * M + m) * Hq + hq) * f.d]
                   : &f.qctx[((static_cast<size_t>(l) * M + m) * Hq + hq) * f.d];
  };
  auto qpos = [&](int m) { return o.aware ? N + m : m; };
  const int n_past = N;
  // A[l][hq][c][m] (eq. 3)
  std::vector<double> A(static_cast<size_t>(L) * Hq * N * M, 0.0);
  auto a_at = [&](int l, int hq, int c, int m) -> double& {
    return A[((static_cast<size_t>(l) * Hq + hq) * N + c) * M + m];
  };
  for (int l = 0; l < L; ++l)
    for (int hq = 0; hq < Hq; ++hq)
      for (int m = 0; m < M; ++m) {
        const int h = hq / G;
        std::vector<double> logit(static_cast<size_t>(N), 0.0);
        std::vector<bool> vis(static_cast<size_t>(N), false);
        double mx = -1e300;
        for (int c = 0; c < N; ++c) {
          vis[c] = c <= qpos(m) && (f.window[l] == 0 || qpos(m) - c < f.window[l]);
          if (!vis[c]) continue;
          double dot = 0;
          for (int i = 0; i < f.d; ++i) dot += static_cast<double>(qv(l, m, hq)[i]) * f.K(l, h, c, i);
          logit[c] = dot * f.scale;
          mx = std::max(mx, logit[c]);
        }
        // the question's own keys it sees (positions N .. N + m): in the denominator only
        std::vector<double> own;
        if (o.aware && o.question_keys)
          for (int j = 0; j <= m; ++j) {
            if (f.window[l] != 0 && m - j >= f.window[l]) continue;
            double dot = 0;
            const float* kj = &f.ktask[((static_cast<size_t>(l) * M + j) * H + h) * f.d];
            for (int i = 0; i < f.d; ++i) dot += static_cast<double>(qv(l, m, hq)[i]) * kj[i];
            own.push_back(dot * f.scale);
            mx = std::max(mx, own.back());
          }
        double z = 0;
        for (int c = 0; c < N; ++c)
          if (vis[c]) z += std::exp(logit[c] - mx);
        for (double x : own) z += std::exp(x - mx);
        for (int c = 0; c < N; ++c) a_at(l, hq, c, m) = vis[c] ? std::exp(logit[c] - mx) / z : 0.0;
      }
  // eq. 14, weights, eq. 15, eq. 16
  std::vector<std::vector<std::vector<double>>> S(static_cast<size_t>(L),
                                                  std::vector<std::vector<double>>(static_cast<size_t>(H)));
  for (int l = 0; l < L; ++l) {
    std::vector<std::vector<double>> sg(static_cast<size_t>(H), std::vector<double>(static_cast<size_t>(N)));
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < N; ++c) {
        std::vector<double> per_g;
        for (int g = 0; g < G; ++g) {
          const int hq = h * G + g;
          double t = o.agg_task == "max" ? -1e300 : 0.0;
          for (int m = 0; m < M; ++m)
            t = o.agg_task == "max" ? std::max(t, a_at(l, hq, c, m)) : t + a_at(l, hq, c, m) / M;
          double w = 1;
          if (o.weight == "vnorm") {
            double n2 = 0;
            for (int i = 0; i < f.dv; ++i) n2 += static_cast<double>(f.V(l, h, c, i)) * f.V(l, h, c, i);
            w = std::sqrt(n2);
          } else if (o.weight == "vonorm") {  // ‖W_O^(hq) v‖, W_O^(hq) = columns hq*dv.. of wo
            double n2 = 0;
            for (int r = 0; r < f.n_embd; ++r) {
              double y = 0;
              for (int i = 0; i < f.dv; ++i)
                y += static_cast<double>(f.wo[l][static_cast<size_t>(r) * Hq * f.dv + hq * f.dv + i]) * f.V(l, h, c, i);
              n2 += y * y;
            }
            w = std::sqrt(n2);
          }
          per_g.push_back(t * w);
        }
        double r = o.agg_group == "max" ? *std::max_element(per_g.begin(), per_g.end()) : 0.0;
        if (o.agg_group == "mean") {
          for (double x : per_g) r += x / G;
        }
        sg[h][c] = r;
      }
    for (int h = 0; h < H; ++h) {
      S[l][h].resize(static_cast<size_t>(N));
      for (int c = 0; c < N; ++c) {
        double mean = 0;
        for (int i = 0; i < H; ++i) mean += sg[i][c] / H;
        S[l][h][c] = sg[h][c] + (o.mean_heads ? mean : 0.0);
      }
    }
  }
  // candidates: a sliding layer's tokens no future query sees are dropped
  auto live = [&](int l, int c) { return f.window[l] == 0 || c > n_past - f.window[l]; };
  int64_t b_total;
  if (o.budget_kind == "ratio") b_total = static_cast<int64_t>((1.0 - o.ratio) * static_cast<double>(L * N));
  else if (o.budget_kind == "budget") b_total = o.amount * L;
  else b_total = o.amount;
  KeepSets keep(static_cast<size_t>(L), std::vector<std::set<int>>(static_cast<size_t>(H)));
  if (o.structured) {
    // eq. 17: idx per head; eq. 18-19: I[l][k]
    std::vector<std::vector<std::vector<int>>> idx(static_cast<size_t>(L));
    struct P { double I; int l, k; };
    std::vector<P> pool;
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < H; ++h) {
        std::vector<int> ix;
        for (int c = 0; c < N; ++c)
          if (live(l, c)) ix.push_back(c);
        std::sort(ix.begin(), ix.end(), [&](int a, int b) {
          return S[l][h][a] != S[l][h][b] ? S[l][h][a] > S[l][h][b] : a < b;
        });
        idx[l].push_back(ix);
      }
      for (size_t k = 0; k < idx[l][0].size(); ++k) {
        double I = o.agg_head == "max" ? -1e300 : 0.0;
        for (int h = 0; h < H; ++h) {
          const double s = S[l][h][idx[l][h][k]];
          I = o.agg_head == "max" ? std::max(I, s) : I + s / H;
        }
        pool.push_back({I, l, static_cast<int>(k)});
      }
    }
    // eq. 22 with each layer's rank 0 forced (a head never goes empty)
    std::vector<int> n_l(static_cast<size_t>(L), 0);
    std::vector<P> rest;
    for (const P& p : pool) {
      if (p.k == 0) ++n_l[p.l];
      else rest.push_back(p);
    }
    std::sort(rest.begin(), rest.end(), [](const P& a, const P& b) {
      if (a.I != b.I) return a.I > b.I;
      return a.l != b.l ? a.l < b.l : a.k < b.k;
    });
    const int64_t take = std::clamp<int64_t>(b_total - L, 0, static_cast<int64_t>(rest.size()));
    for (int64_t i = 0; i < take; ++i) ++n_l[rest[i].l];
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int k = 0; k < n_l[l]; ++k) keep[l][h].insert(idx[l][h][k]);  // eqs. 23-24
  } else {
    struct P { double s; int l, h, c; };
    std::vector<P> rest;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        int best = -1;
        for (int c = 0; c < N; ++c)
          if (live(l, c) && (best < 0 || S[l][h][c] > S[l][h][best])) best = c;
        keep[l][h].insert(best);
        for (int c = 0; c < N; ++c)
          if (live(l, c) && c != best) rest.push_back({S[l][h][c], l, h, c});
      }
    std::sort(rest.begin(), rest.end(), [](const P& a, const P& b) {
      if (a.s != b.s) return a.s > b.s;
      if (a.l != b.l) return a.l < b.l;
      return a.h != b.h ? a.h < b.h : a.c < b.c;
    });
    const int64_t take = std::clamp<int64_t>(b_total * H - L * H, 0, static_cast<int64_t>(rest.size()));
    for (int64_t i = 0; i < take; ++i) keep[rest[i].l][rest[i].h].insert(rest[i].c);
  }
  return keep;
}

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

void ensure_registered() {
  if (!find_press("kvcompose")) register_press(kvcompose_press_info());
}

std::string dump(const KeepSets& k) {
  std::ostringstream s;
  for (size_t l = 0; l < k.size(); ++l)
    for (size_t h = 0; h < k[l].size(); ++h) {
      s << "l" << l << "h" << h << ":";
      for (int c : k[l][h]) s << " " << c;
      s << "\n";
    }
  return s.str();
}

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
// On a tiny random model: prefill (chunked) with the session's press observer, plan, and
// compare with the brute force computed from the captured queries and the cached keys; then
// the cache applies the plan, bytes drop and generation continues.

// Forwards every on_qkv to several observers (the press's, and one that captures all the
// queries for the brute force).
struct TeeObserver : ForwardObserver {
  std::vector<ForwardObserver*> to;
  void on_qkv(int il, int64_t n, const float* q, const float* k, const float* v, const int32_t* pos) override {
    for (ForwardObserver* o : to) o->on_qkv(il, n, q, k, v, pos);
  }
};

// Captures the keys of every forward call per layer ([n, n_head_kv, head_dim] appended).
struct KeyTap : ForwardObserver {
  std::vector<std::vector<float>> k;
  int row = 0;
  void on_qkv(int il, int64_t n, const float*, const float* kk, const float*, const int32_t*) override {
    if (k.size() <= static_cast<size_t>(il)) k.resize(static_cast<size_t>(il) + 1);
    k[static_cast<size_t>(il)].insert(k[static_cast<size_t>(il)].end(), kk, kk + static_cast<size_t>(n) * row);
  }
};

// Task-agnostic observations hold the accumulators (2 floats per (layer, query head, token),
// aligned with the cache) and no query.
void expect_task_accumulators_only(const Observations& ob, const KvCache& cache, const HParams& hp, int64_t n_queries) {
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
      EXPECT_EQ(ob.task_max[i].size(), n);
      EXPECT_EQ(ob.task_sum[i].size(), n);
      floats += ob.task_max[i].size() + ob.task_sum[i].size();
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
  const std::string path = test::write_tiny_model(test::tiny_spec(mc.arch, 3), test::temp_dir("kvcompose"));
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
    model->forward(ctx_tokens.data() + i, n, s.n_past(), s.cache(), logits.data(), false, &s.pool(), &tee);
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
      model->forward(question.data() + i, std::min(3, M - i), s.n_past(), s.cache(), logits.data(), false,
                     &s.pool(), &qtee);
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
        EXPECT_NEAR(got_lse[i], want_lse[i], 1e-4 * (1 + std::fabs(want_lse[i]))) << "layer " << l << " row " << i;
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
    for (int h = 0; h < f.H; ++h) EXPECT_EQ(s.cache().n_tokens(l, h), static_cast<int64_t>(want[l][h].size()));
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
  run_model_case({Arch::kLlama, "kvcompose:ratio=0.7,mode=unstructured,agg_task=mean,task=causal", o});
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
