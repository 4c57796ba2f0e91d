// The re-feed passes (src/engine/refeed.h) on tiny random models, against a brute force:
// for every chunk the brute force runs an independent session (context, then the chunk
// appended after it, as the reference implementations feed it), captures every query, reads
// every key back from that cache, and recomputes the softmax over exactly the keys each
// method lets a re-fed query see, naively in double. The session's pass must give the same
// accumulators (KVCompose: max / sum per stored token and query head; KVzip: max over the
// group and the queries), leave the cache and the logits as they were, and the presses must
// plan from them (KVzip's global bottom-k checked against a brute-force selection).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "core/error.h"
#include "engine/limit_error.h"
#include "engine/press_runner.h"
#include "engine/refeed.h"
#include "engine/session.h"
#include "press/press.h"
#include "press/token/kvcompose.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim {
namespace {

constexpr int kRefeedTokens = 40;

struct RefeedSetup {
  std::unique_ptr<Model> model;
  std::vector<int32_t> context;
  SessionParams sp;
};

RefeedSetup setup(Arch arch) {
  RefeedSetup s;
  s.model = Model::load(test::write_tiny_model(test::tiny_spec(arch, 5), test::temp_dir("refeed")));
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> tok(0, 255);  // byte tokens
  s.context.resize(kRefeedTokens);
  for (auto& t : s.context) t = tok(rng);
  s.sp.n_ctx = 160;
  s.sp.n_threads = 2;
  s.sp.n_batch = 7;
  s.sp.kv_dtype = KvDtype::kF32;
  return s;
}

// What the brute force computes per (layer, kv head): [stored token][group] max and sum of the
// probabilities (KVCompose), or [stored token] max over the group (KVzip); M per layer.
struct Brute {
  std::vector<std::vector<double>> mx, sum, zip;
  std::vector<int64_t> m;
};

enum class Which { kCompose, kKvzip };

Brute brute_force_refeed(const RefeedSetup& s, const std::vector<RefeedChunk>& chunks, Which which, int sinks) {
  const HParams& hp = s.model->hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, G = hp.n_head / hp.n_head_kv, d = hp.head_dim_k;
  const double scale = hp.attn_scale > 0 ? hp.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
  Brute b;
  b.mx.assign(static_cast<size_t>(L * H), std::vector<double>(static_cast<size_t>(kRefeedTokens * G), 0.0));
  b.sum = b.mx;
  b.zip.assign(static_cast<size_t>(L * H), std::vector<double>(kRefeedTokens, 0.0));
  b.m.assign(static_cast<size_t>(L), 0);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < std::min(sinks, kRefeedTokens); ++c) b.zip[static_cast<size_t>(l * H + h)][static_cast<size_t>(c)] = 1.0;
  for (const RefeedChunk& ch : chunks) {
    Session t(*s.model, s.sp);
    PressNeeds all;
    all.window = PressNeeds::kAllQueries;
    t.set_observer(all);
    t.prefill(s.context);
    t.prefill(ch.tokens);  // appended after the context, at positions kRefeedTokens.., as the pass does
    const Observations& ob = *t.observations();
    for (int l = 0; l < L; ++l) {
      const int window = hp.sliding_window.empty() ? 0 : hp.sliding_window[static_cast<size_t>(l)];
      const ObservedQueries& q = ob.window[static_cast<size_t>(l)];
      for (int h = 0; h < H; ++h) {
        std::vector<float> kk;
        std::vector<int32_t> kp;
        t.cache().read_head(l, h, &kk, nullptr, &kp);
        for (int64_t i = 0; i < q.n; ++i) {
          const int32_t qp = q.pos[static_cast<size_t>(i)];
          if (qp < kRefeedTokens) continue;  // the context's own queries are not the re-feed's
          for (int g = 0; g < G; ++g) {
            const float* qv = q.query(i, h * G + g, hp.n_head, d);
            std::vector<double> logit(kp.size(), -INFINITY);
            double mxl = -INFINITY;
            for (size_t j = 0; j < kp.size(); ++j) {
              const int32_t p = kp[j];
              if (p > qp || (window > 0 && qp - p >= window)) continue;
              if (which == Which::kKvzip && p < kRefeedTokens && !(p < std::min(sinks, ch.lo) || (p >= ch.lo && p < ch.hi)))
                continue;  // KVzip: only the sinks and the chunk's own span of the context
              double dot = 0;
              for (int e = 0; e < d; ++e) dot += static_cast<double>(qv[e]) * kk[j * static_cast<size_t>(d) + static_cast<size_t>(e)];
              logit[j] = dot * scale;
              mxl = std::max(mxl, logit[j]);
            }
            double z = 0;
            for (double x : logit)
              if (x > -INFINITY) z += std::exp(x - mxl);
            for (size_t j = 0; j < kp.size(); ++j) {
              if (kp[j] >= kRefeedTokens || logit[j] == -INFINITY) continue;
              const double a = std::exp(logit[j] - mxl) / z;
              const size_t at = static_cast<size_t>(l * H + h), c = static_cast<size_t>(kp[j]);
              if (which == Which::kCompose) {
                b.mx[at][c * static_cast<size_t>(G) + static_cast<size_t>(g)] =
                    std::max(b.mx[at][c * static_cast<size_t>(G) + static_cast<size_t>(g)], a);
                b.sum[at][c * static_cast<size_t>(G) + static_cast<size_t>(g)] += a;
              } else if (kp[j] >= ch.lo && kp[j] < ch.hi) {
                b.zip[at][c] = std::max(b.zip[at][c], a);
              }
            }
          }
        }
      }
      if (which == Which::kCompose) b.m[static_cast<size_t>(l)] += static_cast<int64_t>(ch.tokens.size());
    }
  }
  return b;
}

