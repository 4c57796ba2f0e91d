// The channel-axis presses (ThinK, SPARK) against a brute-force computation written here,
// independently of src/press: the tiny model's captured post-RoPE q and k, the papers' / the
// authors' code's saliency, and each token's (or head's) kept channels and recovery payload.
// Then the bytes they free and that they compose with token eviction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "basis_test_util.h"
#include "core/thread_pool.h"
#include "press_fixture.h"
#include "press_sweeps.h"

namespace kvtrim {
namespace {

using test::CaptureAll;

class ChannelPress : public test::PressFixture {};

constexpr int kChannelTokens = 48;  // prompt tokens
constexpr int kW = 32;  // observation window

// The top k of s (ties: lower index), as increasing indices; and the sorted order.
std::vector<int32_t> bf_top(const std::vector<double>& s, int k, std::vector<int32_t>* order = nullptr) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
  if (order) *order = idx;
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Per channel of kv head ih at layer il, over the last kW queries: (a) mean of q² over window and
// group, (b) L2 norm over the window of the group-mean query, (c) |mean of the group-mean query|.
struct BfWindow {
  std::vector<double> sq, l2, abs_mean;
};
// Query rows [first, first + nw) of the capture (default: the context's last kW).
BfWindow bf_window(const CaptureAll& c, int il, int ih, int group, int64_t first = kChannelTokens - kW, int nw = kW) {
  BfWindow w;
  w.sq.assign(c.d, 0);
  w.l2.assign(c.d, 0);
  w.abs_mean.assign(c.d, 0);
  for (int64_t i = first; i < first + nw; ++i)
    for (int j = 0; j < c.d; ++j) {
      double gm = 0;
      for (int g = 0; g < group; ++g) {
        const double x = c.qrow(il, i, ih * group + g)[j];
        gm += x / group;
        w.sq[j] += x * x / (nw * group);
      }
      w.l2[j] += gm * gm;
      w.abs_mean[j] += gm / nw;
    }
  for (int j = 0; j < c.d; ++j) {
    w.l2[j] = std::sqrt(w.l2[j]);
    w.abs_mean[j] = std::abs(w.abs_mean[j]);
  }
  return w;
}

// The per-token rows of a plan's side: row r's kept channels.
std::vector<int32_t> row_of(const SideSpec& c, size_t r) {
  const int T = c.channels.topk();
  size_t at = 0;
  for (size_t i = 0; i < r; ++i)
    at += T > 0 ? static_cast<size_t>(T) : static_cast<size_t>(c.rows.counts[i]);
  const size_t n = T > 0 ? static_cast<size_t>(T) : static_cast<size_t>(c.rows.counts[r]);
  return std::vector<int32_t>(c.rows.channels.begin() + static_cast<std::ptrdiff_t>(at),
                              c.rows.channels.begin() + static_cast<std::ptrdiff_t>(at + n));
}

// A plan side's per-head subset (empty: none) as int32 coordinates.
std::vector<int32_t> subset_of(const SideSpec& c) {
  const ChannelSubset* s = c.channels.subset();
  return s ? std::vector<int32_t>(s->channels.begin(), s->channels.end()) : std::vector<int32_t>{};
}

TEST_F(ChannelPress, ThinKMatchesBruteForce) {
  const auto c = capture(tokens(kChannelTokens));
  const HParams& hp = model_->hparams();
  const int group = hp.n_head / hp.n_head_kv;
  for (double ratio : {0.25, 0.5, 0.8}) {
    for (const char* count : {"code", "paper"}) {
      auto s = prefilled(strprintf("think:ratio=%g,count=%s", ratio, count), tokens(kChannelTokens));
      const CompressionPlan p = plan_of(*s);
      const int keep = std::string(count) == "code" ? c.d - static_cast<int>(ratio * c.d)
                                                    : static_cast<int>(std::floor((1 - ratio) * c.d));
      for (int il = 0; il < p.n_layer; ++il)
        for (int ih = 0; ih < p.n_head_kv; ++ih) {
          const BfWindow w = bf_window(c, il, ih, group);
          std::vector<double> score(c.d, 0);
          for (int j = 0; j < c.d; ++j) {
            double ks = 0;
            for (int t = 0; t < kChannelTokens; ++t) ks += double(c.krow(il, t, ih)[j]) * c.krow(il, t, ih)[j];
            score[j] = w.sq[j] * ks / kChannelTokens;
          }
          const HeadPlan& h = p.at(il, ih);
          EXPECT_TRUE(h.keep_all);
          EXPECT_EQ(subset_of(h.key), bf_top(score, keep))
              << "ratio " << ratio << " layer " << il << " head " << ih;
          EXPECT_FALSE(h.value.set());
        }
    }
  }
}

// SPARK's per-token choice and recovery payload, every saliency and variant.
struct SparkCase {
  std::string opts;
  bool code_saliency;
  char variant;  // 'r' ratio, 'p' top-p, 'g' groups (code), 'G' groups (paper)
  double ratio;
  int groups;
};

std::vector<int32_t> bf_spark_row(const std::vector<double>& sal, const SparkCase& sc, int d) {
  std::vector<int32_t> order;
  bf_top(sal, 1, &order);
  auto top_p = [&] {
    double total = 0, cum = 0;
    for (double x : sal) total += x;
    for (int j = 0; j < d; ++j) {
      cum += sal[order[j]];
      if (cum > 0.99 * total) return j + 1;
    }
    return 1;
  };
  int k = d - static_cast<int>(sc.ratio * d);
  if (sc.variant == 'p') k = top_p();
  if (sc.variant == 'g') {
    const int idx = top_p() - 1;
    const std::vector<double> b = sc.groups == 4 ? std::vector<double>{0.25, 0.5, 0.75} : std::vector<double>{0.2, 0.4, 0.6, 0.8};
    const std::vector<double> kr = sc.groups == 4 ? std::vector<double>{0.25, 0.5, 0.75, 1.0}
                                                  : std::vector<double>{0.1, 0.3, 0.5, 0.7, 0.9};
    size_t g = 0;
    while (g < b.size() && idx > static_cast<int>(b[g] * d)) ++g;
    k = std::max(1, static_cast<int>(kr[g] * d));
  }
  std::vector<int32_t> kept;
  if (sc.variant == 'G') {  // sorted segments, segment i prunes r_i of its channels
    const std::vector<double> r = sc.groups == 4 ? std::vector<double>{0.25, 0.5, 0.75, 1.0}
                                                 : std::vector<double>{0.1, 0.3, 0.5, 0.7, 0.9};
    for (int gi = 0; gi < sc.groups; ++gi) {
      const int a = gi * d / sc.groups, e = (gi + 1) * d / sc.groups;
      const int keep = (e - a) - static_cast<int>(r[gi] * (e - a));
      for (int j = 0; j < keep; ++j) kept.push_back(order[a + j]);
    }
  } else {
    kept.assign(order.begin(), order.begin() + k);
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST_F(ChannelPress, SparkMatchesBruteForce) {
  const auto c = capture(tokens(kChannelTokens));
  const HParams& hp = model_->hparams();
  const int group = hp.n_head / hp.n_head_kv;
  const SparkCase cases[] = {{"ratio=0.5", true, 'r', 0.5, 4},
                             {"ratio=0.8", true, 'r', 0.8, 4},
                             {"ratio=0.8,saliency=paper", false, 'r', 0.8, 4},
                             {"variant=p", true, 'p', 0, 4},
                             {"variant=g", true, 'g', 0, 4},
                             {"variant=g,groups=5", true, 'g', 0, 5},
                             {"variant=g,grouping=paper", true, 'G', 0, 4},
                             {"variant=g,grouping=paper,groups=5,saliency=paper", false, 'G', 0, 5}};
  for (const SparkCase& sc : cases) {
    SCOPED_TRACE(sc.opts);
    auto s = prefilled("spark:" + sc.opts, tokens(kChannelTokens));
    const CompressionPlan p = plan_of(*s);
    {  // the (layer, kv head) pairs spread over a pool give the same plan
      ThreadPool pool(2);
      const CompressionPlan pp = s->press()->plan(PressContext(s->cache(), model_->hparams(), s->observations(), &pool));
      for (int il = 0; il < p.n_layer; ++il)
        for (int ih = 0; ih < p.n_head_kv; ++ih) {
          const SideSpec &a = p.at(il, ih).key, &b = pp.at(il, ih).key;
          ASSERT_EQ(a.rows.channels, b.rows.channels);
          ASSERT_EQ(a.rows.counts, b.rows.counts);
          ASSERT_EQ(a.rows.fill, b.rows.fill);
        }
    }
    for (int il = 0; il < p.n_layer; ++il)
      for (int ih = 0; ih < p.n_head_kv; ++ih) {
        const BfWindow w = bf_window(c, il, ih, group);
        const std::vector<double>& qn = sc.code_saliency ? w.l2 : w.abs_mean;
        const SideSpec& ch = p.at(il, ih).key;
        ASSERT_EQ(ch.channels.topk() == 0, sc.variant != 'r');
        ASSERT_NE(ch.channels.recovery(), nullptr);
        ASSERT_EQ(ch.channels.recovery()->scale.size(), static_cast<size_t>(c.d));
        for (int j = 0; j < c.d; ++j) {  // r = 1/sqrt(‖Q[:,c]‖) or 1/|q̄_c| (compared as 1/r: |q̄_c| may be ~0)
          const double inv = 1.0 / ch.channels.recovery()->scale[j];
          EXPECT_NEAR(sc.code_saliency ? inv * inv : inv, qn[j], 1e-6 + 1e-4 * qn[j]);
        }
        for (int t = 0; t < kChannelTokens; ++t) {
          std::vector<double> sal(c.d);
          for (int j = 0; j < c.d; ++j) {
            const double k = c.krow(il, t, ih)[j];
            sal[j] = sc.code_saliency ? k * k * qn[j] : std::abs(k) * qn[j];
          }
          const std::vector<int32_t> want = bf_spark_row(sal, sc, c.d);
          EXPECT_EQ(row_of(ch, static_cast<size_t>(t)), want) << "layer " << il << " head " << ih << " token " << t;
          // degenerate recovery: F(mean pruned saliency)
          double mu = 0;
          int np = 0;
          for (int j = 0; j < c.d; ++j)
            if (!std::binary_search(want.begin(), want.end(), j)) mu += sal[j], ++np;
          mu = np ? mu / np : 0;
          const double fill = sc.code_saliency ? std::sqrt(mu) : mu;
          EXPECT_NEAR(ch.rows.fill[static_cast<size_t>(t)], fill, 1e-4 * std::max(1e-3, fill));
        }
      }
  }
}

// query_aware=true: the question's queries (observed by the session, then dropped) are the
// window of both presses; brute force over the same queries from one forward pass of context +
// question (causal, so they are the queries the session observes).
TEST_F(ChannelPress, QueryAwareWindowIsTheQuestion) {
  constexpr int kQ = 7;
  const auto all = tokens(kChannelTokens + kQ);
  const std::vector<int32_t> ctx_tokens(all.begin(), all.begin() + kChannelTokens), question(all.begin() + kChannelTokens, all.end());
  const auto c = capture(all);
  const HParams& hp = model_->hparams();
  const int group = hp.n_head / hp.n_head_kv;
  const SparkCase sc{"ratio=0.8,query_aware=true", true, 'r', 0.8, 4};
  for (const std::string& spec : {"spark:" + sc.opts, std::string("think:ratio=0.5,query_aware=true")}) {
    SCOPED_TRACE(spec);
    auto s = prefilled(spec, ctx_tokens);
    s->observe_question(question);
    const CompressionPlan p = plan_of(*s);
    const bool spark = spec.rfind("spark", 0) == 0;
    for (int il = 0; il < p.n_layer; ++il)
      for (int ih = 0; ih < p.n_head_kv; ++ih) {
        const BfWindow w = bf_window(c, il, ih, group, kChannelTokens, kQ);
        const SideSpec& ch = p.at(il, ih).key;
        if (!spark) {
          std::vector<double> score(c.d, 0);
          for (int j = 0; j < c.d; ++j) {
            double ks = 0;
            for (int t = 0; t < kChannelTokens; ++t) ks += double(c.krow(il, t, ih)[j]) * c.krow(il, t, ih)[j];
            score[j] = w.sq[j] * ks / kChannelTokens;
          }
          EXPECT_EQ(subset_of(ch), bf_top(score, c.d - static_cast<int>(0.5 * c.d)))
              << "layer " << il << " head " << ih;
          continue;
        }
        for (int t = 0; t < kChannelTokens; ++t) {
          std::vector<double> sal(c.d);
          for (int j = 0; j < c.d; ++j) sal[j] = double(c.krow(il, t, ih)[j]) * c.krow(il, t, ih)[j] * w.l2[j];
          EXPECT_EQ(row_of(ch, static_cast<size_t>(t)), bf_spark_row(sal, sc, c.d))
              << "layer " << il << " head " << ih << " token " << t;
        }
      }
  }
  // composed with query-aware eviction, end to end: fewer bytes, generation continues
  for (const char* spec : {"snapkv:ratio=0.5,query_aware=true+spark:ratio=0.8,query_aware=true",
                           "pyramidkv:ratio=0.5,query_aware=true+think:ratio=0.8,query_aware=true"}) {
    SCOPED_TRACE(spec);
    auto s = prefilled(spec, ctx_tokens);
    const size_t before = s->cache().bytes().total();
    s->observe_question(question);
    s->compress();
    EXPECT_LT(s->cache().bytes().total(), before / 2);
    EXPECT_EQ(s->n_past(), kChannelTokens);
    GenerateParams gp;
    gp.max_new_tokens = 4;
    gp.stop_at_eog = false;
    EXPECT_EQ(s->generate(question, gp).tokens.size(), 4u);
  }
  // without the question observed, a query-aware press says so
  auto s = prefilled("spark:ratio=0.8,query_aware=true", ctx_tokens);
  EXPECT_THROW(plan_of(*s), Error);
}

// Values: each token's top channels by |v|; the pruned ones removed (value_recovery=zero, the
// default: the paper's Appendix D) or filled with the token's mean pruned value (mean), checked
// in the plan and in the values the cache reads back after compression.
TEST_F(ChannelPress, SparkValuePruning) {
  const auto c = capture(tokens(kChannelTokens));
  const int T = c.d - static_cast<int>(0.75 * c.d);
  for (const char* vr : {"", ",value_recovery=zero", ",value_recovery=mean"}) {
    SCOPED_TRACE(vr);
    const bool mean = std::string(vr).find("mean") != std::string::npos;
    auto s = prefilled(std::string("spark:ratio=0.5,value_ratio=0.75") + vr, tokens(kChannelTokens));
    const CompressionPlan p = plan_of(*s);
    s->compress();
    for (int il = 0; il < p.n_layer; ++il)
      for (int ih = 0; ih < p.n_head_kv; ++ih) {
        const SideSpec& v = p.at(il, ih).value;
        ASSERT_EQ(v.channels.topk(), T);
        EXPECT_EQ(v.channels.fill(), mean);
        EXPECT_EQ(v.channels.recovery(), nullptr);
        ASSERT_EQ(v.rows.fill.size(), mean ? static_cast<size_t>(kChannelTokens) : size_t{0});
        std::vector<float> vs;
        s->cache().read_head(il, ih, nullptr, &vs, nullptr);
        ASSERT_EQ(vs.size(), static_cast<size_t>(kChannelTokens * c.d));
        for (int t = 0; t < kChannelTokens; ++t) {
          const float* vt = c.vrow(il, t, ih);
          std::vector<double> mag(c.d);
          for (int j = 0; j < c.d; ++j) mag[j] = std::abs(vt[j]);
          const auto want = bf_top(mag, T);
          EXPECT_EQ(row_of(v, static_cast<size_t>(t)), want);
          double sum = 0;
          for (int j = 0; j < c.d; ++j)
            if (!std::binary_search(want.begin(), want.end(), j)) sum += vt[j];
          const double fill = mean ? sum / (c.d - T) : 0.0;
          if (mean) {
            EXPECT_NEAR(v.rows.fill[static_cast<size_t>(t)], fill, 1e-5);
          }
          for (int j = 0; j < c.d; ++j) {  // kept: exact; pruned: 0 (removed) or the fill
            const bool kept = std::binary_search(want.begin(), want.end(), j);
            ASSERT_NEAR(vs[static_cast<size_t>(t * c.d + j)], kept ? vt[j] : fill, 1e-5)
                << "layer " << il << " head " << ih << " token " << t << " channel " << j;
          }
        }
      }
  }
}

// Recovery modes: zero stores nothing; gaussian / exponential store per token μ_t (and σ_t for
// gaussian), over all d saliencies (recovery_stats=all, the default: eqs. 12-13 and the code's
// normal_attn / exponential_attn) or over the pruned ones (recovery_stats=pruned), brute force.
TEST_F(ChannelPress, SparkRecoveryModes) {
  const auto c = capture(tokens(kChannelTokens));
  const HParams& hp = model_->hparams();
  const int group = hp.n_head / hp.n_head_kv;
  auto z = prefilled("spark:ratio=0.5,recovery=zero", tokens(kChannelTokens));
  const SideSpec zc = plan_of(*z).at(1, 0).key;  // a copy: the plan is a temporary
  EXPECT_TRUE(!zc.channels.recovery());
  EXPECT_TRUE(zc.rows.fill.empty());
  const SparkCase sc{"ratio=0.8", true, 'r', 0.8, 4};
  struct Mode {
    std::string opts;
    bool gauss, all;
  };
  const Mode modes[] = {{"recovery=gaussian,seed=3", true, true},
                        {"recovery=gaussian,seed=3,recovery_stats=all", true, true},
                        {"recovery=gaussian,seed=3,recovery_stats=pruned", true, false},
                        {"recovery=exponential", false, true},
                        {"recovery=exponential,recovery_stats=pruned", false, false}};
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.opts);
    auto s = prefilled("spark:ratio=0.8," + m.opts, tokens(kChannelTokens));
    const CompressionPlan p = plan_of(*s);
    for (int il = 0; il < p.n_layer; ++il)
      for (int ih = 0; ih < p.n_head_kv; ++ih) {
        const SideSpec& ch = p.at(il, ih).key;
        ASSERT_NE(ch.channels.recovery(), nullptr);
        EXPECT_EQ(ch.channels.recovery()->dist,
                  m.gauss ? RecoveryDist::kGaussian : RecoveryDist::kExponential);
        EXPECT_EQ(ch.channels.recovery()->seed, m.gauss ? 3u : 0u);
        EXPECT_TRUE(ch.channels.recovery()->sqrt);
        ASSERT_EQ(ch.rows.fill.size(), static_cast<size_t>(kChannelTokens));
        ASSERT_EQ(ch.rows.spread.size(), m.gauss ? static_cast<size_t>(kChannelTokens) : size_t{0});
        const BfWindow w = bf_window(c, il, ih, group);
        for (int t = 0; t < kChannelTokens; ++t) {
          std::vector<double> sal(c.d);
          for (int j = 0; j < c.d; ++j) sal[j] = double(c.krow(il, t, ih)[j]) * c.krow(il, t, ih)[j] * w.l2[j];
          const std::vector<int32_t> kept = bf_spark_row(sal, sc, c.d);
          ASSERT_EQ(row_of(ch, static_cast<size_t>(t)), kept);
          std::vector<double> set;  // the saliencies the statistics run over
          for (int j = 0; j < c.d; ++j)
            if (m.all || !std::binary_search(kept.begin(), kept.end(), j)) set.push_back(sal[j]);
          double mu = 0, var = 0;
          for (double x : set) mu += x / static_cast<double>(set.size());
          for (double x : set) var += (x - mu) * (x - mu) / static_cast<double>(set.size());
          EXPECT_NEAR(ch.rows.fill[static_cast<size_t>(t)], mu, 1e-4 * std::max(1e-3, mu));
          if (m.gauss) {
            EXPECT_NEAR(ch.rows.spread[static_cast<size_t>(t)], std::sqrt(var),
                        1e-3 * std::max(1e-3, std::sqrt(var)));
          }
        }
      }
  }
}

// Applied: every token kept, keys hold exactly the kept channels, the parts add up, attention and
// generation continue; composed with eviction the bytes multiply.
TEST_F(ChannelPress, AppliedBytesAndComposition) {
  const HParams& hp = model_->hparams();
  const int nh = hp.n_layer * hp.n_head_kv, d = hp.head_dim_k;
  auto run = [&](const std::string& spec) {
    auto s = prefilled(spec, tokens(kChannelTokens));
    s->compress();
    EXPECT_EQ(s->n_past(), kChannelTokens);
    const KvBytes b = s->cache().bytes();
    const int64_t n = total_tokens(s->cache());
    const auto& lg = s->decode(7);
    for (float x : lg) EXPECT_TRUE(std::isfinite(x)) << spec;
    return std::make_pair(b, n);
  };
  const int T = d - static_cast<int>(0.8 * d);
  auto [b_spark, n_spark] = run("spark:ratio=0.8");
  EXPECT_EQ(n_spark, nh * kChannelTokens);
  EXPECT_EQ(b_spark.keys, static_cast<size_t>(nh) * kChannelTokens * T * 4);  // f32 cache, T channels per token
  // kept channels: a bitmask where smaller than a uint8 per kept channel
  const size_t mb = static_cast<size_t>(d + 7) / 8, row_idx = std::min(mb, static_cast<size_t>(T));
  EXPECT_EQ(b_spark.indices, static_cast<size_t>(nh) * kChannelTokens * row_idx);
  EXPECT_EQ(b_spark.bitmasks, static_cast<size_t>(nh) * kChannelTokens * ((d + 7) / 8));  // a sign bit per coordinate
  EXPECT_EQ(b_spark.fills, static_cast<size_t>(nh) * kChannelTokens * 4);
  EXPECT_EQ(b_spark.values, static_cast<size_t>(nh) * kChannelTokens * d * 4);
  auto [b_think, n_think] = run("think:ratio=0.5");
  EXPECT_EQ(b_think.keys, static_cast<size_t>(nh) * kChannelTokens * (d / 2) * 4);
  EXPECT_EQ(b_think.indices, static_cast<size_t>(nh) * (d / 2) * 2);  // uint16 subset, once per head
  auto [b_both, n_both] = run("snapkv:0.5+spark:ratio=0.8,value_ratio=0.5");
  EXPECT_EQ(n_both, nh * kChannelTokens / 2);
  EXPECT_EQ(b_both.keys, static_cast<size_t>(nh) * (kChannelTokens / 2) * T * 4);
  EXPECT_EQ(b_both.values, static_cast<size_t>(nh) * (kChannelTokens / 2) * (d / 2) * 4);
  // key recovery only: pruned values are removed (value_recovery=zero, the default) ...
  EXPECT_EQ(b_both.fills, static_cast<size_t>(nh) * (kChannelTokens / 2) * 4);
  // ... or read the token's mean pruned value, one more f32 per row
  auto [b_mean, n_mean] = run("snapkv:0.5+spark:ratio=0.8,value_ratio=0.5,value_recovery=mean");
  EXPECT_EQ(b_mean.values, b_both.values);
  EXPECT_EQ(b_mean.fills, static_cast<size_t>(nh) * (kChannelTokens / 2) * 2 * 4);  // key recovery + value fill
  // two channel choices on the keys do not compose
  auto s = prefilled("spark:0.5+think:0.5", tokens(kChannelTokens));
  test::expect_error([&] { s->compress(); }, "do not compose");
}

// spark:index=: the kept channels as a uint8 list (the list kernels, the recovery's byte tables,
// the value fill's column) or a bitmask (the masked kernels): the same attention up to the order
// of the float additions, different index bytes.
TEST_F(ChannelPress, IndexLayoutsAttendAlike) {
  const HParams& hp = model_->hparams();
  const size_t nh = static_cast<size_t>(hp.n_layer * hp.n_head_kv), d = static_cast<size_t>(hp.head_dim_k);
  const size_t T = d - static_cast<size_t>(0.5 * static_cast<double>(d)), Tv = T, mb = (d + 7) / 8;
  for (const char* vr : {"zero", "mean"}) {  // values removed, or filled (the fill's column)
    SCOPED_TRACE(vr);
    std::vector<std::vector<float>> logits;
    for (const char* layout : {"list", "bitmask"}) {
      auto s = prefilled(strprintf("spark:ratio=0.5,value_ratio=0.5,value_recovery=%s,index=%s", vr, layout), tokens(kChannelTokens));
      s->compress();
      const KvBytes b = s->cache().bytes();
      EXPECT_EQ(b.indices, nh * kChannelTokens * (layout[0] == 'l' ? T + Tv : 2 * mb)) << layout;
      logits.push_back(s->decode(7));
      logits.push_back(s->decode(9));
    }
    for (size_t k = 0; k < 2; ++k) {
      const std::vector<float>& a = logits[k];
      const std::vector<float>& bm = logits[k + 2];
      ASSERT_EQ(a.size(), bm.size());
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], bm[i], 1e-4f * (1.f + std::fabs(a[i]))) << "step " << k;
    }
  }
  test::expect_error([&] { make_press("spark:index=tree"); }, "index");
}

