// The token cache's channel axis for keys, per head (HeadPlan::key_channels, ThinK): a head's
// tokens keep only the planned key channels; attention scores q[S]·k[S] from that layout.
// Against the dense reference over the same keys with the dropped channels zeroed (every
// dtype, GQA, sliding window, decode splits, prefill); read_head's reconstruction (kept
// channels as stored, zeros elsewhere); exact bytes by part (indices counted once per epoch);
// bad plans rejected with the cache unchanged; appends after a plan stored dense until the
// next channel plan; two channel epochs; token selection and anchors with channels; truncate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"

namespace kvtrim {
namespace {

using kvtest::AttnCase;
using kvtest::fill;
using kvtest::kAllDtypes;
using kvtest::make_cfg;
using kvtest::max_abs_diff;
using kvtest::randn;
using kvtest::random_keep;

ChannelSubset random_channels(int d, double frac, std::mt19937& rng) {
  std::bernoulli_distribution keep(frac);
  ChannelSubset r;
  for (int i = 0; i < d; ++i)
    if (keep(rng)) r.channels.push_back(static_cast<uint16_t>(i));
  if (r.channels.empty()) r.channels.push_back(static_cast<uint16_t>(d / 2));
  return r;
}

// A subset of the coordinates 0 .. n-1 taken `step` apart from `first`: first, first + step, ...
ChannelSubset strided(int n, int first, int step) {
  ChannelSubset r;
  for (int i = 0; i < n; ++i) r.channels.push_back(static_cast<uint16_t>(first + step * i));
  return r;
}

// The press-chosen per-token channels of a plan's key side.
TokenChannels& key_tokens(HeadPlan& h) { return *h.key.channels.get<TokenChannels>(); }

struct Snapshot {  // every head's read_head output, per layer
  std::vector<std::vector<float>> k, v;
  std::vector<std::vector<int32_t>> pos;
};
Snapshot snapshot(const KvCache& c) {
  Snapshot s;
  const KvCacheConfig& cfg = c.config();
  for (int il = 0; il < cfg.n_layer; ++il) {
    for (int ih = 0; ih < cfg.n_head_kv; ++ih) {
      s.k.emplace_back();
      s.v.emplace_back();
      s.pos.emplace_back();
      c.read_head(il, ih, &s.k.back(), &s.v.back(), &s.pos.back());
    }
  }
  return s;
}

// attend over layer il against attention_reference over `ref` (the expected f32 keys /
// values / positions of each head, [n_tok, d] per head).
void expect_attention(const KvCache& c, int il, const Snapshot& ref, int n_head, int64_t n_q,
                      int32_t q_pos0, ThreadPool* pool, std::mt19937& rng, double tol,
                      const std::string& what) {
  const KvCacheConfig& cfg = c.config();
  const int nkv = cfg.n_head_kv, dk = cfg.head_dim_k, dv = cfg.head_dim_v;
  const int ng = n_head / nkv;
  AttnParams p;
  p.n_head = n_head;
  p.scale = 1.f / std::sqrt(static_cast<float>(dk));
  p.sliding_window = cfg.sliding_window[static_cast<size_t>(il)];
  std::vector<int32_t> q_pos(static_cast<size_t>(n_q));
  for (int64_t i = 0; i < n_q; ++i) q_pos[i] = static_cast<int32_t>(q_pos0 + i);
  const auto q = randn(static_cast<size_t>(n_q * n_head * dk), rng);
  std::vector<float> out(static_cast<size_t>(n_q * n_head * dv));
  c.attend(il, n_q, q.data(), q_pos.data(), p, out.data(), pool);
  AttnParams p1 = p;
  p1.n_head = ng;
  for (int ih = 0; ih < nkv; ++ih) {
    const size_t h = static_cast<size_t>(il * nkv + ih);
    const int64_t n = static_cast<int64_t>(ref.pos[h].size());
    std::vector<float> qh(static_cast<size_t>(n_q * ng * dk)), want(static_cast<size_t>(n_q * ng * dv)),
        got(want.size());
    for (int64_t iq = 0; iq < n_q; ++iq) {
      std::copy_n(q.data() + (iq * n_head + ih * ng) * dk, ng * dk, qh.data() + iq * ng * dk);
      std::copy_n(out.data() + (iq * n_head + ih * ng) * dv, ng * dv, got.data() + iq * ng * dv);
    }
    attention_reference(n_q, qh.data(), q_pos.data(), n, ref.k[h].data(), ref.v[h].data(),
                        ref.pos[h].data(), 1, dk, dv, p1, want.data());
    EXPECT_LT(max_abs_diff(got, want), tol) << what << " layer " << il << " head " << ih;
  }
}

// The plan: layer 0, a different channel subset (and token selection on odd heads) per head;
// layer 1: untouched.
CompressionPlan channel_plan(const KvCache& c, std::mt19937& rng) {
  const KvCacheConfig& cfg = c.config();
  CompressionPlan plan(cfg.n_layer, cfg.n_head_kv);
  for (int ih = 0; ih < cfg.n_head_kv; ++ih) {
    HeadPlan& hp = plan.at(0, ih);
    hp.key.channels = random_channels(cfg.head_dim_k, 0.3 + 0.2 * ih, rng);
    if (ih % 2 == 1) {
      hp.keep_all = false;
      hp.keep = random_keep(c.n_tokens(0, ih), 0.6, rng);
    }
  }
  return plan;
}

// The expected content after `plan` on layer 0: the selected tokens of `before` with the
// dropped channels zeroed (tokens stored before the plan); other layers unchanged.
Snapshot expected_after(const Snapshot& before, const CompressionPlan& plan, int dk) {
  Snapshot e = before;
  for (int ih = 0; ih < plan.n_head_kv; ++ih) {
    const HeadPlan& hp = plan.at(0, ih);
    const size_t h = static_cast<size_t>(ih);
    std::vector<int32_t> keep = hp.keep;
    if (hp.keep_all)
      for (size_t t = 0; t < before.pos[h].size(); ++t) keep.push_back(static_cast<int32_t>(t));
    const int dv = static_cast<int>(before.v[h].size() / std::max<size_t>(1, before.pos[h].size()));
    e.k[h].clear();
    e.v[h].clear();
    e.pos[h].clear();
    for (int32_t t : keep) {
      for (int i = 0; i < dk; ++i) {
        const std::vector<uint16_t>& sub = hp.key.channels.subset()->channels;
        const bool kept = std::binary_search(sub.begin(), sub.end(), i);
        e.k[h].push_back(kept ? before.k[h][static_cast<size_t>(t) * dk + i] : 0.f);
      }
      for (int i = 0; i < dv; ++i) e.v[h].push_back(before.v[h][static_cast<size_t>(t) * dv + i]);
      e.pos[h].push_back(before.pos[h][static_cast<size_t>(t)]);
    }
  }
  return e;
}

TEST(ChannelCache, PerHeadSubsetEqualsReferenceOnZeroedChannels) {
  const AttnCase cases[] = {
      {9, 3, 64, 64, 300, 1, 0, false},   {4, 1, 256, 256, 200, 17, 0, false},
      {4, 2, 20, 12, 200, 3, 0, false},   {9, 3, 64, 64, 2000, 1, 0, true},  // decode splits
      {12, 2, 128, 128, 1500, 2, 700, true},                                 // window
      {4, 2, 16, 16, 150, 40, 0, true},                                      // prefill
  };
  ThreadPool pool(2);
  uint32_t seed = 10;
  for (KvDtype t : kAllDtypes) {
    for (const AttnCase& cs : cases) {
      std::mt19937 rng(seed++);
      auto c = make_kv_cache(make_cfg(2, cs.n_head_kv, cs.hdk, cs.hdv, t, cs.window));
      fill(*c, cs.n_prev, 0, rng);
      const Snapshot before = snapshot(*c);
      const CompressionPlan plan = channel_plan(*c, rng);
      c->apply(plan);
      const std::string what = std::string(kv_dtype_name(t)) + " heads " +
                               std::to_string(cs.n_head) + "/" + std::to_string(cs.n_head_kv) +
                               " n_prev " + std::to_string(cs.n_prev);
      const Snapshot after = snapshot(*c);
      const Snapshot want = expected_after(before, plan, cs.hdk);
      // kept channels as stored (f32/f16/bf16 re-encode exactly; q8 re-quantizes k[S] with
      // its own scale), dropped channels exactly zero; values and positions unchanged
      for (int ih = 0; ih < cs.n_head_kv; ++ih) {
        const size_t h = static_cast<size_t>(ih);
        ASSERT_EQ(after.pos[h], want.pos[h]) << what;
        ASSERT_EQ(after.k[h].size(), want.k[h].size()) << what;
        EXPECT_EQ(max_abs_diff(after.v[h], want.v[h]), 0.0) << what;
        const double ktol = t == KvDtype::kQ8 ? 0.05 : 0.0;
        EXPECT_LE(max_abs_diff(after.k[h], want.k[h]), ktol) << what << " head " << ih;
        for (size_t i = 0; i < after.k[h].size(); ++i) {
          if (want.k[h][i] == 0.f) {
            ASSERT_EQ(after.k[h][i], 0.f) << what;
          }
        }
      }
      // the cache's attention = the reference over the stored (zero-filled) keys, both layers
      for (int il = 0; il < 2; ++il)
        expect_attention(*c, il, after, cs.n_head, 1, static_cast<int32_t>(cs.n_prev - 1),
                         cs.pool ? &pool : nullptr, rng, 5e-5, what);
      // f32: also the reference over the original keys with the dropped channels zeroed
      if (t == KvDtype::kF32)
        expect_attention(*c, 0, want, cs.n_head, cs.n_q > 1 ? 2 : 1,
                         static_cast<int32_t>(cs.n_prev - 2), cs.pool ? &pool : nullptr, rng,
                         5e-5, what + " (zeroed original)");
      // new tokens (the queries' own): stored dense (all channels) until the next plan
      fill(*c, cs.n_q, c->n_past(), rng);
      const Snapshot grown = snapshot(*c);
      for (int il = 0; il < 2; ++il)
        expect_attention(*c, il, grown, cs.n_head, cs.n_q, static_cast<int32_t>(cs.n_prev),
                         cs.pool ? &pool : nullptr, rng, 5e-5, what + " after append");
    }
  }
}

TEST(ChannelCache, BytesAppendApplyTwiceTruncate) {
  for (KvDtype t : kAllDtypes) {
    std::mt19937 rng(5);
    const int nkv = 2, dk = 32, dv = 16;
    const size_t es = t == KvDtype::kF32 ? 4 : t == KvDtype::kQ8 ? 1 : 2;
    const size_t sc = t == KvDtype::kQ8 ? 4 : 0;  // bytes per q8 scale
    auto c = make_kv_cache(make_cfg(1, nkv, dk, dv, t));
    fill(*c, 100, 0, rng);
    CompressionPlan p1(1, nkv);
    p1.at(0, 0).key.channels = strided(8, 0, 4);  // 8 channels
    p1.at(0, 1).keep_all = false;
    for (int32_t i = 0; i < 100; i += 2) p1.at(0, 1).keep.push_back(i);      // 50 tokens
    c->apply(p1);
    KvBytes b = c->bytes();
    EXPECT_EQ(b.keys, (100 * 8 + 50 * dk) * es);
    EXPECT_EQ(b.values, 150 * dv * es);
    EXPECT_EQ(b.positions, 150 * 4u);
    EXPECT_EQ(b.scales, 2 * 150 * sc);
    EXPECT_EQ(b.indices, 8 * 2u);  // uint16 per kept channel, once per epoch
    EXPECT_EQ(b.other, 4u);        // one epoch id (head 0's segment)
    EXPECT_EQ(b.bases, 0u);
    EXPECT_EQ(b.total(), b.per_layer[0]);
    EXPECT_EQ(b.total(),
              b.keys + b.values + b.positions + b.scales + b.bases + b.indices + b.other);
    // appended tokens are stored dense in head 0
    fill(*c, 20, 100, rng);
    b = c->bytes();
    EXPECT_EQ(b.keys, (100 * 8 + 20 * dk + 70 * dk) * es);
    Snapshot s1 = snapshot(*c);
    // a second channel plan: the 20 dense tokens join a new epoch (16 channels), the first
    // epoch's tokens keep their 8 channels; tokens 0..9 of head 0 dropped; anchor 110 stays dense
    CompressionPlan p2(1, nkv);
    HeadPlan& h = p2.at(0, 0);
    h.key.channels = strided(16, 1, 2);
    h.keep_all = false;
    for (int32_t i = 10; i < 120; ++i) h.keep.push_back(i);
    h.anchors = {110};
    c->apply(p2);
    b = c->bytes();
    EXPECT_EQ(c->n_tokens(0, 0), 110);
    EXPECT_EQ(b.keys, (90 * 8 + 19 * 16 + 1 * dk + 70 * dk) * es);
    EXPECT_EQ(b.indices, (8 + 16) * 2u);
    EXPECT_EQ(b.other, 2 * 4u);
    EXPECT_EQ(b.scales, 2 * (110 + 70) * sc);
    Snapshot s2 = snapshot(*c);
    for (int64_t tk = 0; tk < 110; ++tk) {
      const int64_t src = tk + 10;
      for (int i = 0; i < dk; ++i) {
        const float o = s1.k[0][static_cast<size_t>(src * dk + i)];
        const bool kept = src == 110 || (src < 100 ? i % 4 == 0 : i % 2 == 1);
        const float got = s2.k[0][static_cast<size_t>(tk * dk + i)];
        if (!kept) {
          ASSERT_EQ(got, 0.f) << kv_dtype_name(t) << " token " << src << " ch " << i;
        } else {
          ASSERT_NEAR(got, o, t == KvDtype::kQ8 ? 0.05 : 0.0) << kv_dtype_name(t) << " " << src;
        }
      }
      ASSERT_EQ(s2.pos[0][static_cast<size_t>(tk)], src);
    }
    ThreadPool pool(2);
    expect_attention(*c, 0, s2, 4, 1, 119, &pool, rng, 5e-5, kv_dtype_name(t));
    expect_attention(*c, 0, s2, 4, 3, 60, nullptr, rng, 5e-5, kv_dtype_name(t));
    // truncate: every epoch and the dense rows cut at the position
    c->truncate(105);
    EXPECT_EQ(c->n_tokens(0, 0), 95);
    EXPECT_EQ(c->n_tokens(0, 1), 55);  // 50 even positions < 100, then 100..104
    b = c->bytes();
    EXPECT_EQ(b.keys, (90 * 8 + 5 * 16 + 55 * dk) * es);
    const Snapshot s3 = snapshot(*c);
    expect_attention(*c, 0, s3, 4, 1, 104, &pool, rng, 5e-5, kv_dtype_name(t));
    // apply a keep-all plan without channels: nothing changes
    c->apply(CompressionPlan(1, nkv));
    EXPECT_EQ(c->bytes().total(), b.total());
  }
}

TEST(ChannelCache, BadPlansAreErrorsAndLeaveTheCacheUnchanged) {
  std::mt19937 rng(9);
  const int nkv = 2, dk = 16, dv = 8;
  auto c = make_kv_cache(make_cfg(1, nkv, dk, dv, KvDtype::kF16));
  fill(*c, 40, 0, rng);
  CompressionPlan ok(1, nkv);
  ok.at(0, 1).key.channels = ChannelSubset{{1, 2, 3}};
  c->apply(ok);  // one channel epoch already: a rejected plan must not touch it either
  const Snapshot before = snapshot(*c);
  const KvBytes b0 = c->bytes();
  auto expect_rejected = [&](const CompressionPlan& p, const std::string& what) {
    try {
      c->apply(p);
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("compression plan"), std::string::npos)
          << what << ": " << e.what();
    }
    const Snapshot after = snapshot(*c);
    EXPECT_EQ(after.k, before.k) << what;
    EXPECT_EQ(after.v, before.v) << what;
    EXPECT_EQ(after.pos, before.pos) << what;
    EXPECT_EQ(c->bytes().total(), b0.total()) << what;
  };
  auto with = [&](auto edit) {
    CompressionPlan p(1, nkv);
    p.at(0, 0).key.channels = ChannelSubset{{0, 5}};  // a valid head before the bad one
    edit(p.at(0, 1));
    return p;
  };
  expect_rejected(with([](HeadPlan& h) { h.key.channels = ChannelSubset{{3, 1}}; }), "unsorted");
  expect_rejected(with([](HeadPlan& h) { h.key.channels = ChannelSubset{{2, 2}}; }), "duplicate");
  expect_rejected(with([](HeadPlan& h) { h.key.channels = ChannelSubset{{1, 16}}; }),
                  "out of range");
  // (negative coordinates are unrepresentable: a subset holds uint16)
  expect_rejected(with([&](HeadPlan& h) { h.key.channels = strided(dk + 1, 0, 1); }),
                  "more channels than head_dim_k");
  // (Key channels with a value basis, rejected before the axes composed, are valid since the
  // composable-axes cache; composed_cache_test.cpp checks them against the reference.)
  expect_rejected(with([&](HeadPlan& h) {
                    h.key.channels = ChannelSubset{{0, 1}};
                    h.key.rows.channels.assign(40, 0);
                  }),
                  "per-head subset with per-token rows");
  // all channels is a valid (lossless) subset
  CompressionPlan all(1, nkv);
  all.at(0, 0).key.channels = strided(dk, 0, 1);
  c->apply(all);
  std::vector<float> k;
  c->read_head(0, 0, &k, nullptr, nullptr);
  EXPECT_EQ(k, before.k[0]);
}

// Per-token channels (SPARK / SWAN): a plan for layer 0 where head ih keeps T channels per
// token (its own random rows), with recovery on even heads, token selection on head 1 and an
// anchor on head 2. rows: the kept tokens' indices (keep order).
HeadPlan topk_plan(int64_t n_tok, int dk, int T, bool recovery, bool select, bool anchor,
                   std::mt19937& rng) {
  HeadPlan hp;
  TokenChannels tc{.topk = T};
  std::vector<int32_t> rows;
  if (select) {
    hp.keep_all = false;
    hp.keep = random_keep(n_tok, 0.6, rng);
    rows = hp.keep;
  } else {
    for (int64_t t = 0; t < n_tok; ++t) rows.push_back(static_cast<int32_t>(t));
  }
  std::vector<int32_t> all(static_cast<size_t>(dk));
  for (int i = 0; i < dk; ++i) all[static_cast<size_t>(i)] = i;
  std::uniform_real_distribution<float> u(0.1f, 2.f);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> row(all.begin(), all.begin() + T);
    std::sort(row.begin(), row.end());
    hp.key.rows.channels.insert(hp.key.rows.channels.end(), row.begin(), row.end());
    if (recovery) hp.key.rows.fill.push_back(u(rng));
  }
  if (recovery) {
    KeyRecovery& rec = tc.recovery.emplace();
    for (int i = 0; i < dk; ++i) rec.scale.push_back(u(rng));
  }
  hp.key.channels = tc;
  if (anchor && rows.size() > 3) hp.anchors = {rows[rows.size() / 2]};
  return hp;
}