void expect_near_rel(double got, double want, const char* what, int l, int h, size_t i) {
  ASSERT_NEAR(got, want, 2e-5 + 1e-4 * std::fabs(want)) << what << " layer " << l << " head " << h << " row " << i;
}

// The session's pass for `spec` (one press), the cache and logits compared before / after.
const Observations& run_pass(Session& s, const RefeedSetup& st, const std::string& spec) {
  s.set_press(make_press(spec));
  s.prefill(st.context);
  const std::vector<float> logits = s.logits();
  const size_t bytes = s.cache().bytes().total();
  std::vector<float> k0;
  s.cache().read_head(0, 0, &k0, nullptr, nullptr);
  s.prepare_compress();
  EXPECT_EQ(s.n_past(), kRefeedTokens);
  EXPECT_EQ(s.cache().bytes().total(), bytes) << "the pass keeps none of its own tokens";
  EXPECT_EQ(s.logits(), logits);
  std::vector<float> k1;
  s.cache().read_head(0, 0, &k1, nullptr, nullptr);
  EXPECT_EQ(k0, k1);
  EXPECT_EQ(s.history(), st.context);
  return *s.observations();
}

void check_compose(Arch arch, int64_t chunk) {
  SCOPED_TRACE(std::string(arch_name(arch)) + " chunk " + std::to_string(chunk));
  const RefeedSetup st = setup(arch);
  const HParams& hp = st.model->hparams();
  const int G = hp.n_head / hp.n_head_kv;
  Session s(*st.model, st.sp);
  const Observations& ob = run_pass(s, st, "kvcompose:ratio=0.5,refeed_chunk=" + std::to_string(chunk));
  ASSERT_TRUE(ob.has_refeed());
  EXPECT_FALSE(ob.has_task_attn()) << "the re-feed replaces the prefill's causal accumulation";
  const Brute b = brute_force_refeed(st, context_refeed_chunks(st.context, chunk), Which::kCompose, 0);
  for (int l = 0; l < hp.n_layer; ++l) {
    EXPECT_EQ(ob.refeed_m[static_cast<size_t>(l)], b.m[static_cast<size_t>(l)]);
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const size_t at = static_cast<size_t>(l * hp.n_head_kv + h);
      ASSERT_EQ(ob.stat(TokenStat::kRefeedMax)[at].size(), static_cast<size_t>(kRefeedTokens * G));
      for (size_t i = 0; i < ob.stat(TokenStat::kRefeedMax)[at].size(); ++i) {
        expect_near_rel(ob.stat(TokenStat::kRefeedMax)[at][i], b.mx[at][i], "max", l, h, i);
        expect_near_rel(ob.stat(TokenStat::kRefeedSum)[at][i], b.sum[at][i], "sum", l, h, i);
      }
    }
  }
  // compressing uses them and does not run the pass again; the cache shrinks
  EXPECT_EQ(s.refeed_passes(), 1);
  const Session::State saved = s.save_state();
  s.restore_state(saved);  // a sweep's cells: the restored observations are still current
  const CompressStats cs = s.compress();
  EXPECT_EQ(s.refeed_passes(), 1);
  EXPECT_EQ(cs.refeed_seconds, 0.0);  // the pass ran before the state was saved: not this compress's
  EXPECT_EQ(cs.refeed_rss_peak, 0u);
  EXPECT_LT(cs.bytes_after, cs.bytes_before);
  // appending to the context makes the re-feed stale: the next compress re-feeds
  s.decode(7);
  EXPECT_FALSE(s.observations()->has_refeed());
  EXPECT_GT(s.compress().refeed_seconds, 0.0);
  EXPECT_EQ(s.refeed_passes(), 2);
}