// Bad options get errors naming them.
TEST_F(ChannelPress, BadOptions) {
  for (const char* bad : {"spark:ratio=1", "spark:variant=q", "spark:groups=3", "spark:recovery=uniform",
                          "spark:saliency=x", "spark:p=0", "spark:seed=-1", "think:ratio=-0.1", "think:count=x",
                          "spark:value_ratio=1.5", "think:window=0", "spark:recovery_stats=some",
                          "spark:value_recovery=gaussian"}) {
    EXPECT_THROW(make_press(bad), Error) << bad;
  }
}

// Every channel press x its settings (ratio 0, PressInfo::test_easy, test_hard) x (alone, after
// snapkv, before streamingllm, after adakv(snapkv)) x (f32, q8 cache) runs prefill, compression,
// decode and generation (press_sweeps.h).
TEST_F(ChannelPress, SweepEveryChannelPress) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));  // swan
  const std::vector<const PressInfo*> presses = test::presses_of(PressAxis::kChannel);
  EXPECT_FALSE(presses.empty());  // which presses must be there: press_registry_test
  for (const PressInfo* info : presses)
    EXPECT_EQ(test::sweep_channel_press(*info, *model_, tokens(40), params()),
              static_cast<int>(test::sweep_specs(*info, true).size()) * 4 * 2)
        << info->name;
}

}  // namespace
}  // namespace kvtrim
