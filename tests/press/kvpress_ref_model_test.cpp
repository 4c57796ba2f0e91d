// kvtrim's token-eviction presses (and ThinK's channel selection) against NVIDIA kvpress 0.5.5
// run on the same model and the same token ids (issue 13; reference data:
// scripts/ref/make_kvpress_refs.py -> tests/data/kvpress_refs.json; transformers runs the
// GGUF's weights dequantized to f32, so the weights are the same numbers as kvtrim's).
//
// For each of the 3 stored contexts: one kvtrim Session (f32 cache) capturing what every press
// of the table needs (merged PressNeeds, as a sweep), prefill of the stored ids, the passes the
// presses need before planning (re-feeds, when the session has them), then each press's
// plan() over the same observations, WITHOUT applying it. Per (layer, kv head):
// overlap = |kept_kvtrim ∩ kept_kvpress| / |kept_kvpress|; the table gives its mean per context
// and over everything, the minimum, and whether every head keeps as many tokens as kvpress.
// Options are set to kvpress's defaults (recorded in the JSON), where kvtrim's differ:
//   snapkv / pyramidkv / adakv(snapkv): window=64 (kvpress's window_size; kvtrim's 32),
//     pool=avg (kvpress's avg_pool1d with zero padding; kvtrim's max, as SnapKV's code);
//   expected_attention: window = every query (kvpress's statistics use the whole prompt after
//     the n_sink first tokens; kvtrim's window=128);
//   observed_attention = kvtrim's h2o (recent=0, sinks=0);
//   think: kvpress prunes int(d·λ) channels = kvtrim's count=code; its channels are in
//     transformers' rotate-half order, mapped to the GGUF's interleaved rotary pairs;
//   kvcompose: kvpress re-feeds the context after itself (task=agnostic with refeed_chunk=0,
//     and layer0_max=1 for its layer-0 boost);
//   kvzip: kvpress's pipeline puts the chat template's user prefix before the context and reconstructs what
//     follows it, so the reference treats the context's first n_sink tokens as that prefix
//     (sinks, not reconstructed), as kvtrim's kvzip does.
// Also: kvtrim's forward against transformers' on the same ids (top-1 and top-20 logits).
#include <gtest/gtest.h>

#include <regex>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "engine/session.h"
#include "press/press.h"
#include "test_util.h"

namespace kvtrim {
namespace {

nlohmann::json load_refs() {
  std::ifstream f(test::data_dir() + "/kvpress_refs.json");
  if (!f) return {};
  return nlohmann::json::parse(f);
}

// Indices set in a bitmask: hex digit i holds indices 4i..4i+3, bit j = index 4i+j.
std::vector<int32_t> from_bitmask(const std::string& hex) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < hex.size(); ++i) {
    const char c = hex[i];
    const int v = c >= 'a' ? c - 'a' + 10 : c - '0';
    for (int j = 0; j < 4; ++j)
      if (v & (1 << j)) out.push_back(static_cast<int32_t>(4 * i + static_cast<size_t>(j)));
  }
  return out;
}

struct Case {
  std::string ref;   // key in the JSON
  std::string name;  // kvtrim registry name
  std::string spec;
  double bound;      // asserted lower bound on the mean overlap (control: upper bound)
  bool channels = false;
  bool control = false;  // a different definition on purpose: the comparison must see it
};

struct Row {
  std::vector<double> ctx_mean;
  double sum = 0, min = 1;
  int64_t heads = 0, count_diff = 0;
  double seconds = 0;
  std::string error;
};

// A plan's per-head key subset as int32 coordinates (empty: none).
std::vector<int32_t> key_subset(const HeadPlan& h) {
  const ChannelSubset* s = h.key.channels.subset();
  return s ? std::vector<int32_t>(s->channels.begin(), s->channels.end()) : std::vector<int32_t>{};
}

TEST(KvpressReference, EvictionPressesKeepWhatKvpressKeeps) {
  const auto refs = load_refs();
  ASSERT_FALSE(refs.empty()) << "tests/data/kvpress_refs.json missing (scripts/ref/make_kvpress_refs.py)";
  auto model = Model::load(test::require_model("smollm2"));
  const HParams& hp = model->hparams();

  // kvcompose as kvpress's KVComposePress: the context re-fed after itself in one chunk, and
  // the reference code's layer-0 boost.
  const std::string kvc_spec =
      "kvcompose:ratio=0.5,mode=structured,agg_task=max,agg_group=mean,agg_head=mean,mean_heads=1,weight=none,"
      "task=agnostic,refeed_chunk=0,layer0_max=1";
  // task-aware kvcompose as kvpress's KVComposePress with a registered prompt (the question fed
  // after the context with the cache: its own keys in each softmax's denominator).
  const std::string kvc_aware_spec =
      "kvcompose:ratio=0.5,mode=structured,agg_task=max,agg_group=mean,agg_head=mean,mean_heads=1,weight=none,"
      "task=aware,question_keys=1,layer0_max=1";
  // kvzip as kvpress's KVzipPress defaults (layerwise=False, n_sink=4, chunk_size=2048).
  const std::string kvzip_spec = "kvzip:ratio=0.5,layerwise=0,sinks=4,chunk=2048";

  // Bounds: 0.98 where both sides compute the same scores from the same f32 weights (only the
  // forward's float rounding differs: near ties at the budget's edge may break either way).
  // Measured: 1.0000 everywhere but knorm (0.9999 mean; its worst head 0.9896, 2 near-tied key
  // norms of 192), so 0.98 still catches an off-by-one window or a wrong pooling (the controls
  // below: 0.88 and 0.94).
  std::vector<Case> cases = {
      {"streamingllm", "streamingllm", "streamingllm:ratio=0.5,sinks=4", 0.98},
      {"knorm", "knorm", "knorm:ratio=0.5", 0.98},
      {"snapkv", "snapkv", "snapkv:ratio=0.5,window=64,kernel=5,pool=avg", 0.98},
      {"pyramidkv", "pyramidkv", "pyramidkv:ratio=0.5,window=64,kernel=5,pool=avg,beta=20", 0.98},
      {"tova", "tova", "tova:ratio=0.5", 0.98},
      {"observed_attention", "h2o", "h2o:ratio=0.5,recent=0,sinks=0", 0.98},
      {"expected_attention", "expected_attention",
       "expected_attention:ratio=0.5,window=1000000,n_future=512,sinks=4,cov=true,vnorm=true,epsilon=0", 0.98},
      {"adakv_snapkv", "adakv", "adakv(snapkv:ratio=0.5,window=64,kernel=5,pool=avg):alpha_safeguard=0.2", 0.98},
      {"kvcompose", "kvcompose", kvc_spec, 0.98},
      {"kvzip", "kvzip", kvzip_spec, 0.98},
      {"think", "think", "think:ratio=0.5,window=32,count=code", 0.98, true},
      {"kvcompose_aware", "kvcompose", kvc_aware_spec, 0.98},
      // Controls: kvtrim's own defaults where they differ from kvpress's on purpose. Their
      // overlap must stay clearly below 1, or the comparison above would prove nothing.
      {"snapkv", "snapkv", "snapkv:ratio=0.5", 0.97, false, true},  // window=32, pool=max
      {"expected_attention", "expected_attention", "expected_attention:ratio=0.5", 0.995, false, true},  // window=128
      // task=causal scores with the prefill's causal self-attention: token c is aggregated
      // (max) over the queries m >= c only, each softmax over tokens <= m; kvpress's re-fed
      // query m sees the whole context. Measured 0.566.
      {"kvcompose", "kvcompose", "kvcompose:ratio=0.5,task=causal", 0.9, false, true},
      // task-aware with the softmax over the context only (question_keys=0): the question's
      // own keys take a share of each query's attention that differs from query to query,
      // which changes the max over queries. Measured 0.923 (question_keys=1: 1.0000).
      {"kvcompose_aware", "kvcompose", std::regex_replace(kvc_aware_spec, std::regex("question_keys=1"), "question_keys=0"), 0.97, false, true},
  };

  std::vector<Row> rows(cases.size());
  double prefill_s = 0, refeed_s = 0;
  const auto& contexts = refs["contexts"];
  for (const auto& c : contexts) {
    const std::vector<int32_t> ids = c["ids"];
    const int64_t n = static_cast<int64_t>(ids.size());
    SessionParams sp;
    sp.n_ctx = 2048;
    sp.n_threads = 2;
    sp.kv_dtype = KvDtype::kF32;

    // Every press of the table, planned over ONE prefill: the session captures what all of
    // them need (PressNeeds merged, as a sweep does), then runs the passes they need before
    // planning (the re-feeds) once.
    std::vector<std::unique_ptr<Press>> presses(cases.size());
    PressNeeds all;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      presses[ci] = make_press(cases[ci].spec);
      all.merge(presses[ci]->needs());
    }
    Session s(*model, sp);
    s.set_press(make_press("knorm:0.5"), {}, all);
    const auto tp = std::chrono::steady_clock::now();
    const std::vector<float> logits = s.prefill(ids);
    if (all.question) {  // the task-aware reference's question, as kvpress fed it
      const auto& qa = c["presses"]["kvcompose_aware"];
      ASSERT_TRUE(qa.contains("question_ids")) << "tests/data/kvpress_refs.json predates kvcompose_aware";
      s.observe_question(qa["question_ids"].get<std::vector<int32_t>>());
    }
    const auto tr = std::chrono::steady_clock::now();
    s.prepare_compress();
    prefill_s += std::chrono::duration<double>(tr - tp).count();
    refeed_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();

    // The forward: kvtrim's last-position logits against transformers'.
    {
      const std::vector<int32_t> top_ids = c["top_ids"];
      const std::vector<float> top_logits = c["top_logits"];
      std::vector<int32_t> ours(logits.size());
      std::iota(ours.begin(), ours.end(), 0);
      std::partial_sort(ours.begin(), ours.begin() + static_cast<std::ptrdiff_t>(top_ids.size()), ours.end(),
                        [&](int32_t a, int32_t b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
      ours.resize(top_ids.size());
      const std::set<int32_t> ref_set(top_ids.begin(), top_ids.end());
      int common = 0;
      float max_diff = 0;
      for (int32_t t : ours) common += ref_set.count(t) ? 1 : 0;
      for (size_t i = 0; i < top_ids.size(); ++i)
        max_diff = std::max(max_diff, std::abs(logits[static_cast<size_t>(top_ids[i])] - top_logits[i]));
      std::printf("[logits] %-16s n=%lld top1 kvtrim %d transformers %d, top-%zu overlap %d, max |dlogit| on the reference top-%zu %.4f\n",
                  c["name"].get<std::string>().c_str(), static_cast<long long>(n), ours[0], top_ids[0], top_ids.size(),
                  common, top_ids.size(), max_diff);
      EXPECT_EQ(ours[0], top_ids[0]) << c["name"];
      EXPECT_GE(common, static_cast<int>(top_ids.size()) - 2) << c["name"];
      // Measured 0.055 / 0.077 / 0.121 (logits ~12; identical with one prefill chunk or
      // chunks of 256: kvtrim runs f32 sgemm from 16 tokens on, on the same dequantized
      // weights; what is left is 30 layers of f32 summation-order / kernel differences).
      EXPECT_LT(max_diff, 0.25f) << c["name"];
    }

    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& k = cases[ci];
      Row& row = rows[ci];
      if (!presses[ci]) continue;
      const auto& rp = c["presses"][k.ref];
      if (rp.contains("error")) {
        row.error = rp["error"].get<std::string>();
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      PressContext ctx(s.cache(), hp, s.observations(), nullptr);
      ctx.set_model(model.get());
      const CompressionPlan plan = presses[ci]->plan(ctx);
      const auto& ref_kept = rp[k.channels ? "kept_channels" : "kept"];
      double sum = 0;
      int64_t heads = 0;
      for (int il = 0; il < hp.n_layer; ++il) {
        for (int ih = 0; ih < hp.n_head_kv; ++ih) {
          const HeadPlan& h = plan.at(il, ih);
          std::vector<int32_t> want = from_bitmask(ref_kept[static_cast<size_t>(il)][static_cast<size_t>(ih)]);
          std::vector<int32_t> got;
          if (k.channels) {
            // transformers' channel c (rotate-half pairs c, c + d/2) is the GGUF's 2c / 2c+1
            // (llama.cpp's converter interleaves each head's q/k rows) unless rope is NeoX.
            const int d = hp.head_dim_k;
            if (!hp.rope_neox)
              for (int32_t& x : want) x = x < d / 2 ? 2 * x : 2 * (x - d / 2) + 1;
            std::sort(want.begin(), want.end());
            got = key_subset(h);
            if (got.empty()) {
              got.resize(static_cast<size_t>(d));
              std::iota(got.begin(), got.end(), 0);
            }
          } else if (h.keep_all) {
            got.resize(static_cast<size_t>(n));
            std::iota(got.begin(), got.end(), 0);
          } else {
            got = h.keep;
          }
          std::vector<int32_t> both;
          std::set_intersection(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(both));
          const double ov = want.empty() ? 1.0 : static_cast<double>(both.size()) / static_cast<double>(want.size());
          sum += ov;
          row.min = std::min(row.min, ov);
          row.count_diff += got.size() != want.size() ? 1 : 0;
          ++heads;
        }
      }
      row.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      row.ctx_mean.push_back(sum / static_cast<double>(heads));
      row.sum += sum;
      row.heads += heads;
    }
  }

  std::printf("\nkvtrim vs kvpress %s (transformers %s, torch %s), ratio 0.5, smollm2; overlap = |kvtrim ∩ kvpress| / |kvpress| per (layer, kv head)\n",
              refs["versions"]["kvpress"].get<std::string>().c_str(), refs["versions"]["transformers"].get<std::string>().c_str(),
              refs["versions"]["torch"].get<std::string>().c_str());
  std::printf("%-20s %-10s", "press (kvpress)", "kvtrim");
  for (const auto& c : contexts) std::printf(" %16s", c["name"].get<std::string>().c_str());
  std::printf(" %8s %8s %7s  %s\n", "mean", "min", "plan s", "kept counts equal");
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& k = cases[ci];
    const Row& r = rows[ci];
    std::printf("%-20s %-10s", (k.control ? "(control) " + k.ref : k.ref).c_str(), k.name.c_str());
    if (!r.error.empty()) {
      std::printf("  kvpress failed: %s\n", r.error.c_str());
      continue;
    }
    for (double m : r.ctx_mean) std::printf(" %16.4f", m);
    const double mean = r.sum / static_cast<double>(r.heads);
    std::printf(" %8.4f %8.4f %7.1f  %s", mean, r.min, r.seconds, r.count_diff == 0 ? "yes" : "no");
    if (r.count_diff) std::printf(" (%lld of %lld heads differ)", static_cast<long long>(r.count_diff), static_cast<long long>(r.heads));
    std::printf("\n");
    if (k.control) EXPECT_LT(mean, k.bound) << "control " << k.spec << ": the comparison does not tell definitions apart";
    else EXPECT_GE(mean, k.bound) << k.ref << " (kvtrim " << k.spec << ")";
  }
  std::printf("kvcompose (task-aware) spec: %s\n", kvc_aware_spec.c_str());
  std::printf("kvcompose spec: %s\nkvzip spec: %s\nthe 3 contexts: prefills (capturing every press's needs) %.1f s, re-feeds %.1f s\n",
              kvc_spec.c_str(), kvzip_spec.c_str(), prefill_s, refeed_s);
  for (size_t ci = 0; ci < cases.size(); ++ci)
    if (cases[ci].control) std::printf("control %s\n", cases[ci].spec.c_str());
  std::fflush(stdout);
}

}  // namespace
}  // namespace kvtrim