// The expected reconstruction of head h after a per-token plan hp over `before` (layer 0).
void expect_topk_reconstruction(const std::vector<float>& before_k, const HeadPlan& hp, int dk,
                                const std::vector<float>& got, KvDtype t, const std::string& what) {
  const int T = hp.key.channels.topk();
  const KeyRecovery* rec = hp.key.channels.recovery();
  size_t n_rows = hp.key.rows.channels.size() / static_cast<size_t>(T);
  ASSERT_EQ(got.size(), n_rows * static_cast<size_t>(dk)) << what;
  const double tol = t == KvDtype::kQ8 ? 0.05 : 0.0;
  for (size_t r = 0; r < n_rows; ++r) {
    const size_t src = hp.keep_all ? r : static_cast<size_t>(hp.keep[r]);
    const bool anchor = std::find(hp.anchors.begin(), hp.anchors.end(),
                                  static_cast<int32_t>(src)) != hp.anchors.end();
    const int32_t* row = hp.key.rows.channels.data() + r * static_cast<size_t>(T);
    for (int c = 0; c < dk; ++c) {
      const float o = before_k[src * dk + static_cast<size_t>(c)];
      const float g = got[r * dk + static_cast<size_t>(c)];
      const bool kept = anchor || std::binary_search(row, row + T, c);
      if (kept) {
        ASSERT_NEAR(g, o, anchor ? 0.0 : tol) << what << " row " << r << " ch " << c;
      } else if (!rec) {
        ASSERT_EQ(g, 0.f) << what;
      } else {
        const float f = hp.key.rows.fill[r] * rec->scale[static_cast<size_t>(c)];
        ASSERT_EQ(g, o < 0 ? -f : f) << what << " row " << r << " ch " << c;
      }
    }
  }
}

