// The composable axes (DESIGN.md §3): every combination of basis × channels × precision, for
// keys and values independently, is attended directly and equals the dense reference on the
// reconstructed data; exact bytes per part; bad plans refused with the cache unchanged;
// per-side plan composition; the bound on live bases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "kv/kv_cache.h"
#include "kv/recovery.h"
#include "kv_test_util.h"

namespace kvtrim {
namespace {

using kvtest::AttnCase;
using kvtest::expect_attention_matches_scaled;
using kvtest::fill;
using kvtest::make_cfg;
using kvtest::max_abs_diff;
using kvtest::randn;
using kvtest::random_basis;
using kvtest::random_keep;

constexpr KvDtype kTypes[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16,
                              KvDtype::kQ8,  KvDtype::kFP8, KvDtype::kQ4};

enum class Basis { kNone, kRotation, kRank, kOblique };
// kRecovery: keys topk + recovery, values topk + fill; kGauss / kExp: keys topk + SPARK's sampled
// recovery (variable counts for kExp), values as kRecovery; kRecoveryVar: keys as kRecovery with a
// variable count per token (SPARK-p), values as kRecovery.
enum class Chan { kAll, kSubset, kTopK, kVariable, kRecovery, kGauss, kExp, kRecoveryVar };
constexpr Basis kBases[] = {Basis::kNone, Basis::kRotation, Basis::kRank, Basis::kOblique};
constexpr Chan kChans[] = {Chan::kAll,      Chan::kSubset, Chan::kTopK, Chan::kVariable,
                           Chan::kRecovery, Chan::kGauss,  Chan::kExp};

struct SideChoice {
  Basis b;
  Chan c;
  KvDtype t;
  IndexLayout index = IndexLayout::kAuto;  // per-token rows: list, bitmask or the smaller
};
std::string name(const SideChoice& s) {
  return "basis" + std::to_string(static_cast<int>(s.b)) + "/chan" +
         std::to_string(static_cast<int>(s.c)) + "/" + kv_dtype_name(s.t);
}

// Fills one side of a plan for `rows` re-encoded tokens of head dim d.
void set_side_spec(SideSpec* sp, const SideChoice& ch, int d, size_t rows, bool keys,
                   std::mt19937& rng) {
  int w = d;
  if (ch.b != Basis::kNone) {
    w = ch.b == Basis::kRotation ? d : d / 2;
    sp->rank = w;
    sp->basis = random_basis(d, w, rng);
    if (ch.b == Basis::kOblique) {
      sp->basis = randn(static_cast<size_t>(d * w), rng, 0.3f);
      sp->decoder = randn(static_cast<size_t>(d * w), rng, 0.3f);
    }
  }
  sp->dtype = ch.t;
  TokenChannels tc{.index = ch.index};  // the per-token kinds' stage
  TokenRows& c = sp->rows;
  std::uniform_int_distribution<int> cnt(1, w);
  std::uniform_real_distribution<float> u(0.1f, 1.f);
  auto pick = [&](int k) {  // k distinct sorted coordinates of [0, w)
    std::vector<int32_t> all(static_cast<size_t>(w));
    for (int i = 0; i < w; ++i) all[static_cast<size_t>(i)] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(static_cast<size_t>(k));
    std::sort(all.begin(), all.end());
    return all;
  };
  auto key_recovery = [&]() -> KeyRecovery& {
    if (!tc.recovery) tc.recovery.emplace();
    return *tc.recovery;
  };
  switch (ch.c) {
    case Chan::kAll:
      return;
    case Chan::kSubset: {
      const std::vector<int32_t> sub = pick(std::max(1, w / 3));
      sp->channels = ChannelSubset{std::vector<uint16_t>(sub.begin(), sub.end())};
      return;
    }
    case Chan::kTopK:
    case Chan::kRecovery:
      tc.topk = std::max(1, w / 4);
      for (size_t r = 0; r < rows; ++r) {
        const auto row = pick(tc.topk);
        c.channels.insert(c.channels.end(), row.begin(), row.end());
        if (ch.c == Chan::kRecovery) c.fill.push_back(keys ? u(rng) : u(rng) - 0.5f);
      }
      if (ch.c == Chan::kRecovery && keys)
        for (int i = 0; i < w; ++i) key_recovery().scale.push_back(u(rng));
      tc.fill = ch.c == Chan::kRecovery && !keys && rows > 0;
      break;
    case Chan::kGauss:
    case Chan::kExp:
    case Chan::kRecoveryVar:
      if (keys) {
        if (ch.c != Chan::kRecoveryVar) {
          KeyRecovery& rec = key_recovery();
          rec.dist = ch.c == Chan::kGauss ? RecoveryDist::kGaussian : RecoveryDist::kExponential;
          rec.seed = 7;
          rec.sqrt = ch.c == Chan::kGauss;
        }
        tc.topk = ch.c == Chan::kGauss ? std::max(1, w / 3) : 0;
        for (size_t r = 0; r < rows; ++r) {
          const int k = tc.topk > 0 ? tc.topk : (r % 4 == 0 ? w : cnt(rng));
          if (tc.topk == 0) c.counts.push_back(k);
          const auto row = pick(k);
          c.channels.insert(c.channels.end(), row.begin(), row.end());
          c.fill.push_back(u(rng));
          if (ch.c == Chan::kGauss) c.spread.push_back(u(rng) * 0.5f);
        }
        for (int i = 0; i < w; ++i) key_recovery().scale.push_back(u(rng));
      } else {
        tc.topk = std::max(1, w / 4);
        for (size_t r = 0; r < rows; ++r) {
          const auto row = pick(tc.topk);
          c.channels.insert(c.channels.end(), row.begin(), row.end());
          c.fill.push_back(u(rng) - 0.5f);
        }
        tc.fill = rows > 0;
      }
      break;
    case Chan::kVariable:
      for (size_t r = 0; r < rows; ++r) {
        const int k = r % 5 == 0 ? w : cnt(rng);  // some rows keep every coordinate
        c.counts.push_back(k);
        const auto row = pick(k);
        c.channels.insert(c.channels.end(), row.begin(), row.end());
      }
      break;
  }
  sp->channels = std::move(tc);
}


// One cache per (key choice, value choice): 2 layers (layer 0 with a sliding window), tokens
// selected per head, anchors, a second plan on top, appends after the plans (dense or encoded),
// queries over several positions, with and without decode splits.
void run_combination(const SideChoice& kc, const SideChoice& vc, const AttnCase& ac,
                     std::mt19937& rng) {
  const std::string what = "K " + name(kc) + ", V " + name(vc);
  auto c = make_kv_cache(make_cfg(2, ac.n_head_kv, ac.hdk, ac.hdv, KvDtype::kF16, ac.window));
  fill(*c, ac.n_prev, 0, rng);
  CompressionPlan plan(2, ac.n_head_kv);
  for (int il = 0; il < 2; ++il) {
    for (int ih = 0; ih < ac.n_head_kv; ++ih) {
      HeadPlan& hp = plan.at(il, ih);
      if (ih == 1) {  // token selection with anchors
        hp.keep_all = false;
        hp.keep = random_keep(ac.n_prev, 0.6, rng);
        hp.anchors = {hp.keep.front(), hp.keep.back()};
      }
      const size_t rows = hp.keep_all ? static_cast<size_t>(ac.n_prev) : hp.keep.size();
      set_side_spec(&hp.key, kc, ac.hdk, rows, true, rng);
      set_side_spec(&hp.value, vc, ac.hdv, rows, false, rng);
      hp.appends_dense = ih == 0;
    }
  }
  ASSERT_NO_THROW(c->apply(plan)) << what;
  ThreadPool pool(2);
  expect_attention_matches_scaled(*c, ac.n_head, 3, static_cast<int32_t>(ac.n_prev) - 2, nullptr, rng, what);
  // appends after the plan (head 0: dense; others: encoded at once unless the epoch has channels)
  fill(*c, 20, static_cast<int32_t>(ac.n_prev), rng);
  expect_attention_matches_scaled(*c, ac.n_head, 1, static_cast<int32_t>(ac.n_prev) + 19, &pool, rng, what + " decode");
  expect_attention_matches_scaled(*c, ac.n_head, 5, static_cast<int32_t>(ac.n_prev) + 15, &pool, rng, what + " 5 queries");
}

// Every key choice with a value choice that cycles through all value choices (and the mirror),
// so every stage of every side is attended with every other side's stages at least once.
TEST(ComposedCache, EveryCombinationAttendsLikeTheReference) {
  std::vector<SideChoice> choices;
  for (Basis b : kBases)
    for (Chan ch : kChans)
      for (KvDtype t : kTypes) choices.push_back({b, ch, t});
  const AttnCase cases[] = {{6, 2, 32, 32, 700, 1, 0, true},  // GQA 3, decode splits
                            {4, 1, 64, 48, 130, 1, 50, false}, // window, different head dims
                            {3, 3, 16, 16, 90, 1, 0, true}};   // MHA
  std::mt19937 rng(2024);
  for (size_t i = 0; i < choices.size(); ++i) {
    const AttnCase& ac = cases[i % 3];
    const SideChoice& other = choices[(i * 7 + 3) % choices.size()];
    run_combination(choices[i], other, ac, rng);
    run_combination(other, choices[i], ac, rng);
    if (HasFatalFailure()) return;
  }
}

// The degenerate recovery's byte tables (list rows, segments of >= 96 tokens) over the real models'
// shapes: SmolLM2 (9 / 3 heads, d 64), Qwen2.5-1.5B (12 / 2, d 128: two mask words, two chunks
// of query heads), Gemma3-270M (4 / 1, d 256: four words), and a width that is not a multiple of
// 8. Fixed and variable counts, f16 and q8 keys, against the reference over the reconstructed
// rows; then the same keys as bitmask rows (the masked kernels) with value rows that carry a fill
// as a list (the fill column added at the lift).
TEST(ComposedCache, RecoveryTablesOnWideHeadsAttendLikeTheReference) {
  const AttnCase cases[] = {{9, 3, 64, 64, 300, 1, 0, true},
                            {12, 2, 128, 128, 260, 1, 0, true},
                            {4, 1, 256, 256, 200, 1, 0, false},
                            {6, 2, 100, 100, 150, 1, 0, false}};
  std::mt19937 rng(77);
  for (const AttnCase& ac : cases)
    for (Chan ch : {Chan::kRecovery, Chan::kRecoveryVar})
      for (KvDtype t : {KvDtype::kF16, KvDtype::kQ8}) {
        run_combination({Basis::kNone, ch, t, IndexLayout::kList}, {Basis::kNone, Chan::kAll, KvDtype::kF16}, ac,
                        rng);
        run_combination({Basis::kNone, ch, t, IndexLayout::kBitmask},
                        {Basis::kNone, Chan::kRecovery, KvDtype::kF16, IndexLayout::kList}, ac, rng);
        if (HasFatalFailure()) return;
      }
}

TEST(ComposedCache, ExactBytesPerPart) {
  std::mt19937 rng(5);
  const int nkv = 2, dk = 64, dv = 48, n = 100, r = 32, T = r / 4, S = 20;  // set_side: rank d/2, T = w/4
  auto c = make_kv_cache(make_cfg(1, nkv, dk, dv, KvDtype::kF16));
  fill(*c, n, 0, rng);
  CompressionPlan plan(1, nkv);
  // head 0: keys rotation -> per-token T with recovery -> fp8; values subset S -> q4
  HeadPlan& h0 = plan.at(0, 0);
  set_side_spec(&h0.key, {Basis::kRank, Chan::kRecovery, KvDtype::kFP8}, dk, n, true, rng);
  ChannelSubset sub;
  for (int i = 0; i < S; ++i) sub.channels.push_back(static_cast<uint16_t>(2 * i));
  h0.value.channels = sub;
  h0.value.dtype = KvDtype::kQ4;
  // head 1: keys q8 dense, values per-token variable counts in f16, 10 tokens kept as anchors
  HeadPlan& h1 = plan.at(0, 1);
  h1.key.dtype = KvDtype::kQ8;
  set_side_spec(&h1.value, {Basis::kNone, Chan::kVariable, KvDtype::kF16}, dv, n, false, rng);
  for (int i = 0; i < 10; ++i) h1.anchors.push_back(i * 10);
  c->apply(plan);
  const KvBytes b = c->bytes();
  size_t var_entries = 0;  // head 1's value entries of the re-encoded (non-anchor) tokens
  for (int t = 0; t < n; ++t)
    if (t % 10 != 0)
      var_entries += static_cast<size_t>(h1.value.rows.counts[static_cast<size_t>(t)]);
  EXPECT_EQ(b.keys, n * T * 1u + 90 * dk * 1u + 10 * dk * 2u);
  EXPECT_EQ(b.values, n * (S / 2) + var_entries * 2 + 10 * dv * 2u);
  // kept coordinates as bitmasks (smaller than uint8 lists here: head 0 keys ceil(32 / 8) = 4
  // bytes per row < T = 8 entries, head 1 values 6 bytes < the mean count of the plan's rows);
  // head 1 value offsets (n + 1 for its 90 rows); the subset (uint16)
  size_t all_counts = 0;
  for (int32_t k : h1.value.rows.counts) all_counts += static_cast<size_t>(k);
  ASSERT_LT(6u * n, all_counts);
  EXPECT_EQ(b.indices, n * 4u + 90 * 6u + 91 * 4u + S * 2u);
  EXPECT_EQ(b.bitmasks, n * static_cast<size_t>((r + 7) / 8));  // recovery signs, one per coordinate
  // fp8 key rows: one f32 scale; recovery: r [32] once; q4 values: one f16 per block of 32
  // (S = 20: one block); q8 keys: one f32 per row
  EXPECT_EQ(b.scales, n * 4u + r * 4u + n * 2u + 90 * 4u);
  EXPECT_EQ(b.fills, n * 4u);  // recovery: one f32 fill per token
  EXPECT_EQ(b.bases, static_cast<size_t>(dk * r) * 4);
  EXPECT_EQ(b.positions, (n + n) * 4u);
  EXPECT_EQ(b.other, 2 * 4u);
  EXPECT_EQ(b.total(), b.per_layer[0]);
}

TEST(ComposedCache, BadPlansAreRefusedAndTheCacheIsUnchanged) {
  std::mt19937 rng(8);
  const int nkv = 2, d = 16;
  auto c = make_kv_cache(make_cfg(1, nkv, d, d, KvDtype::kF16));
  fill(*c, 30, 0, rng);
  std::vector<float> k0, v0;
  c->read_head(0, 1, &k0, &v0, nullptr);
  const size_t b0 = c->bytes().total();
  auto refused = [&](auto edit, const char* what) {
    CompressionPlan p(1, nkv);
    p.at(0, 0).value.channels = ChannelSubset{{1, 2}};  // a valid head before the bad one
    edit(p.at(0, 1));
    EXPECT_THROW(c->apply(p), Error) << what;
    std::vector<float> k1, v1;
    c->read_head(0, 1, &k1, &v1, nullptr);
    EXPECT_EQ(k1, k0) << what;
    EXPECT_EQ(v1, v0) << what;
    EXPECT_EQ(c->bytes().total(), b0) << what;
  };
  refused(
      [](HeadPlan& h) {
        h.value.channels = ChannelSubset{{3, 16}};
      },
      "value subset out of range");
  refused([&](HeadPlan& h) {
            h.value.rank = 4;
            h.value.basis = random_basis(16, 4, rng);
            h.value.channels = ChannelSubset{{5}};
          },
          "subset past the basis rank");
  refused(
      [](HeadPlan& h) {
        h.value.channels =
            TokenChannels{.topk = 2, .recovery = KeyRecovery{.scale = std::vector<float>(16, 1.f)}};
        h.value.rows.channels.assign(60, 0);
      },
      "value recovery scale");
  refused(
      [](HeadPlan& h) {
        h.key.channels = TokenChannels{};
        h.key.rows.counts.assign(30, 2);
        h.key.rows.channels.assign(59, 0);
      },
      "variable rows too short");
  refused(
      [](HeadPlan& h) {
        h.key.channels = TokenChannels{};
        h.key.rows.counts.assign(30, 0);
      },
      "zero count");
  refused(
      [](HeadPlan& h) {
        h.value.channels = TokenChannels{.topk = 1, .fill = true};
        h.value.rows.channels.assign(30, 0);
        h.value.rows.fill.assign(29, 0.f);
      },
      "fill rows");
}

TEST(ComposedCache, PlansComposePerSide) {
  std::mt19937 rng(3);
  const int d = 16;
  CompressionPlan a(1, 1), b(1, 1);
  a.at(0, 0).keep_all = false;
  a.at(0, 0).keep = {0, 2, 4, 6, 8};
  a.at(0, 0).key.rank = 8;
  a.at(0, 0).key.basis = random_basis(d, 8, rng);
  b.at(0, 0).keep_all = false;
  b.at(0, 0).keep = {1, 3};  // tokens 2 and 6 of the cache
  b.at(0, 0).value.channels = TokenChannels{.topk = 2};
  b.at(0, 0).value.rows.channels = {0, 5, 3, 4};
  b.at(0, 0).value.dtype = KvDtype::kFP8;
  const CompressionPlan o = compose_plans(a, b);
  EXPECT_EQ(o.at(0, 0).keep, (std::vector<int32_t>{2, 6}));
  EXPECT_EQ(o.at(0, 0).key.basis, a.at(0, 0).key.basis);
  EXPECT_EQ(o.at(0, 0).value.channels, b.at(0, 0).value.channels);
  EXPECT_EQ(o.at(0, 0).value.rows, b.at(0, 0).value.rows);
  EXPECT_EQ(o.at(0, 0).value.dtype, KvDtype::kFP8);
  // the first plan's per-token rows follow the second plan's selection
  CompressionPlan a2 = b, b2(1, 1);
  b2.at(0, 0).keep_all = false;
  b2.at(0, 0).keep = {1};
  EXPECT_EQ(compose_plans(a2, b2).at(0, 0).value.rows.channels, (std::vector<int32_t>{3, 4}));
  // real conflicts
  CompressionPlan c2 = a;
  EXPECT_THROW(compose_plans(a, c2), Error);  // two key bases
  CompressionPlan d2(1, 1);
  d2.at(0, 0).key.channels = ChannelSubset{{1}};
  EXPECT_THROW(compose_plans(a, d2), Error);  // a key basis and key channels from another press
  CompressionPlan e1(1, 1), e2(1, 1);
  e1.at(0, 0).value.dtype = KvDtype::kQ8;
  e2.at(0, 0).value.dtype = KvDtype::kQ4;
  EXPECT_THROW(compose_plans(e1, e2), Error);  // different value precisions
  // the composed plan applies like the reference
  auto cache = make_kv_cache(make_cfg(1, 1, d, d, KvDtype::kF16));
  fill(*cache, 10, 0, rng);
  cache->apply(o);
  EXPECT_EQ(cache->n_tokens(0, 0), 2);
  expect_attention_matches_scaled(*cache, 2, 1, 20, nullptr, rng, "composed");
}

// Periodic basis updates (one epoch every 32 appended tokens, the basis drifting a little each
// time, OjaKV's pattern) never hold more than max_live_bases bases, and never more bytes than
// the same run whose appended tokens stay dense (no updates). Within the bound, tokens decode
// with their own basis; the re-expressed ones lose only what lies outside the newer span.
TEST(ComposedCache, PeriodicBasisUpdatesAreBounded) {
  std::mt19937 rng(11);
  const int nkv = 2, d = 32, r = 16;
  auto upd = make_kv_cache(make_cfg(1, nkv, d, d, KvDtype::kF16));
  auto none = make_kv_cache(make_cfg(1, nkv, d, d, KvDtype::kF16));
  fill({upd.get(), none.get()}, 256, 0, rng);
  std::vector<float> U = random_basis(d, r, rng);
  CompressionPlan first(1, nkv);
  for (int ih = 0; ih < nkv; ++ih) {
    first.at(0, ih).key.rank = first.at(0, ih).value.rank = r;
    first.at(0, ih).key.basis = first.at(0, ih).value.basis = U;
    first.at(0, ih).appends_dense = true;
  }
  upd->apply(first);
  none->apply(first);
  for (int step = 0; step < 64; ++step) {  // 2048 appended tokens
    fill({upd.get(), none.get()}, 32, 256 + step * 32, rng);
    // a slightly rotated basis: U + 0.05·noise, re-orthonormalised
    std::vector<float> N = U;
    const auto noise = randn(N.size(), rng, 0.05f);
    for (size_t i = 0; i < N.size(); ++i) N[i] += noise[i];
    std::vector<double> a(N.begin(), N.end());
    for (int j = 0; j < r; ++j) {  // Gram-Schmidt
      for (int cidx = 0; cidx < j; ++cidx) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += a[static_cast<size_t>(i * r + j)] * a[static_cast<size_t>(i * r + cidx)];
        for (int i = 0; i < d; ++i) a[static_cast<size_t>(i * r + j)] -= dot * a[static_cast<size_t>(i * r + cidx)];
      }
      double nrm = 0;
      for (int i = 0; i < d; ++i) nrm += a[static_cast<size_t>(i * r + j)] * a[static_cast<size_t>(i * r + j)];
      for (int i = 0; i < d; ++i) a[static_cast<size_t>(i * r + j)] /= std::sqrt(nrm);
    }
    U.assign(a.begin(), a.end());
    CompressionPlan p(1, nkv);
    for (int ih = 0; ih < nkv; ++ih) {
      p.at(0, ih).key.rank = p.at(0, ih).value.rank = r;
      p.at(0, ih).key.basis = p.at(0, ih).value.basis = U;
      p.at(0, ih).appends_dense = true;
    }
    upd->apply(p);
    const KvBytes bu = upd->bytes(), bn = none->bytes();
    ASSERT_LE(bu.total(), bn.total()) << "step " << step;
    ASSERT_LE(bu.bases, 2u * 2 * d * r * 4) << "step " << step;  // <= 2 live (K and V share U)
    for (int ih = 0; ih < nkv; ++ih) {
      std::set<int32_t> epochs;
      for (int32_t e : upd->head_layout(0, ih).epoch) epochs.insert(e);
      ASSERT_LE(epochs.size(), 2u) << "step " << step;  // every token in one of <= 2 epochs
    }
  }
  EXPECT_EQ(upd->n_tokens(0, 0), 256 + 2048);
  expect_attention_matches_scaled(*upd, 4, 1, 256 + 2048, nullptr, rng, "after 64 updates");
}

}  // namespace
}  // namespace kvtrim