TEST(Refeed, KVComposeContextOneChunkIsTheReference) { check_compose(Arch::kLlama, 0); }
TEST(Refeed, KVComposeContextChunked) { check_compose(Arch::kQwen2, 16); }
TEST(Refeed, KVComposeSlidingWindowLayers) { check_compose(Arch::kGemma3, 12); }

void check_kvzip(Arch arch, int64_t chunk, int sinks) {
  SCOPED_TRACE(std::string(arch_name(arch)) + " chunk " + std::to_string(chunk));
  const RefeedSetup st = setup(arch);
  const HParams& hp = st.model->hparams();
  Session s(*st.model, st.sp);
  const Observations& ob =
      run_pass(s, st, "kvzip:ratio=0.5,chunk=" + std::to_string(chunk) + ",sinks=" + std::to_string(sinks));
  ASSERT_TRUE(ob.has_kvzip());
  const std::vector<RefeedChunk> chunks = kvzip_refeed_chunks(kvzip_prompts(*st.model), st.context, chunk, sinks);
  const Brute b = brute_force_refeed(st, chunks, Which::kKvzip, sinks);
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const size_t at = static_cast<size_t>(l * hp.n_head_kv + h);
      ASSERT_EQ(ob.stat(TokenStat::kKvzip)[at].size(), static_cast<size_t>(kRefeedTokens));
      for (size_t i = 0; i < static_cast<size_t>(kRefeedTokens); ++i)
        expect_near_rel(ob.stat(TokenStat::kKvzip)[at][i], b.zip[at][i], "kvzip", l, h, i);
    }

  // the plan: the floor(0.5 E) lowest entries go, wherever they are; each head keeps its best
  std::vector<std::tuple<float, int, int, int>> entries;  // (score, -c, -h, -l): lowest first
  std::set<std::tuple<int, int, int>> best;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const auto& z = ob.stat(TokenStat::kKvzip)[static_cast<size_t>(l * hp.n_head_kv + h)];
      const int bc = static_cast<int>(std::max_element(z.begin(), z.end()) - z.begin());
      best.insert({l, h, bc});
      for (int c = 0; c < kRefeedTokens; ++c)
        if (c != bc) entries.emplace_back(z[static_cast<size_t>(c)], -c, -h, -l);
    }
  std::sort(entries.begin(), entries.end());
  const size_t n_drop = static_cast<size_t>(static_cast<double>(hp.n_layer * hp.n_head_kv * kRefeedTokens) * 0.5);
  std::map<std::pair<int, int>, std::set<int>> dropped;
  for (size_t i = 0; i < n_drop; ++i) {
    const auto& [sc, c, h, l] = entries[i];
    dropped[{-l, -h}].insert(-c);
  }
  PressContext ctx(s.cache(), hp, &ob, &s.pool());
  const CompressionPlan plan = make_press("kvzip:ratio=0.5")->plan(ctx);
  int64_t kept = 0;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const HeadPlan& p = plan.at(l, h);
      std::set<int> want;
      for (int c = 0; c < kRefeedTokens; ++c)
        if (!dropped[{l, h}].count(c)) want.insert(c);
      const std::set<int> got = p.keep_all ? want : std::set<int>(p.keep.begin(), p.keep.end());
      if (!p.keep_all) {
        EXPECT_EQ(got, want) << "layer " << l << " head " << h;
      } else {
        EXPECT_TRUE((dropped[{l, h}].empty()));
      }
      kept += static_cast<int64_t>(got.size());
    }
  EXPECT_EQ(kept, hp.n_layer * hp.n_head_kv * kRefeedTokens - static_cast<int64_t>(n_drop));
  // per-head budgets: heads do not all keep the same count
  std::set<int64_t> counts;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const HeadPlan& p = plan.at(l, h);
      counts.insert(p.keep_all ? kRefeedTokens : static_cast<int64_t>(p.keep.size()));
    }
  EXPECT_GT(counts.size(), 1u);
  // layerwise: every layer drops floor(0.5 · E_l)
  const CompressionPlan lw = make_press("kvzip:ratio=0.5,layerwise=1")->plan(ctx);
  for (int l = 0; l < hp.n_layer; ++l) {
    int64_t k = 0;
    for (int h = 0; h < hp.n_head_kv; ++h) k += lw.at(l, h).keep_all ? kRefeedTokens : static_cast<int64_t>(lw.at(l, h).keep.size());
    EXPECT_EQ(k, hp.n_head_kv * kRefeedTokens - hp.n_head_kv * kRefeedTokens / 2) << "layer " << l;
  }
  const CompressStats cs = s.compress();
  EXPECT_LT(cs.bytes_after, cs.bytes_before);
}

