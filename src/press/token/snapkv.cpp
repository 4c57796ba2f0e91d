// SnapKV: keeps the tokens the last queries of the prompt (the observation window) attend to.
// Paper: Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before Generation"
// (arXiv:2404.14469); scoring as kvpress's snapkv_press.py.
//
// Score of stored token t at (layer il, kv head ih):
//   1. the last `window` captured queries of the layer (post-RoPE) attend to the head's
//      stored tokens: softmax(scale · q·k) over the tokens each query may see (causal, and the
//      layer's sliding window); window tokens (position >= the first window query's) are
//      excluded from the scored part;
//   2. mean over the window's queries, per query head;
//   3. pooling over neighbouring tokens with `kernel` (max-pool as in the SnapKV code, or
//      avg-pool with zero padding as in kvpress: pool=avg), per query head;
//   4. mean over the kv head's group of query heads (GQA);
//   5. window tokens score 2 + t/n (above any attention score, so always kept first, the most
//      recent first if the budget is smaller than the window; kvpress pads with the max score).
// Query-aware (query_aware=true): the question's queries replace the window; every stored
// token is scored.
// Hyper-parameters (defaults): ratio = 0.5 (fraction removed), budget = 0 (tokens kept per
// head; overrides ratio), window = 32, kernel = 5, pool = max, query_aware = false.
#include "press/token/snapkv.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace kvtrim {

PressNeeds SnapKVPress::needs() const {
  PressNeeds n;
  if (query_aware_) n.question = true;
  else n.window = window_;
  return n;
}

void SnapKVPress::score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const {
  const ObservedQueries q = query_aware_ ? ctx.queries(il, true, "snapkv")
                                         : last_queries(ctx.queries(il, false, "snapkv"), window_);
  const int g = ctx.group();
  HeadData hd;
  std::vector<float> probs, mean, pooled;
  for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
    ctx.read_head(il, ih, &hd, true, false);
    const int64_t n = hd.n;
    // Scored part: tokens before the window (positions are increasing in stored order).
    int64_t m = n;
    if (!query_aware_ && q.n > 0) {
      const int32_t first = q.pos[0];
      m = std::lower_bound(hd.pos.begin(), hd.pos.end(), first) - hd.pos.begin();
    }
    attention_probs(ctx, il, ih, hd, q, &probs);
    auto& sc = (*scores)[static_cast<size_t>(ih)];
    sc.assign(static_cast<size_t>(n), 0.f);
    for (int64_t t = m; t < n; ++t) sc[static_cast<size_t>(t)] = 2.f + static_cast<float>(t) / static_cast<float>(n);
    mean.assign(static_cast<size_t>(m), 0.f);
    pooled.assign(static_cast<size_t>(m), 0.f);
    const int64_t half = kernel_ / 2;
    for (int gi = 0; gi < g; ++gi) {
      std::fill(mean.begin(), mean.end(), 0.f);
      for (int64_t i = 0; i < q.n; ++i) {
        const float* p = probs.data() + (static_cast<size_t>(gi) * static_cast<size_t>(q.n) + static_cast<size_t>(i)) *
                                            static_cast<size_t>(n);
        for (int64_t t = 0; t < m; ++t) mean[static_cast<size_t>(t)] += p[t];
      }
      for (auto& x : mean) x /= static_cast<float>(std::max<int64_t>(q.n, 1));
      for (int64_t t = 0; t < m; ++t) {
        const int64_t a = std::max<int64_t>(0, t - half), b = std::min<int64_t>(m - 1, t + half);
        float acc = max_pool_ ? -std::numeric_limits<float>::infinity() : 0.f;
        for (int64_t u = a; u <= b; ++u)
          acc = max_pool_ ? std::max(acc, mean[static_cast<size_t>(u)]) : acc + mean[static_cast<size_t>(u)];
        pooled[static_cast<size_t>(t)] = max_pool_ ? acc : acc / static_cast<float>(kernel_);
      }
      for (int64_t t = 0; t < m; ++t) sc[static_cast<size_t>(t)] += pooled[static_cast<size_t>(t)] / static_cast<float>(g);
    }
  }
}

namespace {
std::vector<PressOption> snapkv_options() {
  auto o = budget_options();
  o.push_back({"window", "32", "observation window: the last W queries of the context"});
  o.push_back({"kernel", "5", "pooling kernel over neighbouring tokens (odd; 1 = no pooling)"});
  o.push_back({"pool", "max", "pooling: max (SnapKV code) or avg (kvpress)"});
  o.push_back(query_aware_option());
  return o;
}
}  // namespace

std::unique_ptr<SnapKVPress> make_snapkv_from_args(const PressArgs& a) {
  const std::string pool = a.get_string("pool");
  KVTRIM_CHECK(pool == "max" || pool == "avg", "press '%s': option 'pool' = '%s' must be max or avg", a.press().c_str(),
               pool.c_str());
  const int64_t kernel = a.get_int_min("kernel", 1);
  KVTRIM_CHECK(kernel % 2 == 1, "press '%s': option 'kernel' = %lld must be odd", a.press().c_str(),
               static_cast<long long>(kernel));
  return std::make_unique<SnapKVPress>(a.get_budget(), a.get_int_min("window", 1), kernel, pool == "max",
                                       a.get_bool("query_aware"));
}

PressInfo snapkv_press_info() {
  PressInfo i;
  i.name = "snapkv";
  i.description = "keep what the last W queries attend to (window mean, pooled, GQA-averaged)";
  i.paper = "Li et al. 2024, SnapKV: LLM Knows What You are Looking for Before Generation (arXiv:2404.14469)";
  i.options = snapkv_options();
  i.axis = PressAxis::kToken;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> { return make_snapkv_from_args(a); };
  return i;
}

std::vector<PressOption> snapkv_press_options() { return snapkv_options(); }

}  // namespace kvtrim