TEST(ChannelCache, PerTokenTopKMatchesReferenceOnReconstruction) {
  const AttnCase cases[] = {
      {9, 3, 64, 64, 300, 1, 0, false},   {4, 1, 256, 256, 200, 17, 0, false},
      {8, 4, 20, 12, 200, 3, 0, false},   {9, 3, 64, 64, 2000, 1, 0, true},  // decode splits
      {12, 2, 128, 128, 1500, 2, 700, true},                                 // window
      {4, 2, 16, 16, 150, 40, 0, true},                                      // prefill
  };
  ThreadPool pool(2);
  uint32_t seed = 100;
  for (KvDtype t : kAllDtypes) {
    for (const AttnCase& cs : cases) {
      std::mt19937 rng(seed++);
      auto c = make_kv_cache(make_cfg(2, cs.n_head_kv, cs.hdk, cs.hdv, t, cs.window));
      fill(*c, cs.n_prev, 0, rng);
      const Snapshot before = snapshot(*c);
      CompressionPlan plan(2, cs.n_head_kv);
      for (int ih = 0; ih < cs.n_head_kv; ++ih)
        plan.at(0, ih) = topk_plan(cs.n_prev, cs.hdk, std::max(1, cs.hdk / (2 + ih)), ih % 2 == 0,
                                   ih == 1, ih == 2, rng);
      c->apply(plan);
      const std::string what = std::string(kv_dtype_name(t)) + " heads " +
                               std::to_string(cs.n_head) + "/" + std::to_string(cs.n_head_kv) +
                               " d " + std::to_string(cs.hdk);
      const Snapshot after = snapshot(*c);
      for (int ih = 0; ih < cs.n_head_kv; ++ih)
        expect_topk_reconstruction(before.k[static_cast<size_t>(ih)], plan.at(0, ih), cs.hdk,
                                   after.k[static_cast<size_t>(ih)], t,
                                   what + " head " + std::to_string(ih));
      for (int il = 0; il < 2; ++il)
        expect_attention(*c, il, after, cs.n_head, 1, static_cast<int32_t>(cs.n_prev - 1),
                         cs.pool ? &pool : nullptr, rng, 5e-5, what);
      fill(*c, cs.n_q, c->n_past(), rng);  // appended dense
      const Snapshot grown = snapshot(*c);
      for (int il = 0; il < 2; ++il)
        expect_attention(*c, il, grown, cs.n_head, cs.n_q, static_cast<int32_t>(cs.n_prev),
                         cs.pool ? &pool : nullptr, rng, 5e-5, what + " after append");
    }
  }
}