TEST(Refeed, KvzipScoresAndPlanLlama) { check_kvzip(Arch::kLlama, 16, 4); }
TEST(Refeed, KvzipScoresOneChunkQwen2) { check_kvzip(Arch::kQwen2, 2048, 4); }
TEST(Refeed, KvzipSlidingWindowLayers) { check_kvzip(Arch::kGemma3, 10, 2); }

TEST(Refeed, KvzipChunksQuoteThePreviousChunk) {
  KvzipPrompts p;
  p.first = {900, 901};
  p.next = {910};
  p.suffix = {920};
  std::vector<int32_t> ctx(30);
  for (int i = 0; i < 30; ++i) ctx[static_cast<size_t>(i)] = i;
  const auto ch = kvzip_refeed_chunks(p, ctx, 12, 4);
  ASSERT_EQ(ch.size(), 3u);  // [4, 16), [16, 28), [28, 30)
  EXPECT_EQ(ch[0].lo, 4);
  EXPECT_EQ(ch[0].hi, 16);
  std::vector<int32_t> want = {900, 901, 920};
  for (int i = 4; i < 16; ++i) want.push_back(i);
  EXPECT_EQ(ch[0].tokens, want);
  want = {910, 8, 9, 10, 11, 12, 13, 14, 15, 920};  // the previous chunk's last 8 tokens
  for (int i = 16; i < 28; ++i) want.push_back(i);
  EXPECT_EQ(ch[1].tokens, want);
  EXPECT_EQ(ch[2].lo, 28);
  EXPECT_EQ(ch[2].hi, 30);
  EXPECT_TRUE(kvzip_refeed_chunks(p, std::vector<int32_t>(3, 1), 12, 4).empty());  // all sinks
  EXPECT_THROW(kvzip_refeed_chunks(p, ctx, 0, 4), Error);
  const auto cc = context_refeed_chunks(ctx, 0);
  ASSERT_EQ(cc.size(), 1u);
  EXPECT_EQ(cc[0].tokens, ctx);
  EXPECT_EQ(context_refeed_chunks(ctx, 7).size(), 5u);
}

