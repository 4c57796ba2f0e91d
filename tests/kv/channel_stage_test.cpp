// The channel stage (src/kv/channel_stage.h) and a side's encoding (src/kv/encoding.h): equality
// is defaulted and complete — two encodings differing in any one field compare unequal — and the
// accessors read each kind as the cache and the attention expect.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kv/encoding.h"
#include "kv/plan.h"

namespace kvtrim {
namespace {

using kv::SideEncoding;

// Guards of completeness: each binding lists every data member, so a field added to one of these
// types stops this file from compiling until the edits below cover it.
[[maybe_unused]] void every_field(SideEncoding& e, KeyRecovery& r, TokenChannels& t,
                                  MagnitudeChannels& m, SparseCodeChannels& s, ChannelSubset& c) {
  [[maybe_unused]] auto& [d, basis, channels, dtype, rope] = e;
  [[maybe_unused]] auto& [scale, dist, seed, sqrt] = r;
  [[maybe_unused]] auto& [topk, recovery, fill, index] = t;
  [[maybe_unused]] auto& [mtopk, mindex] = m;
  [[maybe_unused]] auto& [stopk] = s;
  [[maybe_unused]] auto& [subset] = c;
}

SideEncoding base_encoding() {
  SideEncoding e;
  e.d = 8;
  e.channels = TokenChannels{.topk = 3,
                             .recovery = KeyRecovery{.scale = std::vector<float>(8, 1.f),
                                                     .dist = RecoveryDist::kGaussian,
                                                     .seed = 4,
                                                     .sqrt = true},
                             .fill = false,
                             .index = IndexLayout::kList};
  e.dtype = KvDtype::kF16;
  return e;
}

TokenChannels& tokens_of(SideEncoding& e) {
  return *e.channels.get<TokenChannels>();
}

TEST(ChannelStage, EncodingEqualityIsDefaultedAndComplete) {
  const std::vector<float> eye = {1, 0, 0, 1};  // a 2 x 2 identity, for an interned basis
  const std::vector<std::pair<std::string, std::function<void(SideEncoding&)>>> edits = {
      {"d", [](SideEncoding& e) { e.d = 16; }},
      {"basis", [&](SideEncoding& e) { e.basis = kv::intern_basis(2, 2, eye, {}); }},
      {"dtype", [](SideEncoding& e) { e.dtype = KvDtype::kFP8; }},
      {"rope", [](SideEncoding& e) { e.rope = RopeSpec{}; }},
      {"kind all", [](SideEncoding& e) { e.channels = AllChannels{}; }},
      {"kind subset",
       [](SideEncoding& e) {
         e.channels = ChannelSubset{{0, 2}};
       }},
      {"kind magnitude", [](SideEncoding& e) { e.channels = MagnitudeChannels{.topk = 3}; }},
      {"kind sparse code", [](SideEncoding& e) { e.channels = SparseCodeChannels{.topk = 3}; }},
      {"topk", [](SideEncoding& e) { tokens_of(e).topk = 0; }},
      {"fill", [](SideEncoding& e) { tokens_of(e).fill = true; }},
      {"index", [](SideEncoding& e) { tokens_of(e).index = IndexLayout::kBitmask; }},
      {"no recovery", [](SideEncoding& e) { tokens_of(e).recovery.reset(); }},
      {"recovery scale", [](SideEncoding& e) { tokens_of(e).recovery->scale[5] = 2.f; }},
      {"recovery dist", [](SideEncoding& e) { tokens_of(e).recovery->dist = RecoveryDist::kFill; }},
      {"recovery seed", [](SideEncoding& e) { tokens_of(e).recovery->seed = 5; }},
      {"recovery sqrt", [](SideEncoding& e) { tokens_of(e).recovery->sqrt = false; }},
  };
  const SideEncoding a = base_encoding();
  EXPECT_EQ(a, base_encoding());
  for (const auto& [what, edit] : edits) {
    SideEncoding b = base_encoding(), c = base_encoding();
    edit(b);
    edit(c);
    EXPECT_NE(a, b) << what;
    EXPECT_EQ(b, c) << what << ": the same edit twice";
  }
  // the fields of the other kinds, each against the same kind
  auto with = [](ChannelStage s) {
    SideEncoding e = base_encoding();
    e.channels = std::move(s);
    return e;
  };
  EXPECT_NE(with(ChannelSubset{{0, 2}}), with(ChannelSubset{{0, 3}}));
  EXPECT_NE(with(MagnitudeChannels{.topk = 3}), with(MagnitudeChannels{.topk = 4}));
  EXPECT_NE(with(MagnitudeChannels{.topk = 3, .index = IndexLayout::kList}),
            with(MagnitudeChannels{.topk = 3, .index = IndexLayout::kBitmask}));
  EXPECT_NE(with(SparseCodeChannels{.topk = 3}), with(SparseCodeChannels{.topk = 4}));
  RopeSpec r;
  r.n_rot = 8;
  SideEncoding p = base_encoding(), q = base_encoding();
  p.rope = r;
  r.base = 500000.f;
  q.rope = r;
  EXPECT_NE(p, q) << "rope base";
  // an interned basis: equal matrices are one pointer, so equal encodings
  SideEncoding u = base_encoding(), v = base_encoding();
  u.basis = kv::intern_basis(2, 2, eye, {});
  v.basis = kv::intern_basis(2, 2, std::vector<float>(eye), {});
  EXPECT_EQ(u, v);
}

TEST(ChannelStage, AccessorsReadEachKind) {
  const ChannelStage all, sub = ChannelSubset{{1, 4}}, tok = TokenChannels{.topk = 0, .fill = true},
                          mag = MagnitudeChannels{.topk = 2, .index = IndexLayout::kBitmask},
                          sc = SparseCodeChannels{.topk = 5};
  EXPECT_TRUE(all.all());
  EXPECT_FALSE(all.per_token());
  EXPECT_TRUE(all.self_encoding());
  ASSERT_NE(sub.subset(), nullptr);
  EXPECT_EQ(sub.subset()->channels, (std::vector<uint16_t>{1, 4}));
  EXPECT_FALSE(sub.self_encoding());
  EXPECT_TRUE(tok.per_token());
  EXPECT_FALSE(tok.self_encoding());
  EXPECT_FALSE(tok.codes_tokens());
  EXPECT_EQ(tok.topk(), 0);
  EXPECT_TRUE(tok.fill());
  EXPECT_EQ(tok.recovery(), nullptr);
  EXPECT_TRUE(mag.codes_tokens());
  EXPECT_EQ(mag.topk(), 2);
  EXPECT_EQ(mag.index(), IndexLayout::kBitmask);
  EXPECT_TRUE(sc.codes_tokens());
  EXPECT_EQ(sc.topk(), 5);
  EXPECT_EQ(sc.index(), IndexLayout::kList);
  EXPECT_EQ(std::string(mag.name()), "by magnitude");
  // a plan side: channels set by a stage or by per-token rows
  SideSpec sp;
  EXPECT_FALSE(sp.set());
  sp.rows.fill = {1.f};
  EXPECT_TRUE(sp.channels_set());
}

}  // namespace
}  // namespace kvtrim