TEST(ChannelCache, PerTokenBytesApplyTwiceTruncateAndBadPlans) {
  for (KvDtype t : kAllDtypes) {
    for (int dk : {32, 300}) {  // uint8 / uint16 indices
      std::mt19937 rng(21);
      const int nkv = 2, dv = 16, T = 8;
      const size_t es = t == KvDtype::kF32 ? 4 : t == KvDtype::kQ8 ? 1 : 2;
      const size_t sc = t == KvDtype::kQ8 ? 4 : 0;
      const size_t isz = dk <= 256 ? 1 : 2;
      const size_t sb = static_cast<size_t>(dk + 7) / 8;  // recovery: a sign bit per coordinate
      // per-token rows keep a kept-coordinate bitmask where it is smaller than the list (with or
      // without recovery): bytes of n rows of T entries
      auto idx_bytes = [&](size_t n, size_t cnt) { return sb < cnt * isz ? n * sb : n * cnt * isz; };
      const size_t idx1 = idx_bytes(60, T);  // head 1 (no recovery)
      auto c = make_kv_cache(make_cfg(1, nkv, dk, dv, t));
      fill(*c, 60, 0, rng);
      CompressionPlan p1(1, nkv);
      p1.at(0, 0) = topk_plan(60, dk, T, /*recovery=*/true, false, false, rng);
      p1.at(0, 1) = topk_plan(60, dk, T, /*recovery=*/false, false, false, rng);
      const Snapshot s0 = snapshot(*c);
      // bad plans: errors, cache unchanged
      auto rejected = [&](auto edit, const char* what) {
        CompressionPlan bad = p1;
        edit(bad.at(0, 1));
        EXPECT_THROW(c->apply(bad), Error) << what;
        const Snapshot s = snapshot(*c);
        EXPECT_EQ(s.k, s0.k) << what;
        EXPECT_EQ(c->bytes().keys, static_cast<size_t>(nkv * 60 * dk) * es) << what;
      };
      rejected([&](HeadPlan& h) { key_tokens(h).topk = dk + 1; }, "T > d");
      rejected([&](HeadPlan& h) { std::swap(h.key.rows.channels[0], h.key.rows.channels[1]); },
               "unsorted row");
      rejected([&](HeadPlan& h) { h.key.rows.channels[T - 1] = dk; }, "out of range");
      rejected([&](HeadPlan& h) { h.key.rows.channels.pop_back(); }, "wrong size");
      const std::vector<float> ones(static_cast<size_t>(dk), 1.f);
      rejected([&](HeadPlan& h) { key_tokens(h).recovery = KeyRecovery{.scale = ones}; }, "no fills");
      rejected([&](HeadPlan& h) { h.key.channels = ChannelSubset{{0, 1}}; }, "per-head channels");
      // (a basis before per-token channels — SWAN — is valid since the axes compose)
      rejected([&](HeadPlan& h) { key_tokens(h).topk = 0; }, "neither topk nor token_counts");
      c->apply(p1);
      KvBytes b = c->bytes();
      EXPECT_EQ(b.keys, 2 * 60 * T * es);
      EXPECT_EQ(b.values, 2 * 60 * dv * es);
      EXPECT_EQ(b.indices, idx_bytes(60, T) + idx1);
      EXPECT_EQ(b.bitmasks, 60 * sb);                        // head 0 only (recovery)
      EXPECT_EQ(b.scales, 2 * 2 * 60 * sc + dk * 4u);  // q8; r[c] once
      EXPECT_EQ(b.fills, 60 * 4u);                     // head 0's recovery fill per token
      EXPECT_EQ(b.other, 2 * 4u);
      EXPECT_EQ(b.total(), b.per_layer[0]);
      EXPECT_EQ(b.total(), b.keys + b.values + b.positions + b.scales + b.bases + b.indices +
                               b.bitmasks + b.fills + b.other);
      // append (dense), then a second per-token plan selecting tokens across both
      fill(*c, 20, 60, rng);
      EXPECT_EQ(c->bytes().keys, (2 * 60 * T + 2 * 20 * dk) * es);
      const Snapshot s1 = snapshot(*c);
      CompressionPlan p2(1, nkv);
      p2.at(0, 0) = topk_plan(80, dk, 2 * T, true, /*select=*/true, false, rng);
      c->apply(p2);
      const Snapshot s2 = snapshot(*c);
      const HeadPlan& h2 = p2.at(0, 0);
      size_t n_old = 0, n_new = 0;
      for (int32_t g : h2.keep) (g < 60 ? n_old : n_new)++;
      ASSERT_EQ(s2.pos[0].size(), h2.keep.size());
      for (size_t r = 0; r < h2.keep.size(); ++r) {
        const size_t src = static_cast<size_t>(h2.keep[r]);
        EXPECT_EQ(s2.pos[0][r], static_cast<int32_t>(src));
        if (src < 60) {  // first epoch: as stored before
          for (int i = 0; i < dk; ++i)
            ASSERT_EQ(s2.k[0][r * dk + i], s1.k[0][src * dk + i]) << kv_dtype_name(t);
        } else {  // second epoch: 2T channels from the appended dense key
          const int32_t* row = h2.key.rows.channels.data() + r * 2 * T;
          for (int i = 0; i < dk; ++i) {
            const float o = s1.k[0][src * dk + i];
            const float g = s2.k[0][r * dk + i];
            if (std::binary_search(row, row + 2 * T, i)) {
              ASSERT_NEAR(g, o, t == KvDtype::kQ8 ? 0.05 : 0.0);
            } else {
              const float f =
                  h2.key.rows.fill[r] * h2.key.channels.recovery()->scale[static_cast<size_t>(i)];
              ASSERT_EQ(g, o < 0 ? -f : f);
            }
          }
        }
      }
      b = c->bytes();
      EXPECT_EQ(b.keys, (n_old * T + n_new * 2 * T + 60 * T + 20 * dk) * es);
      EXPECT_EQ(b.bitmasks, (n_old + n_new) * sb);  // one sign bit per coordinate, whatever T
      EXPECT_EQ(b.indices, idx_bytes(n_old, T) + idx_bytes(n_new, 2 * T) + idx1);
      ThreadPool pool(2);
      expect_attention(*c, 0, s2, 4, 1, 79, &pool, rng, 5e-5, kv_dtype_name(t));
      // truncate
      c->truncate(50);
      const Snapshot s3 = snapshot(*c);
      EXPECT_EQ(c->n_tokens(0, 1), 50);
      EXPECT_EQ(c->bytes().bitmasks,
                static_cast<size_t>(std::count_if(h2.keep.begin(), h2.keep.end(),
                                                  [](int32_t g) { return g < 50; })) * sb);
      expect_attention(*c, 0, s3, 4, 2, 48, nullptr, rng, 5e-5, kv_dtype_name(t));
    }
  }
}

}  // namespace
}  // namespace kvtrim