// A chunk larger than the room left in the context is cut to the room (a perplexity window's
// session holds exactly the window): the scores are then those of the smaller chunks (checked
// against the brute force with them); too little room for any chunk is a clear error.
TEST(Refeed, ChunksAreCutToTheRoomLeft) {
  RefeedSetup st = setup(Arch::kLlama);
  st.sp.n_ctx = 60;  // 40 context tokens leave 20
  Session s(*st.model, st.sp);
  s.set_press(make_press("kvcompose:ratio=0.5,refeed_chunk=0"));
  s.prefill(st.context);
  s.prepare_compress();
  const Observations& ob = *s.observations();
  const Brute b = brute_force_refeed(st, context_refeed_chunks(st.context, 20), Which::kCompose, 0);
  const HParams& hp = st.model->hparams();
  for (int l = 0; l < hp.n_layer; ++l) {
    EXPECT_EQ(ob.refeed_m[static_cast<size_t>(l)], kRefeedTokens);
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const size_t at = static_cast<size_t>(l * hp.n_head_kv + h);
      for (size_t i = 0; i < ob.stat(TokenStat::kRefeedMax)[at].size(); ++i)
        expect_near_rel(ob.stat(TokenStat::kRefeedMax)[at][i], b.mx[at][i], "max", l, h, i);
    }
  }
  const CompressStats cs = s.compress();
  EXPECT_LT(cs.bytes_after, cs.bytes_before);
  // kvzip: the chunk leaves room for its prompt (about 65 byte tokens with the tiny tokenizer)
  SessionParams zp = st.sp;
  zp.n_ctx = 130;
  Session z(*st.model, zp);
  z.set_press(make_press("kvzip:ratio=0.5"));
  z.prefill(st.context);
  const CompressStats zs = z.compress();
  EXPECT_LT(zs.bytes_after, zs.bytes_before);
  // no room for a chunk of 16
  st.sp.n_ctx = 50;
  Session t(*st.model, st.sp);
  t.set_press(make_press("kvcompose:ratio=0.5"));
  t.prefill(st.context);
  try {
    t.compress();
    FAIL() << "no error";
  } catch (const LimitError& e) {
    EXPECT_NE(std::string(e.what()).find("use a larger --ctx"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.n_past(), kRefeedTokens);  // nothing changed
  EXPECT_EQ(total_tokens(t.cache()), kRefeedTokens * st.model->hparams().n_layer * st.model->hparams().n_head_kv);
}

// After a compression the stored rows are fewer than the positions (a chat's second turn,
// decode-time compression): the next compress re-feeds the whole history over what is stored;
// a truncation into the re-fed context makes the results stale; compositions read them
// through the view.
TEST(Refeed, SecondPassOverACompressedCacheAndCompositions) {
  const RefeedSetup st = setup(Arch::kQwen2);
  for (const char* spec : {"kvzip:ratio=0.5,chunk=16", "kvcompose:ratio=0.5,refeed_chunk=16",
                           "snapkv:ratio=0.3,window=4+kvzip:ratio=0.5", "kvzip:ratio=0.3+kvcompose:ratio=0.3"}) {
    SCOPED_TRACE(spec);
    Session s(*st.model, st.sp);
    s.set_press(make_press(spec));
    s.prefill(st.context);
    const CompressStats first = s.compress();
    EXPECT_LT(first.bytes_after, first.bytes_before);
    for (int32_t t : {5, 6, 7, 8, 9}) s.decode(t);
    const CompressStats second = s.compress();
    EXPECT_LT(second.bytes_after, second.bytes_before);
    EXPECT_EQ(s.refeed_passes(), 2);
    EXPECT_EQ(s.n_past(), kRefeedTokens + 5);
    const auto& lg = s.decode(3);
    for (float x : lg) ASSERT_TRUE(std::isfinite(x));
  }
  Session s(*st.model, st.sp);
  s.set_press(make_press("kvzip:ratio=0.5"));
  s.prefill(st.context);
  s.prepare_compress();
  ASSERT_TRUE(s.observations()->refeed_current);
  s.truncate(kRefeedTokens - 3);
  EXPECT_FALSE(s.observations()->refeed_current);
  EXPECT_GT(s.compress().refeed_seconds, 0.0);  // ran again over the shorter context
}

TEST(Refeed, SharedPassNeedsAgreeingSettings) {
  PressNeeds a = make_press("kvcompose:refeed_chunk=64")->needs();
  EXPECT_THROW(a.merge(make_press("kvcompose:refeed_chunk=0")->needs()), Error);
  a.merge(make_press("kvcompose:refeed_chunk=64")->needs());
  a.merge(make_press("kvzip:chunk=100")->needs());
  EXPECT_TRUE(a.refeed.context && a.refeed.kvzip);
  EXPECT_THROW(a.merge(make_press("kvzip:chunk=200")->needs()), Error);
  EXPECT_THROW(make_press("kvzip:chunk=0"), Error);
  EXPECT_THROW(make_press("kvcompose:task=somewhere"), Error);
  EXPECT_THROW(make_press("kvcompose:mode=unstructured,layer0_max=1"), Error);
}

TEST(Refeed, PlanWithoutThePassNamesIt) {
  const RefeedSetup st = setup(Arch::kLlama);
  Session s(*st.model, st.sp);
  s.set_press(make_press("kvzip:ratio=0.5"));
  s.prefill(st.context);
  PressContext ctx(s.cache(), st.model->hparams(), s.observations(), &s.pool());
  try {
    s.press()->plan(ctx);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reconstruction"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvtrim
