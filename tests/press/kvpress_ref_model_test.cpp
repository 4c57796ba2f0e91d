// kvtrim's token-eviction presses (and ThinK's channel selection) against NVIDIA kvpress 0.5.5
// run on the same model and the same token ids (issues 13, 43; reference data:
// scripts/ref/make_kvpress_refs.py -> tests/data/kvpress_refs*.json, one file per model: SmolLM2,
// Qwen2.5-Coder-1.5B, Gemma 3 270M; transformers runs the GGUF's weights dequantized to f32, so
// the weights are the same numbers as kvtrim's).
//
// For each stored context: one kvtrim Session (f32 cache) capturing what every press of the
// table needs (merged PressNeeds, as a sweep), prefill of the stored ids, the passes the presses
// need before planning (re-feeds, when the session has them), then each press's plan() over the
// same observations, WITHOUT applying it; a second session for the presses whose re-feed differs
// (kvcompose with kvtrim's defaults). Per (layer, kv head):
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
//   kvzip: kvpress's pipeline puts the chat template's user prefix before the context and
//   reconstructs what
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
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "engine/session.h"
#include "press/press.h"
#include "test_util.h"

namespace kvtrim {
namespace {

// One model's reference file: scripts/ref/make_kvpress_refs.py --gguf FILE --out tests/data/FILE.
struct RefModel {
  std::string name;   // the test's suffix
  std::string model;  // test::require_model's name
  std::string refs;   // file in tests/data
};

nlohmann::json load_refs(const std::string& file) {
  std::ifstream f(test::data_dir() + "/" + file);
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
  int session = 0;       // cases of one session share its prefill (their re-feeds must agree)
  std::string label = {};  // the table's first column, when not the reference's name
};

struct Row {
  std::vector<double> ctx_mean;
  double sum = 0, min = 1;
  int64_t heads = 0, count_diff = 0;
  double seconds = 0;
  std::string error;
};

// kvcompose as kvpress's KVComposePress: the context re-fed after itself in one chunk, and the
// reference code's layer-0 boost.
const std::string kKvcSpec =
    "kvcompose:ratio=0.5,mode=structured,agg_task=max,agg_group=mean,agg_head=mean,mean_heads=1,"
    "weight=none,"
    "task=agnostic,refeed_chunk=0,layer0_max=1";
// task-aware kvcompose as kvpress's KVComposePress with a registered prompt (the question fed
// after the context with the cache: its own keys in each softmax's denominator).
const std::string kKvcAwareSpec =
    "kvcompose:ratio=0.5,mode=structured,agg_task=max,agg_group=mean,agg_head=mean,mean_heads=1,"
    "weight=none,"
    "task=aware,question_keys=1,layer0_max=1";
// kvzip as kvpress's KVzipPress defaults (layerwise=False, n_sink=4, chunk_size=2048).
const std::string kKvzipSpec = "kvzip:ratio=0.5,layerwise=0,sinks=4,chunk=2048";

// Bounds: 0.98 where both sides compute the same scores from the same f32 weights (only the
// forward's float rounding differs: near ties at the budget's edge may break either way).
// Measured on SmolLM2: 1.0000 everywhere but knorm (0.9999 mean; its worst head 0.9896, 2
// near-tied key norms of 192), so 0.98 still catches an off-by-one window or a wrong pooling
// (the controls below: 0.88 and 0.94).
std::vector<Case> reference_cases() {
  return {
      {"streamingllm", "streamingllm", "streamingllm:ratio=0.5,sinks=4", 0.98},
      {"knorm", "knorm", "knorm:ratio=0.5", 0.98},
      {"snapkv", "snapkv", "snapkv:ratio=0.5,window=64,kernel=5,pool=avg", 0.98},
      {"pyramidkv", "pyramidkv", "pyramidkv:ratio=0.5,window=64,kernel=5,pool=avg,beta=20", 0.98},
      {"tova", "tova", "tova:ratio=0.5", 0.98},
      {"observed_attention", "h2o", "h2o:ratio=0.5,recent=0,sinks=0", 0.98},
      {"expected_attention", "expected_attention",
       "expected_attention:ratio=0.5,window=1000000,n_future=512,sinks=4,cov=true,vnorm=true,"
       "epsilon=0",
       0.98},
      {"adakv_snapkv", "adakv",
       "adakv(snapkv:ratio=0.5,window=64,kernel=5,pool=avg):alpha_safeguard=0.2", 0.98},
      {"kvcompose", "kvcompose", kKvcSpec, 0.98},
      {"kvzip", "kvzip", kKvzipSpec, 0.98},
      {"think", "think", "think:ratio=0.5,window=32,count=code", 0.98, true},
      {"kvcompose_aware", "kvcompose", kKvcAwareSpec, 0.98},
      // Controls: kvtrim's own defaults where they differ from kvpress's on purpose. Their
      // overlap must stay clearly below 1, or the comparison above would prove nothing.
      {"snapkv", "snapkv", "snapkv:ratio=0.5", 0.97, false, true},  // window=32, pool=max
      {"expected_attention", "expected_attention", "expected_attention:ratio=0.5", 0.995, false,
       true},  // window=128
      // task=causal scores with the prefill's causal self-attention: token c is aggregated
      // (max) over the queries m >= c only, each softmax over tokens <= m; kvpress's re-fed
      // query m sees the whole context. Measured 0.566.
      {"kvcompose", "kvcompose", "kvcompose:ratio=0.5,task=causal", 0.9, false, true},
      // task-aware with the softmax over the context only (question_keys=0): the question's
      // own keys take a share of each query's attention that differs from query to query,
      // which changes the max over queries. Measured 0.923 (question_keys=1: 1.0000).
      {"kvcompose_aware", "kvcompose",
       std::regex_replace(kKvcAwareSpec, std::regex("question_keys=1"), "question_keys=0"), 0.97,
       false, true},
  };
}

// kvcompose with kvtrim's defaults (the paper's: no layer-0 boost; the context re-fed in chunks of
// 512 tokens, so the cache holds the context + one chunk instead of twice the context) against
// kvpress's KVComposePress: not the same definition, a measured approximation, in a second session
// (its re-feed differs). The bounds sit under what was measured on each model
// (docs/results/kvpress_reference.md), so a change that moves the defaults further away fails.
std::vector<Case> default_cases(double bound_defaults, double bound_chunked) {
  return {
      {"kvcompose", "kvcompose", "kvcompose:ratio=0.5", bound_defaults, false, false, 1,
       "kvcompose (kvtrim defaults)"},
      {"kvcompose", "kvcompose", "kvcompose:ratio=0.5,layer0_max=1", bound_chunked, false, false, 1,
       "kvcompose (chunked re-feed)"},
  };
}

// A plan's per-head key subset as int32 coordinates (empty: none).
std::vector<int32_t> key_subset(const HeadPlan& h) {
  const ChannelSubset* s = h.key.channels.subset();
  return s ? std::vector<int32_t>(s->channels.begin(), s->channels.end()) : std::vector<int32_t>{};
}

// kvtrim's last-position logits against transformers' top-20.
void check_logits(const nlohmann::json& c, const std::vector<float>& logits, int64_t n,
                  float max_dlogit) {
  const std::vector<int32_t> top_ids = c["top_ids"];
  const std::vector<float> top_logits = c["top_logits"];
  std::vector<int32_t> ours(logits.size());
  std::iota(ours.begin(), ours.end(), 0);
  std::partial_sort(ours.begin(), ours.begin() + static_cast<std::ptrdiff_t>(top_ids.size()),
                    ours.end(), [&](int32_t a, int32_t b) {
                      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
                    });
  ours.resize(top_ids.size());
  const std::set<int32_t> ref_set(top_ids.begin(), top_ids.end());
  int common = 0;
  float max_diff = 0;
  for (int32_t t : ours) common += ref_set.count(t) ? 1 : 0;
  for (size_t i = 0; i < top_ids.size(); ++i)
    max_diff =
        std::max(max_diff, std::abs(logits[static_cast<size_t>(top_ids[i])] - top_logits[i]));
  std::printf(
      "[logits] %-16s n=%lld top1 kvtrim %d transformers %d, top-%zu overlap %d, max |dlogit| on "
      "the reference top-%zu %.4f\n",
      c["name"].get<std::string>().c_str(), static_cast<long long>(n), ours[0], top_ids[0],
      top_ids.size(), common, top_ids.size(), max_diff);
  EXPECT_EQ(ours[0], top_ids[0]) << c["name"];
  EXPECT_GE(common, static_cast<int>(top_ids.size()) - 2) << c["name"];
  EXPECT_LT(max_diff, max_dlogit) << c["name"];
}

// One session over the context's ids capturing what every given press needs (PressNeeds merged,
// as a sweep does), prefilled, then the passes they need before planning (the re-feeds) once.
std::unique_ptr<Session> prefill_for(const Model& model, const nlohmann::json& c,
                                     const std::vector<const Press*>& presses,
                                     std::vector<float>* logits, double* prefill_s,
                                     double* refeed_s) {
  const std::vector<int32_t> ids = c["ids"];
  SessionParams sp;
  sp.n_ctx = std::max<int64_t>(
      2048, 2 * static_cast<int64_t>(ids.size()) + 256);  // the context re-fed in one chunk
  sp.n_threads = 2;
  sp.kv_dtype = KvDtype::kF32;
  PressNeeds all;
  for (const Press* p : presses) all.merge(p->needs());
  auto s = std::make_unique<Session>(model, sp);
  s->set_press(make_press("knorm:0.5"), {}, all);
  const auto tp = std::chrono::steady_clock::now();
  *logits = s->prefill(ids);
  if (all.question) {  // the task-aware reference's question, as kvpress fed it
    const auto& qa = c["presses"]["kvcompose_aware"];
    EXPECT_TRUE(qa.contains("question_ids")) << "the reference predates kvcompose_aware";
    if (qa.contains("question_ids"))
      s->observe_question(qa["question_ids"].get<std::vector<int32_t>>());
  }
  const auto tr = std::chrono::steady_clock::now();
  s->prepare_compress();
  *prefill_s += std::chrono::duration<double>(tr - tp).count();
  *refeed_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();
  return s;
}

// The tokens (or key channels) one head keeps in kvtrim's plan, in the reference's numbering.
std::vector<int32_t> kept_by_kvtrim(const Case& k, const HeadPlan& h, const HParams& hp,
                                    int64_t n) {
  std::vector<int32_t> got;
  if (k.channels) {
    got = key_subset(h);
    if (got.empty()) {
      got.resize(static_cast<size_t>(hp.head_dim_k));
      std::iota(got.begin(), got.end(), 0);
    }
  } else if (h.keep_all) {
    got.resize(static_cast<size_t>(n));
    std::iota(got.begin(), got.end(), 0);
  } else {
    got = h.keep;
  }
  return got;
}

// Per (layer, kv head) overlap of kvtrim's plan with the reference's kept set, into row.
void score_plan(const Case& k, const nlohmann::json& ref_kept, const CompressionPlan& plan,
                const HParams& hp, int64_t n, Row* row) {
  double sum = 0;
  int64_t heads = 0;
  for (int il = 0; il < hp.n_layer; ++il) {
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      std::vector<int32_t> want =
          from_bitmask(ref_kept[static_cast<size_t>(il)][static_cast<size_t>(ih)]);
      if (k.channels && !hp.rope_neox) {
        // transformers' channel c (rotate-half pairs c, c + d/2) is the GGUF's 2c / 2c+1
        // (llama.cpp's converter interleaves each head's q/k rows) unless rope is NeoX.
        const int d = hp.head_dim_k;
        for (int32_t& x : want) x = x < d / 2 ? 2 * x : 2 * (x - d / 2) + 1;
        std::sort(want.begin(), want.end());
      }
      const std::vector<int32_t> got = kept_by_kvtrim(k, plan.at(il, ih), hp, n);
      std::vector<int32_t> both;
      std::set_intersection(got.begin(), got.end(), want.begin(), want.end(),
                            std::back_inserter(both));
      const double ov =
          want.empty() ? 1.0 : static_cast<double>(both.size()) / static_cast<double>(want.size());
      sum += ov;
      row->min = std::min(row->min, ov);
      row->count_diff += got.size() != want.size() ? 1 : 0;
      ++heads;
    }
  }
  row->ctx_mean.push_back(sum / static_cast<double>(heads));
  row->sum += sum;
  row->heads += heads;
}

// The table of overlaps, with each case's bound checked.
void report(const nlohmann::json& refs, const std::string& model, const std::vector<Case>& cases,
            const std::vector<Row>& rows) {
  std::printf(
      "\nkvtrim vs kvpress %s (transformers %s, torch %s), ratio 0.5, %s; overlap = |kvtrim ∩ "
      "kvpress| / |kvpress| per (layer, kv head)\n",
      refs["versions"]["kvpress"].get<std::string>().c_str(),
      refs["versions"]["transformers"].get<std::string>().c_str(),
      refs["versions"]["torch"].get<std::string>().c_str(), model.c_str());
  std::printf("%-28s %-10s", "press (kvpress)", "kvtrim");
  for (const auto& c : refs["contexts"]) std::printf(" %16s", c["name"].get<std::string>().c_str());
  std::printf(" %8s %8s %7s  %s\n", "mean", "min", "plan s", "kept counts equal");
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& k = cases[ci];
    const Row& r = rows[ci];
    const std::string label = !k.label.empty() ? k.label : k.control ? "(control) " + k.ref : k.ref;
    std::printf("%-28s %-10s", label.c_str(), k.name.c_str());
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
  std::printf("kvcompose (task-aware) spec: %s\nkvcompose spec: %s\nkvzip spec: %s\n",
              kKvcAwareSpec.c_str(), kKvcSpec.c_str(), kKvzipSpec.c_str());
  for (const Case& k : cases)
    if (k.control || k.session != 0)
      std::printf("%s %s\n", k.control ? "control" : "kvtrim defaults", k.spec.c_str());
  std::fflush(stdout);
}

struct RefCase {
  RefModel m;
  double bound_defaults, bound_chunked;  // kvcompose with kvtrim's defaults (default_cases)
  float max_dlogit;                      // kvtrim's logits against transformers' top-20
};

// The test's parameter as ctest lists it: the model's name (not GoogleTest's byte dump).
void PrintTo(const RefCase& r, std::ostream* os) { *os << r.m.name; }

class KvpressReference : public ::testing::TestWithParam<RefCase> {};

TEST_P(KvpressReference, EvictionPressesKeepWhatKvpressKeeps) {
  const RefCase& rc = GetParam();
  const auto refs = load_refs(rc.m.refs);
  ASSERT_FALSE(refs.empty()) << "tests/data/" << rc.m.refs
                             << " missing (scripts/ref/make_kvpress_refs.py)";
  auto model = Model::load(test::require_model(rc.m.model));
  const HParams& hp = model->hparams();
  std::vector<Case> cases = reference_cases();
  for (Case& k : default_cases(rc.bound_defaults, rc.bound_chunked)) cases.push_back(std::move(k));
  std::vector<std::unique_ptr<Press>> presses(cases.size());
  for (size_t ci = 0; ci < cases.size(); ++ci)
    if (refs["contexts"][0]["presses"].contains(cases[ci].ref))
      presses[ci] = make_press(cases[ci].spec);

  std::vector<Row> rows(cases.size());
  double prefill_s = 0, refeed_s = 0;
  for (const auto& c : refs["contexts"]) {
    const int64_t n = static_cast<int64_t>(c["ids"].size());
    for (int group = 0; group < 2; ++group) {  // every press of a group planned over ONE prefill
      std::vector<const Press*> in_group;
      for (size_t ci = 0; ci < cases.size(); ++ci)
        if (presses[ci] && cases[ci].session == group) in_group.push_back(presses[ci].get());
      if (in_group.empty()) continue;
      std::vector<float> logits;
      auto s = prefill_for(*model, c, in_group, &logits, &prefill_s, &refeed_s);
      if (group == 0) check_logits(c, logits, n, rc.max_dlogit);
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        if (!presses[ci] || cases[ci].session != group) continue;
        const auto& rp = c["presses"][cases[ci].ref];
        if (rp.contains("error")) {
          rows[ci].error = rp["error"].get<std::string>();
          continue;
        }
        const auto t0 = std::chrono::steady_clock::now();
        PressContext ctx(s->cache(), hp, s->observations(), nullptr);
        ctx.set_model(model.get());
        const CompressionPlan plan = presses[ci]->plan(ctx);
        score_plan(cases[ci], rp[cases[ci].channels ? "kept_channels" : "kept"], plan, hp, n,
                   &rows[ci]);
        rows[ci].seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
  }
  std::vector<Case> run;
  std::vector<Row> run_rows;
  for (size_t ci = 0; ci < cases.size(); ++ci)
    if (presses[ci]) run.push_back(cases[ci]), run_rows.push_back(rows[ci]);
  report(refs, rc.m.model, run, run_rows);
  std::printf(
      "the %zu contexts: prefills (capturing every press's needs) %.1f s, re-feeds %.1f s\n",
      refs["contexts"].size(), prefill_s, refeed_s);
}

// SmolLM2 (q4_1 / q8_0 weights, llama): 3 contexts of 384 / 480 / 560 tokens, every press. The
// logits: measured 0.055 / 0.077 / 0.121 (logits ~12; identical with one prefill chunk or chunks
// of 256: kvtrim runs f32 sgemm from 16 tokens on, on the same dequantized weights; what is left
// is 30 layers of f32 summation-order / kernel differences).
// Qwen2.5-Coder-1.5B (Q4_K_M, K/V biases, 28 layers x 2 kv heads): one context of 640 tokens
// (two re-feed chunks of kvtrim's default 512), the KVCompose presses and SnapKV.
// Gemma 3 270M (Q4_K_M, QK-norm, sliding windows of 512 on 15 of 18 layers, 1 kv head): 3
// contexts of 500 tokens, every press kvpress runs on it (its KVzip refuses Gemma3ForCausalLM and
// its ExpectedAttention fails on Gemma's two rotary embeddings: recorded in the file).
// Bounds of the kvtrim-default rows: measured minus about 0.02 (docs/results/kvpress_reference.md).
INSTANTIATE_TEST_SUITE_P(
    Kvpress, KvpressReference,
    ::testing::Values(
        RefCase{{"smollm2", "smollm2", "kvpress_refs.json"}, 0.95, 0.96, 0.25f},
        RefCase{{"qwen", "qwen2.5-coder-1.5b", "kvpress_refs_qwen.json"}, 0.93, 0.93, 0.5f},
        RefCase{{"gemma3", "gemma3-270m", "kvpress_refs_gemma3.json"}, 0.98, 0.98, 0.5f}),
    [](const ::testing::TestParamInfo<RefCase>& i) { return i.param.m.name; });
// The same on Qwen over a context of 1152 tokens with every press (6 min on 2 threads: not in the
// test runs; docs/results/kvpress_reference.md has its table): run with
// test_press_model --gtest_filter='DISABLED_KvpressLong*' --gtest_also_run_disabled_tests
INSTANTIATE_TEST_SUITE_P(
    DISABLED_KvpressLong, KvpressReference,
    ::testing::Values(RefCase{
        {"qwen_long", "qwen2.5-coder-1.5b", "kvpress_refs_qwen_long.json"}, 0.92, 0.89, 0.5f}),
    [](const ::testing::TestParamInfo<RefCase>& i) { return i.param.m.name; });

}  // namespace
}  // namespace kvtrim
